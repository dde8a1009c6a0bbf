"""Durable subscriptions a consumer group keeps on its topics (so that Pulsar's own
tools see where a group stands): created at the earliest position, moved to the group's
commits, deleted with the group."""

from __future__ import annotations

from urllib.parse import quote

from kop_dedup.pulsar.admin import AdminError, PulsarAdmin

__all__ = ["create_subscription", "delete_subscription", "move_subscription"]


async def create_subscription(admin: PulsarAdmin, topic: str, subscription: str) -> None:
    """A durable subscription at the earliest position (409: it exists already)."""
    path = topic.removeprefix("persistent://")
    try:
        await admin.request(
            "PUT",
            f"/admin/v2/persistent/{path}/subscription/{quote(subscription, safe='')}",
            json={"ledgerId": -1, "entryId": -1},
        )
    except AdminError as exc:
        if exc.status != 409:
            raise


async def delete_subscription(admin: PulsarAdmin, topic: str, subscription: str) -> None:
    """Delete a durable subscription, even with consumers on it (gone already: done)."""
    path = topic.removeprefix("persistent://")
    try:
        await admin.request(
            "DELETE",
            f"/admin/v2/persistent/{path}/subscription/{quote(subscription, safe='')}",
            params={"force": "true"},
        )
    except AdminError as exc:
        if exc.status != 404:
            raise


async def move_subscription(
    admin: PulsarAdmin, topic: str, subscription: str, ledger: int, entry: int, batch_index: int
) -> None:
    """Move a subscription's cursor so the message at the position is the next unread."""
    path = topic.removeprefix("persistent://")
    await admin.request(
        "POST",
        f"/admin/v2/persistent/{path}/subscription/{quote(subscription, safe='')}/resetcursor",
        json={"ledgerId": ledger, "entryId": entry, "batchIndex": batch_index},
    )
