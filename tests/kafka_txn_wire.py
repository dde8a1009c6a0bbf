"""A bare transactional Kafka client for tests: each transaction API as one request at a
chosen version, so that a test sees the exact code a broker answers (a real client
would act on it instead).

>>> with TxnWire(bootstrap, "app") as t:
...     t.init()                                # retried while 14/15/16/51, as clients do
...     t.add_partitions({"orders": [0]})       # {("orders", 0): 0}
...     t.produce("orders", 0, [rec(b"v")])     # the partition's code
...     t.end(commit=True)                      # the code
"""

from __future__ import annotations

import time
from typing import Any, Self

from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from kop_dedup.protocol.records import KafkaRecord
from kop_dedup.transports.kafka.batches import build_batch
from tests.kafka_wire import WireClient, produce_request

__all__ = ["RETRIED", "TxnWire"]

RETRIED = frozenset({14, 15, 16, 51})
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
CONCURRENT_TRANSACTIONS: what every client retries on the transaction calls."""


_NOT_LEADER = 6


class TxnWire:
    def __init__(self, bootstrap: str, transactional_id: str, timeout: float = 30.0) -> None:
        self.client = WireClient(bootstrap, timeout=timeout)
        self.tid = transactional_id
        self.timeout = timeout
        self.pid, self.epoch = -1, -1
        self.sequences: dict[tuple[str, int], int] = {}

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retried(self, call: Any) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:
            answer = call()
            if answer.error_code not in RETRIED or time.monotonic() > deadline:
                return answer
            time.sleep(0.1)

    # -- InitProducerId ---------------------------------------------------------------

    def init_once(
        self, version: int = 4, timeout_ms: int = 60_000, current: tuple[int, int] = (-1, -1)
    ) -> Any:
        """One InitProducerId; ``current``: the (producer id, epoch) of KIP-360 (v3+)."""
        request = InitProducerIdRequest(
            transactional_id=self.tid,
            transaction_timeout_ms=timeout_ms,
            producer_id=current[0],
            producer_epoch=current[1],
        )
        return self.client.call(request, version)

    def find_coordinator(self, key_type: int = 1, key: str | None = None) -> int:
        """FindCoordinator (v1) for the transactional id (or ``key``), retried like a
        client (Kafka creates its transaction log at the first one); the code."""
        request = FindCoordinatorRequest(key=key or self.tid, key_type=key_type)
        return int(self._retried(lambda: self.client.call(request, 1)).error_code)

    def init(self, version: int = 4, timeout_ms: int = 60_000) -> int:
        """FindCoordinator, then InitProducerId, retried like a client; keeps the id and
        epoch; the code."""
        found = self.find_coordinator()
        if found:
            return found
        answer = self._retried(lambda: self.init_once(version, timeout_ms))
        if answer.error_code == 0:
            self.pid, self.epoch = answer.producer_id, answer.producer_epoch
            self.sequences = {}
        return int(answer.error_code)

    # -- AddPartitionsToTxn, AddOffsetsToTxn ----------------------------------------------

    def add_partitions(
        self, partitions: dict[str, list[int]], version: int = 0
    ) -> dict[tuple[str, int], int]:
        """One AddPartitionsToTxn (v0-3); each partition's code."""
        topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        request = AddPartitionsToTxnRequest(
            transactions=[],
            v3_and_below_transactional_id=self.tid,
            v3_and_below_producer_id=self.pid,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[topic(name=t, partitions=ps) for t, ps in partitions.items()],
        )
        answer = self.client.call(request, version)
        return {
            (t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }

    def add_partitions_retried(self, partitions: dict[str, list[int]], version: int = 0) -> int:
        """AddPartitionsToTxn retried while every code is retried; the codes' max."""
        deadline = time.monotonic() + self.timeout
        while True:
            codes = set(self.add_partitions(partitions, version).values())
            if not codes <= RETRIED or time.monotonic() > deadline:
                return max(codes)
            time.sleep(0.1)

    def add_offsets(self, group: str, version: int = 0) -> int:
        request = AddOffsetsToTxnRequest(
            transactional_id=self.tid,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            group_id=group,
        )
        return int(self._retried(lambda: self.client.call(request, version)).error_code)

    # -- TxnOffsetCommit ------------------------------------------------------------------

    def commit_offsets(
        self,
        group: str,
        offsets: dict[tuple[str, int], int],
        version: int = 3,
        *,
        member: str = "",
        generation: int = -1,
        instance: str | None = None,
    ) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit, sent again while every partition answers a coordinator code
        (14, 15, 16: Kafka's group coordinator loads its partition after the first
        FindCoordinator for the group, and a client waits for it); each partition's code."""
        t = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append(
                t.TxnOffsetCommitRequestPartition(
                    partition_index=partition,
                    committed_offset=offset,
                    committed_leader_epoch=-1,
                    committed_metadata="",
                )
            )
        request = TxnOffsetCommitRequest(
            transactional_id=self.tid,
            group_id=group,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            generation_id=generation,
            member_id=member,
            group_instance_id=instance,
            topics=[t(name=n, partitions=ps) for n, ps in by_topic.items()],
        )
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self.client.call(request, version)
            codes = {
                (topic.name, p.partition_index): p.error_code
                for topic in answer.topics
                for p in topic.partitions
            }
            if not set(codes.values()) <= {14, 15, 16} or time.monotonic() > deadline:
                return codes
            time.sleep(0.1)

    # -- Produce, EndTxn --------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        partition: int,
        records: list[KafkaRecord],
        version: int = 9,
        *,
        epoch: int | None = None,
    ) -> int:
        """One transactional batch (the next sequence of the partition); its code. The
        sequence moves on only when the batch is stored. NOT_LEADER_OR_FOLLOWER (a topic
        just created, on Kafka) is retried, as clients do after a metadata refresh."""
        sequence = self.sequences.get((topic, partition), 0)
        raw = build_batch(
            records,
            producer_id=self.pid,
            producer_epoch=self.epoch if epoch is None else epoch,
            base_sequence=sequence,
            transactional=True,
        )
        request = produce_request(topic, partition, [], raw=raw, transactional_id=self.tid)
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self.client.call(request, version)
            code = int(answer.responses[0].partition_responses[0].error_code)
            if code != _NOT_LEADER or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if code == 0:
            self.sequences[topic, partition] = sequence + len(records)
        return code

    def end_once(self, commit: bool, version: int = 1) -> int:
        request = EndTxnRequest(
            transactional_id=self.tid,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            committed=commit,
        )
        return int(self.client.call(request, version).error_code)

    def end(self, commit: bool, version: int = 1) -> int:
        """EndTxn retried like a client (51 while the last decision is applied)."""
        return int(self._retried(lambda: _Code(self.end_once(commit, version))).error_code)


class _Code:
    def __init__(self, code: int) -> None:
        self.error_code = code
