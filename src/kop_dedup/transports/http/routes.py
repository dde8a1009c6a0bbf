"""Routes: HTTP <-> domain only. Codes come from the error classes, never by hand.

``POST /v1/produce`` is not here: it is the hot path, a plain ASGI endpoint
(produce.py) mounted next to this router.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from kop_dedup import errors
from kop_dedup.admission import ByteBudget
from kop_dedup.coordination.transactions.checkback import check_back_refusal
from kop_dedup.coordination.transactions.requests import InitProducerId
from kop_dedup.observability.groups import group_gauges
from kop_dedup.observability.metrics import CONTENT_TYPE, render
from kop_dedup.observability.stats import INVALID_TOPIC, OTHER_TOPICS
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.http.admitted import InFlight
from kop_dedup.transports.http.answers import (
    AUTH_RESPONSES,
    INVALID_RESPONSE,
    JSON_OBJECT,
    TOO_LARGE_RESPONSE,
)
from kop_dedup.transports.http.bodies import (
    body_spec,
    parsed_body,
    register_answers,
    register_bodies,
)
from kop_dedup.transports.http.deps import AccessDep, Authorized, RuntimeDep, Superuser
from kop_dedup.transports.http.models import (
    EndTxnIn,
    InitProducerIdIn,
    InitProducerIdOut,
    OffsetCommitIn,
    ProduceIn,
    ProduceOut,
    TxnOffsetCommitIn,
)

__all__ = ["router"]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "nothing known about it", **JSON_OBJECT}
}
router = APIRouter(responses=AUTH_RESPONSES)


register_bodies(ProduceIn, InitProducerIdIn, TxnOffsetCommitIn, EndTxnIn, OffsetCommitIn)
register_answers(ProduceOut)


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


_CHECK_BACK_REFUSED: dict[int | str, dict[str, Any]] = {
    400: {"description": "a checkBackUrl KOP_DEDUP_CHECK_BACK_URLS does not allow", **JSON_OBJECT}
}


@router.post(
    "/v1/init-producer-id",
    dependencies=[Authorized],
    tags=["produce"],
    openapi_extra=body_spec(InitProducerIdIn),
    response_model=InitProducerIdOut,
    responses={**TOO_LARGE_RESPONSE, **INVALID_RESPONSE, **_CHECK_BACK_REFUSED},
)
async def init_producer_id(
    body: Annotated[InitProducerIdIn, Depends(parsed_body(InitProducerIdIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> InitProducerIdOut | JSONResponse:
    """A new producer id at epoch 0, or for a transactional id the same id at epoch + 1.

    With a transactional id whose transaction is open, that transaction is aborted and
    its producer fenced first: 51 CONCURRENT_TRANSACTIONS until the abort is complete
    (retry). ``transactionTimeoutMs`` outside 1..max: 50 INVALID_TRANSACTION_TIMEOUT.
    ``checkBackUrl``: asked whether to commit when a transaction of this id times out.
    A transactional id another role used first: 403, 53. A ``checkBackUrl`` outside
    ``KOP_DEDUP_CHECK_BACK_URLS`` (or any, when it is empty): 400, 42.
    """
    await access.require_txn(body.transactionalId)
    if body.checkBackUrl is not None:
        refused = check_back_refusal(body.checkBackUrl, runtime.settings.check_back_prefixes())
        if refused is not None:
            error = errors.InvalidRequest(refused)
            return JSONResponse(
                {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
                status_code=400,
            )
    try:
        if body.transactionalId is None:
            if body.transactionTimeoutMs is not None:
                runtime.transactions.check_timeout(body.transactionTimeoutMs)
            pid, epoch = await runtime.registry.allocator.allocate(), 0
        else:
            ids = await runtime.transactions.init_producer_id(
                InitProducerId(body.transactionalId, body.transactionTimeoutMs, body.checkBackUrl)
            )
            pid, epoch = ids.producer_id, ids.producer_epoch
        await access.claim_producer(pid)  # its batches are its role's alone
    except errors.KafkaError as exc:
        return _init_answer(exc)
    except Exception as exc:  # Pulsar trouble: the one translation says which code
        return _init_answer(translate(exc, "the producer-id registry in Pulsar"))
    return _init_answer(None, pid, epoch)


@router.get("/v1/stats", dependencies=[Superuser], tags=["stats"])
async def stats(runtime: RuntimeDep) -> dict[str, object]:
    """Totals since start, and how many Pulsar producers are open.

    ``batches``/``records`` by outcome; ``dedupStateLost`` (resends the broker
    stored again) and ``lastDedupStateLost`` (producer, epoch, topic, sequences);
    ``topics``/``maxTopics`` (names counted by name) and ``producers``/
    ``maxProducers``/``producersEvicted`` (per-producer counters kept);
    ``heldProducers`` (open, opening or closing), its ``peakHeldProducers`` since start
    and ``maxOpenProducers``, the bound neither passes.
    """
    channels = runtime.service.channels
    return {
        **runtime.stats.totals(),
        "openProducers": runtime.service.open_producers(),
        "heldProducers": channels.held(),
        "peakHeldProducers": channels.peak_held,
        "maxOpenProducers": runtime.settings.max_open_producers,
        "transactions": runtime.transactions.stats.to_dict(),
    }


@router.get(
    "/v1/stats/topics/{topic}", dependencies=[Superuser], tags=["stats"], responses=_NOT_FOUND
)
async def topic_stats(topic: str, runtime: RuntimeDep) -> JSONResponse:
    """Counters for one Kafka topic, plus the broker's view of its partitions.

    ``broker.deduplicationEnabled`` is the setting the broker applies, and
    ``broker.deduplicationSource`` where it comes from: ``topic`` (a topic-level
    policy), else ``namespace``, else ``broker`` (``brokerDeduplicationEnabled``).
    ``~invalid`` and ``~other`` answer the counters of the batches to invalid topic
    names and to names beyond ``KOP_DEDUP_STATS_MAX_TOPICS``.
    """
    stats = runtime.stats
    if topic in {INVALID_TOPIC, OTHER_TOPICS}:
        bucket = stats.by_topic.get(topic)
        if bucket is None:
            return JSONResponse({"error": f"no data for {topic!r}"}, status_code=404)
        return JSONResponse({"topic": topic, "sidecar": bucket.to_dict(), "broker": None})
    label = stats.topic_label(topic)
    if label == INVALID_TOPIC:  # nothing to ask the broker: the name maps to no topic
        return JSONResponse(
            {"error": f"no data for {topic!r}: not a valid Kafka topic name"}, status_code=404
        )
    counters = stats.by_topic.get(topic)
    local = counters.to_dict() if counters is not None else None
    broker: dict[str, object] = {}
    try:
        raw = await runtime.admin.topic_stats(topic)
        partitions = raw.get("partitions", {}) if isinstance(raw, dict) else {}
        enabled, source = await runtime.admin.effective_deduplication(topic)
        broker = {
            "deduplicationEnabled": enabled,
            "deduplicationSource": source,
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
    body: dict[str, object] = {"topic": topic, "sidecar": local, "broker": broker}
    if label == OTHER_TOPICS:  # its batches are counted, but not under its name
        body["countedUnder"] = OTHER_TOPICS
    return JSONResponse(body)


@router.get(
    "/v1/stats/producers/{producer_id}",
    dependencies=[Superuser],
    tags=["stats"],
    responses=_NOT_FOUND,
)
async def producer_stats(producer_id: int, runtime: RuntimeDep) -> JSONResponse:
    """Counters for one producer id, and its highest epoch.

    ``highestEpoch`` is the higher of the epoch registry's record (``registry``:
    epochs raised through any sidecar) and the highest epoch of this id's batches
    stored or answered duplicate here (``batches``); ``highestEpochSource`` says
    which (``registry`` on a tie). Counters are kept for the most recently used
    ids only (``KOP_DEDUP_STATS_MAX_PRODUCERS``).
    """
    counters = runtime.stats.by_producer.get(producer_id)
    recorded = runtime.registry.epochs.highest(producer_id)
    seen = counters.highest_epoch if counters is not None else None
    if counters is None and recorded is None:
        return JSONResponse({"error": f"no data for producer {producer_id}"}, status_code=404)
    epoch, source = (recorded, "registry") if recorded is not None else (None, None)
    if seen is not None and (recorded is None or seen > recorded):
        epoch, source = seen, "batches"
    return JSONResponse(
        {
            "producerId": producer_id,
            "highestEpoch": epoch,
            "highestEpochSource": source,
            "sidecar": counters.to_dict() if counters is not None else None,
        }
    )


@router.get(
    "/metrics",
    dependencies=[Superuser],
    tags=["stats"],
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(request: Request, runtime: RuntimeDep) -> PlainTextResponse:
    """Prometheus text exposition."""
    admission: ByteBudget = request.app.state.admission
    gauges = {
        "open_producers": float(runtime.service.open_producers()),
        "channels": float(len(runtime.service.channels)),
        "held_producers": float(runtime.service.channels.held()),
        "waiting_batches": float(runtime.service.waiting_batches()),
        "inflight_request_bytes": float(admission.in_use),
        "requests_waiting_for_memory": float(admission.waiting),
    }
    gauges["open_transactions_owned"] = float(runtime.transactions.owned_open())
    gauges["txn_copy_unresolved"] = float(runtime.transactions.applier.unresolved())
    gauges["group_pulls_in_flight"] = float(runtime.groups.pulls_in_flight)
    gauges["kafka_connections"] = float(runtime.kafka_stats.open_connections)
    gauges["cluster_nodes"] = float(len(runtime.cluster.members))
    reading: InFlight = request.app.state.reading
    gauges["http_request_bytes_in_flight"] = float(reading.in_use)
    kafka = getattr(request.app.state, "kafka", None)
    if kafka is not None:
        gauges["kafka_queued_request_bytes"] = float(kafka.queued.in_use)
        gauges["kafka_requests_waiting_for_room"] = float(kafka.queued.waiting)
    lag = group_gauges(runtime.group_lag.rows, runtime.settings.group_metrics_max_series)
    return PlainTextResponse(
        render(
            runtime.stats,
            gauges,
            [
                *runtime.transactions.stats.counters(),
                *runtime.kafka_stats.counters(),
                *runtime.cluster.stats.counters(runtime.cluster.moves()),
                (
                    "http_requests_refused_busy_total",
                    "HTTP requests answered 429: no room for their body beside those in flight.",
                    [({}, float(reading.refused))],
                ),
            ],
            lag,
        ),
        media_type=CONTENT_TYPE,
    )


@router.get("/v1/cluster", dependencies=[Superuser], tags=["stats"], responses=_NOT_FOUND)
async def cluster(
    runtime: RuntimeDep,
    topic: str | None = None,
    transactionalId: str | None = None,  # noqa: N803 (the API's spelling)
    groupId: str | None = None,  # noqa: N803
) -> JSONResponse:
    """The cluster as this node sees it: the live nodes, who owns each state partition,
    what this node owns, its counters; with ``topic``, each partition's leader (404 with
    Kafka's code for a topic that does not exist or a name Kafka refuses); with
    ``transactionalId`` or ``groupId``, its coordinator's node id (Kafka's
    FindCoordinator; null before this node has joined its cluster)."""
    described = runtime.cluster.describe_cluster()
    coordinators: dict[str, int | None] = {}
    if transactionalId is not None:
        member = runtime.cluster.txn_coordinator(transactionalId)
        coordinators["transactionalId"] = None if member is None else member.node_id
    if groupId is not None:
        member = runtime.cluster.group_coordinator(groupId)
        coordinators["groupId"] = None if member is None else member.node_id
    if coordinators:
        described["coordinators"] = coordinators
    if topic is not None:
        try:
            validate_topic(topic)
            count = await runtime.admin.partitions(topic, create_with=None)
        except errors.KafkaError as exc:
            return JSONResponse(
                {"errorCode": exc.errno, "error": exc.name, "errorMessage": exc.message}, 404
            )
        described["leaders"] = {
            str(p): m.node_id for p, m in runtime.cluster.leaders(topic, count).items()
        }
    return JSONResponse(described)


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
