"""Consumer-group lag gauges: client-chosen names bounded and escaped, series capped, the
exposition parseable whatever the names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kop_dedup.observability.groups import MAX_LABEL_CHARS, OTHER, group_gauges, label_value
from kop_dedup.observability.metrics import render
from kop_dedup.observability.stats import Stats
from kop_dedup.protocol.groups import LagRow


def row(group: str, lag: int, *, member: str | None = None, minimum: bool = False) -> LagRow:
    return LagRow(
        group=group,
        topic="t",
        partition=0,
        member=member,
        minimum=minimum,
        end=100,
        committed=100 - lag,
        ready=None if minimum else lag - 1,
        inflight=None if minimum else 1,
        lag=lag,
        oldest_inflight_s=None if minimum else float(lag),
    )


def parsed(families) -> dict[str, list]:
    text = render(Stats(), {}, (), families)
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_plain_names_are_their_own_labels_others_a_stable_hash():
    assert label_value("orders.eu-1") == "orders.eu-1"
    assert label_value("héllo") == "héllo"
    for hostile in ("~other", "x" * (MAX_LABEL_CHARS + 1), "a\nb", "", "\x00"):
        label = label_value(hostile)
        assert label.startswith("~id-")
        assert len(label) == 20
        assert label == label_value(hostile)
    assert label_value("a\nb") != label_value("a\rb")


def test_every_number_is_a_gauge_labelled_by_group_topic_partition_and_member():
    samples = parsed(group_gauges([row("g", 7), row("b", 3, member="m1")], max_series=10))
    lag = {
        (s.labels["group"], s.labels["member"]): s.value
        for s in samples["kop_dedup_group_lag_records"]
    }
    assert lag == {("g", ""): 7, ("b", "m1"): 3}
    assert {s.value for s in samples["kop_dedup_group_inflight_records"]} == {1}
    assert {s.value for s in samples["kop_dedup_group_end_offset"]} == {100}
    assert samples["kop_dedup_group_rows_not_shown"][0].value == 0


def test_a_broadcast_minimum_row_has_no_ready_or_inflight():
    samples = parsed(group_gauges([row("g", 4, minimum=True)], max_series=10))
    assert [s.labels["member"] for s in samples["kop_dedup_group_committed_offset"]] == ["~minimum"]
    assert samples["kop_dedup_group_ready_records"] == []
    assert samples["kop_dedup_group_inflight_records"] == []


def test_past_max_series_the_least_lagging_rows_are_summed_under_other():
    rows = [row(f"g{i}", lag) for i, lag in enumerate([5, 50, 1, 20, 2])]
    samples = parsed(group_gauges(rows, max_series=2))
    lag = {s.labels["group"]: s.value for s in samples["kop_dedup_group_lag_records"]}
    assert lag == {"g1": 50, "g3": 20, OTHER: 8}
    ready = {s.labels["group"]: s.value for s in samples["kop_dedup_group_ready_records"]}
    assert ready[OTHER] == 4 + 0 + 1
    oldest = {
        s.labels["group"]: s.value for s in samples["kop_dedup_group_oldest_inflight_seconds"]
    }
    assert oldest[OTHER] == 5.0  # the oldest of those summed
    assert "kop_dedup_group_end_offset" in samples
    assert OTHER not in {s.labels["group"] for s in samples["kop_dedup_group_end_offset"]}
    assert samples["kop_dedup_group_rows_not_shown"][0].value == 3


@given(groups=st.lists(st.text(max_size=300), min_size=1, max_size=30))
def test_any_group_names_leave_the_scrape_parseable_and_bounded(groups):
    rows = [row(g, i, member=g[:5] or None) for i, g in enumerate(groups)]
    samples = parsed(group_gauges(rows, max_series=10))
    lags = samples["kop_dedup_group_lag_records"]
    assert len(lags) <= 11
    for s in lags:
        assert len(s.labels["group"]) <= MAX_LABEL_CHARS
        assert s.labels["group"].isprintable()
