"""The one wall clock: every stored time is read through ``kop_dedup.clock.now_ms``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import kop_dedup
from kop_dedup.clock import now_ms

_SRC = Path(kop_dedup.__file__).parent


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_now_ms_is_the_injected_clock_in_whole_milliseconds(seconds: float) -> None:
    assert now_ms(lambda: seconds) == int(seconds * 1000)


def test_now_ms_defaults_to_the_wall_clock(monkeypatch) -> None:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.1234)
    assert now_ms() == 1_700_000_000_123


def test_no_module_keeps_a_clock_of_its_own() -> None:
    """No other module defines a now_ms function or turns time.time() into
    milliseconds by hand (methods that pass an injected clock to now_ms are fine)."""
    own = set()
    for path in _SRC.rglob("*.py"):
        if path.name == "clock.py":
            continue
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "now_ms":
                own.add(f"{path.relative_to(_SRC)}: def {node.name}")
        if re.search(r"time\.time(_ns)?\(\)\s*\*\s*1_?000\b|\._clock\(\)\s*\*\s*1_?000\b", text):
            own.add(f"{path.relative_to(_SRC)}: milliseconds by hand")
    assert own == set()
