"""Consumer groups through sidecar crashes (SIGKILL): nothing delivered is lost, only
uncommitted records come again, and a reset stays stored and is applied once per
member, whichever sidecar serves it.

The broker is the session's (these tests kill sidecars, not the broker).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.placement import GROUP_LOG
from kop_dedup.coordination.partitions import partition_of
from kop_dedup.settings import Settings
from tests.helpers import newcomer_owning, uniq
from tests.integration.groups import commit, configure, join, offsets, poll, produce, pull
from tests.sidecar import SESSION_SYSTEM_NAMESPACE, ProcessSidecar, ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

FAST = {"coordinator_adopt_interval_ms": 300, "group_sweep_interval_ms": 100}
STORE = f"persistent://public/{SESSION_SYSTEM_NAMESPACE}/consumer-groups"  # as the sidecars read it


def store_writers(admin_url: str, group: str) -> set[str]:
    """Producer names the broker lists on the group's partition of the groups log."""
    p = partition_of(group, Settings().offsets_partitions)
    path = f"{STORE}-partition-{p}".removeprefix("persistent://")
    stats = httpx.get(f"{admin_url}/admin/v2/persistent/{path}/stats", timeout=30).json()
    return {str(pub.get("producerName")) for pub in stats.get("publishers") or []}


@pytest.fixture
def sidecars(pulsar: Any, tmp_path: Path) -> Iterator[list[ProcessSidecar]]:
    pair = [ProcessSidecar(pulsar, tmp_path, **FAST), ProcessSidecar(pulsar, tmp_path, **FAST)]
    try:
        for sc in pair:
            sc.start()
        yield pair
    finally:
        for sc in pair:
            sc.stop()


class Consumer:
    """A member that pulls and commits as it goes, through one sidecar until it dies,
    then through the other (retrying the call that failed), keeping what it received."""

    def __init__(self, sidecars: list[ProcessSidecar], group: str, member: str) -> None:
        self.sidecars, self.group, self.member = sidecars, group, member
        self.current = 0
        self.received: list[int] = []
        self.committed = 0
        self.redelivered_below_commit: list[int] = []

    def call(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(2 * len(self.sidecars)):
            sc = self.sidecars[self.current]
            if sc.running():
                try:
                    r = httpx.post(
                        f"{sc.url}/v1/groups/{self.group}/members/{self.member}/{what}",
                        json=body,
                        timeout=30,
                    )
                except httpx.TransportError:
                    pass  # it died under us: the other one
                else:
                    assert r.status_code == 200, r.text
                    return dict(r.json())
            self.current = (self.current + 1) % len(self.sidecars)
        raise AssertionError(f"no sidecar answered {what}")

    def pull(self, n: int) -> list[int]:
        got = offsets(self.call("pull", {"maxRecords": n, "waitMs": 1000}))
        self.redelivered_below_commit += [o for o in got if o < self.committed]
        self.received += got
        return got

    def commit(self) -> None:
        for c in self.call("commit", {})["committed"]:
            self.committed = max(self.committed, c["offset"])


def test_a_sidecar_killed_mid_stream_loses_nothing_and_repeats_only_uncommitted_records(
    sidecars,
):
    a = sidecars[0]
    topic, group, total = uniq("gf"), uniq("g"), 300
    with httpx.Client(base_url=a.url, timeout=60) as api:
        produce(api, topic, total, per_batch=5)
        configure(api, group)
        join(api, group, [topic], member="c1")
    consumer = Consumer(sidecars, group, "c1")
    uncommitted_at_kills = 0
    step = 0
    while consumer.committed < total:
        step += 1
        consumer.pull(17)
        if step in {3, 9}:  # killed after answering a pull, before its commit
            victim = consumer.sidecars[consumer.current]
            uncommitted_at_kills += max(consumer.received) + 1 - consumer.committed
            victim.kill()
        consumer.commit()
        if step == 6:  # killed right after a commit: nothing uncommitted
            consumer.sidecars[consumer.current].kill()
        for sc in consumer.sidecars:
            if not sc.running() and sc is not consumer.sidecars[consumer.current]:
                sc.start()
        assert step < 200, "the consumer is not getting anywhere"
    received = consumer.received
    duplicates = len(received) - total
    print(
        f"\n{total} records, {len(received)} deliveries, {duplicates} duplicates "
        f"(at most {uncommitted_at_kills} uncommitted when sidecars were killed)"
    )
    assert sorted(set(received)) == list(range(total))  # every record, none lost
    assert consumer.redelivered_below_commit == []  # never a committed record again
    assert 0 <= duplicates <= uncommitted_at_kills


def _coordinator_of(other: ThreadSidecar, group: str) -> int:
    """A node id that, joining ``other``'s cluster, becomes the group's coordinator (so
    the sidecar the test kills is the one that serves the group)."""
    count = other.settings.offsets_partitions
    mine = other.runtime.cluster.me.node_id
    return newcomer_owning(mine, GROUP_LOG, count, partition_of(group, count))


def test_a_sidecar_killed_after_recording_a_pull_and_before_answering_sends_it_again(
    pulsar, tmp_path
):
    topic, group = uniq("gf"), uniq("g")
    # the victim records a pull's delivery and only answers 30 s later: killed between
    with (
        ThreadSidecar(pulsar, **FAST) as other,
        httpx.Client(base_url=other.url, timeout=60) as api,
    ):
        produce(api, topic, 6, per_batch=2)
        configure(api, group)
        member = join(api, group, [topic])["memberId"]
        start = [{"topic": topic, "partition": 0, "offset": 0}]
        assert commit(api, group, member, offsets=start).status_code == 200
        victim = ProcessSidecar(
            pulsar,
            tmp_path,
            group_pull_answer_delay_ms=30_000,
            node_id=_coordinator_of(other, group),  # it joins and takes the group over
            **FAST,
        )
        failed: list[BaseException] = []
        try:
            victim.start()

            def doomed() -> None:
                try:
                    httpx.post(
                        f"{victim.url}/v1/groups/{group}/members/{member}/pull",
                        json={"maxRecords": 10, "waitMs": 0},
                        timeout=60,
                    )
                except httpx.TransportError as exc:
                    failed.append(exc)

            thread = threading.Thread(target=doomed, daemon=True)
            thread.start()

            def recorded() -> bool:
                row = api.get(f"/v1/groups/{group}/lag").json()["partitions"][0]
                return bool(row["pulled"] == 6 and row["inflight"] == 6)

            poll("the victim to record the pull", recorded)
            mine = store_writers(pulsar.admin_url, group)  # the victim's, having recorded
            assert mine
            victim.kill()
            thread.join(timeout=30)
        finally:
            victim.stop()
        assert failed, "the client saw no answer"
        # a real client retries after the failure; the broker forgets the dead writer
        # just as fast (see the notes on this window)
        poll(
            "the broker to drop the victim's writer",
            lambda: not mine & store_writers(pulsar.admin_url, group),
        )
        again = pull(api, group, member, 10)
        assert offsets(again) == [0, 1, 2, 3, 4, 5]


def test_a_reset_survives_a_sidecar_sigkill_and_is_applied_once_per_member_offline_included(
    pulsar, tmp_path
):
    topic, group = uniq("gf"), uniq("g")
    a = ProcessSidecar(pulsar, tmp_path, **FAST)
    with ThreadSidecar(pulsar, **FAST) as other, httpx.Client(base_url=other.url, timeout=60) as b:
        try:
            a.start()
            with httpx.Client(base_url=a.url, timeout=60) as api:
                produce(api, topic, 8, per_batch=3)
                configure(api, group, mode="broadcast")
                for m in ("on", "off"):
                    join(api, group, [topic], member=m)
                for m in ("on", "off"):
                    assert offsets(pull(api, group, m, 6)) == list(range(6))
                for m in ("on", "off"):
                    assert commit(api, group, m).status_code == 200
                assert api.delete(f"/v1/groups/{group}/members/off").status_code == 200
                r = api.post(
                    f"/v1/groups/{group}/reset", json={"topic": topic, "to": "offset", "value": 2}
                )
                assert r.status_code == 200, r.text
                status = api.get(f"/v1/groups/{group}/reset").json()["resets"][0]["members"]
                assert status == {"off": "pending", "on": "pending"}
            a.kill()  # right after answering the reset
            status = b.get(f"/v1/groups/{group}/reset").json()["resets"][0]["members"]
            assert status == {"off": "pending", "on": "pending"}
            first = pull(b, group, "on", 100)
            assert first["resetApplied"][0]["offset"] == 2
            assert offsets(first) == [2, 3, 4, 5, 6, 7]
            assert commit(b, group, "on").status_code == 200
            assert pull(b, group, "on", 100, wait_ms=0)["resetApplied"] == []  # applied once
            a.start()  # the restarted sidecar serves the member that was offline
            with httpx.Client(base_url=a.url, timeout=60) as api:
                join(api, group, [topic], member="off")
                back = pull(api, group, "off", 100)
                assert back["resetApplied"][0]["offset"] == 2
                assert offsets(back) == [2, 3, 4, 5, 6, 7]
                assert commit(api, group, "off").status_code == 200
                assert pull(api, group, "off", 100, wait_ms=0)["resetApplied"] == []
                status = api.get(f"/v1/groups/{group}/reset").json()["resets"][0]["members"]
                assert status == {"off": "applied", "on": "applied"}
        finally:
            a.stop()


def test_a_reset_applied_before_a_crash_is_where_the_next_owner_sends_deliveries_back_to(
    pulsar, tmp_path
):
    """100 records pulled and committed, a reset to the earliest, 10 pulled, and the
    sidecar that served it all is killed: the next owner sends the uncommitted
    deliveries back to the reset's target (0), not to the 100 committed before it."""
    topic, group = uniq("gf"), uniq("g")
    with ThreadSidecar(pulsar, **FAST) as other, httpx.Client(base_url=other.url, timeout=60) as b:
        victim = ProcessSidecar(pulsar, tmp_path, node_id=_coordinator_of(other, group), **FAST)
        try:
            victim.start()
            with httpx.Client(base_url=victim.url, timeout=60) as api:
                produce(api, topic, 100, per_batch=10)
                configure(api, group)
                join(api, group, [topic], member="m")
                got: list[int] = []
                while len(got) < 100:
                    got += offsets(pull(api, group, "m", 100 - len(got)))
                assert commit(api, group, "m").json()["committed"][0]["offset"] == 100
                r = api.post(f"/v1/groups/{group}/reset", json={"topic": topic, "to": "earliest"})
                assert r.status_code == 200, r.text
                assert offsets(pull(api, group, "m", 10)) == list(range(10))
                mine = store_writers(pulsar.admin_url, group)
                assert mine
            victim.kill()
        finally:
            victim.stop()
        poll(
            "the broker to drop the victim's writer",
            lambda: not mine & store_writers(pulsar.admin_url, group),
        )
        again = pull(b, group, "m", 10)
        assert again["resetApplied"] == []
        assert offsets(again) == list(range(10))
