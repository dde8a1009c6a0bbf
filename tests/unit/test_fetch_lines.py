"""What the fetch commands (``scripts/bootstrap`` runs them) print: one line per
artifact, naming it, how many jars and where, never one line per jar; progress lines
only for a person at a terminal."""

from __future__ import annotations

import os
import stat

import pytest

from kop_dedup import resources
from kop_dedup.cli import main
from kop_dedup.spark import jars as spark_jars
from kop_dedup_tools import kafka_jars


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KOP_DEDUP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CI", raising=False)
    return tmp_path / "cache"


def jars_in(directory, names):
    directory.mkdir(parents=True)
    for name in names:
        (directory / name).write_bytes(b"x" * 1000)
    (directory / ".resolved").write_text("1.0s\n")


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_spark_jars_prints_one_line_for_its_artifacts_not_each_jar(cache, capsys):
    where = spark_jars.jars_dir()
    jars_in(where, ["pulsar-spark-connector_2.12-3.1.1.4.jar", "kafka-clients-3.4.1.jar", "a.jar"])
    assert main(["spark-jars"]) == 0
    out = capsys.readouterr()
    what = (
        f"pulsar-spark-connector {spark_jars.CONNECTOR_VERSION} and spark-sql-kafka-0-10 "
        f"{spark_jars.SPARK_KAFKA_VERSION}"
    )
    assert lines(out.out) == [f"{what}: 3 jars, 0 MB in {where}"]
    assert out.err == ""


def test_kafka_fetch_prints_one_line_whether_cached_or_resolved_now(
    cache, capsys, tmp_path, monkeypatch
):
    what = f"Apache Kafka {kafka_jars.KAFKA_VERSION} (broker and tools)"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"  # a Maven that "resolves" two jars where it is told
    mvn.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; '
        "esac; done\n"
        'mkdir -p "$out"\n'
        f'head -c 2000000 /dev/zero > "$out/kafka_2.13-{kafka_jars.KAFKA_VERSION}.jar"\n'
        'head -c 1000000 /dev/zero > "$out/kafka-tools.jar"\n'
    )
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert main(["kafka", "fetch"]) == 0  # resolves
    first = capsys.readouterr()
    assert main(["kafka", "fetch"]) == 0  # cached
    second = capsys.readouterr()
    line = f"{what}: 2 jars, 3 MB in {kafka_jars.libs_dir()}"
    assert lines(first.out) == [line]
    assert first.err == ""  # no "resolving ..." and no second summary off a terminal
    assert lines(second.out) == [line]
    assert second.err == ""


def test_pulsar_fetch_of_an_unpacked_distribution_is_one_line(cache, capsys):
    home = cache / "pulsar" / "apache-pulsar-4.0.8"
    home.mkdir(parents=True)
    (home / ".unpacked").write_text("tarball")
    assert main(["pulsar", "fetch", "--version", "4.0.8"]) == 0
    out = capsys.readouterr()
    assert lines(out.out) == [f"Apache Pulsar 4.0.8 at {home}"]
    assert out.err == ""


def test_progress_lines_go_to_a_terminal_only(capsys, monkeypatch):
    resources.progress("resolving something with Maven...")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    resources.progress("resolving something with Maven...")
    assert capsys.readouterr().err == "resolving something with Maven...\n"
