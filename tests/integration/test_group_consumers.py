"""Consumers as they behave, against the real broker: ready vs inflight counted exactly
(RIP-48 point 2) in JSON, in /metrics and as Pulsar's own subscription backlog; a
member whose session expires hands its inflight records to another; a client that
goes away mid-poll loses nothing; unknown groups and members get 404 and 409."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kop_dedup.coordination.groups.lag import subscription_name
from kop_dedup_tools.topics import create_topic
from tests.helpers import gauges, uniq
from tests.integration.groups import (
    NS,
    commit,
    configure,
    join,
    lag,
    offsets,
    poll,
    produce,
    pull,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def numbers(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in ("end", "committed", "pulled", "ready", "inflight", "lag"))


def test_lag_counts_records_exactly_across_batched_entries_ready_versus_inflight(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 23, per_batch=5)  # entries of 5, 5, 5, 5 and 3 records
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    assert numbers(lag(g, group)[(topic, 0)]) == (23, None, None, None, None, None)
    assert offsets(pull(g, group, member, 12)) == list(range(12))  # ends inside an entry
    r = commit(g, group, member, offsets=[{"topic": topic, "partition": 0, "offset": 7}])
    assert r.json()["committed"] == [{"topic": topic, "partition": 0, "offset": 7}]
    row = lag(g, group)[(topic, 0)]
    assert numbers(row) == (23, 7, 12, 11, 5, 16)
    assert row["oldestInflightMs"] >= 0
    produce(g, topic, 4, per_batch=4)  # one more entry: end 27
    assert numbers(lag(g, group)[(topic, 0)]) == (27, 7, 12, 15, 5, 20)
    assert offsets(pull(g, group, member, 100)) == list(range(12, 27))
    assert numbers(lag(g, group)[(topic, 0)]) == (27, 7, 27, 0, 20, 20)
    assert commit(g, group, member).json()["committed"][0]["offset"] == 27
    row = lag(g, group)[(topic, 0)]
    assert numbers(row) == (27, 27, 27, 0, 0, 0)
    assert row["oldestInflightMs"] is None


def test_the_oldest_inflight_age_is_that_of_the_pull_holding_the_committed_offset(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 6)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    start = [{"topic": topic, "partition": 0, "offset": 0}]
    assert commit(g, group, member, offsets=start).status_code == 200
    assert offsets(pull(g, group, member, 3)) == [0, 1, 2]
    first = lag(g, group)[(topic, 0)]["oldestInflightMs"]
    poll("the first pull to age", lambda: lag(g, group)[(topic, 0)]["oldestInflightMs"] > 300)
    assert offsets(pull(g, group, member, 3)) == [3, 4, 5]
    old = lag(g, group)[(topic, 0)]["oldestInflightMs"]
    assert old > 300 >= first
    to_three = [{"topic": topic, "partition": 0, "offset": 3}]
    assert commit(g, group, member, offsets=to_three).status_code == 200
    assert lag(g, group)[(topic, 0)]["oldestInflightMs"] < old  # now the second pull's


def subscription(api: httpx.Client, admin_url: str, topic: str, group: str) -> dict[str, Any]:
    path = f"{NS}/{topic}-partition-0".removeprefix("persistent://")
    stats = httpx.get(f"{admin_url}/admin/v2/persistent/{path}/stats", timeout=30).json()
    return stats.get("subscriptions", {}).get(subscription_name(group)) or {}


def test_the_durable_subscription_follows_commits_and_pulsar_admin_shows_the_lag(pulsar, g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10)  # one record per entry: Pulsar's backlog (entries) is the lag
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    assert offsets(pull(g, group, member, 6)) == list(range(6))
    assert commit(g, group, member).status_code == 200
    assert subscription_name(group) == f"kop-group-{group}"
    sub = poll(
        "the subscription at the commit",
        lambda: (s := subscription(g, pulsar.admin_url, topic, group)).get("msgBacklog") == 4 and s,
    )
    assert sub["msgBacklog"] == lag(g, group)[(topic, 0)]["lag"] == 4
    pull(g, group, member, 100)
    assert commit(g, group, member).status_code == 200
    poll(
        "the subscription at the end",
        lambda: subscription(g, pulsar.admin_url, topic, group).get("msgBacklog") == 0,
    )
    assert lag(g, group)[(topic, 0)]["lag"] == 0


def test_with_batched_entries_the_subscription_backlog_counts_entries_not_fully_committed(
    pulsar, g
):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10, per_batch=4)  # entries of 4, 4 and 2 records
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    pull(g, group, member, 6)
    assert commit(g, group, member).status_code == 200  # inside the second entry

    def backlog() -> Any:
        return subscription(g, pulsar.admin_url, topic, group).get("msgBacklog")

    poll("the backlog of entries 2 and 3", lambda: backlog() == 2)
    assert lag(g, group)[(topic, 0)]["lag"] == 4
    pull(g, group, member, 2)
    assert commit(g, group, member).status_code == 200  # at an entry's end
    poll("the backlog of entry 3", lambda: backlog() == 1)
    assert lag(g, group)[(topic, 0)]["lag"] == 2


def lag_metrics(api: httpx.Client, group: str) -> dict[str, float]:
    """The group's gauges from /metrics by family name (its first row)."""
    out = {}
    for family in text_string_to_metric_families(api.get("/metrics").text):
        for sample in family.samples:
            if sample.labels.get("group") == group:
                out[sample.name.removeprefix("kop_dedup_group_")] = sample.value
    return out


def test_lag_gauges_in_metrics_are_refreshed_by_the_owner_with_the_json_numbers(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 9, per_batch=3)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    pull(g, group, member, 5)
    commit(g, group, member, offsets=[{"topic": topic, "partition": 0, "offset": 2}])
    want = {
        "end_offset": 9,
        "committed_offset": 2,
        "ready_records": 4,
        "inflight_records": 3,
        "lag_records": 7,
    }
    got = poll(
        "the gauges",
        lambda: (m := lag_metrics(g, group)) and {k: m.get(k) for k in want} == want and m,
    )
    assert got["oldest_inflight_seconds"] >= 0
    text = g.get("/metrics").text
    assert f'group="{group}",topic="{topic}",partition="0",member=""' in text
    assert "kop_dedup_group_rows_not_shown 0" in text


def test_gauges_keep_hostile_group_ids_bounded_and_the_scrape_parseable(pulsar):
    topic = uniq("gt")
    hostile = ['bad"} 1\nfake{x="', "~other", "x" * 300, "héllo"]
    with (
        ThreadSidecar(
            pulsar,
            system_namespace=uniq("kop-dedup-gauges"),  # its own store: only these groups
            group_lag_interval_ms=100,
            group_metrics_max_series=2,
        ) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        produce(api, topic, 3)
        for i, name in enumerate(hostile):
            group = quote(name, safe="")  # the sidecar sees the name itself
            configure(api, group)
            member = join(api, group, [topic])["memberId"]
            pull(api, group, member, i + 1)
            commit(api, group, member, offsets=[{"topic": topic, "partition": 0, "offset": 0}])

        def families() -> Any:
            text = api.get("/metrics").text
            parsed = {f.name: f for f in text_string_to_metric_families(text)}
            shown = parsed.get("kop_dedup_group_rows_not_shown")
            lags = parsed.get("kop_dedup_group_lag_records")
            summed = (
                [s.value for s in lags.samples if s.labels["group"] == "~other"] if lags else []
            )
            return shown and shown.samples[0].value == 2 and summed == [6] and parsed

        parsed = poll("two rows shown, two summed", families)
        lags = parsed["kop_dedup_group_lag_records"].samples
        assert len(lags) == 3  # two rows and ~other
        labels = {s.labels["group"] for s in lags}
        assert "~other" in labels
        assert all(len(label) <= 200 for label in labels)
        # the two least lagging groups (lag 3 each, by name) summed under ~other: 6


def test_a_member_that_misses_its_session_hands_its_inflight_records_to_another(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10, per_batch=2)
    configure(g, group, sessionTimeoutMs=1_500)
    gone = join(g, group, [topic], member="a-gone")["memberId"]  # first by id: partition 0
    stays = join(g, group, [topic], member="b-stays")["memberId"]
    assert offsets(pull(g, group, gone, 3)) == [0, 1, 2]
    assert commit(g, group, gone).status_code == 200
    assert offsets(pull(g, group, gone, 5)) == [3, 4, 5, 6, 7]  # inflight, never committed
    assert numbers(lag(g, group)[(topic, 0)]) == (10, 3, 8, 2, 5, 7)

    def moved() -> bool:  # stays keeps its session; gone says nothing
        r = g.post(f"/v1/groups/{group}/members/{stays}/heartbeat")
        return r.json()["assignment"] == [{"topic": topic, "partitions": [0]}]

    poll("the partition to move to the member that stays", moved)
    assert numbers(lag(g, group)[(topic, 0)]) == (10, 3, 3, 7, 0, 7)  # back to ready
    assert offsets(pull(g, group, stays, 100)) == [3, 4, 5, 6, 7, 8, 9]
    for call, body in (("heartbeat", None), ("commit", {}), ("pull", {"maxRecords": 1})):
        r = g.post(f"/v1/groups/{group}/members/{gone}/{call}", json=body)
        assert r.status_code == 409, r.text
        assert r.json()["errorCode"] == 25


def test_a_client_that_goes_away_mid_poll_loses_nothing(pulsar):
    topic, group = uniq("gt"), uniq("g")
    # every pull is recorded 1.5 s before it is answered: a client that gives up after
    # 0.5 s is gone by the time its records would be answered
    with (
        ThreadSidecar(pulsar, group_pull_answer_delay_ms=1_500) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        create_topic(pulsar.admin_url, topic, partitions=1)  # a join creates no topic
        configure(api, group)
        member = join(api, group, [topic])["memberId"]
        start = [{"topic": topic, "partition": 0, "offset": 0}]
        assert commit(api, group, member, offsets=start).status_code == 200
        body = {"maxRecords": 10, "waitMs": 20_000}
        url = f"/v1/groups/{group}/members/{member}/pull"
        # gone while waiting for records: they arrive after it left
        with pytest.raises(httpx.ReadTimeout):
            api.post(url, json=body, timeout=0.5)
        produce(api, topic, 4)
        poll("the pull to end", lambda: gauges(api)["kop_dedup_group_pulls_in_flight"] == 0)
        assert numbers(lag(api, group)[(topic, 0)]) == (4, 0, 0, 4, 0, 4)
        # gone after its records were read and recorded, before they were answered
        with pytest.raises(httpx.ReadTimeout):
            api.post(url, json=body, timeout=0.5)
        poll("the pull to end", lambda: gauges(api)["kop_dedup_group_pulls_in_flight"] == 0)
        assert numbers(lag(api, group)[(topic, 0)]) == (4, 0, 0, 4, 0, 4)
        assert offsets(pull(api, group, member, 10)) == [0, 1, 2, 3]


def test_unknown_groups_are_404_and_unknown_members_409_with_25(g):
    group = uniq("g")
    for path in ("", "/lag", "/reset"):
        r = g.get(f"/v1/groups/{group}{path}")
        assert r.status_code == 404, (path, r.text)
        assert (r.json()["errorCode"], r.json()["error"]) == (69, "GROUP_ID_NOT_FOUND")
        assert group in r.json()["errorMessage"]
    configure(g, group)
    for call, body in (("heartbeat", None), ("pull", {"maxRecords": 1}), ("commit", {})):
        r = g.post(f"/v1/groups/{group}/members/nobody/{call}", json=body)
        assert r.status_code == 409, (call, r.text)
        assert (r.json()["errorCode"], r.json()["error"]) == (25, "UNKNOWN_MEMBER_ID")
    r = g.delete(f"/v1/groups/{group}/members/nobody")
    assert (r.status_code, r.json()["errorCode"]) == (409, 25)
    r = g.post(f"/v1/groups/{uniq('none')}/members/nobody/heartbeat")
    assert (r.status_code, r.json()["errorCode"]) == (409, 25)
