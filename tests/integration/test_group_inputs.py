"""Bad input to every group route, on a real group with a real member (the served-OpenAPI
fuzz in test_fuzz.py mostly meets unknown groups and members): never a 5xx, a 4xx
always says why, and the group still works afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import uniq
from tests.integration.groups import commit, configure, join, offsets, produce, pull
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

values = (
    st.none()
    | st.booleans()
    | st.sampled_from([-(2**63) - 1, -(2**63), -1, 0, 1, 2**31, 2**63 - 1, 2**63, 10**30])
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["earliest", "latest", "timestamp", "offset", "broadcast", "clustering"])
    | st.lists(st.integers(-3, 3) | st.text(max_size=4), max_size=3)
    | st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=4), max_size=2)
)
FIELDS = {
    "PUT": ["mode", "autoOffsetReset", "sessionTimeoutMs", "broadcastExpireMs"],
    "members": ["memberId", "topics"],
    "pull": ["maxRecords", "maxBytes", "waitMs"],
    "commit": ["offsets", "generation"],
    "reset": ["topic", "partitions", "to", "value", "members"],
}
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class Group:
    """A clustering group with one member reading a topic of 5 records."""

    def __init__(self, api: httpx.Client) -> None:
        self.api = api
        self.topic, self.name = uniq("gi"), uniq("g")
        produce(api, self.topic, 5)
        configure(api, self.name, sessionTimeoutMs=2_000)  # waits of at most 1 s
        self.member = join(api, self.name, [self.topic], member="m")["memberId"]

    def base(self, route: str) -> dict[str, Any]:
        """A valid body for ``route``, for one field at a time to break."""
        return {
            "PUT": {"mode": "clustering"},
            "members": {"memberId": self.member, "topics": [self.topic]},
            "pull": {"maxRecords": 2, "waitMs": 0},
            "commit": {"offsets": [{"topic": self.topic, "partition": 0, "offset": 1}]},
            "reset": {"topic": self.topic, "to": "offset", "value": 0},
        }[route]

    def send(self, route: str, body: Any) -> httpx.Response:
        group = f"/v1/groups/{self.name}"
        if route == "PUT":
            return self.api.put(group, json=body)
        if route == "members":
            return self.api.post(f"{group}/members", json=body)
        if route == "reset":
            return self.api.post(f"{group}/reset", json=body)
        return self.api.post(f"{group}/members/{self.member}/{route}", json=body)


@pytest.fixture(scope="module")
def group(pulsar: Any) -> Iterator[Group]:
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=httpx.Timeout(15.0)) as api,
    ):
        yield Group(api)


def assert_answered(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        body = r.json()
        assert body["errorMessage"], body
        assert r.status_code in {400, 404, 409, 413, 422}, r.text


@given(route=st.sampled_from(sorted(FIELDS)), data=st.data())
@SETTINGS
def test_any_value_in_any_field_of_a_group_route_is_answered_without_a_5xx(group, route, data):
    body = group.base(route)
    field = data.draw(st.sampled_from([*FIELDS[route], "extra"]), label="field")
    body[field] = data.draw(values, label="value")
    assert_answered(group.send(route, body))


@given(route=st.sampled_from(sorted(FIELDS)), body=values)
@SETTINGS
def test_any_whole_body_of_a_group_route_is_answered_without_a_5xx(group, route, body):
    assert_answered(group.send(route, body))


def test_after_the_fuzzing_the_group_still_works(group):
    api, name = group.api, group.name
    configure(api, name, mode="clustering", autoOffsetReset="earliest", sessionTimeoutMs=30_000)
    join(api, name, [group.topic], member=group.member)
    r = api.post(f"/v1/groups/{name}/reset", json={"topic": group.topic, "to": "earliest"})
    assert r.status_code == 200, r.text
    assert offsets(pull(api, name, group.member, 10, wait_ms=0)) == [0, 1, 2, 3, 4]
    assert commit(api, name, group.member).json()["committed"][0]["offset"] == 5
