"""Server-side resets (RIP-48 point 3) against the real broker: a pull in flight while a
reset lands, timestamps before the earliest and after the end, bad targets."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from kop_dedup_tools.topics import create_topic
from tests.helpers import gauges, uniq, wait_until
from tests.integration.groups import (
    commit,
    configure,
    join,
    offsets,
    poll,
    produce,
    pull,
    reset,
    values,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


class PullInFlight:
    """A long poll on its own thread; ``answer`` once it returns."""

    def __init__(self, url: str, group: str, member: str, wait_ms: int) -> None:
        self.answer: dict[str, Any] | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with httpx.Client(base_url=url, timeout=60) as client:
                    self.answer = pull(client, group, member, 100, wait_ms=wait_ms)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> dict[str, Any]:
        self.thread.join(timeout=60)
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


@pytest.mark.parametrize("via", ["the same sidecar", "another sidecar"])
def test_a_pull_in_flight_when_a_reset_lands_answers_nothing_from_before_the_reset(
    pulsar, g, groups_sidecar, via
):
    topic = uniq("gt")
    produce(g, topic, 10, per_batch=2)
    with (
        ThreadSidecar(pulsar, cluster_of=groups_sidecar) as other,
        httpx.Client(base_url=other.url, timeout=60) as h,
    ):
        here = groups_sidecar.runtime.cluster
        wait_until("both nodes to list each other", lambda: len(here.members) == 2)
        # a group groups_sidecar coordinates (the long poll waits there, the reset goes
        # there directly or through the other node)
        group = next(
            name
            for name in (uniq("g") for _ in range(1000))
            if here.is_me(here.group_coordinator(name))
        )
        configure(g, group)
        member = join(g, group, [topic])["memberId"]
        assert offsets(pull(g, group, member, 100)) == list(range(10))
        assert commit(g, group, member).json()["committed"][0]["offset"] == 10
        waiting = PullInFlight(groups_sidecar.url, group, member, wait_ms=8_000)
        poll("the long poll to wait", lambda: gauges(g)["kop_dedup_group_pulls_in_flight"] == 1)
        api = g if via == "the same sidecar" else h
        assert reset(api, group, topic=topic, to="offset", value=3)["resolved"][0]["offset"] == 3
        produce(g, topic, 1)  # offset 10: what the pull, planned before the reset, would read
        answer = waiting.result()
    # the pull either says it applied the reset and holds only records from 3 on, or
    # holds nothing and the next pull applies it: never a record from before the reset
    # in or after a pull that says "reset applied"
    if not answer["resetApplied"]:
        assert answer["records"] == [], answer
        answer = pull(g, group, member, 100)
    assert answer["resetApplied"] == [
        {"topic": topic, "partition": 0, "offset": 3, "epoch": 1, "to": "offset"}
    ]
    seen = offsets(answer)  # 3..9, and 10 when it was written before the pull ended
    while len(seen) < 8:
        more = pull(g, group, member, 100)
        assert more["resetApplied"] == [], more
        seen += offsets(more)
    assert seen == list(range(3, 11))
    assert commit(g, group, member).json()["committed"][0]["offset"] == 11
    assert pull(g, group, member, 100, wait_ms=0)["records"] == []
    status = g.get(f"/v1/groups/{group}/reset").json()["resets"][0]
    assert status["members"] == {member: "applied"}


def test_a_reset_by_timestamp_before_the_earliest_or_after_the_end_is_clamped_and_says_so(g):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 3)
    published = int(time.time() * 1000)
    poll("the clock to move on", lambda: int(time.time() * 1000) > published + 5)
    middle = int(time.time() * 1000)
    produce(g, topic, 2)
    configure(g, group)
    member = join(g, group, [topic])["memberId"]

    def target(ts: int) -> dict[str, Any]:
        return reset(g, group, topic=topic, to="timestamp", value=ts)["resolved"][0]

    before = target(0)
    assert (before["offset"], before["clamped"], before["clampedTo"]) == (0, True, "earliest")
    assert offsets(pull(g, group, member, 100)) == [0, 1, 2, 3, 4]
    after = target(int(time.time() * 1000) + 3_600_000)
    assert (after["offset"], after["clamped"], after["clampedTo"]) == (5, True, "end")
    answer = pull(g, group, member, 100, wait_ms=0)
    assert answer["records"] == []
    assert answer["resetApplied"][0]["offset"] == 5
    inside = target(middle)
    assert (inside["offset"], inside["clamped"], inside["clampedTo"]) == (3, False, None)
    assert values(pull(g, group, member, 100)) == ["0", "1"]  # the second producer's 0, 1


def test_a_reset_by_timestamp_of_an_empty_partition_is_its_end(g, pulsar):
    topic, group = uniq("gt"), uniq("g")
    create_topic(pulsar.admin_url, topic, partitions=1)  # a reset creates no topic
    configure(g, group)
    resolved = reset(g, group, topic=topic, to="timestamp", value=1)["resolved"][0]
    assert (resolved["offset"], resolved["clampedTo"]) == (0, "end")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"to": "offset", "value": -1}, "outside 0..3"),
        ({"to": "offset", "value": 4}, "outside 0..3"),
        ({"to": "offset"}, "needs a value"),
        ({"to": "timestamp"}, "needs a value"),
        ({"to": "earliest", "partitions": [1]}, "partitions 0..0"),
        ({"to": "earliest", "partitions": [-1]}, "partitions 0..0"),
        ({"to": "earliest", "members": ["m"]}, "members is for broadcast groups"),
    ],
)
def test_a_reset_that_cannot_be_carried_out_is_400_with_a_readable_message(g, body, says):
    topic, group = uniq("gt"), uniq("g")
    produce(g, topic, 3)
    configure(g, group)
    r = g.post(f"/v1/groups/{group}/reset", json={"topic": topic, **body})
    assert r.status_code == 400, r.text
    assert says in r.json()["errorMessage"]
    assert g.get(f"/v1/groups/{group}/reset").json()["resets"] == []
