"""What the fuzz tests (tests/integration/test_fuzz.py) hold every answer to: a control
producer's records that must stay exactly as written, and the shape of a produce
answer (a known Kafka code and its name per batch, or a 4xx with a reason)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pulsar as pulsar_client

from kop_dedup.errors import BY_CODE, NONE_ERRNO, NONE_NAME
from tests.helpers import batch, new_pid, read_all, uniq

__all__ = ["PER_BATCH_CODES", "TIMEOUT", "Control", "assert_produce_answer", "code_name"]

TIMEOUT = httpx.Timeout(15.0)
"""No request may take longer: a hang fails the test instead of stalling the suite."""
PER_BATCH_CODES = {0, 3, 10, 17, 42, 45, 46, 47, 87}
"""What a produce request with one well-formed-JSON batch may be answered, per batch."""


@dataclass(frozen=True)
class Control:
    """Five records one producer wrote before the fuzzing; they must stay exactly so."""

    namespace: str
    topic: str
    pid: int

    @classmethod
    def write(cls, url: str, namespace: str) -> Control:
        with httpx.Client(base_url=url, timeout=TIMEOUT) as api:
            topic, pid = uniq("control"), new_pid(api)
            r = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 5)]})
        assert r.json()["results"][0]["errorCode"] == 0, r.text
        return cls(namespace, topic, pid)

    def assert_intact(self, reader: pulsar_client.Client) -> None:
        topic = f"persistent://public/{self.namespace}/{self.topic}-partition-0"
        msgs = read_all(reader, topic, expect=5)
        assert [m.data().decode() for m in msgs] == [f"{self.pid}:0:{i}" for i in range(5)]


def code_name(code: int) -> str:
    return NONE_NAME if code == NONE_ERRNO else BY_CODE[code].name


def assert_produce_answer(
    r: httpx.Response, batches: int = 1, also: frozenset[int] = frozenset()
) -> None:
    """A 200 has one result per batch, a known code and its name; anything else is a 4xx
    with a reason."""
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert r.status_code in (413, 422), r.text
        assert r.json()["errorMessage"]
        return
    results = r.json()["results"]
    assert len(results) == batches, r.text
    for result in results:
        assert result["errorCode"] in PER_BATCH_CODES | also, result
        assert result["error"] == code_name(result["errorCode"]), result
        # a stored batch says where; a retry of a recent one (46) may say where it went
        if result["errorCode"] == 0:
            assert result["messageId"] is not None, result
        elif result["messageId"] is not None:
            assert result["errorCode"] == 46, result
