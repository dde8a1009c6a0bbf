"""Resolve the Pulsar Spark connector jars with Maven, and build a SparkSession.

The jars land in ``<cache>/spark-jars/<connector version>/`` (cache:
``$KOP_DEDUP_CACHE`` or ``~/.cache/kop-dedup``) once; ``spark.jars`` gets
their paths, never ``spark.jars.packages`` (Ivy ignores Maven mirrors and
would reach for other repositories at run time).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from kop_dedup import resources
from kop_dedup.resources import cache_dir

__all__ = ["CONNECTOR_VERSION", "connector_jars", "spark_session"]

_POM = resources.path("spark-jars-pom.xml")
CONNECTOR_VERSION = re.search(
    r"<connector.version>([^<]+)</connector.version>", _POM.read_text()
).group(1)  # type: ignore[union-attr]


def connector_jars(*, quiet: bool = False) -> list[Path]:
    """The connector and its runtime dependencies, resolved from Maven Central once."""
    target = cache_dir() / "spark-jars" / CONNECTOR_VERSION
    stamp = target / ".resolved"
    if not stamp.exists():
        if not quiet:
            print(
                f"resolving pulsar-spark-connector {CONNECTOR_VERSION} with Maven...",
                file=sys.stderr,
            )
        started = time.monotonic()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        resources.run_maven(
            "-f",
            str(_POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
            what="resolve the Pulsar Spark connector",
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
    """A SparkSession with the connector on its classpath.

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
