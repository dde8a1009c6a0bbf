"""The examples of the README and of the docs site run as written, against a sidecar
on the session's broker.

The curl examples: the README's, and those of the site's pages in navigation order
(mkdocs.yml: the HTTP pages, then the metrics page), each set in order in one bash;
each answer shown (a ``# {...}`` comment after a command) is checked: every field it
names is in the answer, with the value shown for codes, names, states and offsets (ids
and times may differ).

How: every ```bash block that calls the API is joined into one script;
``curl`` is a shell function that calls the real curl and keeps each answer (body and
HTTP status) in a numbered file, so that an answer captured in a variable
(``pid=$(curl ... | jq .producerId)``) is checked too. The example names (``orders``,
``billing``...) get a suffix of this run: each run has topics and groups of its own.

The Kafka-client examples (```python blocks that use confluent_kafka against
``127.0.0.1:9092``): the README's, and the Kafka pages' in navigation order, each set
in one Python process against the sidecar's Kafka listener; what they produced is then
read back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.helpers import uniq
from tests.integration.kafka_consume import confluent_read
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def nav_pages() -> list[Path]:
    """The site's pages in the order of its navigation (mkdocs.yml)."""

    def walk(items: Any) -> Iterator[str]:
        for item in items:
            values = item.values() if isinstance(item, dict) else [item]
            for value in values:
                if isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [ROOT / "docs" / page for page in walk(nav)]


SOURCES = {"README": [README], "docs": nav_pages()}
"""Each set of examples, run on its own: the README's are whole by themselves; the
site's pages build on each other in navigation order (the produce page sets ``$pid``)."""
NAMES = (
    "orders-app",
    "orders",
    "invoices",
    "ledger",
    "debits",
    "credits",
    "requests",
    "payments",
    "pay",
    "billing-1",
    "billing",
    "reports",
    "nobody",
)
"""Topic, group and transactional-id names of the examples (longest first)."""
IGNORED = {
    "producerId",  # ids and times: the docs show one run's
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
    """The n-th curl of the script and the answer the docs show after it."""

    number: int
    command: str
    shown: list[str] = field(default_factory=list)


def example_blocks(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [b for b in blocks if "curl" in b and "localhost:8090" in b]


def kafka_blocks(text: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    return [b for b in blocks if "confluent_kafka" in b and "127.0.0.1:9092" in b]


def examples(source: str, blocks: Any) -> list[str]:
    return [b for page in SOURCES[source] for b in blocks(page.read_text())]


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
    """What the docs show that the answer does not have (see the module docstring)."""
    found = scalars(answer)
    problems = [f"no field {k!r}" for k in dict.fromkeys(_KEY.findall(shown)) if k not in found]
    for key, raw in _PAIR.findall(shown):
        if key in IGNORED or key not in found:
            continue
        if json.loads(raw) not in found[key]:
            problems.append(f"{key}: the docs show {raw}, the answer has {found[key]}")
    return problems


def localized(text: str, suffix: str, url: str, kafka: str = "127.0.0.1:9092") -> str:
    """The examples against this sidecar, with names of this run."""
    text = text.replace("localhost:8090", url.removeprefix("http://"))
    text = text.replace("127.0.0.1:9092", kafka)
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
    # the pages' check-back URL is one their operator allowed (docs/http/produce.md)
    with ThreadSidecar(
        pulsar, system_namespace=uniq("sys"), check_back_urls="http://app:8000/"
    ) as sc:
        yield sc


@pytest.mark.parametrize(("source", "at_least"), [("README", 3), ("docs", 25)])
def test_the_curl_examples_run_and_answer_what_the_docs_show(
    readme_sidecar, tmp_path, source, at_least
):
    for tool in ("bash", "curl", "jq"):
        assert shutil.which(tool), f"the examples need {tool}"
    suffix = "-" + uniq("r").split("-")[-1]
    script = "\n".join(
        localized(b, suffix, readme_sidecar.url) for b in examples(source, example_blocks)
    )
    expected = steps(script)
    assert len(expected) >= at_least, [s.command for s in expected]  # every block was found
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


def run_python(code: str, tmp_path: Path) -> None:
    (tmp_path / "examples.py").write_text(code)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "examples.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]


def records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of partition 0 (up to its high watermark), read_committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uniq("check"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        got = confluent_read(consumer, [TopicPartition(topic, 0, 0)], end, timeout=30)
    finally:
        consumer.close()
    assert len(got) == end, (topic, end, got)
    return [(g.key, g.value) for g in got]


def test_the_readmes_kafka_client_example_runs_and_stores_its_record(readme_sidecar, tmp_path):
    suffix = "-" + uniq("k").split("-")[-1]
    bootstrap = readme_sidecar.kafka_bootstrap
    blocks = examples("README", kafka_blocks)
    assert len(blocks) == 1, blocks
    run_python(localized(blocks[0], suffix, readme_sidecar.url, bootstrap), tmp_path)
    assert records(bootstrap, f"orders{suffix}") == [(b"user-1", b"hello")]


def test_the_kafka_pages_examples_run_in_order(readme_sidecar, tmp_path):
    """The producer of the Kafka clients page, then the consumer of the consuming page
    (it reads that record and commits), then the transaction of the transactions page
    (it commits the consumer's offset with its records)."""
    suffix = "-" + uniq("k").split("-")[-1]
    bootstrap = readme_sidecar.kafka_bootstrap
    blocks = examples("docs", kafka_blocks)
    assert len(blocks) >= 3, blocks
    code = "\n".join(localized(b, suffix, readme_sidecar.url, bootstrap) for b in blocks)
    run_python(code, tmp_path)
    assert records(bootstrap, f"orders{suffix}") == [(b"user-1", b"hello")]
    assert records(bootstrap, f"invoices{suffix}") == [(None, b"inv-1")]
    assert records(bootstrap, f"ledger{suffix}") == [(None, b"debit-1")]


def test_a_changed_answer_is_a_mismatch():
    """The check catches what docs drifting from the code would show."""
    answer = {"results": [{"topic": "t", "partition": 0, "errorCode": 0, "error": "NONE"}]}
    assert mismatches('{"results":[{"topic":"t","errorCode":0,"error":"NONE"}]}', answer) == []
    assert mismatches('{"results":[{"errorCode":46,"error":"NONE"}]}', answer) == [
        "errorCode: the docs show 46, the answer has [0]"
    ]
    assert mismatches('{"results":[{"offset":...}]}', answer) == ["no field 'offset'"]
    assert mismatches('{"producerId":1000,"errorCode":0}', {"producerId": 7, "errorCode": 0}) == []
