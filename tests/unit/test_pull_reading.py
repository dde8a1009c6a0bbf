"""A pull's partition reader (``kop_dedup.pulsar.reading``) takes what the client holds
already without asking the broker per message: ``has_message_available`` is a lock and
may be a round trip, and it ran before every message of every HTTP pull. The stand-ins
of tests/unit/test_fetch_reading.py; tests/integration/test_groups.py reads a broker."""

from __future__ import annotations

from kop_dedup.pulsar.reading import _read_available
from tests.unit.test_fetch_reading import _messages, _Reader


def test_the_broker_is_asked_only_when_the_clients_queue_is_empty():
    reader = _Reader(_messages([50]))
    raw, drained = _read_available(reader, 100, None)
    assert (len(raw), drained) == (50, True)
    assert reader.calls.count("has") == 1  # at the end, not per message
    assert [r.position for r in raw[:2]] == [(5, 0, 0), (5, 0, 1)]


def test_a_pull_stops_at_its_limit_without_asking_the_broker():
    reader = _Reader(_messages([50]))
    raw, drained = _read_available(reader, 10, None)
    assert (len(raw), drained) == (10, False)
    assert reader.calls.count("has") == 0


def test_a_message_the_broker_has_but_the_client_has_not_yet_is_waited_for():
    later = _messages([1])
    reader = _Reader([], more=True)
    real = reader.read_next

    def arrives(timeout_ms: int):  # type: ignore[no-untyped-def]
        if timeout_ms > 0 and not reader.queue:
            reader.queue.extend(later)
            reader.more = False
        return real(timeout_ms)

    reader.read_next = arrives  # type: ignore[method-assign]
    raw, _ = _read_available(reader, 10, None)
    assert len(raw) == 1


def test_a_message_handed_out_again_after_a_reconnection_is_not_counted_again():
    """The client subscribes again at the last message it handed out (inclusive) and
    hands it out once more; tests/integration/test_reader_reconnects.py shows it."""
    messages = _messages([5])
    reader = _Reader([messages[2], *messages[3:]])  # 0..2 were read before the reconnection
    raw, _ = _read_available(reader, 100, None, last=(5, 0, 2))
    assert [r.position for r in raw] == [(5, 0, 3), (5, 0, 4)]
