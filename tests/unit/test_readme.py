"""The README stays true: every setting is in its configuration table."""

from __future__ import annotations

import re
from pathlib import Path

from kop_dedup.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_is_documented_in_the_configuration_table():
    text = README.read_text()
    table = text[text.index("| variable | default | meaning |") :].split("\n\n", 1)[0]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    missing = sorted(n.upper() for n in Settings.model_fields if n.upper() not in documented)
    assert not missing, f"settings missing from the README's configuration table: {missing}"
