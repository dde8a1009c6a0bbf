"""A round-robin TCP proxy for tests: what a plain L4 load balancer in front of several
sidecars does. Each accepted connection goes to the next upstream in turn and bytes are
piped both ways until either side closes.

>>> with RoundRobinProxy(["127.0.0.1:9092", "127.0.0.1:9093"]) as proxy:
...     proxy.address            # "127.0.0.1:<port>", for bootstrap.servers
...     proxy.connections        # how many connections each upstream got
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Self

__all__ = ["RecordingProxy", "RoundRobinProxy", "StallingProxy"]


class RoundRobinProxy:
    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = upstreams
        self.connections: Counter[str] = Counter()
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rr-proxy")
        self.address = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = self.upstreams[self._turn % len(self.upstreams)]
        self._turn += 1
        self.connections[upstream] += 1
        host, _, port = upstream.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            if self._server is not None:
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RecordingProxy(RoundRobinProxy):
    """One upstream HTTP server (Pulsar's admin API, say), every request line that
    passes recorded in :attr:`requests` as ``"METHOD /path"``: what a test asserts was
    never asked.

    >>> with RecordingProxy("127.0.0.1:8080") as proxy:
    ...     proxy.url            # "http://127.0.0.1:<port>", the admin URL to give
    ...     proxy.requests       # ["GET /admin/v2/clusters", ...]
    """

    _LINE = re.compile(rb"(?:^|\r\n)([A-Z]{3,7}) (\S+) HTTP/1\.[01]\r\n")

    def __init__(self, upstream: str) -> None:
        super().__init__([upstream])
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.upstreams[0].rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, self._seen), _pipe(up_reader, writer))

    def _seen(self, data: bytes, pending: bytes) -> bytes:
        """Record the request lines complete in ``pending + data``; what is left to
        look at with the next bytes."""
        buf = pending + data
        end = 0
        for match in self._LINE.finditer(buf):
            method, path = match.groups()
            self.requests.append(f"{method.decode()} {path.decode(errors='replace')}")
            end = match.end() - 2  # keep the CRLF: the next line starts after it
        return buf[end:][-8192:]


class StallingProxy(RoundRobinProxy):
    """One upstream (Pulsar's admin API, say) that can be made to stall: while
    :meth:`stall` holds, what clients send is kept back (on connections open already and
    new ones alike), so their calls time out as against a broker that stopped answering;
    :meth:`flow` lets it through again.

    >>> with StallingProxy("127.0.0.1:8080") as proxy:
    ...     proxy.stall()        # admin calls through proxy.url hang from now on
    ...     proxy.flow()
    """

    def __init__(self, upstream: str) -> None:
        super().__init__([upstream])
        self._flowing: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def _set(self, flowing: bool) -> None:
        async def change() -> None:
            if self._flowing is None:
                self._flowing = asyncio.Event()
            (self._flowing.set if flowing else self._flowing.clear)()

        asyncio.run_coroutine_threadsafe(change(), self._loop).result(10)

    def stall(self) -> None:
        self._set(False)

    def flow(self) -> None:
        self._set(True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        host, _, port = self.upstreams[0].rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, gate=self._flowing), _pipe(up_reader, writer))


async def _pipe(
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    tap: Callable[[bytes, bytes], bytes] | None = None,
    gate: asyncio.Event | None = None,
) -> None:
    pending = b""
    try:
        while data := await source.read(1 << 16):
            if gate is not None:
                await gate.wait()
            if tap is not None:
                pending = tap(data, pending)
            sink.write(data)
            await sink.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()
