"""Routes: HTTP <-> domain only. Codes come from the error classes, never by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError

from kop_dedup import errors
from kop_dedup.produce.service import BatchResult
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.http.admission import ByteBudget
from kop_dedup.transports.http.deps import Authorized, RuntimeDep
from kop_dedup.transports.http.models import (
    BatchIn,
    BatchOut,
    InitProducerIdIn,
    InitProducerIdOut,
    ProduceIn,
    ProduceOut,
    to_batch,
)

__all__ = ["body_schemas", "router"]

_ERROR: dict[str, Any] = {"content": {"application/json": {"schema": {"type": "object"}}}}
_AUTH: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing bearer token (when tokens are configured)", **_ERROR},
    403: {"description": "bearer token not accepted", **_ERROR},
    503: {"description": "the sidecar is starting", **_ERROR},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "nothing known about it", **_ERROR}
}
_TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"description": "body over KOP_DEDUP_MAX_REQUEST_BYTES", **_ERROR}
}

router = APIRouter(responses=_AUTH)
MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default


def _out(result: BatchResult) -> BatchOut:
    return BatchOut(
        topic=result.topic,
        partition=result.partition,
        errorCode=result.error_code,
        error=result.error_name,
        messageId=result.message_id,
        errorMessage=None if result.error is None else result.error.message,
    )


_INVALID: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "the body is not JSON (or not UTF-8) or not the documented shape: "
        'error "INVALID_REQUEST", errorCode 42, errorMessage, and detail per problem',
        **_ERROR,
    }
}
M = TypeVar("M", bound=BaseModel)
_BODY_MODELS: tuple[type[BaseModel], ...] = (ProduceIn, InitProducerIdIn)


def _body_spec(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def body_schemas() -> dict[str, Any]:
    """OpenAPI component schemas for the bodies read by hand (see parsed_body)."""
    out: dict[str, Any] = {}
    for model in _BODY_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def parsed_body(model: type[M], *, budgeted: bool = False) -> Callable[[Request], AsyncIterator[M]]:
    """A dependency that parses and validates the body in one pass with pydantic.

    Faster than FastAPI's json.loads + dict walk on the hot path, and every
    body problem (not JSON, not UTF-8, wrong shape) becomes one 422 in the
    house shape: FastAPI's own parser answers a body that is not UTF-8 with a
    bare 400.

    ``budgeted``: the body's bytes are held from the in-flight budget
    (``KOP_DEDUP_MAX_INFLIGHT_BYTES``) from before it is parsed until the
    request is done; the request waits for them. A raw body costs its size,
    its parsed records many times that, so the wait comes after the read:
    a client that is slow to send, or not authorized, holds no budget.
    """

    async def parse(request: Request) -> AsyncIterator[M]:
        raw = await request.body()
        budget: ByteBudget = request.app.state.admission
        share = len(raw) if budgeted else 0
        async with budget.hold(share):
            try:
                parsed = model.model_validate_json(raw)
            except ValidationError as exc:
                raise RequestValidationError(
                    [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
                ) from exc
            yield parsed

    return parse


@router.post(
    "/v1/produce",
    dependencies=[Authorized],
    tags=["produce"],
    openapi_extra=_body_spec(ProduceIn),
    response_model=ProduceOut,
    responses={**_TOO_LARGE, **_INVALID},
)
async def produce(
    body: Annotated[ProduceIn, Depends(parsed_body(ProduceIn, budgeted=True))], runtime: RuntimeDep
) -> Response:
    """Publish Kafka record batches; one result per batch, in request order.

    Each result carries Kafka's error code: 0 NONE, 46 DUPLICATE_SEQUENCE_NUMBER
    (already stored: treat as delivered), 45 OUT_OF_ORDER_SEQUENCE_NUMBER,
    47 INVALID_PRODUCER_EPOCH, 87 INVALID_RECORD, 3/6/7 retriable.
    """
    s = runtime.settings
    if len(body.batches) > s.max_batches_per_request:
        err = errors.InvalidRequest(
            f"{len(body.batches)} batches in one request; the limit is {s.max_batches_per_request}"
        )
        return _json(
            ProduceOut(results=[_out(BatchResult(b.topic, b.partition, err)) for b in body.batches])
        )
    timeout_ms = min(body.timeoutMs or s.default_timeout_ms, s.max_timeout_ms)
    deadline = time.monotonic() + timeout_ms / 1000
    service = runtime.service

    async def one(b: BatchIn) -> BatchResult:
        try:
            batch = to_batch(b)
        except errors.KafkaError as exc:
            runtime.stats.record(b.topic, b.producerId, exc.errno, len(b.records), 0.0)
            return BatchResult(b.topic, b.partition, exc)
        return await service.produce(batch, deadline)

    results = await asyncio.gather(*(one(b) for b in body.batches))
    return _json(ProduceOut(results=[_out(r) for r in results]))


def _json(out: ProduceOut) -> Response:
    """Serialized once by pydantic; FastAPI would validate and encode the model again."""
    return Response(out.model_dump_json(), media_type="application/json")


def _init_answer(
    err: errors.KafkaError | None, pid: int = -1, epoch: int = -1
) -> InitProducerIdOut:
    """The answer to init-producer-id: the id and epoch, or -1/-1 and the error."""
    if err is None:
        return InitProducerIdOut(
            errorCode=errors.NONE_ERRNO, error=errors.NONE_NAME, producerId=pid, producerEpoch=epoch
        )
    return InitProducerIdOut(
        errorCode=err.errno,
        error=err.name,
        producerId=-1,
        producerEpoch=-1,
        errorMessage=err.message,
    )


@router.post(
    "/v1/init-producer-id",
    dependencies=[Authorized],
    tags=["produce"],
    openapi_extra=_body_spec(InitProducerIdIn),
    responses={**_TOO_LARGE, **_INVALID},
)
async def init_producer_id(
    body: Annotated[InitProducerIdIn, Depends(parsed_body(InitProducerIdIn))],
    runtime: RuntimeDep,
) -> InitProducerIdOut:
    """A new producer id at epoch 0, or for a transactional id the same id at epoch + 1."""
    timeout = body.transactionTimeoutMs
    if timeout is not None and not 0 < timeout <= MAX_TRANSACTION_TIMEOUT_MS:
        return _init_answer(
            errors.InvalidTransactionTimeout(
                f"transactionTimeoutMs must be in 1..{MAX_TRANSACTION_TIMEOUT_MS}, got {timeout}"
            )
        )
    try:
        registry = runtime.registry
        if body.transactionalId is None:
            pid, epoch = await registry.allocator.allocate(), 0
        else:
            pid, epoch = await registry.transactional.init(body.transactionalId)
    except errors.KafkaError as exc:
        return _init_answer(exc)
    except Exception as exc:  # Pulsar trouble: the one translation says which code
        return _init_answer(translate(exc, "the producer-id registry in Pulsar"))
    return _init_answer(None, pid, epoch)


@router.get("/v1/stats", dependencies=[Authorized], tags=["stats"])
async def stats(runtime: RuntimeDep) -> dict[str, object]:
    """Totals since start, and how many Pulsar producers are open."""
    return {**runtime.stats.totals(), "openProducers": runtime.service.open_producers()}


@router.get(
    "/v1/stats/topics/{topic}", dependencies=[Authorized], tags=["stats"], responses=_NOT_FOUND
)
async def topic_stats(topic: str, runtime: RuntimeDep) -> JSONResponse:
    """Counters for one Kafka topic, plus the broker's view of its partitions."""
    counters = runtime.stats.by_topic.get(topic)
    broker: dict[str, object] = {}
    try:
        raw = await runtime.admin.topic_stats(topic)
        partitions = raw.get("partitions", {}) if isinstance(raw, dict) else {}
        broker = {
            "deduplicationEnabled": await runtime.admin.topic_deduplication(topic),
            "msgInCounter": raw.get("msgInCounter"),
            "partitions": {
                name.rsplit("-", 1)[-1]: {
                    "msgInCounter": p.get("msgInCounter"),
                    "publishers": [pub.get("producerName") for pub in p.get("publishers", [])],
                }
                for name, p in sorted(partitions.items())
            },
        }
    except Exception as exc:  # the broker's view is a bonus; say why it is missing
        broker = {"error": str(exc)}
    if counters is None and not broker.get("partitions"):
        return JSONResponse({"error": f"no data for topic {topic!r}"}, status_code=404)
    local = counters.to_dict() if counters is not None else None
    return JSONResponse({"topic": topic, "sidecar": local, "broker": broker})


@router.get(
    "/v1/stats/producers/{producer_id}",
    dependencies=[Authorized],
    tags=["stats"],
    responses=_NOT_FOUND,
)
async def producer_stats(producer_id: int, runtime: RuntimeDep) -> JSONResponse:
    """Counters for one producer id, and its highest epoch on record."""
    counters = runtime.stats.by_producer.get(producer_id)
    epoch = runtime.registry.epochs.highest(producer_id)
    if counters is None and epoch is None:
        return JSONResponse({"error": f"no data for producer {producer_id}"}, status_code=404)
    return JSONResponse(
        {
            "producerId": producer_id,
            "highestEpoch": epoch,
            "sidecar": counters.to_dict() if counters else None,
        }
    )


@router.get(
    "/metrics",
    dependencies=[Authorized],
    tags=["stats"],
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(request: Request, runtime: RuntimeDep) -> PlainTextResponse:
    """Prometheus text exposition."""
    admission: ByteBudget = request.app.state.admission
    gauges = {
        "open_producers": float(runtime.service.open_producers()),
        "channels": float(len(runtime.service.channels)),
        "waiting_batches": float(runtime.service.waiting_batches()),
        "inflight_request_bytes": float(admission.in_use),
        "requests_waiting_for_memory": float(admission.waiting),
    }
    return PlainTextResponse(
        runtime.stats.prometheus(gauges), media_type="text/plain; version=0.0.4"
    )


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"])
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """Readiness: the Pulsar broker answers and deduplication is on."""
    ok, reason = await runtime.ready()
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "reason": reason}, status_code=200 if ok else 503
    )
