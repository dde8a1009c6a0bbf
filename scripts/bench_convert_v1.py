"""Convert docs/bench's results files from format 1 (a layout per mode) to format 2 (one
cell shape for every mode), once; check that every best repetition and ratio of the old
summary comes out of the new one unchanged; write the plots again.

    PYTHONPATH=src python scripts/bench_convert_v1.py docs/bench
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench import groups, kafka, kafka_groups, memory, produce, txn
from kop_dedup_tools.bench.cells import Cell, Workload, extras
from kop_dedup_tools.bench.results import Results

CONVERTED = "converted once from format 1 (figures unchanged; reps numbered in the cells' order)"


def cpu_s(pct: float | None, seconds: float) -> float | None:
    return None if pct is None else pct * seconds / 100


def client_us(pct: float | None, seconds: float, records: int) -> float | None:
    cpu = cpu_s(pct, seconds)
    return None if cpu is None or not records else round(cpu / records * 1e6, 2)


class Reps:
    """The repetition number of each cell, counted per (workload, target) in order."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[Workload, str]] = Counter()

    def __call__(self, w: Workload, target: str) -> int:
        self.seen[w, target] += 1
        return self.seen[w, target]


def matrix(old: dict[str, Any]) -> Results:
    rep, cells = Reps(), []
    half = old.get("half_load") or {}
    pairs = [(c, None) for c in old["cells"]]
    pairs += [(half[t], half["rate"]) for t in ("direct", "sidecar") if half]
    for c, rate in pairs:
        w = Workload("produce", c["producers"], c["batch_size"], rate)
        cells.append(
            Cell(
                w,
                c["mode"],
                rep(w, c["mode"]),
                c["records"],
                c["seconds"],
                c["p50_ms"],
                c["p99_ms"],
                cpu_s(c["cpu_pct"], c["seconds"]),
                c["rss_mb"],
                extras(batches=c["batches"]),
            )
        )
    setup = {"sidecars": old["sidecars"], "converted": CONVERTED}
    return Results("produce", produce.TITLE, produce.COMPARE, cells, setup, old["broker"])


def transactions(old: dict[str, Any]) -> Results:
    rep, cells = Reps(), []
    for c in old["cells"]:
        w = Workload("rounds", c["producers"], txn.ROUND)
        own = ("rounds", "rounds_per_s", "visible_p50_ms", "visible_p99_ms", "end_p50_ms")
        own += ("end_p99_ms", "applied_p50_ms", "applied_p99_ms", "unread_rounds")
        cells.append(
            Cell(
                w,
                c["mode"],
                rep(w, c["mode"]),
                c["records"],
                c["seconds"],
                c["produce_p50_ms"],
                c["produce_p99_ms"],
                cpu_s(c["cpu_pct"], c["seconds"]),
                extra=extras(**{k: c[k] for k in own}),
            )
        )
    setup = {"round": old["round"], "converted": CONVERTED}
    return Results("transactions", txn.TITLE, txn.COMPARE, cells, setup, old["broker"])


def group_cell(c: dict[str, Any], kind: str, cpu_key: str = "cpu_pct") -> Cell:
    lat = ("pull_p50_ms", "pull_p99_ms", "commit_p50_ms", "commit_p99_ms")
    own: dict[str, Any] = {"pulls": c["pulls"], **{k: c[k] for k in lat}, "drained": c["drained"]}
    if c["mode"] != "direct":
        own["gaps"] = c["gaps"]
    own["committed_ok"] = c["committed_ok"]
    own["join_s"] = c.get("join_s")
    own["client_cpu_us_per_record"] = client_us(c.get("client_cpu_pct"), c["seconds"], c["records"])
    return Cell(
        Workload(kind, c["members"], c["pull_records"]),
        c["mode"],
        c["rep"],
        c["records"],
        c["seconds"],
        c["cycle_p50_ms"],
        c["cycle_p99_ms"],
        cpu_s(c[cpu_key], c["seconds"]),
        c["rss_mb"],
        extras(**own),
    )


def groups_(old: dict[str, Any]) -> Results:
    cells = [group_cell(c, "pull") for c in old["cells"]]
    e2e = old.get("end_to_end") or {}
    for target in ("direct", "sidecar") if e2e else ():
        e = e2e[target]
        w = Workload("e2e", e2e["members"], e2e["produce_batch"], e2e["rate"])
        seconds = round(e["expected"] / e2e["rate"], 3)  # the paced window (not kept)
        own = extras(expected=e["expected"], max_ms=e["max_ms"])
        cells.append(Cell(w, target, 1, e["records"], seconds, e["p50_ms"], e["p99_ms"], extra=own))
    setup = {
        "partitions": old["partitions"],
        "e2e": {"produce_batch": e2e.get("produce_batch"), "wait_ms": e2e.get("wait_ms")},
        "converted": CONVERTED,
    }
    return Results("groups", groups.TITLE, groups.COMPARE, cells, setup, old["broker"])


def kafka_(old: dict[str, Any]) -> Results:
    rep, cells = Reps(), []
    for c in old["cells"]:
        size = c["txn_records"] if c["measure"] == "txn" else old["setup"]["records_per_batch"]
        w = Workload(c["measure"], c["producers"], size)
        own = extras(
            client_cpu_us_per_record=client_us(c["client_cpu_pct"], c["seconds"], c["records"])
        )
        cells.append(
            Cell(
                w,
                c["mode"],
                rep(w, c["mode"]),
                c["records"],
                c["seconds"],
                c["p50_ms"],
                c["p99_ms"],
                cpu_s(c["sidecar_cpu_pct"], c["seconds"]),
                extra=own,
            )
        )
    setup = {**old["setup"], "converted": CONVERTED}
    return Results("kafka", kafka.TITLE, kafka.COMPARE, cells, setup, old["broker"])


def kafka_groups_(old: dict[str, Any]) -> Results:
    cells = [group_cell(c, "consume") for c in old["cells"]["consume"]]
    for c in old["cells"]["ctp"]:
        own = extras(
            transactions=c["transactions"],
            drained=c["drained"],
            committed_ok=c["committed_ok"],
            join_s=c["join_s"],
            client_cpu_us_per_record=client_us(c["client_cpu_pct"], c["seconds"], c["records"]),
        )
        cells.append(
            Cell(
                Workload("ctp", c["copiers"], c["txn_records"]),
                c["mode"],
                c["rep"],
                c["records"],
                c["seconds"],
                c["p50_ms"],
                c["p99_ms"],
                cpu_s(c["sidecar_cpu_pct"], c["seconds"]),
                extra=own,
            )
        )
    setup = {**old["setup"], "converted": CONVERTED}
    compare = kafka_groups.COMPARE
    return Results("kafka-groups", kafka_groups.TITLE, compare, cells, setup, old["broker"])


def memory_(old: dict[str, Any]) -> Results:
    m = old["memory"]
    own = extras(
        rss_start_mb=m["rss_start_mb"],
        rss_open_mb=m["rss_open_mb"],
        idle_state_bytes=m["idle_state_bytes"],
    )
    w = Workload("idle-states", 64, 1)
    cells = [
        Cell(
            w,
            "sidecar",
            1,
            m["idle_states"],
            m["states_created_s"],
            rss_mb=m["rss_idle_mb"],
            extra=own,
        )
    ]
    for c in m["cost_per_batch"]:
        records = c["batches"] * 100
        cells.append(
            Cell(
                Workload("produce", c["producers"], 100),
                "sidecar",
                1,
                records,
                records / c["records_per_s"],
                sidecar_cpu_s=c["cpu_ms_per_batch"] * c["batches"] / 1000,
                extra=extras(batches=c["batches"], cpu_ms_per_batch=c["cpu_ms_per_batch"]),
            )
        )
    notes = [
        (
            "Converted from format 1: the cost-per-batch cells' CPU includes the producers' "
            "set-up (the only CPU that run kept), and their latencies were not kept."
        )
    ]
    setup = {"idle_states": m["idle_states"], "converted": CONVERTED}
    return Results("memory", memory.TITLE, memory.COMPARE, cells, setup, old["broker"], notes)


def check(old: dict[str, Any], new: Results) -> None:
    """Every best repetition and ratio of the old summary, unchanged in the new one."""
    summary = old.get("summary") or []
    if isinstance(summary, dict):
        summary = [*summary["consume"], *summary["ctp"]]
    rows = [r for r in new.rows() if r.workload.rate is None and r.workload.kind != "e2e"]
    if not summary:
        return
    assert len(rows) == len(summary), (len(rows), len(summary))
    for row, s in zip(rows, summary, strict=True):
        for target, cell in row.cells.items():
            assert s[target]["records_per_s"] == round(cell.records_per_s, 1), (target, s)
        if s.get("ratio") is not None:
            assert abs(s["ratio"] - (row.ratio or 0)) < 0.006, (s["ratio"], row.ratio)


CONVERTERS = {
    "bench.json": matrix,
    "transactions/transactions.json": transactions,
    "groups/groups.json": groups_,
    "kafka/kafka.json": kafka_,
    "kafka-groups/kafka-groups.json": kafka_groups_,
    "memory.json": memory_,
}


def main(root: Path) -> None:
    for name, convert in CONVERTERS.items():
        path = root / name
        old = json.loads(path.read_text())
        new = convert(old)
        new.machine = old["machine"]
        check(old, new)
        print(new.write(path.parent), end="\n\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
