"""Latency arithmetic shared by the load driver and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["latency_summary_ms", "percentile", "percentile_ms"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks
    (numpy's default); 0.0 for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """The q-th percentile of latencies given in seconds, in milliseconds (0.01 ms).

    >>> percentile_ms([0.001, 0.002, 0.003, 0.004], 50)
    2.5
    """
    return round(percentile(seconds, q) * 1000, 2)


def latency_summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of latencies given in seconds, in milliseconds (0.1 ms);
    empty for no samples."""
    if not seconds:
        return {}
    return {
        "p50": round(percentile(seconds, 50) * 1000, 1),
        "p99": round(percentile(seconds, 99) * 1000, 1),
        "max": round(max(seconds) * 1000, 1),
    }
