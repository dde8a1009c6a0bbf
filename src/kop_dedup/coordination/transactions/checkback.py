"""Check-back: ask the application what to do with a transaction in doubt (RocketMQ's
``checkLocalTransaction``).

A transaction of an id whose producer registered a check-back URL is not aborted when
it times out: its producer is fenced and the transaction is kept open *in doubt*
while :class:`CheckBacks` asks the application, up to ``check_back_max`` times
(waiting 1, 2, 4 ... s, up to a minute), then aborts it.

The coordinator POSTs ``{transactionalId, producerId, producerEpoch, ordinal,
partitions, records, recordCount}`` to the URL the producer registered with
``init-producer-id`` and reads the answer: ``COMMIT``, ``ROLLBACK`` or ``UNKNOWN``, as a
JSON object's ``decision`` (or ``status``/``result``), a JSON string, or plain text.
A failure to answer (an error status, a timeout, anything else) counts as UNKNOWN.

Asking is background work of the log partition's owner, and it never takes the
partition: an answer can take the whole check-back timeout, and another sidecar may
have taken the partition meanwhile (a client of another id of that partition went to
it). What the answer changes (the count of check-backs, the decision) is written only
if this sidecar still owns the partition; otherwise the answer is dropped and the new
owner, which recovers the partition's transactions in doubt, asks again. (Taking the
partition back would fence the sidecar the clients use, as a sweep that did so once
did.)

>>> parse_answer(b'{"decision": "commit"}', "application/json")
<Answer.COMMIT: 'COMMIT'>
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import logging
import urllib.parse
from collections.abc import Sequence
from typing import Any

import httpx

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.applier import TransactionApplier
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import Decide, TransactionStateManager
from kop_dedup.coordination.transactions.stats import TxnStats
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.transactions import Transaction, TxnState

__all__ = ["Answer", "CheckBack", "CheckBacks", "check_back_refusal", "parse_answer"]

_CHECK_BACK_RECORDS = 1000

log = logging.getLogger(__name__)


class Answer(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


def parse_answer(body: bytes, content_type: str | None) -> Answer:
    """The decision in an application's answer; UNKNOWN when there is none."""
    text: Any = body.decode("utf-8", "replace").strip()
    looks_json = bool(text) and text[0] in '{["'
    if looks_json or (content_type is not None and "json" in content_type):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = text
        if isinstance(doc, dict):
            doc = next((doc[k] for k in ("decision", "status", "result") if k in doc), "")
        text = doc
    if not isinstance(text, str):
        return Answer.UNKNOWN
    try:
        return Answer(text.strip().upper())
    except ValueError:
        return Answer.UNKNOWN


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_and_path(url: str) -> tuple[tuple[str, str, int], str] | None:
    """((scheme, host, port), path) of an http(s) URL; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    origin = (scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme])
    return origin, parts.path or "/"


def _climbs(path: str) -> bool:
    """Whether ``path`` has a ``.`` or ``..`` segment, once percent-decoded (``%2e``,
    ``%2f`` included)."""
    return any(segment in {".", ".."} for segment in urllib.parse.unquote(path).split("/"))


def check_back_refusal(url: str, prefixes: Sequence[str]) -> str | None:
    """Why ``url`` may not be a check-back URL (None: it may), given the allowed
    prefixes (``check_back_urls``): the same scheme, host and port as one of them, and
    a path that starts with its path and has no ``.`` or ``..`` segment (which would
    take the call elsewhere).

    >>> check_back_refusal("https://app:8443/txn/a", ["https://app:8443/txn/"]) is None
    True
    >>> check_back_refusal("https://app.evil/txn/a", ["https://app/txn/"]) is not None
    True
    """
    if not prefixes:
        return (
            "checkBackUrl is refused: no check-back URL is allowed (set "
            "KOP_DEDUP_CHECK_BACK_URLS to the URL prefixes the sidecar may call)"
        )
    asked = _origin_and_path(url)
    if asked is not None and _climbs(asked[1]):
        # an HTTP client removes dot segments before it sends: /txn/../admin is /admin
        return (
            f"checkBackUrl {url!r} has a '.' or '..' path segment (percent-encoded or "
            "not): give the path as it is to be called"
        )
    for prefix in prefixes:
        allowed = _origin_and_path(prefix)
        if (
            asked is not None
            and allowed is not None
            and asked[0] == allowed[0]
            and asked[1].startswith(allowed[1])
        ):
            return None
    return f"checkBackUrl {url!r} starts with none of KOP_DEDUP_CHECK_BACK_URLS"


class CheckBack:
    """The HTTP client that asks applications (one per sidecar): only URLs the
    allow-list admits, within ``timeout_s`` in all (connect, send, answer), reading at
    most ``max_bytes`` of the answer (a longer one counts as no answer)."""

    def __init__(
        self,
        timeout_s: float,
        *,
        allowed: Sequence[str] = (),
        max_bytes: int = 64 * 1024,
    ) -> None:
        self._http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)
        self._timeout_s, self._allowed, self._max_bytes = timeout_s, tuple(allowed), max_bytes

    async def ask(self, url: str, body: dict[str, Any]) -> tuple[Answer, str]:
        """(the answer, what happened, for the log)."""
        refused = check_back_refusal(url, self._allowed)
        if refused is not None:  # stored before the allow-list changed: never called
            return Answer.UNKNOWN, f"not asked: {refused}"
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._post(url, body)
        except TimeoutError:
            return Answer.UNKNOWN, f"no answer within {self._timeout_s:g} s"
        except httpx.HTTPError as exc:
            return Answer.UNKNOWN, f"no answer: {type(exc).__name__}: {exc}"

    async def _post(self, url: str, body: dict[str, Any]) -> tuple[Answer, str]:
        async with self._http.stream("POST", url, json=body) as resp:
            if resp.status_code >= 300:
                return Answer.UNKNOWN, f"answered HTTP {resp.status_code}"
            content = bytearray()
            async for chunk in resp.aiter_bytes():
                content += chunk
                if len(content) > self._max_bytes:
                    return Answer.UNKNOWN, f"an answer over {self._max_bytes} bytes"
            answer = parse_answer(bytes(content), resp.headers.get("content-type"))
            return answer, f"answered {answer.value}"

    async def close(self) -> None:
        await self._http.aclose()


class CheckBacks:
    """The check-backs of transactions in doubt in the log partitions this sidecar
    owns: one task per transactional id, until the application decides or the limit."""

    def __init__(
        self,
        state: TransactionStateManager,
        applier: TransactionApplier,
        copier: Copier,
        stats: TxnStats,
        settings: TxnSettings,
    ) -> None:
        self._state, self._applier, self._copier = state, applier, copier
        self._stats, self._settings = stats, settings
        self._client = CheckBack(
            settings.check_back_timeout_s,
            allowed=settings.check_back_urls,
            max_bytes=settings.check_back_max_response_bytes,
        )
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    def asking(self) -> int:
        return len(self._asking)

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._asking.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._client.close()

    def ensure(self, transactional_id: str) -> None:
        """Ask about the id's transaction in doubt in the background (once at a time)."""
        task = self._asking.get(transactional_id)
        if (task is not None and not task.done()) or self._closing:
            return
        task = asyncio.create_task(
            self._ask(transactional_id), name=f"check back {transactional_id}"
        )
        self._asking[transactional_id] = task
        task.add_done_callback(lambda _t: self._asking.pop(transactional_id, None))

    async def _ask(self, transactional_id: str) -> None:
        """Check back until the application answers COMMIT or ROLLBACK, or the limit."""
        p = self._state.partition_of(transactional_id)
        while not self._closing:
            txn = self._state.get(transactional_id)
            if txn is None or not txn.in_doubt or txn.state is not TxnState.ONGOING:
                return
            if not self._state.owned(p):
                return
            if txn.check_backs >= self._settings.check_back_max:
                log.info(
                    "transaction %d of %r: no decision after %d check-backs: aborting",
                    txn.ordinal,
                    transactional_id,
                    txn.check_backs,
                )
                with contextlib.suppress(errors.NotCoordinator):  # the new owner decides
                    await self._decide(transactional_id, commit=False)
                return
            answer, what = await self._client.ask(txn.check_back_url or "", await self._body(txn))
            self._stats.check_backs[answer.value] += 1
            log.info(
                "check-back %d of transaction %d of %r at %s: %s",
                txn.check_backs + 1,
                txn.ordinal,
                transactional_id,
                txn.check_back_url,
                what,
                extra={"transactional_id": transactional_id, "check_back": answer.value},
            )
            try:
                if answer is Answer.COMMIT or answer is Answer.ROLLBACK:
                    await self._decide(transactional_id, commit=answer is Answer.COMMIT)
                    return
                await self._state.change(
                    transactional_id, _count_check_back(txn.ordinal), take=False
                )
            except errors.NotCoordinator:
                log.info(
                    "check-back of transaction %d of %r: log partition %d moved to another "
                    "sidecar while the application answered; its new owner asks again",
                    txn.ordinal,
                    transactional_id,
                    p,
                )
                return
            wait_ms = min(self._settings.check_back_interval_ms * 2**txn.check_backs, 60_000)
            await asyncio.sleep(wait_ms / 1000)

    async def _decide(self, transactional_id: str, *, commit: bool) -> None:
        """Write the decision, as the partition's owner still (NOT_COORDINATOR when it is
        not: the new owner asks again)."""

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None or not current.in_doubt or current.state is not TxnState.ONGOING:
                return current
            ends = await self._applier.ends(current, commit)
            return tx.prepare(current, commit, ends, now_ms=now_ms())

        txn = await self._state.change(transactional_id, decide, take=False)
        if txn is not None and txn.state.preparing:
            self._applier.ensure(transactional_id)

    async def _body(self, txn: Transaction) -> dict[str, object]:
        """What the application is asked about: the transaction and its journaled records."""
        partitions: list[dict[str, object]] = []
        records: list[dict[str, object]] = []
        total = 0
        for part in txn.partitions:
            stored = await self._copier.journaled_now(txn, part)
            count = sum(len(b.records) for b in stored)
            total += count
            partitions.append({"topic": part.topic, "partition": part.partition, "records": count})
            for b in stored:
                for r in b.records:
                    if len(records) < _CHECK_BACK_RECORDS:
                        records.append(
                            {
                                "topic": part.topic,
                                "partition": part.partition,
                                "key": None if r.key is None else _b64(r.key),
                                "value": None if r.value is None else _b64(r.value),
                            }
                        )
        return {
            "transactionalId": txn.transactional_id,
            "producerId": txn.producer_id,
            "producerEpoch": txn.producer_epoch - 1,
            "ordinal": txn.ordinal,
            "partitions": partitions,
            "records": records,
            "recordCount": total,
        }


def _count_check_back(ordinal: int) -> Decide[Transaction | None]:
    async def count(current: Transaction | None) -> Transaction | None:
        if current is None or not current.in_doubt or current.ordinal != ordinal:
            return current
        return tx.asked(current, now_ms=now_ms())

    return count


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
