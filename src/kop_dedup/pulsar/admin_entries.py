"""The broker's view of a topic's entries, as the admin REST answers it: an entry's index
and publish time, the earliest entry, the entry at a time, the ledgers and their entry
counts (consumer groups' positions, copies' counts), and :class:`AdminError`, what every
admin call raises.

:class:`EntryLookups` is a part of :class:`~kop_dedup.pulsar.admin.PulsarAdmin` (its
``request`` is the admin's: redirects, errors, the token).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

from kop_dedup.pulsar.message_ids import EntryPosition

__all__ = ["AdminError", "EntryLookups"]


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Pulsar admin answered {status}: {message}")
        self.status = status


class EntryLookups:
    """Lookups of a (partition) topic's entries (see the module docstring)."""

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        raise NotImplementedError  # the admin's

    async def entry_index(self, topic: str, ledger: int, entry: int) -> tuple[int, int] | None:
        """(index of the entry's last message, messages in the entry) from the broker's
        entry metadata; None when the broker does not index entries (no
        AppendIndexMetadataInterceptor). Raises AdminError 404 for an entry that is gone."""
        path = topic.removeprefix("persistent://")
        resp = await self.request(
            "GET", f"/admin/v2/persistent/{path}/ledger/{ledger}/entry/{entry}"
        )
        return _index_headers(resp.headers)

    async def entry_publish_ms(self, topic: str, ledger: int, entry: int) -> int | None:
        """When an entry was published (epoch ms; a batch: when it was sent), None when
        the broker does not say. Raises AdminError 404 for an entry that is gone."""
        path = topic.removeprefix("persistent://")
        resp = await self.request(
            "GET", f"/admin/v2/persistent/{path}/ledger/{ledger}/entry/{entry}"
        )
        return _publish_ms(resp.headers)

    async def first_entry(self, topic: str) -> tuple[int, int, tuple[int, int] | None] | None:
        """(ledger, entry, (index, messages) or None) of the earliest entry still stored;
        None when the topic holds none."""
        path = topic.removeprefix("persistent://")
        try:
            resp = await self.request(
                "GET",
                f"/admin/v2/persistent/{path}/examinemessage",
                params={"initialPosition": "earliest", "messagePosition": "1"},
            )
        except AdminError as exc:
            if exc.status in {404, 412}:  # nothing to examine
                return None
            raise
        mid = resp.headers.get("X-Pulsar-Message-ID", "")
        ledger, _, entry = mid.partition(":")
        if not ledger.lstrip("-").isdigit() or not entry.lstrip("-").isdigit():
            return None
        return int(ledger), int(entry), _index_headers(resp.headers)

    async def position_at(self, topic: str, timestamp_ms: int) -> EntryPosition:
        """(ledger, entry) of the first entry published at or after ``timestamp_ms`` (one
        past the last entry when none is)."""
        path = topic.removeprefix("persistent://")
        body = (
            await self.request("GET", f"/admin/v2/persistent/{path}/messageid/{timestamp_ms}")
        ).json()
        return int(body["ledgerId"]), int(body["entryId"])

    async def ledgers(self, topic: str) -> list[tuple[int, int]]:
        """(ledger id, entries) of every ledger still stored, oldest first."""
        path = topic.removeprefix("persistent://")
        stats = (await self.request("GET", f"/admin/v2/persistent/{path}/internalStats")).json()
        out = [
            (int(lg["ledgerId"]), int(lg.get("entries") or 0)) for lg in stats.get("ledgers") or []
        ]
        if out:  # the current ledger's count is only in currentLedgerEntries
            out[-1] = (out[-1][0], max(out[-1][1], int(stats.get("currentLedgerEntries") or 0)))
        return out


def _publish_ms(headers: httpx.Headers) -> int | None:
    raw = headers.get("X-Pulsar-publish-time")
    if raw is None:
        return None
    try:
        return int(datetime.fromisoformat(raw).timestamp() * 1000)
    except ValueError:
        return None


def _index_headers(headers: httpx.Headers) -> tuple[int, int] | None:
    index = headers.get("X-Pulsar-Broker-Entry-METADATA-index")
    if index is None:
        return None
    return int(index), int(headers.get("X-Pulsar-num-batch-message") or 1)
