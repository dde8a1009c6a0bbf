"""A server distribution from Maven Central, unpacked once into the cache.

Maven resolves the artifact into the local repository (``$MAVEN_REPO``, else
``~/.m2/repository``) through the packaged settings, which mirror every repository to
Central (:func:`kop_dedup.resources.run_maven`); :func:`unpack_once` unpacks it under a
file lock, so that concurrent first starts unpack it once, and leaves a marker, so that
later calls return at once. The local Pulsar broker
(:meth:`~kop_dedup_tools.launcher.LocalPulsar.ensure_distribution`) does:

>>> tarball = maven_file("org.apache.pulsar", "pulsar-server-distribution", "4.0.8",
...                      "tar.gz", "bin")
>>> coordinates = "org.apache.pulsar:pulsar-server-distribution:4.0.8:tar.gz:bin"
>>> home = unpack_once(tarball, cache_dir() / "pulsar" / "apache-pulsar-4.0.8",
...                    lock=cache_dir() / "pulsar" / ".lock",
...                    fetch=lambda: fetch_artifact(coordinates, tarball))
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kop_dedup import resources
from kop_dedup_tools.processes import BrokerError

__all__ = ["fetch_artifact", "file_lock", "maven_file", "unpack_once"]

log = logging.getLogger(__name__)


def maven_file(
    group: str, artifact: str, version: str, packaging: str = "jar", classifier: str = ""
) -> Path:
    """Where Maven keeps ``group:artifact:version:packaging[:classifier]`` locally."""
    m2 = Path(os.environ.get("MAVEN_REPO") or Path.home() / ".m2" / "repository")
    name = f"{artifact}-{version}{f'-{classifier}' if classifier else ''}.{packaging}"
    return m2 / group.replace(".", "/") / artifact / version / name


def fetch_artifact(coordinates: str, expected: Path) -> None:
    """``mvn dependency:get`` of ``coordinates``, which must leave ``expected`` (its
    :func:`maven_file`); a :class:`~kop_dedup_tools.processes.BrokerError` when not."""
    try:
        resources.run_maven(
            "dependency:get",
            f"-Dartifact={coordinates}",
            "-Dtransitive=false",
            what=f"fetch {coordinates}",
        )
    except resources.MavenError as exc:
        raise BrokerError(str(exc)) from exc
    if not expected.exists():
        raise BrokerError(f"Maven fetched {coordinates} but {expected} is not there")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) across processes, for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def unpack_once(tarball: Path, home: Path, *, lock: Path, fetch: Callable[[], None]) -> Path:
    """``home``, the top directory of ``tarball`` unpacked beside its siblings; the
    first call (under ``lock``) fetches the tarball when it is missing and unpacks it,
    later calls return at once."""
    marker = home / ".unpacked"
    if marker.exists():
        return home
    with file_lock(lock):
        if marker.exists():
            return home
        if not tarball.exists():
            fetch()
        started = time.monotonic()
        if home.exists():
            shutil.rmtree(home)
        with tarfile.open(tarball) as tar:
            tar.extractall(home.parent, filter="tar")
        marker.write_text(str(tarball))
        log.debug("unpacked %s in %.1fs", tarball.name, time.monotonic() - started)
    return home
