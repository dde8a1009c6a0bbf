"""The README's curl examples run as written, in order, in one bash, against a sidecar
on the session's broker; each answer the README shows (a ``# {...}`` comment after a
command) is checked: every field it names is in the answer, with the value shown for
codes, names, states and offsets (ids and times may differ).

How: every ```bash block of the README that calls the API is joined into one script;
``curl`` is a shell function that calls the real curl and keeps each answer (body and
HTTP status) in a numbered file, so that an answer captured in a variable
(``pid=$(curl ... | jq .producerId)``) is checked too. The example names (``orders``,
``billing``...) get a suffix of this run: each run has topics and groups of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
NAMES = (
    "orders-app",
    "orders",
    "debits",
    "credits",
    "requests",
    "payments",
    "pay",
    "billing",
    "reports",
    "nobody",
)
"""Topic, group and transactional-id names of the examples (longest first)."""
IGNORED = {
    "producerId",  # ids and times: the README shows one run's
    "producerEpoch",
    "messageId",
    "generation",
    "commitMs",
    "ageMs",
    "startedMs",
    "lastSeenMs",
    "position",
    "epoch",
    "errorMessage",  # names ids; the code and name say what happened
}
_PAIR = re.compile(r'"(\w+)"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+|null|true|false)')
_KEY = re.compile(r'"(\w+)"\s*:')


@dataclass
class Step:
    """The n-th curl of the script and the answer the README shows after it."""

    number: int
    command: str
    shown: list[str] = field(default_factory=list)


def example_blocks(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [b for b in blocks if "curl" in b and "localhost:8090" in b]


def steps(script: str) -> list[Step]:
    """Each curl in order, with the ``# {...}`` lines that follow it (until the braces
    close)."""
    out: list[Step] = []
    depth = 0
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            if depth > 0 or (comment.startswith("{") and out):
                out[-1].shown.append(comment)
                depth += comment.count("{") + comment.count("[")
                depth -= comment.count("}") + comment.count("]")
            continue
        depth = 0
        code = line.split(" # ", 1)[0]
        for _ in re.findall(r"(?<![\w-])curl\s", code):
            out.append(Step(len(out) + 1, line.strip()))
    return out


def scalars(value: Any, into: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """Every (key, scalar value) anywhere in a JSON answer."""
    into = {} if into is None else into
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict | list):
                into.setdefault(k, [])
                scalars(v, into)
            else:
                into.setdefault(k, []).append(v)
    elif isinstance(value, list):
        for v in value:
            scalars(v, into)
    return into


def mismatches(shown: str, answer: Any) -> list[str]:
    """What the README shows that the answer does not have (see the module docstring)."""
    found = scalars(answer)
    problems = [f"no field {k!r}" for k in dict.fromkeys(_KEY.findall(shown)) if k not in found]
    for key, raw in _PAIR.findall(shown):
        if key in IGNORED or key not in found:
            continue
        if json.loads(raw) not in found[key]:
            problems.append(f"{key}: README shows {raw}, the answer has {found[key]}")
    return problems


def localized(text: str, suffix: str, url: str) -> str:
    """The examples against this sidecar, with names of this run."""
    text = text.replace("localhost:8090", url.removeprefix("http://"))
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, NAMES)) + r")(?![\w])")
    return pattern.sub(lambda m: f"{m.group(1)}{suffix}", text)


WRAPPER = """
curl() {  # the real curl; each answer kept as $ANSWERS/<n>.body and <n>.status
  local n; n=$(( $(cat "$ANSWERS/count") + 1 )); echo "$n" > "$ANSWERS/count"
  command curl -o "$ANSWERS/$n.body" -w '%{http_code}' "$@" > "$ANSWERS/$n.status"
  local rc=$?
  cat "$ANSWERS/$n.body"
  return $rc
}
"""


@pytest.fixture(scope="module")
def readme_sidecar(pulsar: Any) -> Any:
    with ThreadSidecar(pulsar) as sc:
        yield sc


def test_the_readme_examples_run_and_answer_what_the_readme_shows(readme_sidecar, tmp_path):
    for tool in ("bash", "curl", "jq"):
        assert shutil.which(tool), f"the README's examples need {tool}"
    suffix = "-" + uniq("r").split("-")[-1]
    script = "\n".join(
        localized(b, suffix, readme_sidecar.url) for b in example_blocks(README.read_text())
    )
    expected = steps(script)
    assert len(expected) >= 25, [s.command for s in expected]  # every block was found
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "count").write_text("0")
    (tmp_path / "examples.sh").write_text(WRAPPER + script)
    run = subprocess.run(
        ["bash", str(tmp_path / "examples.sh")],
        env={**os.environ, "ANSWERS": str(answers)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    count = int((answers / "count").read_text())
    assert count == len(expected), (count, [s.command for s in expected])
    problems = []
    for step in expected:
        status = int((answers / f"{step.number}.status").read_text())
        body = (answers / f"{step.number}.body").read_text()
        where = f"curl #{step.number} ({step.command[:70]})"
        if not step.shown:
            if status >= 400:
                problems.append(f"{where}: HTTP {status} {body[:300]}")
            continue
        shown = " ".join(step.shown)
        try:
            answer = json.loads(body)
        except ValueError:
            problems.append(f"{where}: not JSON: {body[:300]}")
            continue
        if status >= 400 and f'"errorCode":{answer.get("errorCode")}' not in shown.replace(" ", ""):
            problems.append(f"{where}: HTTP {status} {body[:300]}")
        problems += [f"{where}: {p}\n    answer: {body[:400]}" for p in mismatches(shown, answer)]
    assert not problems, "\n".join(problems)


def test_a_changed_answer_is_a_mismatch():
    """The check catches what a README drifting from the code would show."""
    answer = {"results": [{"topic": "t", "partition": 0, "errorCode": 0, "error": "NONE"}]}
    assert mismatches('{"results":[{"topic":"t","errorCode":0,"error":"NONE"}]}', answer) == []
    assert mismatches('{"results":[{"errorCode":46,"error":"NONE"}]}', answer) == [
        "errorCode: README shows 46, the answer has [0]"
    ]
    assert mismatches('{"results":[{"offset":...}]}', answer) == ["no field 'offset'"]
    assert mismatches('{"producerId":1000,"errorCode":0}', {"producerId": 7, "errorCode": 0}) == []
