"""scripts/test: coverage on every run, the floor only on a whole-suite run, and
pytest's exit status as its own (.ci/run relies on both)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path):
    """scripts/test in a copy whose bootstrap does nothing and whose 'python' records
    its arguments and exits with $FAKE_STATUS."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / "scripts" / "bootstrap").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_FILE"\nexit "${FAKE_STATUS:-0}"\n')
    for script in (python, tmp_path / "scripts" / "bootstrap", tmp_path / "scripts" / "test"):
        script.chmod(0o755)
    return tmp_path


def run(checkout: Path, *args: str, status: int = 0) -> tuple[int, list[str]]:
    env = {
        **os.environ,
        "KOP_DEDUP_VENV": str(checkout / "venv"),
        "ARGS_FILE": str(checkout / "args"),
        "FAKE_STATUS": str(status),
    }
    proc = subprocess.run(
        [str(checkout / "scripts" / "test"), *args], env=env, capture_output=True, check=False
    )
    return proc.returncode, (checkout / "args").read_text().splitlines()


def test_a_whole_suite_run_measures_coverage_and_holds_the_floor(checkout):
    _, args = run(checkout, "-p", "no:cacheprovider")  # what .ci/run passes
    assert args[:3] == ["-m", "pytest", "--cov"]
    assert "--cov-fail-under=0" not in args
    assert args[-2:] == ["-p", "no:cacheprovider"]


@pytest.mark.parametrize(
    "selection",
    [["tests/unit", "-q"], ["tests/unit::test_x"], ["-m", "not spark"], ["-k", "wrap"], ["--lf"]],
)
def test_a_partial_run_reports_coverage_without_the_floor(checkout, selection):
    _, args = run(checkout, *selection)
    assert "--cov" in args
    assert "--cov-fail-under=0" in args


@pytest.mark.parametrize("status", [0, 1, 2, 5])
def test_the_script_exits_with_pytests_status(checkout, status):
    assert run(checkout, status=status)[0] == status


def test_the_floor_is_configured_where_coverage_reads_it():
    text = (ROOT / "pyproject.toml").read_text()
    assert "[tool.coverage.report]" in text
    assert "fail_under = " in text.split("[tool.coverage.report]")[1]
