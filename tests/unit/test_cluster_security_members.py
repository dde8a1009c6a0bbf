"""Membership refuses a node whose security differs from a member's, and a running node
leaves such a member out of its views (issue 36: a node without authentication in the
cluster served the keys it coordinated for everyone). Pulsar faked: the members are
the consumers the fake admin lists."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from kop_dedup.cluster.members import SUBSCRIPTION, Membership, SecurityMismatch, properties_of
from kop_dedup.cluster.placement import Member

OPEN = "v1;auth=off;tokens=-;tokensFile=-;rolesFile=-;secretKey=-;publicKey=-;claim=-;superusers=-"
ROLES = OPEN.replace("auth=off", "auth=on").replace("rolesFile=-", "rolesFile=set")


class Broker:
    """The members topic's consumers: subscribe adds one, close removes it."""

    def __init__(self) -> None:
        self.listed: list[dict[str, str]] = []

    async def subscribe(self, _topic: str, _sub: str, **kwargs: Any) -> Any:
        props = kwargs["properties"]
        self.listed.append(props)
        broker = self

        class Consumer:
            async def close(self) -> None:
                broker.listed.remove(props)

        return Consumer()

    async def get_json(self, _path: str) -> dict[str, Any]:
        consumers = [{"metadata": dict(p)} for p in self.listed]
        return {"subscriptions": {SUBSCRIPTION: {"consumers": consumers}}}


def _member(node_id: int, security: str, started_ms: int) -> Member:
    return Member(
        node_id,
        "h",
        9000 + node_id,
        f"http://h:{8000 + node_id}",
        f"i{node_id}",
        started_ms,
        security,
    )


def _membership(broker: Broker) -> Membership:
    return Membership(broker, broker, "persistent://public/sys/cluster-members")  # type: ignore[arg-type]


@pytest.mark.parametrize(("running", "joining"), [(OPEN, ROLES), (ROLES, OPEN)])
def test_a_node_is_refused_by_a_member_that_authenticates_differently(running, joining):
    async def scenario() -> None:
        broker = Broker()
        first = _membership(broker)
        await first.join(_member(1, running, 1_000))
        second = _membership(broker)
        with pytest.raises(SecurityMismatch) as refused:
            await second.join(_member(2, joining, 2_000))
        message = str(refused.value)
        assert "node 1 at h:9001" in message, message
        assert "authentication is" in message
        assert "KOP_DEDUP_AUTH_ROLES_FILE" in message
        assert [p["nodeId"] for p in broker.listed] == ["1"]  # it left
        assert (await first.refresh()).node_ids == (1,)

    asyncio.run(scenario())


def test_a_node_started_earlier_is_refused_too_when_it_lists_the_other_first():
    """Side by side: the node that lists the other is refused, whichever started first."""

    async def scenario() -> None:
        broker = Broker()
        broker.listed.append(properties_of(_member(2, OPEN, 5_000)))  # listed, not yet joined
        with pytest.raises(SecurityMismatch):
            await _membership(broker).join(_member(1, ROLES, 1_000))

    asyncio.run(scenario())


def test_a_running_node_leaves_a_mismatched_member_out_of_its_views_and_says_so(caplog):
    async def scenario() -> None:
        broker = Broker()
        me = _membership(broker)
        await me.join(_member(1, ROLES, 1_000))
        broker.listed.append(properties_of(_member(2, OPEN, 2_000)))  # an older build's way
        broker.listed.append(properties_of(_member(3, ROLES, 3_000)))
        with caplog.at_level(logging.ERROR, logger="kop_dedup.cluster.members"):
            assert (await me.refresh()).node_ids == (1, 3)
            assert (await me.refresh()).node_ids == (1, 3)
        assert me.excluded == frozenset({2})
        broker.listed.pop(1)  # node 2 stops
        assert (await me.refresh()).node_ids == (1, 3)
        assert me.excluded == frozenset()
        logged = [r.getMessage() for r in caplog.records if "node 2" in r.getMessage()]
        assert len(logged) == 1, logged  # once per run of that node
        assert "authentication is on here and off on node 2" in logged[0]

    asyncio.run(scenario())


def test_nodes_with_the_same_security_join_one_cluster():
    async def scenario() -> None:
        broker = Broker()
        a, b = _membership(broker), _membership(broker)
        await a.join(_member(1, ROLES, 1_000))
        assert (await b.join(_member(2, ROLES, 2_000))).node_ids == (1, 2)
        assert (await a.refresh()).node_ids == (1, 2)

    asyncio.run(scenario())
