"""``kop-dedup edges``: what a read_committed reader must see, as pure data (no I/O).

The model is Kafka's guarantee written down per partition: every value a producer was
told is committed (a plain record acknowledged, a transaction whose commit returned),
in the order it was written, once; nothing aborted; and a transaction whose outcome the
client could not learn (its commit raised, its producer was fenced) either whole in
every partition it wrote or nowhere.

>>> m = Model()
>>> m.topic("a", 2)
>>> m.committed("a", {0: ["x0", "x1"], 1: ["y0"]})
>>> m.aborted(["z0"])
>>> m.check("a", {0: ["x0", "x1"], 1: ["y0"]})
[]
>>> m.check("a", {0: ["x0", "x0", "x1"], 1: ["z0", "y0"]})[0]
'a-0: read x0 twice'
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Model", "Pending"]


@dataclass(slots=True)
class Pending:
    """A transaction whose outcome the client did not learn: all or nothing."""

    topic: str
    values: dict[int, list[str]]


@dataclass(slots=True)
class Model:
    """Expected contents of each live topic (see the module docstring)."""

    partitions: dict[str, int] = field(default_factory=dict)
    expected: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    forbidden: set[str] = field(default_factory=set)
    pending: list[Pending] = field(default_factory=list)

    def topic(self, name: str, count: int) -> None:
        """A topic created (or grown to ``count`` partitions)."""
        self.partitions[name] = count
        parts = self.expected.setdefault(name, {})
        for p in range(count):
            parts.setdefault(p, [])

    def deleted(self, name: str) -> None:
        self.partitions.pop(name, None)
        self.expected.pop(name, None)
        self.pending = [p for p in self.pending if p.topic != name]

    def committed(self, name: str, values: dict[int, list[str]]) -> None:
        for p, vs in values.items():
            self.expected[name][p].extend(vs)

    def aborted(self, values: list[str]) -> None:
        self.forbidden.update(values)

    def uncertain(self, name: str, values: dict[int, list[str]]) -> None:
        self.pending.append(Pending(name, values))

    def waiting_for(self, name: str, got: dict[int, list[str]]) -> list[str]:
        """What a reader still has to see before the topic can be judged: committed values
        not read yet, and a pending transaction read in part (it must complete)."""
        seen = {v for vs in got.values() for v in vs}
        out = [
            f"{name}-{p}: {len([v for v in vs if v not in seen])} committed value(s) not read"
            for p, vs in self.expected.get(name, {}).items()
            if any(v not in seen for v in vs)
        ]
        for pending in self._pending(name):
            flat = [v for vs in pending.values.values() for v in vs]
            read = sum(v in seen for v in flat)
            if 0 < read < len(flat):
                out.append(f"{name}: a transaction of unknown outcome read {read} of {len(flat)}")
        return out

    def _pending(self, name: str) -> list[Pending]:
        return [p for p in self.pending if p.topic == name]

    def _unknown_outcomes(
        self, name: str, seen: Counter[str], out: list[str]
    ) -> dict[int, set[str]]:
        """The values of transactions of unknown outcome, by partition (each judged all or
        nothing into ``out``)."""
        maybe: dict[int, set[str]] = {}
        for pending in self._pending(name):
            flat = [v for vs in pending.values.values() for v in vs]
            read = sum(v in seen for v in flat)
            if 0 < read < len(flat):
                out.append(
                    f"{name}: a transaction of unknown outcome read {read} of {len(flat)} "
                    "(not all or nothing)"
                )
            for p, vs in pending.values.items():
                maybe.setdefault(p, set()).update(vs)
        return maybe

    def check(self, name: str, got: dict[int, list[str]]) -> list[str]:
        """Violations in what a read_committed reader read of ``name`` from offset 0 to
        each partition's end (values per partition, in offset order)."""
        out: list[str] = []
        seen = Counter(v for vs in got.values() for v in vs)
        for value, n in sorted(seen.items()):
            if n > 1:
                where = next(p for p, vs in got.items() if value in vs)
                out.append(f"{name}-{where}: read {value} twice")
        aborted = sorted(v for v in seen if v in self.forbidden)
        out.extend(f"{name}: read {v}, of an aborted transaction" for v in aborted[:5])
        maybe = self._unknown_outcomes(name, seen, out)
        for p, want in sorted(self.expected.get(name, {}).items()):
            have = [v for v in got.get(p, []) if v not in maybe.get(p, set())]
            have = [v for v in have if v not in self.forbidden]
            if have == want:
                continue
            missing = [v for v in want if v not in set(have)]
            extra = [v for v in have if v not in set(want)]
            if missing:
                out.append(
                    f"{name}-{p}: {len(missing)} committed value(s) lost, first {missing[0]}"
                )
            if extra:
                out.append(
                    f"{name}-{p}: {len(extra)} value(s) never written here, first {extra[0]}"
                )
            if not missing and not extra and len(have) == len(want):
                first = next(i for i, (a, b) in enumerate(zip(have, want, strict=True)) if a != b)
                out.append(f"{name}-{p}: out of order at offset {first}: {have[first]}")
        return out
