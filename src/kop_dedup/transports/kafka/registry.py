"""What a handler module declares, and what a handler gets: :class:`Api`, :class:`Session`.

A handler module declares ``APIS``: a tuple of :class:`Api`, one per Kafka API it
serves. :mod:`kop_dedup.transports.kafka.apis` gathers them into the table the
connection dispatches on and ApiVersions advertises. A handler is
``async def handle(session, request, version) -> response | None``: ``request`` is
the kafka-python message decoded from the frame, the answer a kafka-python
response message built at ``version`` (None: no answer, Produce with acks=0). It
raises :class:`CloseConnection` where Kafka closes the connection instead of
answering, and a :class:`~kop_dedup.errors.KafkaError` to answer the whole request
with one code (``Api.error_answer`` renders it, so it must build a valid response
of the API at any served version).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kop_dedup.errors import KafkaError
from kop_dedup.protocol.client_quotas import ByteRate
from kop_dedup.security.identity import ANONYMOUS, Authenticator, Credential, Identity
from kop_dedup.security.quotas import RoleCounts

if TYPE_CHECKING:
    from kop_dedup.observability.wire import WireStats
    from kop_dedup.pulsar.produced import ProducedOffsets
    from kop_dedup.pulsar.reader_pool import ReaderPool
    from kop_dedup.runtime import Runtime
    from kop_dedup.settings import Settings

__all__ = [
    "AfterForward",
    "Api",
    "CloseConnection",
    "CoordinatorKey",
    "ErrorAnswer",
    "Handler",
    "Node",
    "Session",
    "Shared",
]

Handler = Callable[["Session", Any, int], Awaitable[Any]]
"""(session, decoded request, version) -> response message, or None for no answer."""
ErrorAnswer = Callable[[Any, int, KafkaError], Any]
"""(decoded request, version, error) -> a response of the API carrying the error."""
CoordinatorKey = Callable[[Any, int], tuple[int, str] | None]
"""(decoded request, version) -> (key type, key) of the coordinator that serves it."""
AfterForward = Callable[["Session", Any], Awaitable[None]]
"""(session, the coordinator's decoded answer): done where the client is, before it gets
the answer of a request another node served."""


class CloseConnection(Exception):
    """Close the connection (after writing ``answer``, when there is one), as Kafka does
    for this input; ``reason`` is logged once, ``kind`` is one of
    :data:`~kop_dedup.observability.wire.CLOSE_REASONS` (counted)."""

    def __init__(self, reason: str, *, kind: str, answer: Any = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.answer = reason, kind, answer


@dataclass(frozen=True, slots=True)
class Api:
    """One Kafka API as the listener serves it.

    ``versions`` are advertised in ApiVersions; ``served_from`` (default: the lowest
    advertised) is the lowest version answered: a request below it closes the
    connection (Produce 0-2, advertised for librdkafka as Kafka 4 does, KAFKA-18659).
    ``concurrent``: requests of one connection are handled side by side with the ones of
    the same API just before them (Produce, ListOffsets; up to the connection's
    in-flight limit); any other request waits until every earlier one of its connection
    is answered, and later ones wait for it. ``before_auth``: served
    before SASL authentication (ApiVersions, the SASL APIs). ``advertised=False``:
    answered (with an error) but not listed, so that clients do not pick it.
    """

    key: int
    name: str
    request: Any
    """The kafka-python request class (decodes the body)."""
    versions: tuple[int, int]
    handle: Handler
    error_answer: ErrorAnswer
    served_from: int | None = None
    concurrent: bool = False
    before_auth: bool = False
    advertised: bool = True
    coordinator_key: CoordinatorKey | None = None
    """For an API a group or transaction coordinator serves: the (key type, key) a request
    names (0 a group id, 1 a transactional id; None: any node serves it), so that the
    listener refuses it (16) or forwards it (sidecar mode) on another node
    (:mod:`kop_dedup.transports.kafka.routed`)."""
    response: Any = None
    """The kafka-python response class (decodes a forwarded request's answer)."""
    after_forward: AfterForward | None = None
    """What the node a client sent a forwarded request to does with its answer before
    the client sees it, as the API's handler does here: InitProducerId gives the
    producer id to the caller's role (the coordinator serving a forwarded request does
    not know the caller)."""

    def serves(self, version: int) -> bool:
        low = self.versions[0] if self.served_from is None else self.served_from
        return low <= version <= self.versions[1]


@dataclass(frozen=True, slots=True)
class Node:
    """This sidecar as the one broker of its cluster: where clients connect back to."""

    node_id: int
    host: str
    port: int
    cluster_id: str


@dataclass(slots=True)
class Shared:
    """What every connection of one listener shares."""

    runtime: Runtime
    settings: Settings
    node: Node
    apis: Mapping[int, Api]
    offsets: ProducedOffsets
    stats: WireStats
    auth: Authenticator
    """Who a SASL/PLAIN password is (the HTTP tokens, roles and JWTs); off: no SASL."""
    role_connections: RoleCounts = field(default_factory=lambda: RoleCounts(None))
    """Authenticated connections per role, held to ``ROLE_QUOTA_PERCENT`` of
    ``KAFKA_MAX_CONNECTIONS`` (:mod:`.sasl` counts, the listener releases)."""
    byte_rates: ByteRate = field(default_factory=ByteRate)
    """Each role's produce and fetch bytes a second on this node (:mod:`.throttle`)."""
    readers: ReaderPool | None = None
    """Pulsar readers kept between fetches (:mod:`.fetch` opens it at the first read;
    the listener closes it after its connections)."""


@dataclass(slots=True)
class Session:
    """One client connection, as handlers see it."""

    shared: Shared
    peer: str
    client_id: str = ""
    authenticated: bool = False
    mechanism: str | None = None
    """The SASL mechanism a handshake chose; None before one."""
    raw_sasl: bool = False
    """SaslHandshake v0 answered: the next frame is a bare SASL token, not a request."""
    user: str | None = None
    identity: Identity = ANONYMOUS
    """The authenticated caller (its role); everyone is a superuser with auth off."""
    credential: Credential | None = None
    """What the SASL login proved, checked again at each request (an expired JWT or a
    removed roles-file line closes the connection)."""
    forwarded: bool = False
    """A request another node forwarded (``/internal/v1/kafka``): served here, never
    forwarded again."""
    muted_until: float = 0.0
    """``time.monotonic()`` before which no further request is read: a byte-rate quota's
    throttle (:mod:`.throttle`), as Kafka mutes a throttled channel."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Per-connection state a handler module keeps (keyed by its module name)."""

    @property
    def runtime(self) -> Runtime:
        return self.shared.runtime

    @property
    def settings(self) -> Settings:
        return self.shared.settings

    @property
    def auth_required(self) -> bool:
        return self.shared.auth.enabled
