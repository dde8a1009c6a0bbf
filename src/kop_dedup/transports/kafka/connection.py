"""One client connection: frames in, answers out in request order.

A frame is a 4-byte big-endian size and that many bytes. The reader takes frames one
by one; each request gets a place in the answer queue as it is read, so answers leave
in request order whatever order they are ready in (the Java client fails a connection
whose answer to its oldest request is not the next one). Requests of an API marked
``concurrent`` (Produce, ListOffsets) are handled side by side with the ones of the same
API before them (a consumer asks the offsets of each of its partitions in a request of
its own); any other request waits until every earlier request of the connection is
handled, and the next ones wait for it (Kafka mutes a connection while it handles a
request). At most ``max_in_flight`` requests are read and not yet answered: past that the
reader stops reading (TCP pushes back). Over every connection, a frame is admitted into
the listener's ``queued`` budget (``KAFKA_QUEUED_MAX_REQUEST_BYTES``, Kafka's
``queued.max.request.bytes``) from its size header, before its body is read, and let go
once its request is handled: while it does not fit, its connection reads nothing more
(first come, first served).

Where Kafka closes the connection, so does this one, after the answers to earlier
requests and logging the reason once (``SocketServer`` closes on a frame over
``socket.request.max.bytes``, a header or body that does not parse, an unknown API key
or a version it does not serve; ``KafkaApis`` on a Produce with acks=0 that failed;
``SaslServerAuthenticator`` before authentication on a frame over
``sasl.server.max.receive.size``, judged from its size header, or any request but
ApiVersions and SASL, never decoded). A request must arrive whole within the read
timeout of its first byte (the wait for room in the budget not counted); a failed
authentication closes after Kafka's delay. An authenticated connection's credential
is checked again at each request: once its JWT has expired or its roles-file line is
gone, the request closes the connection unanswered (Kafka closes a session past its
KIP-368 lifetime so; Pulsar's
``authenticationRefreshCheckSeconds`` ends such a connection too).
Nothing one connection sends reaches another: each has its own reader, queue and
tasks, and an unexpected exception in a handler answers UNKNOWN_SERVER_ERROR naming the
exception's class (its text is logged, never answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from kop_dedup import errors
from kop_dedup.admission import ByteBudget
from kop_dedup.transports.kafka import codec, routed
from kop_dedup.transports.kafka.registry import Api, CloseConnection, Session
from kop_dedup.transports.kafka.sasl import raw_token

__all__ = ["API_VERSIONS_KEY", "Connection"]

log = logging.getLogger("kop_dedup.kafka")

API_VERSIONS_KEY = 18
_SIZE = 4
_DECODE_ON_LOOP_BYTES = 256 * 1024  # a larger request is decoded in a worker thread
_GONE = (ConnectionError, asyncio.IncompleteReadError)  # the client went away


class _Admitted:
    """A frame's bytes of the listener's budget, let go once, when its request is
    handled (by the reader, or by the task it hands the request to: :meth:`moved`)."""

    __slots__ = ("_budget", "_n")

    def __init__(self, budget: ByteBudget | None, n: int) -> None:
        self._budget, self._n = budget, n

    def moved(self) -> _Admitted:
        """The bytes, now another's to let go (this one lets go of nothing)."""
        n, self._n = self._n, 0
        return _Admitted(self._budget, n)

    def let_go(self, *_: object) -> None:
        if self._budget is not None and self._n:
            self._budget.release(self._n)
            self._n = 0


@dataclass(frozen=True, slots=True)
class _Outcome:
    frame: bytes | None
    """The framed answer; None: nothing to write (acks=0, or a close without answer)."""
    close: tuple[str, str] | None = None
    """(kind, reason): close the connection after writing ``frame``."""
    failed_auth: bool = False
    """A failed authentication: the close waits the failed-authentication delay."""


class Connection:
    def __init__(
        self,
        session: Session,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_request_bytes: int,
        max_unauthenticated_bytes: int = 512 * 1024,
        read_timeout_s: float = 30.0,
        failed_auth_delay_s: float = 0.1,
        max_in_flight: int = 5,
        idle_timeout_s: float = 600.0,
        queued: ByteBudget | None = None,
    ) -> None:
        self.session = session
        self._reader, self._writer = reader, writer
        self._max_bytes = max_request_bytes
        self._unauth_bytes = min(max_unauthenticated_bytes, max_request_bytes)
        self._read_s = read_timeout_s
        self._auth_delay_s = failed_auth_delay_s
        self._idle_s = idle_timeout_s
        self._queued = queued
        self._slots = asyncio.Semaphore(max_in_flight)
        self._answers: asyncio.Queue[asyncio.Future[_Outcome] | None] = asyncio.Queue()
        self._running: dict[asyncio.Future[_Outcome], int] = {}
        """The requests being handled side by side, and their API key."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._between_requests = False
        self._reading: asyncio.Task[None] | None = None
        self.closed_because = "client"

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until the client leaves, a request closes it or :meth:`stop`."""
        stats = self.session.shared.stats
        stats.connection_opened()
        writing = asyncio.create_task(self._write_answers())
        reading = self._reading = asyncio.create_task(self._read_requests())
        try:
            await asyncio.wait({reading})
            exc = None if reading.cancelled() else reading.exception()
            if exc is not None and not isinstance(exc, _GONE):
                log.error(
                    "kafka connection failed", exc_info=exc, extra={"peer": self.session.peer}
                )
        finally:
            reading.cancel()
            self._answers.put_nowait(None)
            with contextlib.suppress(Exception):
                await writing
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            stats.connection_closed(self.closed_because)

    def stop(self) -> None:
        """Read no further request; answer those read, then close."""
        self._stopping = True
        self.closed_because = "shutdown"
        if self._between_requests and self._reading is not None:
            self._reading.cancel()

    async def drain_tasks(self) -> None:
        """Wait for the requests being handled (their batches are Pulsar's by now)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- reading -----------------------------------------------------------------------

    async def _read_frame(self) -> bytes | None:
        """The next frame's bytes; None when the connection is to close (logged).

        Waits up to the idle timeout for a request's first byte; from then the whole
        request must arrive within the read timeout (the wait for room in the listener's
        budget, between its size header and its body, not counted). The size header is
        judged before the body is read: before authentication against the (small)
        unauthenticated limit, so a client that has not proved itself never makes the
        sidecar hold more; then the frame waits for room in the budget, its body unread.
        """
        self._between_requests = True
        try:
            first = await asyncio.wait_for(self._reader.readexactly(1), self._idle_s)
        except TimeoutError:
            self._refuse("idle", f"no request for {self._idle_s:g} s")
            return None
        except asyncio.IncompleteReadError:
            return None
        finally:
            self._between_requests = False
        try:
            async with asyncio.timeout(self._read_s):
                head = first + await self._reader.readexactly(_SIZE - 1)
                size = int.from_bytes(head, "big", signed=True)
                limit, setting = self._limit()
                if size < 0 or size > limit:
                    self._refuse(
                        "oversized", f"a frame of {size} bytes; the limit is {limit} ({setting})"
                    )
                    return None
        except TimeoutError:
            self._timed_out()
            return None
        if self._queued is not None:  # nothing more read until the frame fits
            self._between_requests = True
            try:
                await self._queued.acquire(size)
            finally:
                self._between_requests = False
        try:
            async with asyncio.timeout(self._read_s):
                return await self._reader.readexactly(size)
        except BaseException as exc:
            if self._queued is not None:
                self._queued.release(size)
            if not isinstance(exc, TimeoutError):
                raise
            self._timed_out()
            return None

    def _timed_out(self) -> None:
        self._refuse(
            "timeout",
            f"a request not complete {self._read_s:g} s after its first byte "
            "(KOP_DEDUP_KAFKA_REQUEST_READ_TIMEOUT_MS)",
        )

    def _credential_ended(self, api: Api) -> str | None:
        """Why the session's login no longer holds, for a request that needs it."""
        session = self.session
        if api.before_auth or not session.authenticated or session.credential is None:
            return None
        reason = session.shared.auth.ended(session.credential)
        if reason is None:
            return None
        return (
            f"{api.name} after the session's credential ended ({reason}): "
            "the client must log in again with a valid token"
        )

    def _limit(self) -> tuple[int, str]:
        """The largest frame the connection takes now, and the setting that says so."""
        session = self.session
        if session.auth_required and not session.authenticated:
            return self._unauth_bytes, "KOP_DEDUP_KAFKA_MAX_UNAUTHENTICATED_BYTES"
        return self._max_bytes, "KOP_DEDUP_KAFKA_MAX_REQUEST_BYTES"

    async def _read_requests(self) -> None:
        apis = self.session.shared.apis
        while not self._stopping:
            frame = await self._read_frame()
            if frame is None:
                return
            admitted = _Admitted(self._queued, len(frame))
            try:
                if not await self._serve_frame(apis, frame, admitted):
                    return
            finally:
                admitted.let_go()  # unless a task took it (a Produce being handled)

    async def _serve_frame(self, apis: Any, frame: bytes, admitted: _Admitted) -> bool:
        """Answer or start one frame's request; False when the connection must close."""
        muted = self.session.muted_until - time.monotonic()
        if muted > 0:  # a byte-rate quota's throttle: as Kafka mutes the channel, the
            self._between_requests = True  # next request waits until it has passed
            try:  # (a stop() cancels the wait: the request is dropped unanswered)
                await asyncio.sleep(muted)
            finally:
                self._between_requests = False
        await self._slots.acquire()
        if self.session.raw_sasl:
            try:
                answer = await raw_token(self.session, frame)
            except CloseConnection as exc:
                self._queue(_Outcome(None, (exc.kind, exc.reason), failed_auth=True))
                return False
            self._queue(_Outcome(len(answer).to_bytes(4, "big") + answer))
            return True
        ids = codec.peek_ids(frame)
        api = apis.get(ids[0]) if ids is not None else None
        if ids is None or api is None:
            key = "none" if ids is None else str(ids[0])
            self._refuse("unsupported", f"unknown API key {key}")
            return False
        refusal = self._refusal(api, ids[1])
        if refusal is not None:
            self._refuse(*refusal)
            return False
        return await self._dispatch(api, frame, admitted)

    def _refusal(self, api: Api, version: int) -> tuple[str, str] | None:
        """(kind, reason) when a request of ``api`` closes the connection undecoded."""
        session = self.session
        if session.auth_required and not session.authenticated and not api.before_auth:
            # not decoded: before authentication only ApiVersions and SASL are (Kafka
            # closes on any other request during the SASL exchange, without answer)
            return (
                "auth",
                (
                    f"{api.name} before SASL authentication: authenticate with SASL/PLAIN, "
                    "the sidecar's token as the password"
                ),
            )
        ended = self._credential_ended(api)
        if ended is not None:
            return "auth", ended
        if not api.serves(version) and api.key != API_VERSIONS_KEY:
            return (
                "unsupported",
                (
                    f"{api.name} v{version} is not served (versions "
                    f"{api.served_from or api.versions[0]}..{api.versions[1]})"
                ),
            )
        return None

    async def _dispatch(self, api: Api, frame: bytes, admitted: _Admitted) -> bool:
        """Decode one request and start it; False when the connection must close. A
        request handled side by side takes the frame's ``admitted`` bytes with it."""
        version = codec.peek_ids(frame)[1]  # type: ignore[index]
        supported = api.serves(version)  # False only for ApiVersions: answered v0, error 35
        try:
            flexible = supported and bool(api.request.flexible_version_q(version))
            if api.key == API_VERSIONS_KEY and not supported:
                flexible = version >= 3  # a newer ApiVersions still sends header v2
            header = codec.parse_header(frame, flexible)
            body = None
            if supported and len(frame) > _DECODE_ON_LOOP_BYTES:  # seconds for a huge one
                body = await asyncio.to_thread(codec.decode_body, api.request, frame, header)
            elif supported:
                body = codec.decode_body(api.request, frame, header)
        except codec.FrameError as exc:
            self._refuse("malformed", str(exc))
            return False
        self.session.client_id = header.client_id
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._answers.put_nowait(future)
        earlier = [f for f, key in self._running.items() if key != api.key or not api.concurrent]
        if earlier:
            await asyncio.wait(earlier)
        if not api.concurrent:
            future.set_result(await self._handle(api, header, body))
            return future.result().close is None
        self._running[future] = api.key
        future.add_done_callback(self._drop_running)
        task = asyncio.create_task(self._settle(future, api, header, body))
        task.add_done_callback(admitted.moved().let_go)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _drop_running(self, future: asyncio.Future[_Outcome]) -> None:
        self._running.pop(future, None)

    async def _settle(
        self, future: asyncio.Future[_Outcome], api: Api, header: codec.Header, body: Any
    ) -> None:
        outcome = await self._handle(api, header, body)
        if not future.done():
            future.set_result(outcome)

    async def _handle(self, api: Api, header: codec.Header, body: Any) -> _Outcome:
        session, version = self.session, header.api_version
        started = time.perf_counter()
        close: tuple[str, str] | None = None
        failed_auth = False
        try:
            answer = await routed.handle(session, api, body, version)
        except CloseConnection as exc:
            answer, close = exc.answer, (exc.kind, exc.reason)
            failed_auth = exc.kind == "auth" and api.before_auth  # a SASL API refused
        except errors.KafkaError as exc:
            answer = api.error_answer(body, version, exc)
        except Exception as exc:
            log.exception(
                "kafka request failed",
                extra={"api": api.name, "version": version, "peer": session.peer},
            )
            # its text may hold internal addresses or state: logged above, named by kind
            why = f"an unexpected {type(exc).__name__} (the sidecar's log has the detail)"
            answer = api.error_answer(body, version, errors.KafkaError(why))
        outcome = self._encoded(api, header, answer, close)
        if failed_auth:
            outcome = _Outcome(outcome.frame, outcome.close, failed_auth=True)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "kafka request",
                extra={
                    "api": api.name,
                    "version": version,
                    "correlation_id": header.correlation_id,
                    "client_id": header.client_id,
                    "peer": session.peer,
                    "errors": sorted(set(codec.error_codes(answer))) if answer else [],
                    "latency_ms": round((time.perf_counter() - started) * 1000, 2),
                },
            )
        return outcome

    def _encoded(
        self, api: Api, header: codec.Header, answer: Any, close: tuple[str, str] | None
    ) -> _Outcome:
        """The framed answer (counted), and whether to close after it."""
        if answer is None:
            self.session.shared.stats.answered(api.name, [])
            return _Outcome(None, close)
        version = header.api_version if api.serves(header.api_version) else 0
        try:
            frame = codec.encode_answer(answer, version, header.correlation_id)
        except Exception:
            log.exception("kafka answer did not encode", extra={"api": api.name})
            return _Outcome(None, ("malformed", f"the answer to {api.name} did not encode"))
        self.session.shared.stats.answered(api.name, codec.error_codes(answer))
        return _Outcome(frame, close)

    def _queue(self, outcome: _Outcome) -> None:
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        future.set_result(outcome)
        self._answers.put_nowait(future)

    def _refuse(self, kind: str, reason: str) -> None:
        """Close after the answers to earlier requests, as Kafka closes for this input."""
        self._queue(_Outcome(None, (kind, reason)))

    # -- writing -----------------------------------------------------------------------

    async def _write_answers(self) -> None:
        writer = self._writer
        while (future := await self._answers.get()) is not None:
            outcome = await future
            self._slots.release()
            if outcome.frame is not None and not writer.is_closing():
                writer.write(outcome.frame)
                try:
                    await writer.drain()
                except ConnectionError:
                    self._stopping = True
            if outcome.close is not None:
                kind, reason = outcome.close
                self.closed_because = kind
                if outcome.failed_auth and self._auth_delay_s > 0:
                    await asyncio.sleep(self._auth_delay_s)  # as Kafka, to slow guessing
                log.info(
                    "kafka connection closed: %s",
                    reason,
                    extra={"peer": self.session.peer, "client_id": self.session.client_id},
                )
                self._stopping = True
                writer.close()
                return
