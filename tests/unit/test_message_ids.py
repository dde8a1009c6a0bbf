"""The two position types (entry, message) and their stored text: one definition each,
round trips, and the text that earlier versions wrote still reads the same."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given

import kop_dedup
from kop_dedup.pulsar.message_ids import (
    EntryPosition,
    MessagePosition,
    decode_entry_position,
    decode_message_position,
    encode_entry_position,
    encode_message_position,
)
from tests.strategies import entry_positions, message_positions

_SRC = Path(kop_dedup.__file__).parent


@given(entry_positions)
def test_entry_position_round_trips_through_its_text(position: EntryPosition) -> None:
    text = encode_entry_position(position)
    assert decode_entry_position(text) == position
    assert text == f"{position[0]}:{position[1]}"


@given(message_positions)
def test_message_position_round_trips_through_its_text(position: MessagePosition) -> None:
    text = encode_message_position(position)
    assert decode_message_position(text) == position
    assert text == f"{position[0]}:{position[1]}:{position[2]}"


@pytest.mark.parametrize(
    ("stored", "position"), [("12:3", (12, 3)), ("7:-1", (7, -1)), ("0:0", (0, 0))]
)
def test_stored_entry_positions_read_as_before(stored: str, position: EntryPosition) -> None:
    """Journal and data ranges of transactions already in Pulsar ("ledger:entry")."""
    assert decode_entry_position(stored) == position
    assert encode_entry_position(position) == stored


@pytest.mark.parametrize(
    ("stored", "position"),
    [("12:3:0", (12, 3, 0)), ("12:3:-1", (12, 3, -1)), ("5:9:100", (5, 9, 100))],
)
def test_stored_message_positions_read_as_before(stored: str, position: MessagePosition) -> None:
    """Group offsets, deliveries and resets already in Pulsar ("ledger:entry:batch")."""
    assert decode_message_position(stored) == position
    assert encode_message_position(position) == stored


def test_the_two_texts_are_told_apart() -> None:
    with pytest.raises(ValueError, match="unpack"):
        decode_message_position("12:3")
    with pytest.raises(ValueError, match="invalid literal"):
        decode_entry_position("12:3:0")


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_position_type_and_its_codec_is_defined_once() -> None:
    """No module but message_ids.py defines a position type or a position codec."""
    defined = {
        f"{path.relative_to(_SRC)}: {name}"
        for path in _SRC.rglob("*.py")
        if path.name != "message_ids.py"
        for name in _top_level_names(path)
        if name.endswith(("Position", "_position")) and not name.startswith("_")
    }
    assert defined == set()
