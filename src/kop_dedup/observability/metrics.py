"""Prometheus text exposition (format 0.0.4) of :class:`~kop_dedup.observability.stats.Stats`.

Written by hand, not with ``prometheus_client``: counting stays a dict
increment on the produce path, and the text is built only when scraped.
What keeps a scrape parseable whatever clients send:

- label values are escaped as the format says (backslash, double quote,
  line feed: :func:`escape_label_value`);
- and before that, :class:`Stats` only ever uses a valid Kafka topic name or
  one of its two fixed labels as a ``topic`` value, and at most
  ``max_topics`` distinct names (so the series count is bounded too).

>>> escape_label_value('bad"} 1\\nfake{x="')
'bad\\\\"} 1\\\\nfake{x=\\\\"'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kop_dedup.observability.stats import OUTCOMES, Stats

__all__ = ["CONTENT_TYPE", "Counter", "escape_label_value", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    """A label value as the text format wants it between double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        self.lines.append(f"{name}{_labels(labels)} {value}")


Counter = tuple[str, str, Sequence[tuple[Mapping[str, str], float]]]
"""(name without the ``kop_dedup_`` prefix, help, [(labels, value)]): a counter family
with fixed label values (no client-chosen label ever goes here)."""


def render(
    stats: Stats,
    gauges: Mapping[str, float],
    counters: Sequence[Counter] = (),
    labelled_gauges: Sequence[Counter] = (),
) -> str:
    """The whole exposition: per-topic counters, the latency histogram, ``counters``
    (the coordinators'), ``gauges``, ``labelled_gauges``.

    ``gauges`` maps a name (without the ``kop_dedup_`` prefix) to its value;
    ``labelled_gauges`` are gauge families shaped as :data:`Counter` whose label values
    the caller has bounded (consumer-group lag: :mod:`kop_dedup.observability.groups`).
    """
    out = _Text()
    topics = sorted(stats.by_topic.items())
    out.family("kop_dedup_batches_total", "counter", "Kafka batches by outcome and topic.")
    for topic, c in topics:
        for o in OUTCOMES:
            out.sample("kop_dedup_batches_total", c.batches[o], topic=topic, outcome=o)
    out.family("kop_dedup_records_total", "counter", "Kafka records by outcome and topic.")
    for topic, c in topics:
        for o in OUTCOMES:
            out.sample("kop_dedup_records_total", c.records[o], topic=topic, outcome=o)
    out.family(
        "kop_dedup_dedup_state_lost_total",
        "counter",
        "Resends the broker stored again (its deduplication state for the producer was gone).",
    )
    for topic, c in topics:
        out.sample("kop_dedup_dedup_state_lost_total", c.dedup_state_lost, topic=topic)
    out.family("kop_dedup_batch_latency_seconds", "histogram", "Time to answer one batch.")
    cumulative = 0
    for le, n in stats.latency_buckets():
        cumulative += n
        out.sample("kop_dedup_batch_latency_seconds_bucket", cumulative, le=le)
    out.sample("kop_dedup_batch_latency_seconds_sum", stats.latency_sum)
    out.sample("kop_dedup_batch_latency_seconds_count", cumulative)
    _families(out, "counter", counters)
    for name, value in sorted(gauges.items()):
        out.lines.append(f"# TYPE kop_dedup_{name} gauge")
        out.sample(f"kop_dedup_{name}", value)
    _families(out, "gauge", labelled_gauges)
    return "\n".join(out.lines) + "\n"


def _families(out: _Text, kind: str, families: Sequence[Counter]) -> None:
    for name, help_text, samples in families:
        out.family(f"kop_dedup_{name}", kind, help_text)
        for labels, value in samples:
            out.sample(f"kop_dedup_{name}", value, **labels)
