"""What the group routes answer for what does not exist: a topic a join or reset names
(404 with 3, and no topic is created, unless GROUP_AUTO_CREATE_TOPICS), and the offsets
of a group with nothing stored (404 with 69, as the other group routes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import uniq
from tests.integration.groups import configure, join, produce
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def topic_exists(pulsar: Any, topic: str) -> bool:
    r = httpx.get(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions", timeout=30
    )
    return r.status_code == 200 and r.json().get("partitions", 0) > 0


def assert_unknown_topic(r: httpx.Response, topic: str) -> None:
    assert r.status_code == 404, r.text
    body = r.json()
    assert (body["errorCode"], body["error"]) == (3, "UNKNOWN_TOPIC_OR_PARTITION"), body
    assert topic in body["errorMessage"]
    assert "GROUP_AUTO_CREATE_TOPICS" in body["errorMessage"]


def test_a_join_naming_a_missing_topic_is_404_unknown_topic_and_creates_nothing(api, pulsar):
    group, typo = uniq("g"), uniq("ordres")
    configure(api, group)
    r = api.post(f"/v1/groups/{group}/members", json={"memberId": "m", "topics": [typo]})
    assert_unknown_topic(r, typo)
    assert not topic_exists(pulsar, typo)
    assert api.get(f"/v1/groups/{group}").json()["members"] == []  # nobody joined


def test_a_reset_naming_a_missing_topic_is_404_unknown_topic_and_creates_nothing(api, pulsar):
    group, topic, typo = uniq("g"), uniq("gt"), uniq("ordres")
    produce(api, topic, 2)
    configure(api, group)
    join(api, group, [topic])
    r = api.post(f"/v1/groups/{group}/reset", json={"topic": typo, "to": "earliest"})
    assert_unknown_topic(r, typo)
    assert not topic_exists(pulsar, typo)


def test_produce_still_creates_a_missing_topic(api, pulsar):
    topic = uniq("gt")
    produce(api, topic, 1)
    assert topic_exists(pulsar, topic)


@pytest.fixture(scope="module")
def creating(pulsar: Any) -> Iterator[httpx.Client]:
    with (
        ThreadSidecar(pulsar, group_auto_create_topics=True, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as client,
    ):
        yield client


def test_with_group_auto_create_topics_a_join_creates_the_topic(creating, pulsar):
    group, topic = uniq("g"), uniq("gt")
    configure(creating, group)
    joined = join(creating, group, [topic])
    assert joined["assignment"] == [{"topic": topic, "partitions": [0]}]
    assert topic_exists(pulsar, topic)


def test_the_offsets_of_a_group_with_nothing_stored_are_404_group_id_not_found(api):
    group = uniq("g")
    r = api.get(f"/v1/groups/{group}/offsets")
    assert r.status_code == 404, r.text
    body = r.json()
    assert (body["errorCode"], body["error"], body["offsets"]) == (69, "GROUP_ID_NOT_FOUND", [])
    assert group in body["errorMessage"]
    for path in ("", "/lag", "/reset"):  # the same answer as the other routes
        assert api.get(f"/v1/groups/{group}{path}").status_code == 404
    configured = uniq("g")
    configure(api, configured)  # a group with a configuration and no offsets: 200, none
    r = api.get(f"/v1/groups/{configured}/offsets")
    assert (r.status_code, r.json()["offsets"]) == (200, [])
    plain = uniq("g")  # offsets alone (a simple group) are something stored
    topic = uniq("gt")
    produce(api, topic, 1)
    body = {"offsets": [{"topic": topic, "partition": 0, "offset": 1}]}
    assert api.post(f"/v1/groups/{plain}/offsets", json=body).json()["errorCode"] == 0
    r = api.get(f"/v1/groups/{plain}/offsets")
    assert (r.status_code, [o["offset"] for o in r.json()["offsets"]]) == (200, [1])


def test_a_commit_with_a_generation_ahead_of_the_groups_says_it_is_ahead(api):
    group, topic = uniq("g"), uniq("gt")
    produce(api, topic, 1)
    configure(api, group)
    joined = join(api, group, [topic])
    member, generation = joined["memberId"], joined["generation"]
    body = {
        "generation": generation + 5,
        "offsets": [{"topic": topic, "partition": 0, "offset": 1}],
    }
    r = api.post(f"/v1/groups/{group}/members/{member}/commit", json=body)
    assert (r.status_code, r.json()["errorCode"]) == (409, 22), r.text
    message = r.json()["errorMessage"]
    assert f"generation {generation + 5} is ahead of group {group!r}'s generation {generation}" in (
        message
    )
    assert "stale" not in message
