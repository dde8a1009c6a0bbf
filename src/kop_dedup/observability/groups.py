"""Consumer-group lag as Prometheus gauges, with label values and series bounded.

The rows come from ``GroupLag`` (``coordination/groups/lag.py``) (refreshed in
the background by the sidecar that owns each group's partition); this module only
turns them into gauge families for :func:`~kop_dedup.observability.metrics.render`.

Group ids, member ids and topics come from clients, so, as for topics in
:mod:`~kop_dedup.observability.stats`:

- a **label value** is the name itself when it is short (at most
  :data:`MAX_LABEL_CHARS`), printable and does not start with ``~``; any other name is
  written ``~id-<16 hex digits of its SHA-256>`` (stable, so a series keeps its name
  across scrapes; ``~`` marks labels we made). The text format escaping is
  :func:`~kop_dedup.observability.metrics.escape_label_value`'s.
- the **series** are bounded: the ``max_series`` rows with the largest lag are
  exported one by one; the others are summed into one row labelled
  ``group="~other"`` (``ready``, ``inflight``, ``lag``; the oldest age is their
  maximum), and ``kop_dedup_group_rows_not_shown`` says how many rows that was.

>>> label_value("orders-eu"), label_value("~x")[:4], len(label_value("x" * 500))
('orders-eu', '~id-', 20)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from kop_dedup.protocol.groups import LagRow

__all__ = ["MAX_LABEL_CHARS", "OTHER", "group_gauges", "label_value"]

MAX_LABEL_CHARS = 200
OTHER = "~other"
"""The group (and topic) label of the rows summed together past ``max_series``."""

Family = tuple[str, str, Sequence[tuple[Mapping[str, str], float]]]
"""(name without the ``kop_dedup_`` prefix, help, [(labels, value)]): one gauge family."""

_FAMILIES = (
    ("group_end_offset", "end", "Next offset to be written to the partition (records)."),
    (
        "group_committed_offset",
        "committed",
        (
            "The group's committed offset (broadcast: the member's; member=\"~minimum\": "
            "the group's minimum over members seen within broadcastExpireMs)."
        ),
    ),
    ("group_ready_records", "ready", "Records on the server not handed out yet (end - pulled)."),
    (
        "group_inflight_records",
        "inflight",
        "Records handed to a consumer and not committed (pulled - committed).",
    ),
    ("group_lag_records", "lag", "Records not committed (end - committed)."),
    (
        "group_oldest_inflight_seconds",
        "oldest_inflight_s",
        "Age of the oldest record handed out and not committed.",
    ),
)
_SUMMED = frozenset({"ready", "inflight", "lag"})


def label_value(name: str) -> str:
    """A client-chosen name as a bounded label value (see the module docstring)."""
    if name and len(name) <= MAX_LABEL_CHARS and name.isprintable() and not name.startswith("~"):
        return name
    return "~id-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _labels(row: LagRow) -> dict[str, str]:
    member = "~minimum" if row.minimum else label_value(row.member) if row.member else ""
    return {
        "group": label_value(row.group),
        "topic": label_value(row.topic),
        "partition": str(row.partition),
        "member": member,
    }


def group_gauges(rows: Iterable[LagRow], max_series: int) -> list[Family]:
    """Gauge families for ``rows``: at most ``max_series`` rows by name, the rest summed
    under :data:`OTHER`."""
    ordered = sorted(rows, key=lambda r: (-(r.lag or 0), r.group, r.topic, r.partition))
    shown, rest = ordered[:max_series], ordered[max_series:]
    families: list[Family] = []
    for name, attr, help_text in _FAMILIES:
        samples: list[tuple[Mapping[str, str], float]] = []
        for row in shown:
            value = getattr(row, attr)
            if value is not None:
                samples.append((_labels(row), float(value)))
        if rest and attr in _SUMMED | {"oldest_inflight_s"}:
            values = [getattr(r, attr) for r in rest if getattr(r, attr) is not None]
            if values:
                total = max(values) if attr == "oldest_inflight_s" else sum(values)
                other = {"group": OTHER, "topic": OTHER, "partition": "", "member": ""}
                samples.append((other, float(total)))
        families.append((name, help_text, samples))
    families.append(
        (
            "group_rows_not_shown",
            (
                'Group partition rows summed under group="~other" (beyond '
                "KOP_DEDUP_GROUP_METRICS_MAX_SERIES)."
            ),
            [({}, float(len(rest)))],
        )
    )
    return families
