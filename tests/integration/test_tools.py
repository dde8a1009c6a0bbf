"""The tools against the real broker: topic creation, the load driver's command."""

from __future__ import annotations

import httpx
import pytest

from kop_dedup_tools.topics import create_topic
from tests.helpers import uniq

pytestmark = pytest.mark.integration


def test_create_topic_makes_the_partitions_and_a_second_call_is_fine(pulsar):
    topic = uniq("tools")
    create_topic(pulsar.admin_url, topic, partitions=3)
    create_topic(pulsar.admin_url, topic, partitions=3)  # 409: already there
    r = httpx.get(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions", timeout=30
    )
    assert r.json()["partitions"] == 3
