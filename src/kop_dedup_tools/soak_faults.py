"""The soak's faults: what each one does to the cluster, and the seeded schedule of them.

A fault is a :class:`FaultKind` in :data:`FAULT_KINDS`: a name, a sentence of help, how
its parameters are drawn from the schedule's random generator (``draw``), and what it
does to a :class:`FaultTarget` with them (``apply``, which returns once the cluster is
back: a restarted sidecar ready, a restarted broker answering its health check). The
schedule (:func:`plan`) is drawn whole from the seed before the run starts and printed,
so a run that found a violation replays with the same ``--seed``: the same faults, in
the same order, on the same sidecars, with the same pauses and gaps (how far the copy
has got when each one lands depends on the machine's speed and is not replayed).

A new fault (the cluster work's ownership moves, a network cut) is one more entry::

    FAULT_KINDS["ownership-move"] = FaultKind(
        "ownership-move",
        "move sidecar N's state partitions to another member",
        draw=lambda rng, sidecars: {"sidecar": rng.randrange(sidecars)},
        apply=lambda target, params: target.move_ownership(params["sidecar"]),
    )

(with ``move_ownership`` added to :class:`FaultTarget` and to the soak's cluster).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "FAULT_KINDS",
    "FaultKind",
    "FaultTarget",
    "PlannedFault",
    "describe",
    "plan",
]


class FaultTarget(Protocol):
    """What the faults act on: the soak's broker and sidecars (by index)."""

    def kill_sidecar(self, index: int) -> None: ...
    def terminate_sidecar(self, index: int) -> None: ...
    def start_sidecar(self, index: int) -> None: ...
    def kill_broker(self) -> None: ...
    def start_broker(self) -> None: ...
    def pause_broker(self) -> None: ...
    def resume_broker(self) -> None: ...


Params = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    help: str
    draw: Callable[[random.Random, int], Params]
    """(the schedule's generator, how many sidecars) -> this fault's parameters."""
    apply: Callable[[FaultTarget, Mapping[str, Any]], None]
    """Do it; return once the cluster is back up."""


def _sidecar_restart(*, graceful: bool) -> Callable[[FaultTarget, Mapping[str, Any]], None]:
    def apply(target: FaultTarget, params: Mapping[str, Any]) -> None:
        index = int(params["sidecar"])
        if graceful:
            target.terminate_sidecar(index)
        else:
            target.kill_sidecar(index)
        time.sleep(float(params["down_s"]))
        target.start_sidecar(index)

    return apply


def _broker_kill(target: FaultTarget, params: Mapping[str, Any]) -> None:
    target.kill_broker()
    time.sleep(float(params["down_s"]))
    target.start_broker()


def _broker_pause(target: FaultTarget, params: Mapping[str, Any]) -> None:
    target.pause_broker()
    try:
        time.sleep(float(params["pause_s"]))
    finally:
        target.resume_broker()


def _down(low: float, high: float) -> Callable[[random.Random, int], Params]:
    return lambda rng, sidecars: {
        "sidecar": rng.randrange(sidecars),
        "down_s": round(rng.uniform(low, high), 1),
    }


FAULT_KINDS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind(
            "sidecar-kill",
            "SIGKILL a sidecar (a crash), start it again after 0-2 s",
            draw=_down(0.0, 2.0),
            apply=_sidecar_restart(graceful=False),
        ),
        FaultKind(
            "sidecar-term",
            "SIGTERM a sidecar (a graceful stop), start it again after 0-1 s",
            draw=_down(0.0, 1.0),
            apply=_sidecar_restart(graceful=True),
        ),
        FaultKind(
            "broker-kill",
            "SIGKILL the Pulsar broker (its whole process group), start it again after 0-3 s",
            draw=lambda rng, _sidecars: {"down_s": round(rng.uniform(0.0, 3.0), 1)},
            apply=_broker_kill,
        ),
        FaultKind(
            "broker-pause",
            "SIGSTOP the Pulsar broker for 2-6 s, then SIGCONT",
            draw=lambda rng, _sidecars: {"pause_s": round(rng.uniform(2.0, 6.0), 1)},
            apply=_broker_pause,
        ),
        FaultKind(
            "takeover",
            "stop a sidecar gracefully and keep it down 4-8 s, so the other takes over its "
            "state partitions (transaction log, group offsets), then start it again",
            draw=_down(4.0, 8.0),
            apply=_sidecar_restart(graceful=True),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class PlannedFault:
    index: int
    kind: str
    gap_s: float
    """Seconds to wait (copying) before applying it."""
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "gap_s": self.gap_s, **self.params}


def plan(
    seed: int,
    count: int,
    *,
    kinds: Sequence[str] | None = None,
    gap_s: tuple[float, float] = (3.0, 8.0),
    sidecars: int = 2,
    registry: Mapping[str, FaultKind] = FAULT_KINDS,
) -> list[PlannedFault]:
    """``count`` faults drawn from ``seed``: the kinds in rounds (each round every kind
    once, in a shuffled order, so a short schedule still has each kind), each with its
    gap and its parameters. The same arguments give the same schedule."""
    names = list(kinds) if kinds is not None else list(registry)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {sorted(registry)}")
    if not names and count:
        raise ValueError("no fault kinds to draw from")
    low, high = gap_s
    if not 0 <= low <= high:
        raise ValueError(f"the gap range must be 0 <= low <= high, not {gap_s}")
    rng = random.Random(seed)  # noqa: S311 - a schedule to replay, not a secret
    out: list[PlannedFault] = []
    round_: list[str] = []
    for index in range(count):
        if not round_:
            round_ = names.copy()
            rng.shuffle(round_)
        name = round_.pop(0)
        gap = round(rng.uniform(low, high), 1)
        out.append(PlannedFault(index, name, gap, registry[name].draw(rng, sidecars)))
    return out


def describe(fault: PlannedFault) -> str:
    """One line: ``#3 broker-pause after 5.2s (pause_s=3.1)``."""
    params = ", ".join(f"{k}={v}" for k, v in fault.params.items())
    return f"#{fault.index} {fault.kind} after {fault.gap_s}s" + (f" ({params})" if params else "")
