"""Files shipped with the package (read through :func:`path`, never through the checkout):
the Maven settings that mirror every repository to Central, and the pom that names the
Spark connector's jars; and :func:`cache_dir`, where what they fetch is kept."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["cache_dir", "path"]


def path(name: str) -> Path:
    """A real filesystem path to a packaged resource (Maven needs files, not streams)."""
    ref = resources.files(__name__).joinpath(name)
    if not ref.is_file():
        raise FileNotFoundError(f"kop_dedup.resources has no {name!r}")
    return Path(str(ref))


def cache_dir() -> Path:
    """Where fetched files live: ``$KOP_DEDUP_CACHE``, else ``~/.cache/kop-dedup``."""
    return Path(os.environ.get("KOP_DEDUP_CACHE") or Path.home() / ".cache" / "kop-dedup")
