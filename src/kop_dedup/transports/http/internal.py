"""``/internal/v1``: what nodes of one cluster call on each other (never clients).

- ``POST /internal/v1/kafka``: a Kafka request (or the part of one) this node owns,
  forwarded by the node a client sent it to (sidecar mode, transactional batches sent to
  a partition's leader): handled by this node's Kafka listener as if its own client had
  sent it (:meth:`kop_dedup.transports.kafka.listener.KafkaListener.forwarded`); the
  encoded response body comes back (204 when the request gets no answer: acks=0).
- ``POST /internal/v1/groups/offsets``: a transaction coordinator staging, committing or
  aborting a transaction's offsets in a group this node coordinates
  (:mod:`kop_dedup.cluster.offsets`).

Authenticated like the public API, as a superuser only (the nodes call each other with
the first ``auth_tokens`` token, or a superuser role's); a forwarded Kafka request was
authorized by the node its client sent it to, before it was forwarded.
Left out of the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from kop_dedup.cluster import offsets
from kop_dedup.cluster.peers import FORWARDED
from kop_dedup.transports.http.deps import RuntimeDep, Superuser

__all__ = ["router"]

router = APIRouter(include_in_schema=False, dependencies=[Superuser])


@router.post("/internal/v1/kafka")
async def kafka(request: Request, _runtime: RuntimeDep) -> Response:
    listener = getattr(request.app.state, "kafka", None)
    if listener is None:
        return Response("this node runs no Kafka listener", status_code=503)
    try:
        api_key = int(request.headers["x-kafka-api-key"])
        version = int(request.headers["x-kafka-api-version"])
    except (KeyError, ValueError):
        return Response("x-kafka-api-key and x-kafka-api-version are required", status_code=400)
    try:
        answer = await listener.forwarded(
            api_key,
            version,
            request.headers.get("x-kafka-client-id", ""),
            await request.body(),
            request.headers.get(FORWARDED, "?"),
        )
    except ValueError as exc:
        return Response(str(exc), status_code=400)
    if answer is None:
        return Response(status_code=204)
    return Response(answer, media_type="application/octet-stream")


@router.post(f"/internal/v1/{offsets.CALL}")
async def group_offsets(request: Request, runtime: RuntimeDep) -> dict[str, Any]:
    return await offsets.serve(runtime.offsets, await request.json())
