"""A bare Kafka wire client for tests: send any request (or any bytes), read answers.

>>> with WireClient(bootstrap) as c:
...     answer = c.call(MetadataRequest[9](topics=None), 9)
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any, Self

from aiokafka.record.util import calc_crc32c
from kafka.protocol.api_header import ResponseClassRegistry, ResponseHeader

from kop_dedup.protocol.records import KafkaRecord
from kop_dedup.transports.kafka.batches import build_batch

__all__ = ["WireClient", "produce_request"]


class WireClient:
    def __init__(
        self, address: str, timeout: float = 30.0, tls: ssl.SSLContext | None = None
    ) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = sock if tls is None else tls.wrap_socket(sock, server_hostname=host)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: Any, version: int, correlation: int | None = None) -> int:
        self.correlation += 1
        cid = self.correlation if correlation is None else correlation
        request.API_VERSION = version
        request.with_header(correlation_id=cid, client_id="wire-test")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        return cid

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the listener")
            out += chunk
        return out

    def receive_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def receive(self, request: Any, version: int) -> tuple[int, Any]:
        """(correlation id, decoded answer) of the next frame, decoded as the answer to
        ``request``'s API at ``version``."""
        frame = self.receive_frame()
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
        flexible = cls.flexible_version_q(version) and cls.name != "ApiVersionsResponse"
        data = io.BytesIO(frame)
        header = ResponseHeader.decode(data, flexible=flexible)
        body = cls.decode(frame[data.tell() :], version=version)
        return header.correlation_id, body

    def call(self, request: Any, version: int) -> Any:
        cid = self.send(request, version)
        got, body = self.receive(request, version)
        assert got == cid, f"answer to {got}, expected {cid}"
        return body

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True once the listener closed the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return True
        except TimeoutError:
            return False


def produce_request(
    topic: str,
    partition: int,
    records: list[KafkaRecord],
    *,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    acks: int = -1,
    codec: str = "none",
    transactional_id: str | None = None,
    raw: bytes | None = None,
) -> Any:
    from kafka.protocol.producer import ProduceRequest

    data = raw
    if data is None:
        data = build_batch(
            records,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=base_sequence,
            codec=codec,
        )
    return ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=partition, records=data
                    )
                ],
            )
        ],
    )


_CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def batch_with_records_bytes(codec: str, payload: bytes, count: int = 1) -> bytes:
    """A RecordBatch v2 whose compressed records are ``payload`` (any bytes), its CRC
    right: what a hostile client can send."""
    body = struct.pack(
        ">hiqqqhii",
        _CODEC_IDS[codec],  # attributes
        count - 1,  # last offset delta
        0,  # first timestamp
        0,  # max timestamp
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
        count,
    )
    crc = calc_crc32c(body + payload)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(body) + len(payload), 0, 2, crc)
    return head + body + payload
