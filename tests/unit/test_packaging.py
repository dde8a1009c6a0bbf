"""A wheel built from the checkout works without it: the packaged files (Maven settings,
the Spark pom) and the tools are inside, and they resolve inside the install, never in
the checkout (no ``parents[2]``). A few seconds: one build, one ``pip install --target``
and one interpreter start, all offline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kop_dedup.spark.jars import _POM, SPARK_KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, kop_dedup, kop_dedup_tools
from kop_dedup import resources
from kop_dedup.cli import build_parser
from kop_dedup.spark.jars import _POM, CONNECTOR_VERSION
from kop_dedup_tools import kafka_jars
commands = build_parser()._subparsers._group_actions[0].choices
print(json.dumps({
    "kop_dedup": kop_dedup.__file__,
    "tools": kop_dedup_tools.__file__,
    "settings": str(resources.path("maven-settings.xml")),
    "pom": str(_POM),
    "connector": CONNECTOR_VERSION,
    "kafka_pom": str(kafka_jars.pom()),
    "kafka": kafka_jars.KAFKA_VERSION,
    "commands": sorted(commands),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("-w", str(out), str(ROOT)),
        ],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("kop_dedup-*.whl")
    return built


def test_the_wheel_holds_the_resources_and_the_tools_but_not_the_tests(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "kop_dedup/resources/maven-settings.xml",
        "kop_dedup/resources/spark-jars-pom.xml",
        "kop_dedup/py.typed",
        "kop_dedup/transports/kafka/schemas/ConsumerGroupHeartbeatRequest.json",
        "kop_dedup/transports/kafka/schemas/ConsumerGroupDescribeResponse.json",
        "kop_dedup_tools/__init__.py",
        "kop_dedup_tools/py.typed",
        "kop_dedup_tools/bench/__init__.py",
        "kop_dedup_tools/bench/command.py",
        "kop_dedup_tools/launcher.py",
        "kop_dedup_tools/kafka_broker.py",
        "kop_dedup_tools/kafka_jars.py",
        "kop_dedup_tools/kafka-jars-pom.xml",
        "kop_dedup_tools/load.py",
        "kop_dedup_tools/sidecar.py",
    } <= names
    assert not [n for n in names if n.startswith(("tests/", "src/"))], sorted(names)


def test_installed_elsewhere_it_reads_its_files_from_the_install(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"),
            *("--target", str(site), str(wheel)),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # no KOP_DEDUP_* settings, and no coverage: the install's files are copies, measured
    # as the checkout's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOP_DEDUP_", "COVERAGE_"))}
    env["PYTHONPATH"] = str(site)  # ahead of the venv's editable path to the checkout
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    found = json.loads(proc.stdout)
    for key in ("kop_dedup", "tools", "settings", "pom", "kafka_pom"):
        path = Path(found[key])
        assert path.is_relative_to(site), f"{key} resolved to {path}, not inside {site}"
        assert path.exists()
    assert found["connector"]
    assert found["kafka"].startswith("4.1.")
    assert {"serve", "pulsar", "kafka", "load", "bench", "audit"} <= set(found["commands"])


def test_the_cli_and_the_benchmark_import_without_the_test_extras():
    """psutil and matplotlib are loaded where they are used; without them every command
    still parses, and using them says what to install."""
    probe = """
import sys
sys.modules["psutil"] = None
sys.modules["matplotlib"] = None
from kop_dedup.cli import build_parser
import kop_dedup_tools.bench
from kop_dedup_tools import sidecar
from kop_dedup_tools.bench import plot
build_parser().parse_args(["bench", "--quick"])
for use in (plot.pyplot, sidecar._psutil):
    try:
        use()
    except ModuleNotFoundError as exc:
        print(exc)
"""
    proc = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert all("pip install 'kop-dedup[bench]'" in line for line in lines), lines
    assert "matplotlib" in lines[0]
    assert "psutil" in lines[1]


def test_sparks_kafka_source_is_of_the_pinned_pysparks_line_and_scala():
    """spark-sql-kafka-0-10 runs inside pyspark's JVM: its Spark line (major.minor) is the
    one pyproject pins, and its Scala suffix the Pulsar connector's (2.12)."""
    pom = _POM.read_text()
    pin = re.search(r'"pyspark==(\d+\.\d+)\.\d+"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None
    assert SPARK_KAFKA_VERSION.rsplit(".", 1)[0] == pin.group(1)
    assert "<artifactId>spark-sql-kafka-0-10_2.12</artifactId>" in pom
    assert "<artifactId>pulsar-spark-connector_2.12</artifactId>" in pom
