"""The transaction log: each transactional id's :class:`Transaction` as a keyed record
in a partitioned, compacted topic, and the in-memory view a sidecar keeps of it.

A record's key is the transactional id; its value the JSON below; a tombstone removes
an expired id. The view keeps, per id, the record with the highest ``version`` (the
coordinator bumps it on every write), so reading its own writes again, or an old
record after a takeover, never moves a transaction backwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kop_dedup.protocol.transactions import Completed, Offset, Partition, Transaction, TxnState
from kop_dedup.pulsar.tables import TableRecord

__all__ = ["TransactionView", "decode", "encode"]


def encode(txn: Transaction) -> bytes:
    doc: dict[str, Any] = {
        "transactionalId": txn.transactional_id,
        "producerId": txn.producer_id,
        "producerEpoch": txn.producer_epoch,
        "timeoutMs": txn.timeout_ms,
        "state": txn.state.value,
        "ordinal": txn.ordinal,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "journalStart": p.journal_start,
                "journalEnd": p.journal_end,
                "dataStart": p.data_start,
                "journaler": p.journaler,
                "batches": p.batches,
                **({"dropped": True} if p.dropped else {}),
                **({"unresolved": True} if p.unresolved else {}),
            }
            for p in txn.partitions
        ],
        "offsets": [
            {
                "group": o.group,
                "topic": o.topic,
                "partition": o.partition,
                "offset": o.offset,
                "metadata": o.metadata,
            }
            for o in txn.offsets
        ],
        "startedMs": txn.started_ms,
        "updatedMs": txn.updated_ms,
        "checkBackUrl": txn.check_back_url,
        "checkBacks": txn.check_backs,
        "inDoubt": txn.in_doubt,
        "version": txn.version,
        "lastProducerId": txn.last_producer_id,
        "lastProducerEpoch": txn.last_producer_epoch,
        "token": txn.token,
        "history": [
            {"token": c.token, "ordinal": c.ordinal, "committed": c.committed} for c in txn.history
        ],
        "unresolved": txn.unresolved,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(data: bytes) -> Transaction:
    """Raises ValueError or KeyError for a malformed record (the table skips it)."""
    doc = json.loads(data)
    return Transaction(
        transactional_id=str(doc["transactionalId"]),
        producer_id=int(doc["producerId"]),
        producer_epoch=int(doc["producerEpoch"]),
        timeout_ms=int(doc["timeoutMs"]),
        state=TxnState(doc["state"]),
        ordinal=int(doc["ordinal"]),
        partitions=tuple(
            Partition(
                str(p["topic"]),
                int(p["partition"]),
                p.get("journalStart"),
                p.get("journalEnd"),
                p.get("dataStart"),
                p.get("journaler"),
                None if p.get("batches") is None else int(p["batches"]),
                bool(p.get("dropped", False)),
                bool(p.get("unresolved", False)),
            )
            for p in doc.get("partitions", ())
        ),
        offsets=tuple(
            Offset(
                str(o["group"]),
                str(o["topic"]),
                int(o["partition"]),
                int(o["offset"]),
                str(o.get("metadata") or ""),
            )
            for o in doc.get("offsets", ())
        ),
        started_ms=int(doc.get("startedMs", 0)),
        updated_ms=int(doc.get("updatedMs", 0)),
        check_back_url=doc.get("checkBackUrl"),
        check_backs=int(doc.get("checkBacks", 0)),
        in_doubt=bool(doc.get("inDoubt", False)),
        version=int(doc.get("version", 0)),
        last_producer_id=int(doc.get("lastProducerId", -1)),
        last_producer_epoch=int(doc.get("lastProducerEpoch", -1)),
        token=doc.get("token"),
        history=tuple(
            Completed(str(c["token"]), int(c["ordinal"]), bool(c["committed"]))
            for c in doc.get("history", ())
        ),
        unresolved=doc.get("unresolved"),
    )


class TransactionView:
    """The transactions of every partition this sidecar has read, by id."""

    def __init__(self, partitions: int) -> None:
        self._by_partition: list[dict[str, Transaction]] = [{} for _ in range(partitions)]

    def apply(self, partition: int, record: TableRecord) -> None:
        txns = self._by_partition[partition]
        if record.value is None:
            txns.pop(record.key, None)
            return
        txn = decode(record.value)
        current = txns.get(record.key)
        if current is None or txn.version >= current.version:
            txns[record.key] = txn

    def put(self, partition: int, txn: Transaction) -> None:
        """A write of this sidecar's, applied at once (it is read back later)."""
        current = self._by_partition[partition].get(txn.transactional_id)
        if current is None or txn.version >= current.version:
            self._by_partition[partition][txn.transactional_id] = txn

    def size(self, partition: int) -> int:
        """How many transactional ids the partition holds."""
        return len(self._by_partition[partition])

    def forget(self, partition: int, transactional_id: str) -> None:
        self._by_partition[partition].pop(transactional_id, None)

    def get(self, partition: int, transactional_id: str) -> Transaction | None:
        return self._by_partition[partition].get(transactional_id)

    def in_partition(self, partition: int) -> list[Transaction]:
        return list(self._by_partition[partition].values())

    def __iter__(self) -> Iterator[Transaction]:
        for txns in self._by_partition:
            yield from list(txns.values())
