"""Reading the soak's topics from Pulsar directly, not through a sidecar.

Each partition is read from its first message with a Pulsar reader. A message's Kafka
offset is its place in the partition counted from 0: the broker's entry index (see
:mod:`kop_dedup.pulsar.positions`) numbers a topic's messages from 0 without gaps, and
nothing is ever trimmed from a soak's fresh topics, so counting while reading gives the
offsets a Kafka reader sees; the count is checked against the index of the last entry
(one admin call per partition). Each record comes back with the transaction its copy
belongs to (``kafka.producer.id`` with ``kafka.txn.ordinal``) and the transactional id
(``kafka.txn.id``, on the first record of each copied batch; every record of a batch
entry is given it).
"""

from __future__ import annotations

import time

import httpx
import pulsar

from kop_dedup.coordination.transactions.journal import PROP_TXN_ID, PROP_TXN_ORDINAL
from kop_dedup.pulsar.wire import PROP_HEADERS, PROP_PRODUCER_ID, PROP_VALUE_NULL, decode_headers
from kop_dedup_tools.soak_check import ATTEMPT_HEADER, OutRecord

__all__ = ["PulsarSide"]

_READ_MS = 5_000


class PulsarSide:
    def __init__(self, service_url: str, admin_url: str, namespace: str) -> None:
        self.service_url, self.admin_url, self.namespace = service_url, admin_url, namespace

    def topic(self, topic: str, partition: int) -> str:
        return f"persistent://{self.namespace}/{topic}-partition-{partition}"

    def entry_index(self, topic: str, partition: int, ledger: int, entry: int) -> int | None:
        """The broker's index of the entry's last message, None when it does not say."""
        path = self.topic(topic, partition).removeprefix("persistent://")
        r = httpx.get(
            f"{self.admin_url}/admin/v2/persistent/{path}/ledger/{ledger}/entry/{entry}",
            timeout=30,
        )
        index = r.headers.get("X-Pulsar-Broker-Entry-METADATA-index")
        return int(index) if r.status_code == 200 and index is not None else None

    def read(
        self, topic: str, partitions: int, *, at_least: dict[int, int]
    ) -> tuple[list[OutRecord], list[str]]:
        """Every message of every partition, with its offset and transaction; goes on
        reading a partition until it has ``at_least[p]`` messages (what a Kafka reader
        was told is there), or raises TimeoutError. Also: each partition whose count
        disagrees with the broker's index of the last entry read (offsets would be
        wrong), said in a sentence."""
        client = pulsar.Client(
            self.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        out: list[OutRecord] = []
        wrong: list[str] = []
        try:
            for p in range(partitions):
                records, last = self._read_partition(client, topic, p, at_least.get(p, 0))
                out += records
                if last is not None:
                    index = self.entry_index(topic, p, *last)
                    if index != len(records) - 1:
                        wrong.append(
                            f"{topic}/{p}: {len(records)} messages read, the broker's index "
                            f"of the last is {index}"
                        )
        finally:
            client.close()
        return out, wrong

    def _read_partition(
        self, client: pulsar.Client, topic: str, partition: int, at_least: int
    ) -> tuple[list[OutRecord], tuple[int, int] | None]:
        reader = client.create_reader(self.topic(topic, partition), pulsar.MessageId.earliest)
        out: list[OutRecord] = []
        last: tuple[int, int] | None = None
        deadline = time.monotonic() + 120
        head: dict[str, str] = {}
        try:
            while True:
                try:
                    msg = reader.read_next(_READ_MS if len(out) < at_least else 1_000)
                except pulsar.Timeout:
                    if len(out) >= at_least:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"{self.topic(topic, partition)}: read {len(out)} of {at_least}"
                        ) from None
                    continue
                props = msg.properties()
                mid = msg.message_id()
                last = (mid.ledger_id(), mid.entry_id())
                if mid.batch_index() <= 0:  # an entry's first record carries the txn id
                    head = props
                txn_id = props.get(PROP_TXN_ID) or head.get(PROP_TXN_ID)
                ordinal, pid = props.get(PROP_TXN_ORDINAL), props.get(PROP_PRODUCER_ID)
                attempt = None
                raw = props.get(PROP_HEADERS)
                if raw:
                    for header in decode_headers(raw):
                        if header.key == ATTEMPT_HEADER and header.value is not None:
                            attempt = header.value.decode()
                value = b"" if props.get(PROP_VALUE_NULL) == "true" else msg.data()
                out.append(
                    OutRecord(
                        partition,
                        len(out),
                        value.decode(errors="replace"),
                        attempt,
                        (int(pid), int(ordinal)) if ordinal is not None and pid else None,
                        txn_id,
                    )
                )
        finally:
            reader.close()
        return out, last
