"""The configuration reference stays true: it is generated from the Settings class at
every docs build (scripts/mkdocs_hooks.py), and every field has its row with a
description (its docstring). A field added without a docstring fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field

from kop_dedup.settings import Settings
from kop_dedup_tools.settings_reference import PLACEHOLDER, problems, reference, render_page

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "configuration.md"


def generated() -> str:
    """The page as the docs build renders it."""
    return render_page(PAGE.read_text())


def test_every_setting_has_a_described_row_in_the_generated_reference():
    assert problems(Settings, generated()) == []
    rows = re.findall(r"`(KOP_DEDUP_[A-Z0-9_]+)` \|", generated())
    assert sorted(rows) == sorted(f"KOP_DEDUP_{n.upper()}" for n in Settings.model_fields)


def test_the_page_is_generated_not_written_by_hand():
    text = PAGE.read_text()
    assert PLACEHOLDER in text
    assert "KOP_DEDUP_MAX_INFLIGHT_BATCHES" not in text  # no hand-kept table beside it
    with pytest.raises(ValueError, match="placeholder"):
        render_page(text.replace(PLACEHOLDER, ""))


class WithAKnob(Settings):
    """Settings as they would be with one more field, documented."""

    extra_knob: int = Field(default=3, ge=1)
    """How many knobs to turn."""


class WithAnUndocumentedKnob(Settings):
    extra_knob: int = 3


def test_a_new_setting_is_missing_from_a_reference_generated_before_it():
    assert problems(WithAKnob, generated()) == ["KOP_DEDUP_EXTRA_KNOB: no row in the reference"]
    regenerated = render_page(PAGE.read_text(), WithAKnob)
    assert problems(WithAKnob, regenerated) == []
    assert "`KOP_DEDUP_EXTRA_KNOB` | `3` | int; ≥ 1 | How many knobs to turn. |" in regenerated


def test_a_setting_without_a_docstring_fails():
    page = render_page(PAGE.read_text(), WithAnUndocumentedKnob)
    assert problems(WithAnUndocumentedKnob, page) == [
        "KOP_DEDUP_EXTRA_KNOB: no description (a docstring below the field)"
    ]


def test_a_removed_setting_leaves_no_row():
    page = generated() + '| <a id="kop_dedup_gone"></a>`KOP_DEDUP_GONE` | `1` | int | gone |\n'
    assert problems(Settings, page) == ["KOP_DEDUP_GONE: documented, but no such setting"]


def test_rows_say_default_type_range_and_link_the_settings_they_name():
    text = reference()
    assert "## Where Pulsar is" in text
    assert "## The Kafka wire listener (kop_dedup.transports.kafka)" in text
    row = next(line for line in text.splitlines() if "`KOP_DEDUP_MAX_BATCH_BYTES`" in line)
    assert "| `1048576` (1 MiB) | int; ≥ 1, ≤ 4,194,304 |" in row
    assert "[`KOP_DEDUP_PULSAR_MAX_MESSAGE_BYTES`](#kop_dedup_pulsar_max_message_bytes)" in row
    secret = next(line for line in text.splitlines() if "`KOP_DEDUP_PULSAR_AUTH_TOKEN`" in line)
    assert "| unset | secret |" in secret
    listed = next(line for line in text.splitlines() if "`KOP_DEDUP_AUTH_TOKENS`" in line)
    assert "| `[]` | JSON list of secrets |" in listed
    fmt = next(line for line in text.splitlines() if "`KOP_DEDUP_LOG_FORMAT`" in line)
    assert "| `auto` | `auto` or `json` or `console` |" in fmt
    week = next(line for line in text.splitlines() if "`KOP_DEDUP_GROUP_RETENTION_MS`" in line)
    assert "| `604800000` (7 days) |" in week
