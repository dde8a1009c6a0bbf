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
import threading
from collections import Counter
from typing import Self

__all__ = ["RoundRobinProxy"]


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


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()
