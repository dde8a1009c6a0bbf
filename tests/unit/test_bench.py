from __future__ import annotations

from kop_dedup_tools.bench import Cell, render_table


def test_table_shows_the_sidecar_to_direct_ratio():
    cells = [
        Cell("direct", 100, 8, records=20_000, batches=200, seconds=2.0, p50_ms=5, p99_ms=9),
        Cell(
            "sidecar",
            100,
            8,
            records=18_000,
            batches=180,
            seconds=2.0,
            p50_ms=6,
            p99_ms=11,
            cpu_pct=80,
            rss_mb=90,
        ),
        Cell(
            "sidecar",
            100,
            8,
            records=1,
            batches=1,
            seconds=2.0,
            p50_ms=1,
            p99_ms=1,
            rate_limited=500.0,
        ),
    ]
    table = render_table(cells)
    row = table.splitlines()[-1]
    assert row.split()[0:2] == ["100", "8"]
    assert row.rstrip().endswith("0.90")
    assert "10,000" in row
    assert "9,000" in row
