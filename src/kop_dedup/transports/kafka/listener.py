"""The Kafka listener: a TCP (or TLS) server whose connections share one Runtime.

>>> listener = KafkaListener(runtime)         # runtime started; settings from it
>>> await listener.start()                    # binds KAFKA_LISTENER (port 0: a free one)
>>> listener.bound, listener.node.host, listener.node.port
>>> await listener.close()                    # stop accepting, finish what was read, close

``kop-dedup serve`` starts it after the runtime is ready and closes it before the
runtime (the HTTP app's lifespan does both), so that no request reaches a
coordinator that is closing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import ssl
import time
import uuid

from kop_dedup.admission import ByteBudget
from kop_dedup.errors import KafkaError
from kop_dedup.observability.wire import WireStats
from kop_dedup.pulsar.produced import ProducedOffsets
from kop_dedup.runtime import Runtime
from kop_dedup.security.identity import Authenticator
from kop_dedup.security.quotas import RoleCounts
from kop_dedup.settings import split_address
from kop_dedup.transports.kafka import routed
from kop_dedup.transports.kafka.apis import API_TABLE
from kop_dedup.transports.kafka.connection import Connection
from kop_dedup.transports.kafka.registry import CloseConnection, Node, Session, Shared
from kop_dedup.transports.kafka.sasl import ROLE_COUNTED

__all__ = ["KafkaListener", "ListenerError"]

log = logging.getLogger("kop_dedup.kafka")

_UNSPECIFIED = {"", "0.0.0.0", "::"}  # noqa: S104 - names an address, binds nothing


class ListenerError(RuntimeError):
    """The listener cannot start (its address is taken or not this host's)."""


def cluster_id(tenant: str, namespace: str) -> str:
    """The same id on every sidecar serving one data namespace (22 characters, as
    Kafka's)."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"kop-dedup:{tenant}/{namespace}").bytes
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


class KafkaListener:
    def __init__(self, runtime: Runtime, stats: WireStats | None = None) -> None:
        settings = runtime.settings
        address = settings.kafka_address()
        if address is None:
            raise ValueError("the Kafka listener is off (KOP_DEDUP_KAFKA_LISTENER is empty)")
        self.runtime, self.settings, self.address = runtime, settings, address
        self.stats = stats or WireStats()
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._per_address: dict[str, int] = {}
        self.queued = ByteBudget(settings.kafka_queued_max_request_bytes)
        """Request bytes read (or being read) and not yet handled, over every connection
        (``KAFKA_QUEUED_MAX_REQUEST_BYTES``)."""
        self._refusal_logged = 0.0
        self.bound: tuple[str, int] = address
        self.node = Node(0, address[0], address[1], cluster_id(settings.tenant, settings.namespace))
        self._shared: Shared | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop it serves on (set by :meth:`start`; tests inspect it)."""

    def _tls(self) -> ssl.SSLContext | None:
        s = self.settings
        if s.kafka_tls_cert is None or s.kafka_tls_key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(s.kafka_tls_cert), str(s.kafka_tls_key))
        return context

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        host, port = self.address
        try:
            self._server = await asyncio.start_server(
                self._accept,
                host or None,
                port,
                ssl=self._tls(),
                reuse_address=True,
                limit=1 << 16,
            )
        except OSError as exc:
            raise ListenerError(
                f"the Kafka listener cannot listen on {host}:{port} ({exc.strerror or exc}): "
                "set KOP_DEDUP_KAFKA_LISTENER to another host:port, or to nothing to turn "
                "the listener off"
            ) from exc
        sock = self._server.sockets[0].getsockname()
        self.bound = (str(sock[0]), int(sock[1]))
        if self.settings.kafka_advertised:
            adv_host, adv_port = split_address(self.settings.kafka_advertised, "kafka_advertised")
        else:
            adv_host = host if host not in _UNSPECIFIED else socket.getfqdn()
            adv_port = self.bound[1]
        self.node = Node(0, adv_host, adv_port, self.node.cluster_id)
        self._shared = Shared(
            runtime=self.runtime,
            settings=self.settings,
            node=self.node,
            apis=API_TABLE,
            offsets=ProducedOffsets(self.runtime.admin, mode=self.settings.kafka_produce_offsets),
            stats=self.stats,
            auth=Authenticator.from_settings(self.settings),
            role_connections=RoleCounts.connections(self.settings),
        )
        log.info(
            "kafka listener on %s:%d, advertised as %s:%d%s%s",
            *self.bound,
            self.node.host,
            self.node.port,
            " (TLS)" if self._tls() is not None else "",
            " (SASL/PLAIN)" if self._shared.auth.enabled else "",
        )

    def joined(self, node_id: int) -> None:
        """The node joined its cluster as ``node_id``: the id Metadata gives this node."""
        self.node = Node(node_id, self.node.host, self.node.port, self.node.cluster_id)
        if self._shared is not None:
            self._shared.node = self.node

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        shared = self._shared
        if shared is None:  # closing
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        refused = self._over_limit(address)
        if refused is not None:
            self.stats.connection_opened()
            now = time.monotonic()
            if now - self._refusal_logged >= 1.0:  # once a second at most: a flood is one line
                self._refusal_logged = now
                log.info("kafka connection refused: %s", refused, extra={"peer": address})
            writer.close()
            self.stats.connection_closed("limit")
            return
        with contextlib.suppress(OSError):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(
            Session(shared, peer=f"{peer[0]}:{peer[1]}" if peer else "?"),
            reader,
            writer,
            max_request_bytes=self.settings.kafka_max_request_bytes,
            max_unauthenticated_bytes=self.settings.kafka_max_unauthenticated_bytes,
            read_timeout_s=self.settings.kafka_request_read_timeout_ms / 1000,
            failed_auth_delay_s=self.settings.kafka_failed_auth_delay_ms / 1000,
            queued=self.queued,
        )
        self._connections.add(connection)
        self._per_address[address] = self._per_address.get(address, 0) + 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            counted = connection.session.extra.pop(ROLE_COUNTED, None)
            if counted is not None:
                shared.role_connections.release(counted)
            left = self._per_address.pop(address, 1) - 1
            if left > 0:
                self._per_address[address] = left
            if task is not None:
                self._handlers.discard(task)

    def _over_limit(self, address: str) -> str | None:
        """Why a new connection from ``address`` is refused (None: it is not)."""
        s = self.settings
        if len(self._connections) >= s.kafka_max_connections:
            return (
                f"{len(self._connections)} connections open, the limit "
                "(KOP_DEDUP_KAFKA_MAX_CONNECTIONS)"
            )
        if self._per_address.get(address, 0) >= s.kafka_max_connections_per_address:
            return (
                f"{self._per_address[address]} connections open from {address}, the limit "
                "(KOP_DEDUP_KAFKA_MAX_CONNECTIONS_PER_ADDRESS)"
            )
        return None

    async def forwarded(
        self, api_key: int, version: int, client_id: str, body: bytes, by: str
    ) -> bytes | None:
        """A Kafka request another node forwarded (its body at ``version``): handled here
        as if a client of this listener had sent it; the response body (None: no answer,
        acks=0). ValueError for an API or version this listener does not serve, or a
        body that does not parse."""
        shared = self._shared
        api = None if shared is None else shared.apis.get(api_key)
        if shared is None or api is None or not api.serves(version):
            raise ValueError(f"API {api_key} v{version} is not served here")
        try:
            request = api.request.decode(memoryview(body), version=version)
        except Exception as exc:
            raise ValueError(
                f"the forwarded {api.name} v{version} does not parse: {exc!r}"
            ) from exc
        session = Session(
            shared, peer=f"node {by}", client_id=client_id, authenticated=True, forwarded=True
        )
        try:
            answer = await routed.handle(session, api, request, version)
        except CloseConnection as exc:
            answer = exc.answer
        except KafkaError as exc:
            answer = api.error_answer(request, version, exc)
        if answer is None:
            return None
        return bytes(answer.encode(version=version))

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop accepting; answer what was read (bounded by ``grace_s``); close."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self._connections):
            connection.stop()
        pending = [c.drain_tasks() for c in list(self._connections)]
        handlers = set(self._handlers)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*pending, *handlers, return_exceptions=True), grace_s
            )
        for task in handlers:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._shared is not None and self._shared.readers is not None:
            await self._shared.readers.close()  # after the handlers: none opens another
        self._shared = None
        log.info("kafka listener closed")
