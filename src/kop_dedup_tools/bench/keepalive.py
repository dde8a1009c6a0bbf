"""The benchmark's HTTP client: keep-alive HTTP/1.1 on asyncio streams, light enough that
measuring the sidecar through it measures the sidecar (:class:`KeepAlive`), and the
produce bodies it sends, built as text (:func:`produce_body`).

>>> client = KeepAlive(sc.url)
>>> body = produce_body(topic, 0, pid, 0, base=0, count=100, records=records_json(values))
>>> status, answer = await client.post("/v1/produce", body)
>>> await client.close()
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterable

from kop_dedup.protocol.records import SEQ_MODULUS

__all__ = ["KeepAlive", "produce_body", "records_json"]


def records_json(values: Iterable[bytes]) -> str:
    """Record values (no keys) as a produce body's ``records``, base64."""
    return ",".join(f'{{"value":"{base64.b64encode(v).decode()}"}}' for v in values)


def produce_body(
    topic: str,
    partition: int,
    pid: int,
    epoch: int,
    base: int,
    count: int,
    records: str,
    tid: str = "",
) -> bytes:
    """``POST /v1/produce`` with one batch of ``count`` records from sequence ``base``
    (both wrapped as Kafka's are); in transaction ``tid`` when one is given."""
    txn = f'"transactionalId":"{tid}",' if tid else ""
    return (
        f'{{{txn}"batches":[{{"topic":"{topic}","partition":{partition},"producerId":{pid},'
        f'"producerEpoch":{epoch},"baseSequence":{base % SEQ_MODULUS},'
        f'"lastSequence":{(base + count - 1) % SEQ_MODULUS},"records":[{records}]}}]}}'
    ).encode()


class KeepAlive:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams.

    httpx's async client managed about 80 requests/s at 40 concurrent
    requests on our 2-core machines (against a plain FastAPI app too), far
    below what uvicorn serves (about 3,000/s with this client): measuring the
    sidecar with it measured the client. One connection per in-flight
    request, reused.
    """

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._all: list[asyncio.StreamWriter] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self.request("GET", path, b"")

    async def request(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._all.append(writer)
        writer.write(
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError(f"the sidecar closed the connection before answering {path}")
        status = int(status_line.split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status, data

    async def close(self) -> None:
        """Close every connection, idle or not (a failed run leaves some in use)."""
        for writer in self._all:
            writer.close()
        for writer in self._all:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._all.clear()
        self._idle.clear()
