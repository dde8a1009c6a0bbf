"""``python -m kop_dedup`` is the ``kop-dedup`` command."""

from __future__ import annotations

from kop_dedup.cli import main

raise SystemExit(main())
