"""``kop-dedup bench`` (the default mode): the sidecar against a direct Pulsar producer,
cell by cell over batch sizes x producer counts, then both paced at half the sidecar's
peak (:func:`half_load`: the latency the sidecar adds below its limit).

Each cell (batch size x producers) runs for ``--seconds`` per mode, ``--reps`` times,
the modes alternating on a fresh topic each; the producers are those of
:mod:`kop_dedup_tools.bench_produce`. The results (table, plot, ``bench.json``) are
written by :func:`kop_dedup_tools.bench.write_results`.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from kop_dedup_tools.bench_produce import direct_cell, sidecar_cell
from kop_dedup_tools.bench_results import Cell, Row, summarize
from kop_dedup_tools.bench_support import Sidecars, full_topic, new_topic, say, step

__all__ = ["half_load", "run_matrix"]


def run_matrix(args: argparse.Namespace, sc: Sidecars) -> tuple[list[Cell], dict[str, Any]]:
    """Every (batch size, producers, repetition, mode) cell, then the half-load run."""
    cells: list[Cell] = []
    for size in args.batch_sizes:
        for prods in args.producers:
            for rep in range(args.reps):
                for mode in ("direct", "sidecar"):
                    what = f"{mode} cell (batch {size}, {prods} producers, rep {rep + 1})"
                    with step(what, sc):
                        topic = new_topic(args)
                        if mode == "direct":
                            cell = asyncio.run(
                                direct_cell(
                                    args.pulsar_service_url,
                                    full_topic(topic),
                                    size,
                                    prods,
                                    args.seconds,
                                    args.value_size,
                                )
                            )
                        else:
                            cell = asyncio.run(
                                sidecar_cell(sc, topic, size, prods, args.seconds, args.value_size)
                            )
                    cells.append(cell)
                    say(
                        f"bench: batch {size:>4} producers {prods:>2} rep {rep + 1} {mode:>7}: "
                        f"{cell.records_per_s:>9,.0f} rec/s p99 {cell.p99_ms:6.1f} ms"
                    )
    with step("the half-load run", sc):
        half = half_load(args, sc, summarize(cells))
    return cells, half


def half_load(args: argparse.Namespace, sc: Sidecars, rows: list[Row]) -> dict[str, Any]:
    """Both modes paced at half the sidecar's peak (as the table shows it) at 100-record
    batches and the most producers up to 8: the latency the sidecar adds below its limit."""
    size, prods = 100, max((p for p in args.producers if p <= 8), default=None)
    row = next((r for r in rows if (r.batch_size, r.producers) == (size, prods)), None)
    if row is None or row.sidecar is None:  # no 100-record cell with at most 8 producers
        return {}
    rate = row.sidecar.records_per_s / 2
    d = asyncio.run(
        direct_cell(
            args.pulsar_service_url,
            full_topic(new_topic(args)),
            size,
            row.producers,
            args.seconds,
            args.value_size,
            rate=rate,
        )
    )
    s = asyncio.run(
        sidecar_cell(sc, new_topic(args), size, row.producers, args.seconds, args.value_size, rate)
    )
    say(
        f"bench: half load {rate:,.0f} rec/s: direct p99 {d.p99_ms:.2f} ms, "
        f"sidecar p99 {s.p99_ms:.2f} ms"
    )
    return {
        "rate": rate,
        "batch_size": size,
        "producers": row.producers,
        "direct": d.to_dict(),
        "sidecar": s.to_dict(),
        "added_p99_ms": s.p99_ms - d.p99_ms,
        "added_p50_ms": s.p50_ms - d.p50_ms,
    }
