"""Check-back: ask the application what to do with a transaction in doubt (RocketMQ's
``checkLocalTransaction``).

The coordinator POSTs ``{transactionalId, producerId, producerEpoch, ordinal,
partitions, records, recordCount}`` to the URL the producer registered with
``init-producer-id`` and reads the answer: ``COMMIT``, ``ROLLBACK`` or ``UNKNOWN``, as a
JSON object's ``decision`` (or ``status``/``result``), a JSON string, or plain text.
A failure to answer (an error status, a timeout, anything else) counts as UNKNOWN.

>>> parse_answer(b'{"decision": "commit"}', "application/json")
<Answer.COMMIT: 'COMMIT'>
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

import httpx

__all__ = ["Answer", "CheckBack", "parse_answer"]

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


class CheckBack:
    """The HTTP client that asks applications (one per sidecar)."""

    def __init__(self, timeout_s: float) -> None:
        self._http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)

    async def ask(self, url: str, body: dict[str, Any]) -> tuple[Answer, str]:
        """(the answer, what happened, for the log)."""
        try:
            resp = await self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            return Answer.UNKNOWN, f"no answer: {type(exc).__name__}: {exc}"
        if resp.status_code >= 300:
            return Answer.UNKNOWN, f"answered HTTP {resp.status_code}"
        answer = parse_answer(resp.content, resp.headers.get("content-type"))
        return answer, f"answered {answer.value}"

    async def close(self) -> None:
        await self._http.aclose()
