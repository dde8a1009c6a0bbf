"""The apply loop finishes what it starts, a replayed commit is a no-op, and a staging
that fails leaves no pending marker (real broker; faults injected at the coordinators'
boundaries: the group store's answers, the log writer's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.coordination.transactions.log import decode
from kop_dedup.protocol.transactions import TxnState
from tests.helpers import batch, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

FAST = {"coordinator_adopt_interval_ms": 300, "txn_sweep_interval_ms": 100}


def call(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stable(api: httpx.Client, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o for o in r.json()["offsets"]}


def begin_with_offsets(
    api: httpx.Client, tid: str, group: str, source: str, offset: int
) -> dict[str, Any]:
    """An open transaction of ``tid`` with one batch and ``offset`` staged; its ids."""
    body = call(api, "/v1/init-producer-id", {"transactionalId": tid})
    ids = {
        "transactionalId": tid,
        "producerId": body["producerId"],
        "producerEpoch": body["producerEpoch"],
    }
    one = batch(uniq("a"), body["producerId"], 0, 1, epoch=body["producerEpoch"])
    produced = call(api, "/v1/produce", {"transactionalId": tid, "batches": [one]})
    assert produced["results"][0]["errorCode"] == 0, produced
    stage = {
        **ids,
        "groupId": group,
        "offsets": [{"topic": source, "partition": 0, "offset": offset}],
    }
    assert call(api, "/v1/txn-offset-commit", stage)["errorCode"] == 0
    return ids


def fail_once(real: Callable[..., Awaitable[Any]], error: BaseException, seen: list[str]) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not seen:
            seen.append(type(error).__name__)
            raise error
        return await real(*args, **kwargs)

    return wrapper


def test_offsets_that_meet_not_coordinator_are_committed_on_a_later_try(pulsar):
    """The group store answers NOT_COORDINATOR (its partition moved) while this sidecar
    still owns the transaction's log partition: the apply loop tries again instead of
    leaving the transaction PrepareCommit for good."""
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")
    with ThreadSidecar(pulsar, **FAST) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        store = sc.runtime.offsets
        seen: list[str] = []
        moved = errors.NotCoordinator("consumer-groups partition moved (injected)")
        for name in ("commit", "commit_transaction"):
            if hasattr(store, name):
                setattr(store, name, fail_once(getattr(store, name), moved, seen))
        ids = begin_with_offsets(api, tid, group, source, 7)
        assert call(api, "/v1/end-txn", {**ids, "commit": True})["errorCode"] == 0
        wait_until(
            "the commit to complete",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
            30,
        )
        assert seen == ["NotCoordinator"]
        committed = stable(api, group)[(source, 0)]
        assert (committed["offset"], committed["errorCode"]) == (7, 0)


def test_a_decision_whose_write_failed_but_was_stored_is_applied(pulsar):
    """The PrepareCommit write reaches the log but its sender hears a failure: end-txn
    answers an error, the client gives up, and the decision must still be applied
    (data visible, offsets committed, CompleteCommit) with nobody asking again."""
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")
    with ThreadSidecar(pulsar, **FAST) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        ids = begin_with_offsets(api, tid, group, source, 3)
        coordinator = sc.runtime.transactions
        parts = getattr(coordinator, "parts", None) or coordinator.state.parts
        seen: list[str] = []
        for part in parts._parts:
            writer, real = part.writer, part.writer.send

            async def send(key: str, value: bytes, *, _real: Any = real, **kw: Any) -> None:
                await _real(key, value, **kw)
                if key == tid and not seen and decode(value).state is TxnState.PREPARE_COMMIT:
                    seen.append(key)
                    raise TimeoutError("stored, but the receipt was lost (injected)")

            writer.send = send
        answer = call(api, "/v1/end-txn", {**ids, "commit": True})
        assert seen == [tid]
        assert answer["errorCode"] != 0, answer  # the client hears a failure and gives up
        wait_until(
            "the stored decision to be applied",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
            30,
        )
        assert stable(api, group)[(source, 0)]["offset"] == 3
