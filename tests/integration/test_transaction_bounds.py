"""The coordinator's memory stays flat however many transactional ids pass through a
sidecar, their requests arriving through either of two sidecars (real broker)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers import batch, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

FAST = {"coordinator_adopt_interval_ms": 300, "txn_sweep_interval_ms": 100}
CAP = 8
TRANSIENT = ("local copies", "gates", "applying", "asking", "copy producers", "copy locks")


def call(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def coordinated_by(sc: ThreadSidecar) -> str:
    """A new transactional id whose coordinator is ``sc``: it journals and copies every
    transaction of the id, whichever sidecar the requests reach (the other forwards)."""
    cluster = sc.runtime.cluster
    return next(
        tid
        for tid in (uniq("tx") for _ in range(1000))
        if cluster.is_me(cluster.txn_coordinator(tid))
    )


def one_transaction(journaler: str, decider: str, tid: str) -> None:
    """A transaction of ``tid`` on a new topic: produced through ``journaler``, begun and
    committed through ``decider``."""
    topic = uniq("a")
    body = call(decider, "/v1/init-producer-id", {"transactionalId": tid})
    pid, epoch = body["producerId"], body["producerEpoch"]
    produced = call(
        journaler,
        "/v1/produce",
        {"transactionalId": tid, "batches": [batch(topic, pid, 0, 2, epoch=epoch)]},
    )
    assert produced["results"][0]["errorCode"] == 0, produced
    end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
    assert call(decider, "/v1/end-txn", end)["errorCode"] == 0
    wait_until(
        "the commit to complete",
        lambda: httpx.get(f"{decider}/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
        30,
    )


def sizes(sc: ThreadSidecar) -> dict[str, int]:
    """What the journaling sidecar keeps per transactional id, topic or transaction."""
    c = sc.runtime.transactions
    copier = c._copier
    journal = copier._journal
    return {
        "local copies": copier.local.to_dict()["transactions"],
        "journal positions": len(journal._seen),
        "journals ready": len(journal._ready),
        "gates": c.admission.gates(),
        "applying": c.applier.applying(),
        "asking": c.checkbacks.asking(),
        "copy producers": len(copier._pool),
        "copy locks": len(copier._locks),
    }


def test_memory_stays_flat_over_many_transactional_ids_completed_elsewhere(pulsar):
    settings = {
        **FAST,
        "txn_local_copy_max_transactions": CAP,
        "txn_remembered_partitions": CAP,
    }
    with ThreadSidecar(pulsar, **settings) as a, ThreadSidecar(pulsar, **FAST) as b:
        rounds = []
        for _ in range(2):
            for _ in range(2 * CAP):  # twice the cap per round
                one_transaction(b.url, a.url, coordinated_by(a))
            # what is kept only while a transaction needs it drains: local copies of
            # transactions completed elsewhere within a few sweeps, a copy producer (the
            # journaling sidecar may apply a decision after taking the id back) once
            # idle (10 s)
            wait_until(
                "what is kept per transaction to drain",
                lambda: all(sizes(a)[k] == 0 for k in TRANSIENT),
                30,
            )
            rounds.append(sizes(a))
        first, second = rounds
        assert second == first, rounds  # flat
        assert all(n <= CAP for n in second.values()), second
        assert (second["journal positions"], second["journals ready"]) == (CAP, CAP)
