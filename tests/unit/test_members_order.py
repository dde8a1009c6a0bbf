"""Listings of the members are published in the order they were begun: a node lists on
its timer and again on every forward that fails (a node died a moment ago), side by
side, and an answer that comes late must not take the view back to members Pulsar no
longer lists. It did: right after a SIGKILL a survivor's view went to the survivors, back
to the dead node's (a listing begun before the death, answered after), and to the
survivors again, so a partition's load there was cancelled mid-read and begun again.
Pulsar faked: the members are the consumers the fake admin lists, as of when it is
asked; the test chooses when each answer arrives."""

from __future__ import annotations

import asyncio
from typing import Any

from kop_dedup.cluster.members import SUBSCRIPTION, Membership, properties_of
from kop_dedup.cluster.placement import ClusterView, Member


class Broker:
    """The members topic's consumers, listed as of the moment the admin API is asked; a
    listing can be held (its answer arrives when the test says)."""

    def __init__(self) -> None:
        self.listed: list[dict[str, str]] = []
        self.hold: asyncio.Event | None = None
        self.asked = asyncio.Event()

    async def subscribe(self, _topic: str, _sub: str, **kwargs: Any) -> Any:
        props = kwargs["properties"]
        self.listed.append(props)

        class Consumer:
            async def close(self) -> None:
                return None

        return Consumer()

    async def get_json(self, _path: str) -> dict[str, Any]:
        consumers = [{"metadata": dict(p)} for p in self.listed]  # as the broker has them now
        hold, self.hold = self.hold, None
        self.asked.set()
        if hold is not None:
            await hold.wait()
        return {"subscriptions": {SUBSCRIPTION: {"consumers": consumers}}}


def _member(node_id: int) -> Member:
    return Member(node_id, "h", 9000 + node_id, f"http://h:{8000 + node_id}", f"i{node_id}", 1)


def test_a_listing_answered_after_a_later_one_does_not_bring_a_dead_node_back():
    async def scenario() -> None:
        broker = Broker()
        for n in (2, 3):
            broker.listed.append(properties_of(_member(n)))
        membership = Membership(broker, broker, "persistent://public/sys/cluster-members")  # type: ignore[arg-type]
        await membership.join(_member(1))
        views: list[tuple[int, ...]] = []

        async def seen(view: ClusterView) -> None:
            views.append(view.node_ids)

        membership.listen(seen)
        answer = broker.hold = asyncio.Event()
        broker.asked.clear()
        timer = asyncio.ensure_future(membership.refresh())  # begun while node 2 is live
        await broker.asked.wait()
        broker.listed.remove(properties_of(_member(2)))  # node 2 dies: its consumer goes
        assert (await membership.refresh()).node_ids == (1, 3)  # a forward failed: relisted
        answer.set()
        assert (await timer).node_ids == (1, 3), "the late answer was published"
        assert (await membership.refresh()).node_ids == (1, 3)
        assert (1, 2, 3) not in views[views.index((1, 3)) :], views

    asyncio.run(scenario())
