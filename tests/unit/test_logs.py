"""The log lines a person reads: our ``extra`` fields, never uvicorn's ``color_message``
(its message again with terminal escape codes, which it passes to every record)."""

from __future__ import annotations

import json
import logging

import pytest

from kop_dedup.observability.logs import ConsoleFormatter, JsonFormatter


def uvicorn_record() -> logging.LogRecord:
    """What uvicorn logs at start: the plain message, and ``color_message`` as extra."""
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (2478,), None
    )
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"
    record.topic = "orders"  # one of ours, to show extras still come through
    return record


def test_json_lines_leave_out_uvicorns_color_message():
    doc = json.loads(JsonFormatter().format(uvicorn_record()))
    assert doc["event"] == "Started server process [2478]"
    assert doc["topic"] == "orders"
    assert "color_message" not in doc


def test_console_lines_leave_out_uvicorns_color_message():
    line = ConsoleFormatter("%(levelname)s %(name)s: %(message)s").format(uvicorn_record())
    assert line == "INFO uvicorn.error: Started server process [2478] topic=orders"
    assert "\x1b" not in line


@pytest.mark.parametrize("formatter", [JsonFormatter(), ConsoleFormatter()])
def test_a_record_without_extras_has_no_extra_fields(formatter):
    record = logging.LogRecord("kop_dedup", logging.INFO, __file__, 1, "hello", (), None)
    text = formatter.format(record)
    assert "color_message" not in text
    assert "=" not in text.split("hello", 1)[1]
