"""``POST /v1/produce``: the hot path, a plain ASGI endpoint.

Per request it does only what the answer needs: check the bearer token, read
the body, take the body's size from the in-flight byte budget, decode the body
in one pass straight into :class:`~kop_dedup.protocol.records.KafkaBatch`
objects (msgspec: JSON, the schema's types and bounds, and base64, in C), hand
each batch to the service, and write the answer, encoded once. FastAPI's
dependency resolution, pydantic's validation and a response model built and
then serialized are not on this path.

The pydantic models in models.py stay the documented schema (the operation in
the OpenAPI document is written here, :func:`openapi_paths`, against them) and
decode the rare body the fast decoder refuses. The fast decoder accepts no body
they refuse, so that second look gives the answer the API promises: a 422
naming every problem by its field path, or, for a body whose only problem is
bad base64, an INVALID_RECORD (87) for each batch concerned while the other
batches are produced.

>>> app.router.routes.insert(0, Route(PATH, ProduceEndpoint(app.state), methods=["POST"]))
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct
from pydantic import ValidationError
from starlette.datastructures import State
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from kop_dedup import errors
from kop_dedup.admission import ByteBudget
from kop_dedup.cluster.peers import PeerUnavailable
from kop_dedup.cluster.placement import Member
from kop_dedup.produce.service import BatchResult
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.runtime import Runtime
from kop_dedup.security.authorizer import PRODUCE
from kop_dedup.security.identity import Identity
from kop_dedup.transports.http.answers import (
    AUTH_RESPONSES,
    INVALID_RESPONSE,
    TOO_LARGE_RESPONSE,
    batch_answer,
    invalid_request,
    over_setting,
)
from kop_dedup.transports.http.deps import STARTING, authenticated_scope, refused_with
from kop_dedup.transports.http.models import ProduceIn, ProduceOut, to_batch
from kop_dedup.transports.http.routing import forwarded, route_produce

__all__ = [
    "PATH",
    "ProduceEndpoint",
    "ProduceRequest",
    "Transactional",
    "decode",
    "openapi_paths",
]

PATH = "/v1/produce"
MAX_REQUEST_TIMEOUT_MS = (1 << 63) - 1
"""The decoder's bound; the route refuses more than ``MAX_TIMEOUT_MS`` (422)."""


class ProduceRequest(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """The body, as the fast decoder reads it (the same shape as models.ProduceIn)."""

    batches: Annotated[list[KafkaBatch], Meta(min_length=1)]
    timeoutMs: Annotated[int, Meta(ge=1, le=MAX_REQUEST_TIMEOUT_MS)] | None = None  # noqa: N815
    transactionalId: Annotated[str, Meta(min_length=1, max_length=32_767)] | None = None  # noqa: N815
    transactionToken: Annotated[str, Meta(min_length=1, max_length=256)] | None = None  # noqa: N815


_decode_fast = msgspec.json.Decoder(ProduceRequest).decode
_encode = msgspec.json.Encoder().encode


class InvalidBody(Exception):
    """The body is not the documented shape; ``problems`` as pydantic reports them."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(problems)} problem(s)")
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Refused:
    """A batch answered without reaching the service (bad base64: INVALID_RECORD)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    records: int
    error: errors.KafkaError


@dataclass(frozen=True, slots=True)
class Transactional:
    """The transaction a produce body's batches belong to."""

    transactional_id: str
    token: str | None = None


def _transactional(tid: str | None, token: str | None) -> Transactional | None:
    if tid is None:
        if token is not None:
            raise InvalidBody(
                [
                    {
                        "loc": ("body", "transactionToken"),
                        "msg": "transactionToken needs a transactionalId",
                        "type": "value_error",
                        "input": token,
                    }
                ]
            )
        return None
    return Transactional(tid, token)


def decode(raw: bytes) -> tuple[list[KafkaBatch | Refused], int | None, Transactional | None]:
    """(batches, timeoutMs, the transaction) of a produce body; raises :class:`InvalidBody`.

    One C-level pass for a well-formed body; the pydantic models only when that
    pass refuses the body, for the 422's field paths or the per-batch 87s.
    """
    try:
        body = _decode_fast(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    else:
        txn = _transactional(body.transactionalId, body.transactionToken)
        return list(body.batches), body.timeoutMs, txn
    try:
        checked = ProduceIn.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidBody(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from exc
    batches: list[KafkaBatch | Refused] = []
    for b in checked.batches:
        try:
            batches.append(to_batch(b))
        except errors.KafkaError as exc:
            batches.append(
                Refused(b.topic, b.partition, b.producerId, b.producerEpoch, len(b.records), exc)
            )
    return (
        batches,
        checked.timeoutMs,
        _transactional(checked.transactionalId, checked.transactionToken),
    )


class ProduceEndpoint:
    """The ASGI app behind ``POST /v1/produce``; ``state`` is the FastAPI app's state
    (``auth``, ``admission``, and ``runtime`` once the lifespan has started it)."""

    def __init__(self, state: State) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        who = authenticated_scope(state.auth, scope)
        if isinstance(who, JSONResponse):
            await who(scope, receive, send)
            return
        runtime: Runtime | None = getattr(state, "runtime", None)
        if runtime is None:
            await JSONResponse({"detail": STARTING}, 503)(scope, receive, send)
            return
        try:
            from_peer = forwarded(scope, runtime)  # before the body is read
        except errors.ClusterAuthorizationFailed as exc:
            await refused_with(exc)(scope, receive, send)
            return
        raw = await _read_body(receive)
        if raw is None:  # the client went away
            return
        # the raw body costs its size, its decoded records many times that: wait for
        # room after the read (a slow or refused client holds none), hold until answered
        budget: ByteBudget = state.admission
        held = len(raw)
        await budget.acquire(held)
        try:
            await _serve(runtime, who, raw, from_peer, scope, receive, send)
        finally:
            budget.release(held)


async def _serve(
    runtime: Runtime,
    who: Identity,
    raw: bytes,
    from_peer: bool,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Decode, check, authorize, produce (here, or by the node that owns each batch),
    answer. ``from_peer``: a node of the cluster forwarded it (produced here)."""
    try:
        batches, timeout_ms, transactional = decode(raw)
    except InvalidBody as exc:
        await invalid_request(exc.problems)(scope, receive, send)
        return
    s = runtime.settings
    if timeout_ms is not None and (
        late := over_setting("timeoutMs", timeout_ms, s.max_timeout_ms, "MAX_TIMEOUT_MS")
    ):
        await late(scope, receive, send)
        return
    if len(batches) > s.max_batches_per_request:
        await _too_many(len(batches), s.max_batches_per_request)(scope, receive, send)
        return
    if not who.superuser:  # a whole request the role may not make: 403, nothing produced
        try:
            if transactional is not None:  # first, as Kafka's produce checks
                await runtime.authorizer.require_txn(who, transactional.transactional_id)
            await runtime.authorizer.require(who, PRODUCE, (b.topic for b in batches))
            await runtime.authorizer.require_producers(who, (b.producer_id for b in batches))
        except errors.KafkaError as exc:
            await refused_with(exc)(scope, receive, send)
            return
    here = from_peer or len(runtime.cluster.members) <= 1
    if transactional is not None and not here:
        owner = runtime.cluster.txn_coordinator(transactional.transactional_id)
        if owner is not None and not runtime.cluster.is_me(owner):
            await _to_coordinator(runtime, owner, scope, raw, receive, send)
            return
    del raw
    if here or transactional is not None:
        results = await _produce(runtime, batches, timeout_ms, transactional)
        answers = [batch_answer(r) for r in results]
    else:
        answers = await _routed(runtime, batches, timeout_ms, scope)
    body = _encode({"results": answers})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _to_coordinator(
    runtime: Runtime, owner: Member, scope: Scope, raw: bytes, receive: Receive, send: Send
) -> None:
    """A transactional request, as a whole, to its transactional id's coordinator (which
    journals every batch of it, whichever node leads their partitions)."""
    cluster = runtime.cluster
    try:
        answer = await runtime.peers.forward(
            owner, "POST", PATH, headers=scope["headers"], body=raw
        )
    except PeerUnavailable as exc:
        cluster.stats.forward_failures += 1
        error = errors.CoordinatorNotAvailable(
            f"node {owner.node_id} coordinates this transactional id and could not be "
            f"reached ({exc}); retry"
        )
        response = JSONResponse(
            {"errorCode": error.errno, "error": error.name, "errorMessage": error.message}, 503
        )
        await response(scope, receive, send)
        return
    cluster.stats.forwarded += 1
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})


async def _routed(
    runtime: Runtime, batches: list[KafkaBatch | Refused], timeout_ms: int | None, scope: Scope
) -> list[dict[str, Any]]:
    """Each batch produced by its partition's leader: here, or forwarded."""
    deadline = time.monotonic() + (timeout_ms or runtime.settings.default_timeout_ms) / 1000
    answers: list[dict[str, Any] | None] = [None] * len(batches)

    async def local(indexes: list[int]) -> None:
        if not indexes:
            return
        results = await _produce(runtime, [batches[i] for i in indexes], timeout_ms)
        for i, r in zip(indexes, results, strict=True):
            answers[i] = batch_answer(r)

    def encode(part: list[KafkaBatch], remaining_ms: int) -> bytes:
        return _encode(ProduceRequest(batches=part, timeoutMs=remaining_ms))

    routed = await route_produce(runtime, batches, scope["headers"], deadline, encode, local)
    out = []
    for here, there in zip(answers, routed, strict=True):
        answer = here if here is not None else there
        if answer is None:
            raise RuntimeError("a batch was neither produced here nor forwarded")
        out.append(answer)
    return out


def _too_many(count: int, limit: int) -> JSONResponse:
    """413 answered once for the whole request (not one 42 per batch)."""
    error = errors.InvalidRequest(
        f"{count} batches in one request; the limit is {limit} "
        "(KOP_DEDUP_MAX_BATCHES_PER_REQUEST): split the request"
    )
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=413,
    )


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _produce(
    runtime: Runtime,
    batches: list[KafkaBatch | Refused],
    timeout_ms: int | None,
    transactional: Transactional | None = None,
) -> list[BatchResult]:
    """One result per batch, in request order; the batches of one request concurrently
    (a later batch may be the one an earlier batch's sequence waits for)."""
    s = runtime.settings
    deadline = time.monotonic() + (timeout_ms or s.default_timeout_ms) / 1000
    service = runtime.service
    if transactional is not None:
        return await _produce_transactional(runtime, batches, deadline, transactional)
    if len(batches) == 1 and isinstance(batches[0], KafkaBatch):
        return [await service.produce(batches[0], deadline)]  # no task to gather

    async def one(b: KafkaBatch | Refused) -> BatchResult:
        if isinstance(b, Refused):
            runtime.stats.record(b.topic, b.producer_id, b.producer_epoch, b.error, b.records, 0.0)
            return BatchResult(b.topic, b.partition, b.error)
        return await service.produce(b, deadline)

    return list(await asyncio.gather(*(one(b) for b in batches)))


async def _produce_transactional(
    runtime: Runtime,
    batches: list[KafkaBatch | Refused],
    deadline: float,
    transactional: Transactional,
) -> list[BatchResult]:
    """Every batch through the transaction coordinator (journaled until the commit)."""
    good = [b for b in batches if isinstance(b, KafkaBatch)]
    answers = iter(
        await runtime.transactions.produce(
            transactional.transactional_id, good, deadline, transactional.token
        )
    )
    results = []
    for b in batches:
        if isinstance(b, Refused):
            runtime.stats.record(b.topic, b.producer_id, b.producer_epoch, b.error, b.records, 0.0)
            results.append(BatchResult(b.topic, b.partition, b.error))
            continue
        answer = next(answers)
        if not answer.counted:
            runtime.stats.record(
                b.topic, b.producer_id, b.producer_epoch, answer.error, len(b.records), 0.0
            )
        results.append(BatchResult(b.topic, b.partition, answer.error, answer.message_id))
    return results


def _code(cls: type[errors.KafkaError]) -> str:
    return f"{cls.errno} {cls.name}"


_RETRIABLE = [
    c
    for c in (
        errors.UnknownTopicOrPartition,
        errors.NotLeaderOrFollower,
        errors.RequestTimedOut,
        errors.KafkaStorageError,
    )
    if c.retriable
]
DESCRIPTION = (
    "Publish Kafka record batches; one result per batch, in request order.\n\n"
    f"Each result carries Kafka's error code: {errors.NONE_ERRNO} {errors.NONE_NAME}, "
    f"{_code(errors.DuplicateSequenceNumber)} (already stored: treat as delivered), "
    f"{_code(errors.OutOfOrderSequenceNumber)}, {_code(errors.InvalidProducerEpoch)}, "
    f"{_code(errors.InvalidRecord)}, {_code(errors.MessageTooLarge)}, "
    f"{_code(errors.InvalidTopic)}; retriable (send the same batch again): "
    + ", ".join(_code(c) for c in _RETRIABLE)
    + ". messageId is the Pulsar position of the batch's first record, when known."
)


def openapi_paths() -> dict[str, Any]:
    """The operation as FastAPI would document it (the models are in body_schemas)."""

    def ref(model: type[Any]) -> dict[str, Any]:
        return {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}

    responses: dict[str, Any] = {
        "200": {
            "description": "Successful Response",
            "content": {"application/json": ref(ProduceOut)},
        },
        **{str(code): doc for code, doc in AUTH_RESPONSES.items()},
        **{str(code): doc for code, doc in TOO_LARGE_RESPONSE.items()},
        **{str(code): doc for code, doc in INVALID_RESPONSE.items()},
    }
    operation = {
        "tags": ["produce"],
        "summary": "Produce",
        "description": DESCRIPTION,
        "operationId": "produce_v1_produce_post",
        "requestBody": {"required": True, "content": {"application/json": ref(ProduceIn)}},
        "responses": dict(sorted(responses.items())),
    }
    return {PATH: {"post": operation}}
