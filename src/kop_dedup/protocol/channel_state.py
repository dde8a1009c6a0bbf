"""What is known of one channel (a Pulsar producer name on one partition topic): the
sequences stored and sent, the broker's mark, the last batches stored with their
positions. The rules machine (:mod:`kop_dedup.protocol.rules`) decides on it; the
produce service updates it as batches are handed to Pulsar and answered.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kop_dedup.protocol.records import unwrap

__all__ = ["RECENT_BATCHES", "ChannelState", "StoredBatch"]

RECENT_BATCHES = 5
"""Stored batches remembered per channel with their position (Kafka keeps 5)."""


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch the broker stored: its extended sequences and its first record's position."""

    first: int
    last: int
    position: str


@dataclass(slots=True)
class ChannelState:
    """What is known of one producer name on one partition topic.

    ``persisted``: highest extended sequence known stored (None: none).
    ``sent``: highest extended sequence handed to Pulsar (>= ``persisted``).
    ``broker_mark``: highest sequence the broker is known to deduplicate: its own mark
    when the channel opened, raised by every store. Below ``persisted`` only when the
    broker lost its state for the name and the sidecar remembers more.
    ``floor``: where a producer that had no state started, when above 0 (Kafka >= 2.5
    lets it start anywhere); nothing below was ever stored.
    ``in_flight``: batches handed to Pulsar with no answer yet (resends included).
    ``broken``: a send failed; what is in flight is unknown until the broker says.
    ``recent``: the last :data:`RECENT_BATCHES` batches stored through this channel.
    """

    persisted: int | None = None
    sent: int | None = None
    broker_mark: int | None = None
    floor: int | None = None
    in_flight: int = 0
    broken: bool = False
    recent: deque[StoredBatch] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    @classmethod
    def from_broker(
        cls, broker_mark: int | None, remembered: int | None = None, floor: int | None = None
    ) -> ChannelState:
        """State after (re)connecting: the broker's mark, and what the sidecar remembers
        having stored (which exceeds the broker's mark only if the broker lost state)."""
        persisted = broker_mark
        if remembered is not None and (persisted is None or remembered > persisted):
            persisted = remembered
        if persisted is None:
            floor = None  # nothing stored: the next batch starts afresh
        return cls(persisted=persisted, sent=persisted, broker_mark=broker_mark, floor=floor)

    @property
    def has_state(self) -> bool:
        return self.sent is not None

    def place(self, base_sequence: int, count: int) -> tuple[int, int]:
        """Extended (first, last) for a batch, unwrapped near what was sent."""
        first = unwrap(base_sequence, self.sent)
        return first, first + count - 1

    def on_handed(self, first: int, last: int, *, resend: bool) -> None:
        """The batch was handed to Pulsar."""
        self.in_flight += 1
        if resend:
            return
        if self.sent is None and first > 0:
            self.floor = first
        self.sent = last if self.sent is None else max(self.sent, last)

    def on_stored(self, first: int, last: int, position: str | None) -> None:
        """The broker stored the batch (position None: it already had it, -1/-1)."""
        self.in_flight -= 1
        self.persisted = last if self.persisted is None else max(self.persisted, last)
        self.broker_mark = last if self.broker_mark is None else max(self.broker_mark, last)
        self.sent = last if self.sent is None else max(self.sent, last)
        if position is not None:
            self.recent.append(StoredBatch(first, last, position))

    def on_failed(self) -> None:
        """A send failed: what is in flight is unknown until the broker says."""
        self.in_flight -= 1
        self.sent = self.persisted
        self.broken = True

    def recent_position(self, first: int, last: int) -> str | None:
        for stored in self.recent:
            if stored.first == first and stored.last == last:
                return stored.position
        return None
