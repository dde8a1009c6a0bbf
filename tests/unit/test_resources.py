"""Packaged files and the one way Maven is run with them."""

from __future__ import annotations

import os
import stat

import pytest

from kop_dedup import resources


def fake_mvn(tmp_path, monkeypatch, script: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\n" + script)
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CI", raising=False)


def test_maven_runs_batch_quiet_with_the_packaged_settings(tmp_path, monkeypatch):
    argv = tmp_path / "argv"
    fake_mvn(tmp_path, monkeypatch, f'printf "%s\\n" "$@" > {argv}\n')
    resources.run_maven("dependency:get", "-Dartifact=a:b:1", what="fetch a:b")
    args = argv.read_text().splitlines()
    assert args[:3] == ["-B", "-q", "-s"]
    assert args[3] == str(resources.path("maven-settings.xml"))
    assert args[4:] == ["dependency:get", "-Dartifact=a:b:1"]


def test_maven_failure_says_what_for_with_its_output_tail(tmp_path, monkeypatch):
    fake_mvn(tmp_path, monkeypatch, 'echo "[ERROR] artifact not found in central"\nexit 3\n')
    with pytest.raises(resources.MavenError) as err:
        resources.run_maven("dependency:get", what="fetch a:b")
    assert "could not fetch a:b with Maven (exit 3)" in str(err.value)
    assert "artifact not found in central" in str(err.value)


def test_missing_maven_says_it_is_needed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(resources.MavenError, match=r"Maven \(mvn\) is needed to fetch a:b"):
        resources.run_maven("x", what="fetch a:b")


def test_an_unknown_resource_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match=r"no 'nope\.xml'"):
        resources.path("nope.xml")
