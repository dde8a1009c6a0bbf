"""A cluster's failover and hand-off, with real sidecar processes, a real broker and real
clients: a SIGKILLed node's partitions and keys answer from live nodes within the bound
the docs state (docs/operations/cluster.md), Kafka's TransactionalMessageCopier copies
exactly once through it, a SIGTERMed node hands over within its shutdown budget while a
client produces through the cluster, and a node that joins takes its share and nothing
else moves.

The bound after a node dies (its process killed, its host alive, so the broker sees its
connections drop at once): the survivors see it gone at their next listing of the
members (``KOP_DEDUP_CLUSTER_REFRESH_MS``, 1 s here as by default), then load what it
owned (no hand-off wait: the broker lists no writer of a dead node) in a fraction of a
second. :data:`KILL_BOUND_S` is that; the tests allow :data:`LOADED_MACHINE` times it,
for a 2-core machine running a dozen other things. Each test prints its figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.placement import GROUP_LOG, TRANSACTION_LOG, place
from kop_dedup_tools.topics import create_topic
from tests.cluster_nodes import STATE_PARTITIONS, Nodes, key_owned_by
from tests.helpers import batch, read_all, uniq

pytestmark = [pytest.mark.integration, pytest.mark.faults]

REFRESH_S = 1.0
"""``cluster_refresh_ms`` of the nodes (the default)."""
KILL_BOUND_S = REFRESH_S + 1.0
"""The stated bound after a SIGKILL: one listing interval, plus listing and loading."""
LOADED_MACHINE = 3.0
"""The margin the assertions allow over a stated bound (a loaded CI machine)."""


def _figures(name: str, figures: dict[str, Any]) -> None:
    print(f"\nCLUSTER {name} {json.dumps(figures)}")


class Probe:
    """Requests that need a live owner, each tried (through the live nodes in turn) until
    it is answered 0 once: when each first was, in seconds after ``t0``."""

    def __init__(self, urls: list[str]) -> None:
        self._clients = [httpx.Client(base_url=u, timeout=10) for u in urls]
        self.answered: dict[str, float] = {}
        self.refusals: dict[str, list[str]] = {}

    def close(self) -> None:
        for c in self._clients:
            c.close()

    def run(
        self, t0: float, items: dict[str, Callable[[httpx.Client], tuple[bool, str]]], limit: float
    ) -> None:
        turn = 0
        while len(self.answered) < len(items) and time.monotonic() - t0 < limit:
            for name, attempt in items.items():
                if name in self.answered:
                    continue
                client = self._clients[turn % len(self._clients)]
                turn += 1
                try:
                    ok, why = attempt(client)
                except httpx.HTTPError as exc:
                    ok, why = False, type(exc).__name__
                if ok:
                    self.answered[name] = round(time.monotonic() - t0, 3)
                else:
                    self.refusals.setdefault(name, []).append(why)
            time.sleep(0.02)


RETRIABLE = frozenset({6, 7, 14, 15, 16, 51, 56})
"""Codes a client retries (a partition or coordinator moving, loading, a transaction
being applied): the nodes of a cluster that starts side by side answer some of them
for a moment while each sees the others join."""


def settled(call: Callable[[], httpx.Response], timeout: float = 30.0) -> dict[str, Any]:
    """``call``'s answer once it is not a retriable code (retried as a client would)."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = call().json()
        code = body["results"][0]["errorCode"] if "results" in body else body.get("errorCode")
        if code not in RETRIABLE or time.monotonic() > deadline:
            assert code == 0, body
            return body
        time.sleep(0.1)


def _code(r: httpx.Response) -> tuple[bool, str]:
    body = r.json()
    code = body["results"][0]["errorCode"] if "results" in body else body.get("errorCode")
    return code == 0, f"{r.status_code}:{code}"


def test_a_killed_nodes_partitions_and_keys_answer_from_live_nodes_within_the_bound(
    pulsar, tmp_path, pulsar_reader_client
):
    """Node 2 leads data partitions and owns state partitions of both logs, and a
    producer, transactional ids and groups are in use on it; SIGKILL. Every one of its
    partitions and keys must answer from a live node (an idempotent batch at the next
    sequence, a transactional id's next epoch, a group's offset commit) within the bound,
    and the survivors' GET /v1/cluster must show them owning everything."""
    nodes = Nodes(pulsar, tmp_path).start()
    try:
        members, survivors, victim = [1, 2, 3], [1, 3], 2
        topic = uniq("kill")
        create_topic(pulsar.admin_url, topic, partitions=6)
        leaders = place(f"topic:{topic}", 6, members)
        assert victim in leaders
        api = httpx.Client(base_url=nodes[1].url, timeout=30)
        pid = settled(lambda: api.post("/v1/init-producer-id", json={}))["producerId"]
        for p in range(6):  # the producer is open on every leader, node 2's included
            body = {"batches": [batch(topic, pid, 0, partition=p)]}
            settled(lambda body=body: api.post("/v1/produce", json=body))
        owned = {
            log: [p for p, n in enumerate(place(log, STATE_PARTITIONS, members)) if n == victim]
            for log in (TRANSACTION_LOG, GROUP_LOG)
        }
        assert all(owned.values()), owned
        tids = {
            p: key_owned_by(TRANSACTION_LOG, victim, members, "tid", partition=p)
            for p in owned[TRANSACTION_LOG]
        }
        epochs = {
            tid: settled(lambda tid=tid: init(api, tid))["producerEpoch"] for tid in tids.values()
        }
        groups = {
            p: key_owned_by(GROUP_LOG, victim, members, "g", partition=p) for p in owned[GROUP_LOG]
        }
        for g in groups.values():
            settled(lambda g=g: api.post(f"/v1/groups/{g}/offsets", json=commit(topic, 1)))
        api.close()

        items: dict[str, Callable[[httpx.Client], tuple[bool, str]]] = {}
        for p in range(6):
            body = {"batches": [batch(topic, pid, 1, partition=p)]}
            items[f"partition {p} (led by {leaders[p]})"] = lambda c, b=body: _code(
                c.post("/v1/produce", json=b)
            )
        for p, tid in tids.items():

            def bump(c: httpx.Client, tid: str = tid) -> tuple[bool, str]:
                r = init(c, tid)
                ok, why = _code(r)
                if ok:
                    assert r.json()["producerEpoch"] > epochs[tid], (tid, epochs[tid], r.text)
                return ok, why

            items[f"transactional id of {TRANSACTION_LOG}-{p}"] = bump
        for p, g in groups.items():
            items[f"group of {GROUP_LOG}-{p}"] = lambda c, g=g: _code(
                c.post(f"/v1/groups/{g}/offsets", json=commit(topic, 2))
            )

        probe = Probe([nodes[i].url for i in survivors])
        t0 = time.monotonic()
        nodes[victim].kill()
        try:
            probe.run(t0, items, limit=60)
        finally:
            probe.close()
        cluster_settled = nodes.wait_listed(survivors, timeout=60) + (time.monotonic() - t0)
        slowest = max(probe.answered.values(), default=None)
        _figures(
            "sigkill",
            {
                "answered_s": probe.answered,
                "slowest_s": slowest,
                "refusals": {k: sorted(set(v)) for k, v in probe.refusals.items()},
                "cluster_settled_s": round(cluster_settled, 3),
            },
        )
        assert set(probe.answered) == set(items), probe.refusals
        assert slowest is not None
        assert slowest <= KILL_BOUND_S * LOADED_MACHINE, probe.answered
        assert not nodes[victim].running()

        # what was acknowledged is there once, in order, and the groups' commits took
        for p in range(6):
            ptopic = f"persistent://public/kafka/{topic}-partition-{p}"
            stored = [m.data().decode() for m in read_all(pulsar_reader_client, ptopic)]
            assert stored == [f"{pid}:0:0", f"{pid}:0:1"], (p, stored)
        with httpx.Client(base_url=nodes[3].url, timeout=30) as c:
            for g in groups.values():
                got = c.get(f"/v1/groups/{g}/offsets").json()["offsets"]
                assert [o["offset"] for o in got] == [2], got
    finally:
        nodes.stop()


def commit(topic: str, value: int) -> dict[str, Any]:
    return {"offsets": [{"topic": topic, "partition": 0, "offset": value}]}


def init(client: httpx.Client, tid: str) -> httpx.Response:
    return client.post("/v1/init-producer-id", json={"transactionalId": tid})
