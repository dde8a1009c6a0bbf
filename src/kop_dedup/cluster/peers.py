"""Talking to the other nodes: requests forwarded to the node that owns what they name.

Nodes reach each other over their HTTP APIs (``Member.peer_url``). What travels:

- a client's HTTP request, forwarded as it came (method, path, query, body, its
  ``Authorization``) with the header :data:`FORWARDED` naming the forwarding node: the
  owner serves it locally, never forwards it again, and its answer goes back to the
  client unchanged (:meth:`Peers.forward`);
- a Kafka request (or the part of one that another node owns), encoded at the client's
  version, to ``POST /internal/v1/kafka``: the owner runs it through its own Kafka
  handlers and answers the encoded response (:meth:`Peers.kafka`);
- a few calls one coordinator makes of another (the transaction coordinator staging or
  committing offsets in a group another node coordinates): JSON to ``/internal/v1/...``
  (:meth:`Peers.call`).

A node that cannot be reached (it died a moment ago: the next listing drops it) is a
:class:`PeerUnavailable`, which the transports answer with a retriable code.

Every request a node sends another carries :data:`FORWARDED` and, when the cluster has a
shared secret, its proof (:mod:`kop_dedup.cluster.proof`); a node that authenticates
serves a request as forwarded only with a good proof (:meth:`Peers.vouched`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from kop_dedup import errors
from kop_dedup.cluster.placement import Member
from kop_dedup.cluster.proof import PROOF, prove, proved

__all__ = ["FORWARDED", "INTERNAL", "PeerAnswer", "PeerUnavailable", "Peers"]

log = logging.getLogger(__name__)

FORWARDED = "x-kop-forwarded-by"
"""The header a forwarded request carries: the node id that forwarded it."""
INTERNAL = "/internal/v1"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "proxy-authorization",
        "proxy-connection",
    }
)


_NOT_SENT = _HOP_BY_HOP | {FORWARDED, PROOF}
"""Headers of a client's request not sent on (the forwarding ones: this node's own)."""


class PeerUnavailable(ConnectionError):
    """The owner could not be reached (or did not answer in time). Its text names the
    node and the kind of failure only, and may be put in a client's answer: the peer's
    URL and the underlying error are logged where it is raised, never answered."""


def _unavailable(owner: Member, what: str, detail: str) -> PeerUnavailable:
    """A :class:`PeerUnavailable` saying ``node N <what>``; ``detail`` (the URL, the
    error) logged for the operator."""
    log.warning("node %d %s: %s", owner.node_id, what, detail, extra={"peer_url": owner.peer_url})
    return PeerUnavailable(f"node {owner.node_id} {what}")


def _failed(owner: Member, exc: httpx.HTTPError) -> PeerUnavailable:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "could not be reached"
    return _unavailable(owner, f"{kind} ({type(exc).__name__})", f"{owner.peer_url}: {exc!r}")


class PeerAnswer:
    """What the owner answered: status, headers (hop-by-hop ones dropped), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class Peers:
    def __init__(
        self,
        *,
        me: int,
        token: str | None,
        timeout_s: float,
        secret: bytes | None = None,
        authenticating: bool = False,
        verify: bool | str = True,
    ) -> None:
        """``token``: what this node calls the others' internal API with; ``secret``:
        the cluster's shared secret, keying the proofs of forwarded requests (None:
        there is none); ``authenticating``: whether this node authenticates callers;
        ``verify``: httpx's, for ``https://`` peers (a CA file, or True: the system's)."""
        self._me = me
        self._token = token
        self._secret, self._authenticating = secret, authenticating
        self._http = httpx.AsyncClient(
            verify=verify,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    def identify(self, node_id: int) -> None:
        """This node's id (known once it joined), sent in :data:`FORWARDED`."""
        self._me = node_id

    async def close(self) -> None:
        await self._http.aclose()

    def vouched(self, by: str, method: str, authorization: str, proof: str | None) -> bool:
        """Whether a request naming node ``by`` in :data:`FORWARDED` is served as
        forwarded (here, never routed again). A node without authentication takes the
        header's word (a caller may do anything there anyway); one without a shared
        secret ignores it (the request is routed as a client's); otherwise the proof
        must hold, or the request is refused (ClusterAuthorizationFailed)."""
        if not self._authenticating:
            return True
        if self._secret is None:
            return False
        if proof is not None and proved(
            self._secret, by, method, authorization, proof, time.time()
        ):
            return True
        raise errors.ClusterAuthorizationFailed(
            f"{FORWARDED} is for the nodes of this cluster, and this request does not "
            f"prove it comes from one ({PROOF} missing, stale or wrong); send it without "
            f"{FORWARDED}"
        )

    def _forwarding(self, method: str, authorization: str) -> dict[str, str]:
        """:data:`FORWARDED` and, with a shared secret, its proof."""
        headers = {FORWARDED: str(self._me)}
        if self._secret is not None:
            at = int(time.time())
            headers[PROOF] = prove(self._secret, str(self._me), method, authorization, at)
        return headers

    async def forward(
        self,
        owner: Member,
        method: str,
        path: str,
        *,
        query: bytes = b"",
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> PeerAnswer:
        """A client's HTTP request, sent on to ``owner`` as it came."""
        sent = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in headers
            if k.decode("latin-1").lower() not in _NOT_SENT
        }
        authorization = next((v for k, v in sent.items() if k.lower() == "authorization"), "")
        sent.update(self._forwarding(method, authorization))
        url = owner.peer_url + path + (f"?{query.decode('latin-1')}" if query else "")
        try:
            resp = await self._http.request(method, url, headers=sent, content=body)
        except httpx.HTTPError as exc:
            raise _failed(owner, exc) from exc
        kept = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.multi_items()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-encoding"
        ]
        return PeerAnswer(resp.status_code, kept, resp.content)

    async def kafka(
        self, owner: Member, api_key: int, version: int, client_id: str, body: bytes
    ) -> bytes:
        """A Kafka request body (encoded at ``version``) handled by ``owner``; its
        response body. PeerUnavailable when the owner cannot answer it."""
        headers = {
            "content-type": "application/octet-stream",
            "x-kafka-api-key": str(api_key),
            "x-kafka-api-version": str(version),
            "x-kafka-client-id": client_id,
            **self._auth(),
        }
        headers.update(self._forwarding("POST", headers.get("authorization", "")))
        try:
            resp = await self._http.post(
                f"{owner.peer_url}{INTERNAL}/kafka", headers=headers, content=body
            )
        except httpx.HTTPError as exc:
            raise _failed(owner, exc) from exc
        if resp.status_code != 200:
            raise _unavailable(
                owner,
                f"answered HTTP {resp.status_code} to a forwarded Kafka request",
                f"{owner.peer_url}: {resp.text[:200]!r}",
            )
        return resp.content

    async def call(self, owner: Member, name: str, payload: Mapping[str, Any]) -> Any:
        """An internal call ``name`` (``POST /internal/v1/<name>``) on ``owner``: its JSON
        answer. A Kafka error the owner raised comes back as ``{"errorCode": ...}`` for
        the caller to raise again."""
        try:
            resp = await self._http.post(
                f"{owner.peer_url}{INTERNAL}/{name}",
                json=dict(payload),
                headers={
                    **self._auth(),
                    **self._forwarding("POST", self._auth().get("authorization", "")),
                },
            )
        except httpx.HTTPError as exc:
            raise _failed(owner, exc) from exc
        if resp.status_code != 200:
            raise _unavailable(
                owner,
                f"answered HTTP {resp.status_code} to {name}",
                f"{owner.peer_url}: {resp.text[:200]!r}",
            )
        return resp.json()

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._token}"} if self._token else {}
