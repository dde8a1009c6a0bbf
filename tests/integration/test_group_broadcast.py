"""Broadcast groups (RIP-48 point 1) against the real broker: every member reads every
partition under its own offset; a member with none starts at the group's minimum over
the members seen within broadcastExpireMs; a minimum that retention deleted is clamped
to the earliest still stored, and the pull says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest

from tests.helpers import uniq
from tests.integration.groups import (
    NS,
    commit,
    configure,
    join,
    member_lag,
    offsets,
    poll,
    produce,
    produce_raw,
    pull,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def members_seen(api: httpx.Client, group: str) -> dict[str, int]:
    body = api.get(f"/v1/groups/{group}").json()
    return {m["memberId"]: m["lastSeenMs"] for m in body["members"]}


def test_a_restarted_member_resumes_from_its_own_offset_and_a_new_one_from_the_minimum(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10, per_batch=3)
    configure(g, group, mode="broadcast", autoOffsetReset="earliest")
    slow = join(g, group, [topic], member="slow")["memberId"]
    fast = join(g, group, [topic], member="fast")["memberId"]
    assert offsets(pull(g, group, slow, 4)) == [0, 1, 2, 3]
    assert offsets(pull(g, group, fast, 7)) == list(range(7))  # every member reads everything
    assert commit(g, group, slow).json()["committed"][0]["offset"] == 4
    assert commit(g, group, fast).json()["committed"][0]["offset"] == 7
    # from here on autoOffsetReset is latest: a member that starts at its own offset or
    # the group minimum is not starting at the latest offset (10)
    configure(g, group, autoOffsetReset="latest")
    # slow restarts (lost its local state, keeps its id): its own offset, not fast's
    assert join(g, group, [topic], member=slow)["memberId"] == slow
    assert offsets(pull(g, group, slow, 2)) == [4, 5]
    # fast restarts: its own offset too
    join(g, group, [topic], member=fast)
    assert offsets(pull(g, group, fast, 100)) == [7, 8, 9]
    # a new member: the minimum over the members seen recently (slow's 4), not latest
    new = join(g, group, [topic])["memberId"]
    answer = pull(g, group, new, 100)
    assert offsets(answer) == [4, 5, 6, 7, 8, 9]
    rows = member_lag(g, group, slow)[(topic, 0)]
    assert (rows["committed"], rows["pulled"], rows["inflight"], rows["lag"]) == (4, 6, 2, 6)
    minimum = [
        r for r in g.get(f"/v1/groups/{group}/lag").json()["partitions"] if "groupMinimum" in r
    ]
    assert [(r["groupMinimum"], r["lag"]) for r in minimum] == [(4, 6)]


def test_members_seen_within_broadcast_expire_ms_count_for_the_minimum_those_beyond_do_not(g):
    topic, group, expire = uniq("gt"), uniq("g"), 1_500
    produce(g, topic, 10)
    configure(g, group, mode="broadcast", broadcastExpireMs=expire, sessionTimeoutMs=60_000)
    old = join(g, group, [topic])["memberId"]
    recent = join(g, group, [topic])["memberId"]
    assert offsets(pull(g, group, recent, 6)) == list(range(6))
    assert offsets(pull(g, group, old, 2)) == [0, 1]
    assert commit(g, group, recent).json()["committed"][0]["offset"] == 6
    assert commit(g, group, old).json()["committed"][0]["offset"] == 2
    committed_at = int(time.time() * 1000)  # old is last seen at (or just before) this
    # just within: old was seen well inside broadcastExpireMs: the minimum is its 2
    within = join(g, group, [topic])["memberId"]
    assert int(time.time() * 1000) - committed_at < expire
    assert offsets(pull(g, group, within, 1)) == [2]
    # just beyond: once old was last seen more than broadcastExpireMs ago, it no longer
    # holds the minimum back (recent keeps committing: it stays seen)
    poll("old to be seen too long ago", lambda: int(time.time() * 1000) - committed_at > expire)
    assert commit(g, group, recent).json()["committed"][0]["offset"] == 6
    assert members_seen(g, group)[old] <= committed_at
    beyond = join(g, group, [topic])["memberId"]
    assert offsets(pull(g, group, beyond, 1)) == [6]


@pytest.fixture
def short_retention_topic(pulsar: Any) -> Iterator[tuple[str, httpx.Client]]:
    """A one-partition topic whose closed ledgers retention deletes at once (retention
    0, deduplication off at the topic, so no deduplication cursor holds them)."""
    topic = uniq("gr")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        path = f"/admin/v2/persistent/public/kafka/{topic}"
        assert admin.put(f"{path}/partitions", json=1).status_code == 204
        assert admin.post(f"{path}/deduplicationEnabled", json=False).status_code == 204
        retention = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
        assert admin.post(f"{path}/retention", json=retention).status_code == 204
        poll(
            "the topic policies to apply",
            lambda: (
                admin.get(f"{path}/deduplicationEnabled").json() is False
                and admin.get(f"{path}/retention").json() == retention
            ),
        )
        yield topic, admin


def earliest_index(admin: httpx.Client, ptopic: str) -> int | None:
    r = admin.get(
        f"/admin/v2/persistent/{ptopic.removeprefix('persistent://')}/examinemessage",
        params={"initialPosition": "earliest", "messagePosition": "1"},
    )
    raw = r.headers.get("X-Pulsar-Broker-Entry-METADATA-index")
    return None if raw is None else int(raw)


def test_a_group_minimum_deleted_by_retention_is_clamped_to_the_earliest_and_the_pull_says_so(
    pulsar, short_retention_topic, pulsar_reader_client: pulsar_client.Client
):
    topic, admin = short_retention_topic
    ptopic = f"{NS}/{topic}-partition-0"
    produce_raw(pulsar_reader_client, ptopic, [str(i) for i in range(5)])
    group = uniq("g")
    # no durable subscription in this sidecar's lifetime (it would keep the data)
    with (
        ThreadSidecar(pulsar, group_cursor_interval_ms=3_600_000) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        configure(api, group, mode="broadcast")
        first = join(api, group, [topic])["memberId"]
        assert offsets(pull(api, group, first, 2)) == [0, 1]
        assert commit(api, group, first).json()["committed"][0]["offset"] == 2
        # roll the ledger over (an unload closes it), write on, and let retention trim
        path = f"/admin/v2/persistent/{ptopic.removeprefix('persistent://')}"
        assert admin.put(f"{path}/unload").status_code == 204
        produce_raw(pulsar_reader_client, ptopic, ["5", "6", "7"])
        assert admin.post(f"{path}/trim").status_code in {200, 204}
        poll("retention to delete offsets 0-4", lambda: earliest_index(admin, ptopic) == 5)
        # a new member: the group minimum (2) is gone: it starts at the earliest (5)
        new = join(api, group, [topic])["memberId"]
        answer = pull(api, group, new, 100)
        assert offsets(answer) == [5, 6, 7]
        assert answer["clamped"] == [{"topic": topic, "partition": 0, "from": 2, "to": 5}]
        # the member whose own offset (2) was deleted, restarted: the same
        join(api, group, [topic], member=first)
        again = pull(api, group, first, 100)
        assert offsets(again) == [5, 6, 7]
        assert again["clamped"] == [{"topic": topic, "partition": 0, "from": 2, "to": 5}]
        # said once: the next pull goes on from there
        assert commit(api, group, first).status_code == 200
        assert pull(api, group, first, 100, wait_ms=0)["clamped"] == []


def test_a_second_reset_of_a_partition_for_one_member_keeps_the_first_pending_for_the_others(g):
    """A reset for every member, then another of the same partition for one member: the
    others still apply the first (the second does not replace it for them), the one
    member applies the second; the status lists both."""
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10)
    configure(g, group, mode="broadcast")
    for m in ("a", "b", "c"):
        join(g, group, [topic], member=m)
    for m in ("a", "b", "c"):
        assert offsets(pull(g, group, m, 100)) == list(range(10))
    for m in ("a", "b", "c"):
        assert commit(g, group, m).status_code == 200
    assert g.delete(f"/v1/groups/{group}/members/c").status_code == 200  # c is offline
    first = g.post(f"/v1/groups/{group}/reset", json={"topic": topic, "to": "offset", "value": 2})
    assert first.status_code == 200, first.text
    second = g.post(
        f"/v1/groups/{group}/reset",
        json={"topic": topic, "to": "offset", "value": 6, "members": ["a"]},
    )
    assert second.status_code == 200, second.text
    statuses = {
        (r["epoch"], r["offset"]): r["members"]
        for r in g.get(f"/v1/groups/{group}/reset").json()["resets"]
    }
    assert statuses == {
        (1, 2): {"b": "pending", "c": "pending"},
        (2, 6): {"a": "pending"},
    }
    b = pull(g, group, "b", 100)
    assert (b["resetApplied"][0]["offset"], offsets(b)) == (2, list(range(2, 10)))
    a = pull(g, group, "a", 100)
    assert (a["resetApplied"][0]["offset"], offsets(a)) == (6, [6, 7, 8, 9])
    join(g, group, [topic], member="c")
    c = pull(g, group, "c", 100)
    assert (c["resetApplied"][0]["offset"], offsets(c)) == (2, list(range(2, 10)))
    statuses = {
        (r["epoch"], r["offset"]): r["members"]
        for r in g.get(f"/v1/groups/{group}/reset").json()["resets"]
    }
    assert statuses == {
        (1, 2): {"b": "applied", "c": "applied"},
        (2, 6): {"a": "applied"},
    }
