"""The producer-id allocator claims again when the broker refuses a claim.

The broker's dedup refusing a block claim means the holder read the topic
behind what it stores (a claim in flight, a dedup state being recovered). What
is tested here is the allocator's policy around that answer (read again, then
give up with 56), with a stand-in for the name mutex; claims against the real
broker are made by every integration test that asks init-producer-id (CI saw a
claim refused once: test_group_retention answered 56 before this).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

from kop_dedup import errors
from kop_dedup.coordination import producer_ids
from kop_dedup.coordination.producer_ids import BLOCK_SIZE, CLAIM_ATTEMPTS, ProducerIdAllocator


class _Held:
    def __init__(self, topic: _Topic) -> None:
        self._topic = topic
        self.last_sequence_id = topic.seen_sequence

    async def last_record(self):
        return None

    async def send(self, value: bytes, *, sequence_id: int) -> bool:
        if sequence_id <= self._topic.stored_sequence:
            self._topic.seen_sequence = self._topic.stored_sequence  # next read is fresh
            return False
        self._topic.stored_sequence = self._topic.seen_sequence = sequence_id
        return True


class _Topic:
    """The broker's view: what it stores, and what a holder reads (maybe behind)."""

    def __init__(self, stored: int, seen: int, refuse_always: bool = False) -> None:
        self.stored_sequence, self.seen_sequence = stored, seen
        self.refuse_always = refuse_always
        self.holds = 0

    @asynccontextmanager
    async def hold(self):
        self.holds += 1
        if self.refuse_always:
            self.seen_sequence = -1
        yield _Held(self)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(producer_ids, "_CLAIM_BACKOFF_S", 0.0)


def test_a_refused_claim_is_claimed_again_from_a_fresh_read():
    # block 16 is stored (sequence 17) but the holder reads 16: its first claim
    # of block 16 is refused; the allocator must not answer 56 for that
    topic = _Topic(stored=17, seen=16)
    pid = asyncio.run(ProducerIdAllocator(topic).allocate())  # type: ignore[arg-type]
    assert pid == 17 * BLOCK_SIZE
    assert topic.holds == 2
    assert topic.stored_sequence == 18


def test_claims_refused_every_time_answer_56_after_the_attempts():
    topic = _Topic(stored=5, seen=-1, refuse_always=True)
    with pytest.raises(errors.KafkaStorageError, match="already claimed"):
        asyncio.run(ProducerIdAllocator(topic).allocate())  # type: ignore[arg-type]
    assert topic.holds == CLAIM_ATTEMPTS
