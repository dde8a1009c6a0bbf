"""Consumer groups over HTTP with server-side offsets, against the real broker."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Self

import httpx
import pytest

from kop_dedup_tools.topics import create_topic
from tests.helpers import uniq, wait_until
from tests.integration.groups import (
    commit,
    configure,
    join,
    lag,
    member_lag,
    offsets,
    poll,
    produce,
    pull,
    values,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def test_commit_is_the_next_offset_across_batch_entries_no_skip_no_repeat(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10, per_batch=4)  # entries of 4, 4 and 2 records
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    first = pull(g, group, member, 5)
    assert values(first) == ["0", "1", "2", "3", "4"]
    assert [r["offset"] for r in first["records"]] == [0, 1, 2, 3, 4]
    assert commit(g, group, member).json()["committed"] == [
        {"topic": topic, "partition": 0, "offset": 5}
    ]
    second = pull(g, group, member, 100)
    assert values(second) == ["5", "6", "7", "8", "9"]
    stats = lag(g, group)[(topic, 0)]
    assert (stats["end"], stats["committed"], stats["pulled"]) == (10, 5, 10)
    assert (stats["ready"], stats["inflight"], stats["lag"]) == (0, 5, 5)
    assert stats["oldestInflightMs"] is not None


def test_a_long_poll_on_an_empty_partition_answers_the_first_record_that_lands(g, groups_sidecar):
    topic, group = uniq("gt"), uniq("g")
    create_topic(groups_sidecar.settings.pulsar_admin_url, topic, partitions=1)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    answers: list[dict[str, object]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(pull(g, group, member, 10, wait_ms=10_000)), daemon=True
    )
    started = time.monotonic()
    waiting.start()
    time.sleep(0.5)  # the pull is waiting on a partition with nothing in it
    assert waiting.is_alive(), "the long poll on an empty partition answered at once"
    produce(g, topic, 3, per_batch=3)
    waiting.join(timeout=15)
    assert [values(a) for a in answers] == [["0", "1", "2"]]
    assert time.monotonic() - started < 10  # answered by the record, not by waitMs


def test_an_empty_body_commit_after_a_partial_pull_commits_only_what_was_delivered(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 6, per_batch=6)  # one entry of 6
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    assert values(pull(g, group, member, 2)) == ["0", "1"]
    assert commit(g, group, member).json()["committed"][0]["offset"] == 2
    offsets = g.get(f"/v1/groups/{group}/offsets").json()["offsets"]
    assert [(o["topic"], o["offset"]) for o in offsets] == [(topic, 2)]
    # a new member after the first leaves starts exactly there
    assert g.delete(f"/v1/groups/{group}/members/{member}").status_code == 200
    other = join(g, group, [topic])["memberId"]
    assert values(pull(g, group, other, 10)) == ["2", "3", "4", "5"]


def test_a_member_alternating_between_two_sidecars_sees_no_gap_and_no_duplicate(
    pulsar, g, groups_sidecar
):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 30, per_batch=3)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    seen: list[str] = []
    with (
        ThreadSidecar(pulsar, cluster_of=groups_sidecar) as other,
        httpx.Client(base_url=other.url, timeout=60) as h,
    ):
        for i in range(6):
            api = g if i % 2 == 0 else h
            answer = pull(api, group, member, 5)
            seen += values(answer)
            assert commit(api, group, member).status_code == 200
    assert seen == [str(i) for i in range(30)]


def test_a_stale_generation_or_an_unknown_member_gets_409_with_kafkas_code(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 2)
    configure(g, group)
    first = join(g, group, [topic])
    join(g, group, [topic])  # a second member: a new generation
    stale = commit(g, group, first["memberId"], generation=first["generation"])
    assert stale.status_code == 409
    assert stale.json()["errorCode"] == 22
    unknown = commit(g, group, "nobody")
    assert unknown.status_code == 409
    assert unknown.json()["errorCode"] == 25


def test_reset_by_offset_out_of_range_is_400_with_a_readable_message(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 3)
    configure(g, group)
    r = g.post(f"/v1/groups/{group}/reset", json={"topic": topic, "to": "offset", "value": 99})
    assert r.status_code == 400
    assert "outside 0..3" in r.json()["errorMessage"]


def test_a_reset_is_applied_at_the_next_pull_and_a_stale_commit_cannot_undo_it(
    pulsar, g, groups_sidecar
):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 10, per_batch=5)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    assert values(pull(g, group, member, 8)) == [str(i) for i in range(8)]
    r = g.post(f"/v1/groups/{group}/reset", json={"topic": topic, "to": "offset", "value": 3})
    assert r.status_code == 200, r.text
    assert r.json()["resolved"][0]["offset"] == 3
    status = g.get(f"/v1/groups/{group}/reset").json()["resets"][0]
    assert status["members"] == {member: "pending"}
    # the member commits what it had before the reset: refused, the reset stays
    stale = commit(g, group, member)
    assert stale.status_code == 409
    assert "reset" in stale.json()["errorMessage"]
    # the next pull (through another sidecar) starts at the reset and says so
    with (
        ThreadSidecar(pulsar, cluster_of=groups_sidecar) as other,
        httpx.Client(base_url=other.url, timeout=60) as h,
    ):
        after = pull(h, group, member, 2)
    assert values(after) == ["3", "4"]
    assert after["resetApplied"][0]["offset"] == 3
    assert g.get(f"/v1/groups/{group}/reset").json()["resets"][0]["members"] == {member: "applied"}
    assert commit(g, group, member).json()["committed"][0]["offset"] == 5


def test_check_member_raises_what_a_stale_members_commit_gets(g, groups_sidecar):
    """KIP-447 fencing of a transactional offset commit: check_member answers as the
    member's own commit would (25 for a member not in the group, else 22 for a stale
    generation), and accepts the current member and generation."""
    from kop_dedup.coordination.groups.coordinator import StaleMember

    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 1)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]
    generation = join(g, group, [topic], member="other")["generation"]
    groups = groups_sidecar.runtime.groups

    def check(m: str | None, gen: int | None, in_group: str = group) -> int:
        try:
            groups_sidecar.call(groups.check_member(in_group, m, gen))
        except StaleMember as exc:
            return exc.error.errno
        return 0

    assert check(member, generation) == 0
    assert check(None, None) == 0
    assert check(member, None) == 0
    stale = commit(g, group, member, generation=generation - 1).json()
    assert check(member, generation - 1) == stale["errorCode"] == 22
    gone = commit(g, group, "nobody", generation=generation).json()
    assert check("nobody", generation) == gone["errorCode"] == 25
    assert check("nobody", generation - 1) == 25  # the member first, as Kafka checks
    assert check(None, generation + 1) == 22
    assert check("m", None, uniq("none")) == check("m", 0, uniq("none")) == 25  # no such group


@pytest.mark.parametrize("mode", ["clustering", "broadcast"])
def test_inflight_before_the_first_commit_counts_from_where_the_member_started(g, mode):
    """A fresh group pulls 30 of 100 from earliest: inflight 30, ready 70 (committed and
    lag stay unknown); one starting at the latest offset counts from there."""
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 100, per_batch=10)
    configure(g, group, mode=mode)
    member = join(g, group, [topic])["memberId"]
    got = 0
    while got < 30:
        got += len(pull(g, group, member, 30 - got)["records"])
    rows = lag(g, group) if mode == "clustering" else member_lag(g, group, member)
    row = rows[(topic, 0)]
    assert (row["end"], row["committed"], row["pulled"]) == (100, None, 30)
    assert (row["ready"], row["inflight"], row["lag"]) == (70, 30, None)
    assert row["oldestInflightMs"] is not None
    late = uniq("g")
    configure(g, late, mode=mode, autoOffsetReset="latest")
    other = join(g, late, [topic])["memberId"]
    assert pull(g, late, other, 10, wait_ms=0)["records"] == []
    produce(g, topic, 4, per_batch=4)
    assert len(pull(g, late, other, 10)["records"]) == 4
    rows = lag(g, late) if mode == "clustering" else member_lag(g, late, other)
    row = rows[(topic, 0)]
    assert (row["end"], row["pulled"], row["ready"], row["inflight"]) == (104, 104, 0, 4)


class PullInFlight:
    """A pull sent on a raw connection, so the test decides when its client goes away
    (:meth:`hang_up`) whatever the machine's speed, or reads its answer (:meth:`result`)."""

    def __init__(self, url: str, group: str, member: str, n: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"maxRecords": n, "waitMs": 0}).encode()
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.sendall(
            f"POST /v1/groups/{group}/members/{member}/pull HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    def hang_up(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()  # closed already when answered or hung up

    def result(self) -> dict[str, Any]:
        raw = b""
        while chunk := self.sock.recv(65536):
            raw += chunk
        self.sock.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), raw[:300]
        return dict(json.loads(body))


def committed(api: httpx.Client, group: str, topic: str) -> int:
    body = api.get(f"/v1/groups/{group}/offsets").json()
    return {o["topic"]: o["offset"] for o in body["offsets"]}[topic]


def recorded(api: httpx.Client, group: str, topic: str, pulled: int) -> bool:
    return bool(lag(api, group)[(topic, 0)]["pulled"] == pulled)


@pytest.mark.parametrize("client", ["waits for it", "goes away"])
def test_an_empty_commit_racing_the_next_pull_commits_only_what_was_answered(pulsar, client):
    """The member's next pull is recorded but not answered yet (answers wait 6 s) when
    its empty-body commit lands: the commit names what the earlier pull answered, and
    the pull then answers (or, its client gone, its records stay ready)."""
    topic, group = uniq("gt"), uniq("g")
    with (
        ThreadSidecar(pulsar, group_pull_answer_delay_ms=6_000) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        produce(api, topic, 20, per_batch=5)
        configure(api, group)
        member = join(api, group, [topic])["memberId"]
        assert offsets(pull(api, group, member, 10)) == list(range(10))
        with PullInFlight(sc.url, group, member, 10) as racing:
            poll("the next pull to be recorded", lambda: recorded(api, group, topic, 20))
            done = commit(api, group, member)
            assert done.json()["committed"] == [{"topic": topic, "partition": 0, "offset": 10}]
            if client == "waits for it":
                assert offsets(racing.result()) == list(range(10, 20))
                assert commit(api, group, member).json()["committed"][0]["offset"] == 20
            else:
                racing.hang_up()
                poll("the pull to be put back", lambda: recorded(api, group, topic, 10))
                assert committed(api, group, topic) == 10
                assert offsets(pull(api, group, member, 10)) == list(range(10, 20))


def test_a_pull_not_answered_is_not_left_committed_by_a_commit_through_another_sidecar(pulsar, g):
    """The same race through two sidecars of one cluster: the pull's client is on one,
    the commit comes through the other, and the group's coordinator (either of them)
    serves both (b, here: the pull sent to a is forwarded). The pull's client hangs up on
    a: the forwarded pull is cut with it, so its records stay ready and the committed
    offset goes back to what was answered."""
    topic = uniq("gt")
    produce(g, topic, 20, per_batch=5)
    with (
        ThreadSidecar(pulsar, group_pull_answer_delay_ms=6_000, system_namespace=uniq("sys")) as a,
        ThreadSidecar(pulsar, group_pull_answer_delay_ms=6_000, cluster_of=a) as b,
        httpx.Client(base_url=a.url, timeout=60) as ha,
        httpx.Client(base_url=b.url, timeout=60) as hb,
    ):
        wait_until("both nodes to list each other", lambda: len(a.runtime.cluster.members) == 2)
        b_id = b.runtime.cluster.me.node_id
        # a group b coordinates: the pull sent to a is forwarded to b
        group = next(
            name
            for name in (uniq("g") for _ in range(1000))
            if a.runtime.cluster.group_coordinator(name).node_id == b_id
        )
        configure(ha, group)
        member = join(ha, group, [topic])["memberId"]
        assert offsets(pull(ha, group, member, 10)) == list(range(10))
        with PullInFlight(a.url, group, member, 10) as racing:
            poll("the pull to be recorded", lambda: recorded(hb, group, topic, 20))
            assert commit(hb, group, member).status_code == 200
            racing.hang_up()
            poll("the pull to be put back", lambda: recorded(hb, group, topic, 10))
        assert committed(hb, group, topic) == 10
        join(hb, group, [topic], member=member)  # a rewind: back to the committed offset
        assert offsets(pull(hb, group, member, 10)) == list(range(10, 20))
