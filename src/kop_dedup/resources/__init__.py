"""Files shipped with the package (read through :func:`path`, never through the checkout):
the Maven settings that mirror every repository to Central, and the pom that names the
Spark connector's jars; :func:`run_maven`, which runs Maven with those settings;
:func:`cache_dir`, where what they fetch is kept; and the lines the fetch commands print
(:func:`fetched`: one per artifact, never one per jar; :func:`progress`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

__all__ = ["MavenError", "cache_dir", "fetched", "path", "progress", "run_maven"]


class MavenError(RuntimeError):
    """Maven is missing or failed; the message says what it was for, with its output's tail."""


def path(name: str) -> Path:
    """A real filesystem path to a packaged resource (Maven needs files, not streams)."""
    ref = resources.files(__name__).joinpath(name)
    if not ref.is_file():
        raise FileNotFoundError(f"kop_dedup.resources has no {name!r}")
    return Path(str(ref))


def cache_dir() -> Path:
    """Where fetched files live: ``$KOP_DEDUP_CACHE``, else ``~/.cache/kop-dedup``."""
    return Path(os.environ.get("KOP_DEDUP_CACHE") or Path.home() / ".cache" / "kop-dedup")


def fetched(what: str, jars: Sequence[Path], where: Path) -> str:
    """The one line a fetch command prints for an artifact it has (fetched now or
    before): ``<what>: <n> jars, <MB> MB in <where>``; the jars themselves are not
    listed (``ls`` the directory for them)."""
    size = sum(j.stat().st_size for j in jars)
    return f"{what}: {len(jars)} jars, {size / 1e6:.0f} MB in {where}"


def progress(message: str) -> None:
    """Say what a slow step is waiting for (a Maven resolution, a download), to a person
    at a terminal only: logs and CI get the one result line per artifact."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr)


def run_maven(*args: str, what: str) -> None:
    """Run ``mvn -B -q -s <packaged maven-settings.xml> *args`` (every repository mirrored
    to Central; ``-ntp`` under CI) and wait. ``what`` completes "could not ..." in the
    :class:`MavenError` raised when Maven is missing or fails."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(f"Maven (mvn) is needed to {what}; install it first")
    quiet = ["-ntp"] if os.environ.get("CI") else []
    cmd = [mvn, "-B", "-q", *quiet, "-s", str(path("maven-settings.xml")), *args]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)  # noqa: S603
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise MavenError(f"could not {what} with Maven (exit {proc.returncode}):\n{tail}")
