"""A record written into a data partition the way the coordinator's copy writes a
committed transactional record, for the audits that stage a copy cut short."""

from __future__ import annotations

from typing import Any

from kop_dedup.coordination.transactions.copier import PROP_TXN_BATCH
from kop_dedup.coordination.transactions.journal import (
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    PROP_TXN_PARTITIONS,
    PROP_TXN_RECORDS,
)
from kop_dedup.protocol.records import KafkaRecord
from kop_dedup.pulsar.wire import encode_key, encode_properties


def send_copy(
    producer: Any,
    *,
    pid: int,
    seq: int,
    partition: int,
    tid: str,
    ordinal: int,
    records: int,
    partitions: int,
) -> None:
    """A record shaped like the coordinator's copy of a committed transactional record."""
    record = KafkaRecord(key=f"k{seq}".encode(), value=f"{tid}:{seq}".encode())
    key, enc = encode_key(record.key)
    props = encode_properties(
        record, producer_id=pid, epoch=0, sequence=seq, partition=partition, key_encoding=enc
    )
    props |= {
        PROP_TXN_ID: tid,
        PROP_TXN_ORDINAL: str(ordinal),
        PROP_TXN_BATCH: "0",
        PROP_TXN_RECORDS: str(records),
        PROP_TXN_PARTITIONS: str(partitions),
    }
    producer.send(record.value, properties=props, partition_key=key)
