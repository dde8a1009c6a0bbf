"""Resolve the Spark jars with Maven, and build a SparkSession.

The packaged ``spark-jars-pom.xml`` names the Pulsar Spark connector (the audit's
reader) and Spark's own Kafka source (``spark-sql-kafka-0-10``, ``format("kafka")``,
which reads the sidecar's Kafka listener). The jars land in
``<cache>/spark-jars/<connector version>-<pom digest>/`` (cache: ``$KOP_DEDUP_CACHE``
or ``~/.cache/kop-dedup``) once: a changed pom resolves afresh. ``spark.jars`` gets
their paths, never ``spark.jars.packages`` (Ivy ignores Maven mirrors and would reach
for other repositories at run time).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from kop_dedup import resources
from kop_dedup.resources import cache_dir

__all__ = [
    "ARTIFACTS",
    "CONNECTOR_VERSION",
    "SPARK_KAFKA_VERSION",
    "connector_jars",
    "jars_dir",
    "spark_session",
]

_POM = resources.path("spark-jars-pom.xml")


def _pom_property(name: str) -> str:
    found = re.search(rf"<{name}>([^<]+)</{name}>", _POM.read_text())
    if found is None:  # pragma: no cover - the packaged pom names both
        raise RuntimeError(f"{_POM} names no <{name}>")
    return found.group(1)


CONNECTOR_VERSION = _pom_property("connector.version")
SPARK_KAFKA_VERSION = _pom_property("spark-kafka.version")


ARTIFACTS = (
    f"pulsar-spark-connector {CONNECTOR_VERSION} and spark-sql-kafka-0-10 {SPARK_KAFKA_VERSION}"
)
"""What the pom names, as the fetch line says it."""


def jars_dir() -> Path:
    """Where this pom's jars are kept: a changed pom resolves into a new directory."""
    digest = hashlib.sha256(_POM.read_bytes()).hexdigest()[:8]
    return cache_dir() / "spark-jars" / f"{CONNECTOR_VERSION}-{digest}"


def connector_jars(*, quiet: bool = False) -> list[Path]:
    """The connector, Spark's Kafka source and their runtime dependencies, resolved from
    Maven Central once per pom."""
    target = jars_dir()
    stamp = target / ".resolved"
    if not stamp.exists():
        if not quiet:
            resources.progress(f"resolving {ARTIFACTS} with Maven...")
        started = time.monotonic()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        resources.run_maven(
            "-f",
            str(_POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
            what="resolve the Spark jars (Pulsar connector, Kafka source)",
        )
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        stamp.write_text(f"{time.monotonic() - started:.1f}s\n")
    return sorted(target.glob("*.jar"))


def spark_session(
    app_name: str = "kop-dedup-audit",
    master: str | None = None,
    jars: list[Path] | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the Pulsar connector and Spark's Kafka source on its classpath.

    ``master`` defaults to ``$KOP_DEDUP_SPARK_MASTER`` or ``local[*]``; under
    ``spark-submit`` the master and jars given there win.
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415

    jars = jars if jars is not None else connector_jars()
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("KOP_DEDUP_SPARK_MASTER", "local[*]"))
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the audit prints its own
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", os.environ.get("KOP_DEDUP_SPARK_DRIVER_MEMORY", "1g"))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
