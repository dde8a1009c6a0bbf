"""HTTP clients never see the cluster's topology: a request for what another node owns
is forwarded to it, and answered as if this node had served it.

:class:`Forwarding` (ASGI middleware) routes by what a request names:

- ``/v1/groups/{groupId}...`` (every group call, offsets included): the group's
  coordinator;
- ``POST /v1/init-producer-id`` with a ``transactionalId``, ``/v1/end-txn``,
  ``/v1/txn-offset-commit``, ``GET /v1/transactions/{transactionalId}``, ``DELETE
  /v1/transactions/{transactionalId}/owner``: the transactional id's coordinator (init
  without one is served anywhere);

``POST /v1/produce`` is routed by the produce endpoint itself (:func:`route_produce`):
a transactional request to its coordinator as a whole, the other batches each to its
partition's leader, the answers put back in request order.

Before this reads a body (to route by it, or to forward it) the caller's token is
checked: a request refused there is answered 401/403 with its body unread. The bodies of
the transactional posts are read up to ``MAX_TXN_REQUEST_BYTES`` (413 past it) and only
their ``transactionalId`` is decoded, by a decoder that skips the rest (a body that is not
an object, or nests too deep, routes nowhere: the route answers its 422).

A forwarded request carries :data:`~kop_dedup.cluster.peers.FORWARDED` (and, on a node
that authenticates, the proof that a node of the cluster sent it:
:meth:`~kop_dedup.cluster.peers.Peers.vouched`; a client sending the header without
one is refused 403, CLUSTER_AUTHORIZATION_FAILED) and is always served where it lands
(if that node is no longer the owner, the coordinators answer their retriable codes:
NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER). An owner that cannot be reached is answered
503 with COORDINATOR_NOT_AVAILABLE (or per batch 6), both retriable: the next listing
of the members names a live owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote

import msgspec
from starlette.datastructures import State
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kop_dedup import errors
from kop_dedup.cluster.peers import FORWARDED, PeerAnswer, PeerUnavailable
from kop_dedup.cluster.placement import Member
from kop_dedup.cluster.proof import PROOF
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.runtime import Runtime
from kop_dedup.transports.http.answers import too_large
from kop_dedup.transports.http.deps import authenticated_scope, forbidden

__all__ = ["Forwarding", "forwarded", "route_produce"]

log = logging.getLogger(__name__)

_FORWARDED = FORWARDED.encode()
_PROOF = PROOF.encode()
_TXN_POSTS = frozenset({"/v1/init-producer-id", "/v1/end-txn", "/v1/txn-offset-commit"})
_GROUPS = "/v1/groups/"
_TRANSACTIONS = "/v1/transactions/"


def forwarded(scope: Scope, runtime: Runtime) -> bool:
    """Whether another node forwarded this request (it is served here, whatever).
    ClusterAuthorizationFailed when the request names a node without proving it, on a
    node that authenticates (see :meth:`~kop_dedup.cluster.peers.Peers.vouched`), or
    names a node left out of this cluster for authenticating differently (an earlier
    build's node, which would have forwarded its client unauthenticated)."""
    by = proof = None
    authorization = ""
    for name, value in scope["headers"]:
        if name == _FORWARDED:
            by = value.decode("latin-1")
        elif name == _PROOF:
            proof = value.decode("latin-1")
        elif name == b"authorization":
            authorization = value.decode("latin-1")
    if by is None:
        return False
    if runtime.cluster.excluded(by):
        raise errors.ClusterAuthorizationFailed(
            f"node {by} authenticates differently from this node and is not a member of "
            "its cluster: requests it forwards are refused"
        )
    return runtime.peers.vouched(by, scope["method"], authorization, proof)


def _unavailable(owner: Member, exc: Exception) -> JSONResponse:
    error = errors.CoordinatorNotAvailable(
        f"node {owner.node_id} owns this and could not be reached ({exc}); retry"
    )
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=503,
    )


async def _read(receive: Receive, limit: int | None = None) -> bytes | None:
    """The request's body; None once it passes ``limit`` bytes (the rest left unread)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _announced(scope: Scope) -> int | None:
    """The request's Content-Length, when it sends one."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The request's body again (it was read to route the request), then the client's own
    messages: a disconnect is its real one (a long poll watches for it)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _unless_gone(forwarding: Awaitable[PeerAnswer], receive: Receive) -> PeerAnswer | None:
    """The owner's answer; None when the client disconnects first. The forwarded request
    is cancelled then (its connection to the owner closes), so the owner sees its client
    go away as it would a direct one (a long poll whose client is gone puts its records
    back)."""
    task = asyncio.ensure_future(forwarding)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, PeerUnavailable):
        await task
    return None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Named(msgspec.Struct):
    transactionalId: str | None = None  # noqa: N815 (the body's field)


_NAMED = msgspec.json.Decoder(_Named)


def _transactional_id(body: bytes) -> str | None:
    """The body's ``transactionalId``; the rest of the body is skipped, not built."""
    try:
        tid = _NAMED.decode(body).transactionalId
    except (msgspec.DecodeError, RecursionError):
        return None  # the route answers 422
    return tid or None


class Forwarding:
    """ASGI middleware in front of the routes (see the module docstring)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app, self.state = app, state

    async def _body(
        self, scope: Scope, receive: Receive, send: Send, limit: int | None
    ) -> bytes | None:
        """The request's body, read once its caller's token is accepted and only up to
        ``limit`` bytes (MAX_TXN_REQUEST_BYTES); None when the request was answered (401,
        403, 413) instead."""
        who = authenticated_scope(self.state.auth, scope)
        if isinstance(who, JSONResponse):
            await who(scope, receive, send)
            return None
        announced = _announced(scope)
        body = None
        if limit is None or announced is None or announced <= limit:
            body = await _read(receive, limit)
        if body is None and limit is not None:
            await too_large(limit, "MAX_TXN_REQUEST_BYTES")(scope, receive, send)
        return body

    @staticmethod
    def _owner(runtime: Runtime, path: str, method: str, body: bytes | None) -> Member | None:
        """The node that owns what the request names (None: any node serves it)."""
        cluster = runtime.cluster
        if path.startswith(_GROUPS):
            group = unquote(path[len(_GROUPS) :].split("/", 1)[0])
            return cluster.group_coordinator(group) if group else None
        if path.startswith(_TRANSACTIONS) and method in {"GET", "DELETE"}:
            named = unquote(path[len(_TRANSACTIONS) :].split("/", 1)[0])
            return cluster.txn_coordinator(named) if named else None
        if body is not None:
            tid = _transactional_id(body)
            return cluster.txn_coordinator(tid) if tid else None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime: Runtime | None = getattr(self.state, "runtime", None)
        if scope["type"] != "http" or runtime is None:
            await self.app(scope, receive, send)
            return
        try:
            here = forwarded(scope, runtime)
        except errors.ClusterAuthorizationFailed as exc:
            await forbidden(exc)(scope, receive, send)
            return
        if here:
            await self.app(scope, receive, send)
        else:
            await self._route(runtime, scope, receive, send)

    async def _route(self, runtime: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve here what this node owns; forward the rest to its owner."""
        cluster = runtime.cluster
        path, method = scope["path"], scope["method"]
        body: bytes | None = None
        if path in _TXN_POSTS and method == "POST":
            body = await self._body(scope, receive, send, runtime.settings.max_txn_request_bytes)
            if body is None:
                return  # answered
        owner = self._owner(runtime, path, method, body)
        if owner is None or cluster.is_me(owner):
            await self.app(scope, receive if body is None else _replay(body, receive), send)
            return
        if body is None:
            body = await self._body(scope, receive, send, None)  # BodyLimit bounds it
        if body is not None:
            await self._forward(runtime, owner, body, scope, receive, send)

    async def _forward(
        self,
        runtime: Runtime,
        owner: Member,
        body: bytes,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Serve the request by the node that owns what it names (here again, when a
        fresh listing of the members says so)."""
        cluster = runtime.cluster
        path, method = scope["path"], scope["method"]
        query = scope.get("query_string", b"")
        try:
            answer = await _unless_gone(
                runtime.peers.forward(
                    owner, method, path, query=query, headers=scope["headers"], body=body
                ),
                receive,
            )
            if answer is None:
                return  # the client went away: so does the forwarded request
        except PeerUnavailable as exc:
            cluster.stats.forward_failures += 1
            await cluster.relist()  # it stopped or died a moment ago: who owns it now?
            again = self._owner(runtime, path, method, body)
            if again is None or cluster.is_me(again):
                await self.app(scope, _replay(body, receive), send)
                return
            if again.node_id == owner.node_id:
                await _unavailable(owner, exc)(scope, receive, send)
                return
            try:
                answer = await runtime.peers.forward(
                    again, method, path, query=query, headers=scope["headers"], body=body
                )
            except PeerUnavailable as exc_again:
                cluster.stats.forward_failures += 1
                await _unavailable(again, exc_again)(scope, receive, send)
                return
        cluster.stats.forwarded += 1
        await send(
            {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
        )
        await send({"type": "http.response.body", "body": answer.body})


async def _by_leader(
    runtime: Runtime, batches: Sequence[KafkaBatch | Any], indexes: list[int]
) -> tuple[list[int], dict[int, list[int]], dict[int, Member]]:
    """Of ``indexes``: (those led here, leader node id -> those it leads, node id ->
    member)."""
    cluster = runtime.cluster
    remote: dict[int, list[int]] = {}
    owners: dict[int, Member] = {}
    mine: list[int] = []
    for i in indexes:
        b = batches[i]
        leader = None
        if isinstance(b, KafkaBatch):
            try:
                count = await runtime.topic_partitions(b.topic)  # created, as produce does
                leader = cluster.leader(b.topic, b.partition, count)
            except (errors.KafkaError, ValueError):
                leader = None  # the local path answers the topic's (or partition's) problem
        if leader is None or cluster.is_me(leader):
            mine.append(i)
        else:
            remote.setdefault(leader.node_id, []).append(i)
            owners[leader.node_id] = leader
    return mine, remote, owners


Encode = Callable[[list[KafkaBatch], int], bytes]
Answer = dict[str, Any]


async def route_produce(
    runtime: Runtime,
    batches: Sequence[KafkaBatch | Any],
    headers: Sequence[tuple[bytes, bytes]],
    deadline: float,
    encode: Encode,
    local: Callable[[list[int]], Any],
) -> list[Answer | None]:
    """Forward the batches another node leads to it (one request per leader, side by
    side); ``local(indexes)`` produces the others here. Per batch, in order: the answer a
    leader gave (a dict), or None where ``local`` answers. ``batches`` may hold refused
    entries (not KafkaBatch): they stay local. A leader that cannot be reached (it
    stopped or died a moment ago) is looked for again once, in a fresh listing of the
    members; its batches are then answered 6 (retriable) if it is still listed."""
    cluster = runtime.cluster
    out: list[Answer | None] = [None] * len(batches)
    auth = [(k, v) for k, v in headers if k == b"authorization"]
    pending = list(range(len(batches)))

    async def send_to(owner: Member, indexes: list[int], failed: list[int]) -> None:
        remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
        body = encode([batches[i] for i in indexes], remaining_ms)
        try:
            answer = await runtime.peers.forward(
                owner,
                "POST",
                "/v1/produce",
                headers=[(b"content-type", b"application/json"), *auth],
                body=body,
            )
            results = json.loads(answer.body)["results"] if answer.status == 200 else None
        except (PeerUnavailable, ValueError, KeyError):
            results = None
        if results is None or len(results) != len(indexes):
            cluster.stats.forward_failures += 1
            failed.extend(indexes)
            return
        cluster.stats.forwarded += 1
        for i, result in zip(indexes, results, strict=True):
            out[i] = result

    for attempt in (1, 2):
        mine, remote, owners = await _by_leader(runtime, batches, pending)
        failed: list[int] = []
        await asyncio.gather(
            local(mine), *(send_to(owners[n], ix, failed) for n, ix in remote.items())
        )
        if not failed:
            return out
        pending = sorted(failed)
        if attempt == 1:
            await cluster.relist()
    for i in pending:
        error = errors.NotLeaderOrFollower(
            f"the leader of {batches[i].topic}-{batches[i].partition} could not be reached; retry"
        )
        out[i] = {
            "topic": batches[i].topic,
            "partition": batches[i].partition,
            "errorCode": error.errno,
            "error": error.name,
            "messageId": None,
            "errorMessage": error.message,
        }
    return out
