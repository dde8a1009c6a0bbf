"""MkDocs hooks (``hooks:`` in mkdocs.yml): the configuration reference is generated
from the Settings class of this checkout at every build, never written by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))  # this checkout's settings, whatever is installed

from kop_dedup_tools.settings_reference import render_page  # noqa: E402

__all__ = ["CONFIGURATION", "on_page_markdown"]

CONFIGURATION = "reference/configuration.md"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == CONFIGURATION:
        return render_page(markdown)
    return markdown
