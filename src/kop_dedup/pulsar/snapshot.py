"""Read a keyed, compacted topic to its end once, outside the service's event loop: the
latest value of every key (a tombstone removes one). For tools that take a snapshot of
the sidecar's state (the Spark audit reads the transaction log with it before it reads
the data).

>>> latest = read_latest("pulsar://127.0.0.1:6650", "persistent://public/sys/transaction-log", 8)
"""

from __future__ import annotations

from collections.abc import Callable

import pulsar

__all__ = ["read_latest"]

_READ_WAIT_MS = 10_000


def read_latest(
    service_url: str,
    topic: str,
    partitions: int,
    *,
    newer: Callable[[bytes, bytes], bool] | None = None,
) -> dict[str, bytes]:
    """Every key's latest value in the ``partitions`` partitions of ``topic`` (its
    compacted view, then what came after), read to the end each had when read; ``newer``
    (new, kept): whether a value read later replaces the one kept (default: always)."""
    latest: dict[str, bytes] = {}
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for p in range(partitions):
            reader = client.create_reader(
                f"{topic}-partition-{p}", pulsar.MessageId.earliest, is_read_compacted=True
            )
            try:
                while reader.has_message_available():
                    msg = reader.read_next(_READ_WAIT_MS)
                    key, data = msg.partition_key(), msg.data()
                    if not data:  # a tombstone
                        latest.pop(key, None)
                    elif key not in latest or newer is None or newer(data, latest[key]):
                        latest[key] = data
            finally:
                reader.close()
    finally:
        client.close()
    return latest
