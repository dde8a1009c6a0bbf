"""Reading a load's topics back: every record its producers were told was delivered must
be there exactly once, in order, and intact (:func:`verify`).

>>> print(verify("pulsar://127.0.0.1:6650", ["t"], report).to_dict())
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS, unwrap
from kop_dedup.pulsar.wire import PROP_PRODUCER_ID, PROP_SEQUENCE
from kop_dedup_tools.load_types import LoadReport, Ranges, Slot

__all__ = ["VerifyReport", "verify"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What reading the topics back found, for the load's producers."""

    read: int
    """Records of the load's producers read back."""
    expected: int
    """Records the producers were told were delivered."""
    lost: int
    """Delivered but not read back."""
    duplicated: int
    """Extra copies read (a record read 3 times counts 2)."""
    out_of_order: int
    """Records read after a higher sequence of the same producer on the same partition."""
    unexpected: int
    """Records never sent, or not delivered nor given up (should be impossible)."""
    uncertain_stored: int
    """Records of batches given up without an answer that are stored after all."""
    corrupt: int
    """Records whose value does not name their producer, partition and sequence."""
    other: int
    """Records of other producers on the same topics (ignored)."""
    seconds: float

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.unexpected) and (
            not self.corrupt
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _seqs(runs: Ranges) -> set[int]:
    return {(first + i) % SEQ_MODULUS for first, n in runs for i in range(n)}


def verify(
    service_url: str,
    topics: Sequence[str],
    expected: LoadReport | Mapping[Slot, Ranges],
    *,
    partitions: int | None = None,
    uncertain: Mapping[Slot, Ranges] | None = None,
    tenant: str = "public",
    namespace: str = "kafka",
    read_timeout_ms: int = 30_000,
) -> VerifyReport:
    """Read each partition of ``topics`` from the earliest; compare with what was delivered.

    ``expected`` is a :class:`LoadReport` (its ``delivered`` and ``uncertain``)
    or a mapping of slot -> delivered runs. ``partitions`` defaults to the
    highest partition the expectation names, plus one.
    """
    import pulsar  # noqa: PLC0415 - the CLI's load path does not need the client

    if isinstance(expected, LoadReport):
        uncertain = expected.uncertain if uncertain is None else uncertain
        expected = expected.delivered
    want = {slot: _seqs(runs) for slot, runs in expected.items()}
    maybe = {slot: _seqs(runs) for slot, runs in (uncertain or {}).items()}
    pids = {pid for _, _, pid in [*want, *maybe]}
    started = time.monotonic()
    seen: Counter[tuple[Slot, int]] = Counter()
    out_of_order = corrupt = other = 0
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for topic in topics:
            count = partitions or 1 + max((p for t, p, _ in want if t == topic), default=0)
            for p in range(count):
                reader = client.create_reader(
                    f"persistent://{tenant}/{namespace}/{topic}-partition-{p}",
                    pulsar.MessageId.earliest,
                )
                last: dict[int, int] = {}
                try:
                    while reader.has_message_available():
                        msg = reader.read_next(read_timeout_ms)
                        props = msg.properties()
                        pid = int(props.get(PROP_PRODUCER_ID, "-1"))
                        if pid not in pids:
                            other += 1
                            continue
                        seq = int(props[PROP_SEQUENCE])
                        ext = unwrap(seq, last.get(pid))
                        if pid in last and ext < last[pid]:
                            out_of_order += 1
                        last[pid] = max(ext, last.get(pid, ext))
                        seen[((topic, p, pid), seq)] += 1
                        if not msg.data().startswith(f"{pid}:{p}:{seq}:".encode()):
                            corrupt += 1
                finally:
                    reader.close()
    finally:
        client.close()
    expected_keys = {(slot, s) for slot, seqs in want.items() for s in seqs}
    maybe_keys = {(slot, s) for slot, seqs in maybe.items() for s in seqs}
    return VerifyReport(
        read=sum(seen.values()),
        expected=len(expected_keys),
        lost=sum(1 for key in expected_keys if key not in seen),
        duplicated=sum(c - 1 for c in seen.values() if c > 1),
        out_of_order=out_of_order,
        unexpected=sum(1 for key in seen if key not in expected_keys and key not in maybe_keys),
        uncertain_stored=sum(1 for key in seen if key in maybe_keys),
        corrupt=corrupt,
        other=other,
        seconds=round(time.monotonic() - started, 3),
    )
