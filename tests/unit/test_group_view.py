"""The group store's view (no Pulsar): versions never restart, so the owner's view never
goes back to an older write, and a reader of the log ends where the owner is."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.coordination.groups.view import FLOOR_FIELD, View, key
from kop_dedup.pulsar.tables import TableRecord

K = key("p", "g", "t", 0)


class Owner:
    """The store's owner in miniature: writes and removals applied to its view at once,
    the records kept as the log has them (echoes to apply later)."""

    def __init__(self) -> None:
        self.view = View(1)
        self.log: list[TableRecord] = []
        self.intended: dict[str, dict[str, object] | None] = {}

    def write(self, k: str, value: object) -> dict[str, object]:
        doc = {"value": value, "v": self.view.next_version(0, k)}
        self.view.put(0, k, doc)
        self.log.append(TableRecord(k, json.dumps(doc).encode(), 0))
        self.intended[k] = doc
        return doc

    def remove(self, k: str) -> None:
        if self.view.get(0, k) is None:
            return
        self.view.removed(0, k)
        self.log.append(TableRecord(k, None, 0))
        self.intended[k] = None


def test_a_key_written_again_after_its_removal_gets_a_version_above_its_old_ones():
    owner = Owner()
    for i in range(3):
        owner.write(K, i)
    owner.remove(K)
    assert owner.write(K, "again")["v"] == 4


def test_echoes_of_writes_made_before_a_removal_never_replace_the_write_after_it():
    owner = Owner()
    owner.write(K, "a")
    owner.write(K, "a2")
    owner.remove(K)
    newest = owner.write(K, "b")
    for record in owner.log:  # the echoes come back after all of it was done
        owner.view.apply(0, record)
        assert owner.view.get(0, K) == newest


def test_the_echo_of_a_removal_does_not_remove_a_write_made_after_it():
    owner = Owner()
    owner.write(K, "a")
    for record in owner.log:
        owner.view.apply(0, record)
    owner.log.clear()
    owner.remove(K)
    newest = owner.write(K, "b")
    owner.view.apply(0, owner.log[0])  # the tombstone
    assert owner.view.get(0, K) == newest


def test_a_reader_of_a_compacted_log_keeps_the_version_floor_of_removed_keys():
    reader = View(1)
    clean = key("c", "")
    reader.apply(0, TableRecord(clean, json.dumps({FLOOR_FIELD: 7, "v": 9}).encode(), 0))
    assert reader.next_version(0, K) == 8
    assert reader.groups(0) == []


ops = st.lists(
    st.tuples(st.sampled_from(["write", "remove"]), st.sampled_from([K, key("o", "g", "t", 0)])),
    min_size=1,
    max_size=30,
)


@given(ops=ops, echoes=st.lists(st.integers(min_value=0, max_value=3), max_size=30))
def test_the_owner_sees_its_last_change_whatever_echoes_come_back_meanwhile(ops, echoes):
    """Echoes of the owner's writes come back later, a few at a time, between its next
    changes: its view always holds what it last did, and a reader of the whole log ends
    with the same; each key's versions only grow."""
    owner = Owner()
    read = 0
    versions: dict[str, int] = {}
    for i, (op, k) in enumerate(ops):
        if op == "write":
            doc = owner.write(k, i)
            assert int(doc["v"]) > versions.get(k, 0)  # type: ignore[call-overload]
            versions[k] = int(doc["v"])  # type: ignore[call-overload]
        else:
            owner.remove(k)
        for record in owner.log[read : read + (echoes[i] if i < len(echoes) else 0)]:
            owner.view.apply(0, record)
        read = min(len(owner.log), read + (echoes[i] if i < len(echoes) else 0))
        for kk, doc in owner.intended.items():
            assert owner.view.get(0, kk) == doc
    for record in owner.log[read:]:
        owner.view.apply(0, record)
    reader = View(1)
    for record in owner.log:
        reader.apply(0, record)
    for kk, doc in owner.intended.items():
        assert owner.view.get(0, kk) == doc
        assert reader.get(0, kk) == doc
