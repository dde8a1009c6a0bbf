"""Where a server-side reset meets a rewind (rejoin, leave, session expiry, rebalance):
a reset applied by a pull stays applied, so what the member gets after the rewind
starts from the reset's target (or from what it committed since), never from the
committed offset from before the reset. Against the real broker."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers import uniq
from tests.integration.groups import commit, configure, join, offsets, poll, produce, pull, reset

pytestmark = pytest.mark.integration

REWINDS = ["rejoin", "leave and join", "session expiry", "rebalance"]


def pull_all(api: httpx.Client, group: str, member: str, n: int) -> list[int]:
    got: list[int] = []
    while len(got) < n:
        more = offsets(pull(api, group, member, n - len(got)))
        assert more, f"only {len(got)} of {n} records came"
        got += more
    return got


def rewind(api: httpx.Client, group: str, topic: str, member: str, how: str) -> str:
    """Rewind ``member``'s delivery the way ``how`` says; the member that reads the
    partition afterwards."""
    if how == "rejoin":
        join(api, group, [topic], member=member)
    elif how == "leave and join":
        assert api.delete(f"/v1/groups/{group}/members/{member}").status_code == 200
        join(api, group, [topic], member=member)
    elif how == "session expiry":

        def gone() -> bool:
            body = api.get(f"/v1/groups/{group}").json()
            return member not in {m["memberId"] for m in body["members"]}

        poll("the member's session to expire", gone)
        join(api, group, [topic], member=member)
    elif how == "rebalance":  # a member whose id sorts first takes the only partition
        taker = join(api, group, [topic], member="0-" + member)
        assert taker["assignment"] == [{"topic": topic, "partitions": [0]}]
        return str(taker["memberId"])
    else:
        raise AssertionError(how)
    return member


def setup(api: httpx.Client, mode: str, how: str, records: int) -> tuple[str, str, str]:
    topic, group = uniq("gr"), uniq("g")
    produce(api, topic, records, per_batch=10)
    body: dict[str, Any] = {"mode": mode}
    if how == "session expiry":
        body["sessionTimeoutMs"] = 2_500
    configure(api, group, **body)
    member = join(api, group, [topic], member=uniq("m"))["memberId"]
    return topic, group, member


@pytest.mark.parametrize("how", REWINDS)
def test_records_handed_out_after_a_backward_reset_come_again_after_a_rewind(g, how):
    """The issue's example: 100 records, pull 100, commit, reset to earliest, pull 10,
    rewind, pull: it starts at offset 0 (not at the 100 committed before the reset)."""
    topic, group, member = setup(g, "clustering", how, 100)
    assert pull_all(g, group, member, 100) == list(range(100))
    assert commit(g, group, member).json()["committed"][0]["offset"] == 100
    reset(g, group, topic=topic, to="earliest")
    first = pull(g, group, member, 10)
    assert first["resetApplied"][0]["offset"] == 0
    assert offsets(first) == list(range(10))
    reader = rewind(g, group, topic, member, how)
    again = pull(g, group, reader, 10)
    assert again["resetApplied"] == []  # applied once
    assert offsets(again) == list(range(10))


@pytest.mark.parametrize("how", REWINDS)
def test_what_was_committed_after_a_reset_is_where_a_rewind_goes_back_to(g, how):
    """After the reset, the member commits 5 of the 10 it pulled: the rewind goes back to
    5 (its commit counts, the reset is not applied again)."""
    topic, group, member = setup(g, "clustering", how, 30)
    assert pull_all(g, group, member, 30) == list(range(30))
    assert commit(g, group, member).json()["committed"][0]["offset"] == 30
    reset(g, group, topic=topic, to="offset", value=2)
    assert offsets(pull(g, group, member, 10)) == list(range(2, 12))
    done = commit(g, group, member, offsets=[{"topic": topic, "partition": 0, "offset": 7}])
    assert done.status_code == 200, done.text
    reader = rewind(g, group, topic, member, how)
    again = pull(g, group, reader, 5)
    assert again["resetApplied"] == []
    assert offsets(again) == [7, 8, 9, 10, 11]


@pytest.mark.parametrize("how", REWINDS)
def test_a_forward_reset_keeps_its_skipped_backlog_skipped_after_a_rewind(g, how):
    topic, group, member = setup(g, "clustering", how, 100)
    assert pull_all(g, group, member, 50) == list(range(50))
    assert commit(g, group, member).json()["committed"][0]["offset"] == 50
    reset(g, group, topic=topic, to="latest")
    applied = pull(g, group, member, 10, wait_ms=0)
    assert (applied["resetApplied"][0]["offset"], offsets(applied)) == (100, [])
    reader = rewind(g, group, topic, member, how)
    produce(g, topic, 1)
    assert offsets(pull(g, group, reader, 10)) == [100]


@pytest.mark.parametrize("how", ["rejoin", "leave and join", "session expiry"])
def test_a_broadcast_members_reset_holds_after_its_rewind(g, how):
    topic, group, member = setup(g, "broadcast", how, 40)
    other = join(g, group, [topic], member=uniq("o"))["memberId"]
    assert pull_all(g, group, member, 40) == list(range(40))
    assert commit(g, group, member).json()["committed"][0]["offset"] == 40
    reset(g, group, topic=topic, to="offset", value=5, members=[member])
    assert offsets(pull(g, group, member, 10)) == list(range(5, 15))
    if how == "session expiry":  # the other member keeps its session meanwhile
        poll(
            "the member's session to expire",
            lambda: (
                g.post(f"/v1/groups/{group}/members/{other}/heartbeat").status_code == 200
                and member
                not in {m["memberId"] for m in g.get(f"/v1/groups/{group}").json()["members"]}
            ),
        )
    reader = rewind(g, group, topic, member, how)
    assert offsets(pull(g, group, reader, 10)) == list(range(5, 15))
