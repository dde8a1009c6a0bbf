"""DeleteRecords' log start offset as the HTTP group API sees it: a member whose next
record was deleted is clamped to the log start (the pull says so, as for records
retention deleted), and a new group reading from the earliest starts there."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.groups import configure, join, offsets, produce, pull
from tests.kafka_admin_wire import delete_records
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration]


def test_pulls_below_the_log_start_are_clamped_to_it(api, sidecar_kafka):
    topic = f"dr-{uuid.uuid4().hex[:10]}"
    produce(api, topic, 10)
    group = f"g-{uuid.uuid4().hex[:10]}"
    configure(api, group)
    member = join(api, group, [topic])["memberId"]
    assert offsets(pull(api, group, member, 3)) == [0, 1, 2]
    with WireClient(sidecar_kafka) as c:
        assert delete_records(c, topic, [(0, 6)]) == [(0, 6, 0)]
    after = pull(api, group, member, 10)
    assert offsets(after) == [6, 7, 8, 9]
    assert after["clamped"] == [{"topic": topic, "partition": 0, "from": 3, "to": 6}]
    fresh = f"g-{uuid.uuid4().hex[:10]}"
    configure(api, fresh)
    newcomer = join(api, fresh, [topic])["memberId"]
    assert offsets(pull(api, fresh, newcomer, 10)) == [6, 7, 8, 9]
