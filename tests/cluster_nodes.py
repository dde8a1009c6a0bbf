"""A cluster of real ``kop-dedup serve`` processes for the cluster's fault and client
tests: node ids chosen by the test, one system namespace of their own (so no other
sidecar of the session joins them), INFO logs kept under the test's directory.

>>> nodes = Nodes(pulsar, tmp_path, ids=(1, 2, 3)).start()
>>> nodes[2].kill()                       # SIGKILL node 2 (a ProcessSidecar)
>>> nodes.wait_listed((1, 3))             # every live node lists exactly 1 and 3
>>> nodes.described(1)["owned"]           # GET /v1/cluster of node 1
>>> nodes.moves(1)                        # cluster_ownership_moves_total of node 1
>>> nodes.stop()

Placement questions (who owns what with which members) are asked of the pure rule
(:func:`kop_dedup.cluster.placement.place`), the same one the nodes use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import httpx

from kop_dedup.cluster.placement import GROUP_LOG, TRANSACTION_LOG, place
from kop_dedup.coordination.partitions import partition_of
from tests.helpers import uniq
from tests.sidecar import ProcessSidecar

__all__ = ["LOGS", "RETRIABLE", "STATE_PARTITIONS", "Nodes", "key_owned_by", "leader_of", "settled"]

STATE_PARTITIONS = 8
"""Partitions of each coordinator log (the default of both settings)."""
LOGS = (TRANSACTION_LOG, GROUP_LOG)


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


def key_owned_by(
    log: str, node: int, members: Iterable[int], prefix: str, *, partition: int | None = None
) -> str:
    """A fresh key (group id or transactional id) whose state partition ``node`` owns
    among ``members`` (and is ``partition``, when given)."""
    owners = place(log, STATE_PARTITIONS, list(members))
    for _ in range(100_000):
        key = uniq(prefix)
        p = partition_of(key, STATE_PARTITIONS)
        if owners[p] == node and (partition is None or p == partition):
            return key
    raise AssertionError(f"no key of {log} owned by node {node} among {members}")


def leader_of(topic: str, partition: int, count: int, members: Iterable[int]) -> int:
    """The leader the placement gives a data partition among ``members``."""
    return place(f"topic:{topic}", count, list(members))[partition]


class Nodes:
    """Sidecar processes of one cluster, by node id."""

    def __init__(
        self, pulsar: Any, log_dir: Path, ids: Iterable[int] = (1, 2, 3), **settings: Any
    ) -> None:
        self.system_namespace = settings.pop("system_namespace", None) or uniq("sys")
        self.settings = {
            "system_namespace": self.system_namespace,
            "cluster_refresh_ms": 1000,
            "log_level": "INFO",
            **settings,
        }
        self._pulsar, self._log_dir = pulsar, log_dir
        self.by_id: dict[int, ProcessSidecar] = {}
        for node_id in ids:
            self.add(node_id)
        self._http = httpx.Client(timeout=10)

    def add(self, node_id: int) -> ProcessSidecar:
        """A node of this cluster (not started)."""
        sc = ProcessSidecar(self._pulsar, self._log_dir, node_id=node_id, **self.settings)
        self.by_id[node_id] = sc
        return sc

    def __getitem__(self, node_id: int) -> ProcessSidecar:
        return self.by_id[node_id]

    def __iter__(self) -> Iterator[ProcessSidecar]:
        return iter(self.by_id.values())

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self.by_id)

    def running(self) -> tuple[int, ...]:
        return tuple(i for i, sc in self.by_id.items() if sc.running())

    def bootstrap(self, ids: Iterable[int] | None = None) -> str:
        return ",".join(self.by_id[i].kafka_bootstrap for i in (ids or self.ids))

    def start(self, timeout: float = 180.0) -> Self:
        """Start every node not running, side by side, and wait until each lists them all."""
        todo = [sc for sc in self if not sc.running()]
        with ThreadPoolExecutor(max(1, len(todo))) as pool:
            for future in [pool.submit(sc.start, timeout) for sc in todo]:
                future.result()
        self.wait_listed(self.running(), timeout=60)
        return self

    def write_every_state_partition(self) -> None:
        """Write every state partition through its owner (a transactional id's init, a
        group's commit) through the first running node, retrying what a client retries.

        Nodes started side by side can leave a partition whose owner was fenced for a
        moment by a node that held it in its own first view and let it go: the owner
        still counts it as loaded and learns otherwise at its next write (answered
        NOT_COORDINATOR, then it loads the partition again: one more ownership move).
        Written once by its owner, every partition is held by it."""
        members = list(self.running())
        offsets = {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}
        with httpx.Client(base_url=self.by_id[members[0]].url, timeout=30) as api:
            for p in range(STATE_PARTITIONS):
                owner = place(TRANSACTION_LOG, STATE_PARTITIONS, members)[p]
                tid = key_owned_by(TRANSACTION_LOG, owner, members, "tid", partition=p)
                settled(lambda t=tid: api.post("/v1/init-producer-id", json={"transactionalId": t}))
                owner = place(GROUP_LOG, STATE_PARTITIONS, members)[p]
                group = key_owned_by(GROUP_LOG, owner, members, "g", partition=p)
                settled(lambda g=group: api.post(f"/v1/groups/{g}/offsets", json=offsets))

    def stop(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.by_id))) as pool:
            list(pool.map(lambda sc: sc.stop(), self.by_id.values()))
        self._http.close()

    # -- what each node says ----------------------------------------------------------

    def described(self, node_id: int) -> dict[str, Any]:
        """GET /v1/cluster of a node."""
        r = self._http.get(f"{self.by_id[node_id].url}/v1/cluster")
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def moves(self, node_id: int) -> int:
        """``kop_dedup_cluster_ownership_moves_total`` of a node (``/metrics``)."""
        return int(self.metric(node_id, "kop_dedup_cluster_ownership_moves_total"))

    def metric(self, node_id: int, name: str) -> float:
        """One sample of a node's ``/metrics`` (``name`` with its labels, as printed)."""
        text = self._http.get(f"{self.by_id[node_id].url}/metrics").text
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == name:
                return float(value)
        raise AssertionError(f"node {node_id} has no sample {name}")

    def listed(self, ids: Iterable[int]) -> bool:
        """Whether every node of ``ids`` lists exactly ``ids`` as the cluster."""
        want = sorted(ids)
        return all([n["nodeId"] for n in self.described(i)["nodes"]] == want for i in want)

    def covered(self, ids: Iterable[int]) -> bool:
        """Whether the nodes of ``ids`` agree on the owners of every state partition and,
        between them, have every one loaded, each once."""
        described = [self.described(i) for i in ids]
        if any(d["stateOwners"] != described[0]["stateOwners"] for d in described):
            return False
        for log in LOGS:
            owned = [p for d in described for p in d["owned"][log]]
            if sorted(owned) != list(range(STATE_PARTITIONS)):
                return False
        return True

    def wait_listed(self, ids: Iterable[int], timeout: float = 30.0) -> float:
        """Wait until every node of ``ids`` lists exactly those and they have every state
        partition loaded; the seconds it took."""
        ids = tuple(ids)
        began = time.monotonic()
        last: object = None
        while time.monotonic() - began < timeout:
            try:
                if self.listed(ids) and self.covered(ids):
                    return time.monotonic() - began
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.05)
        views = {}
        for i in ids:
            try:
                d = self.described(i)
                views[i] = ([n["nodeId"] for n in d["nodes"]], d["owned"])
            except httpx.HTTPError as exc:
                views[i] = repr(exc)
        raise AssertionError(f"nodes {ids} did not settle in {timeout}s: {views} (last {last!r})")
