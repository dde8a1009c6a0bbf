"""Logging: to stdout, JSON when not on a terminal, one line per batch.

``extra={...}`` fields on a record become JSON keys (``key=value`` on a terminal),
except uvicorn's ``color_message`` (its message again with terminal escape codes,
passed as an extra on every record it logs). Secrets never reach the
log: settings hold them as SecretStr, and nothing logs request headers.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["configure"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_NOT_EXTRA = _STANDARD | {"color_message"}


def _extra(record: logging.LogRecord) -> dict[str, object]:
    """The fields a caller added to the record, in the order it added them."""
    return {k: v for k, v in vars(record).items() if k not in _NOT_EXTRA}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        doc.update(_extra(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extra = _extra(record)
        if extra:
            base += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return base


def configure(fmt: str = "auto", level: str = "INFO") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else ConsoleFormatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # the per-batch line is INFO; keep uvicorn's access log off (it duplicates it)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per admin call is noise
