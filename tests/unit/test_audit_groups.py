"""The audit's consumer-group report without Spark or a broker: message ids decoded as
the connector gives them, ranges reconciled with the offsets, the text, the command."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pulsar
import pytest

from kop_dedup.cli import build_parser
from kop_dedup.spark.audit import AuditReport
from kop_dedup.spark.groups import GroupPartition, GroupReportError, message_id_decoder, reconcile


@pytest.mark.parametrize(
    ("partition", "ledger", "entry", "batch", "placed"),
    [
        (0, 2760, 3, -1, (2760, 3, 0)),  # sent without batching: batch index 0 of its entry
        (1, 2760, 0, 2, (2760, 0, 2)),
        (-1, 2**40 + 5, 123_456, 511, (2**40 + 5, 123_456, 511)),  # multi-byte varints
    ],
)
def test_a_message_id_is_placed_by_ledger_entry_and_batch_index(
    partition, ledger, entry, batch, placed
):
    serialized = pulsar.MessageId(partition, ledger, entry, batch).serialize()
    assert message_id_decoder()(serialized.hex()) == placed


def test_message_ids_as_the_connector_wrote_them_are_placed():
    decode = message_id_decoder()
    # seen in a run: a batched entry (partition 0 explicit), then an unbatched message
    assert decode("08C815100018002002") == (2760, 0, 2)
    assert decode("08C81510031800") == (2760, 3, 0)
    assert decode(None) is None
    assert decode("1003") is None  # no ledger: cannot be placed


def partition(**kw: Any) -> GroupPartition:
    base: dict[str, Any] = {
        "topic": "orders",
        "partition": 0,
        "member": None,
        "minimum": False,
        "first": 0,
        "end": 20,
        "committed": 8,
        "pulled": 13,
    }
    return GroupPartition(**{**base, **kw})


def test_records_matching_the_offsets_give_the_counts_and_no_mismatch():
    counted = {"consumed": 8, "inflight": 5, "ready": 7, "lag": 12, "later": 3}
    row, mismatches = reconcile("g", partition(), counted)
    assert mismatches == []
    assert {k: row[k] for k in counted} == counted
    assert row["ahead"] == 0


def test_a_range_holding_fewer_records_than_its_offsets_is_a_mismatch():
    counted = {"consumed": 8, "inflight": 4, "ready": 7, "lag": 11, "later": 0}
    _, mismatches = reconcile("g", partition(), counted)
    assert [(m["range"], m["offsets"], m["records"]) for m in mismatches] == [
        ("inflight", 5, 4),
        ("lag", 12, 11),
    ]


def test_retention_moves_the_first_offset_and_consumed_counts_from_there():
    row, mismatches = reconcile(
        "g",
        partition(first=5),
        {"consumed": 3, "inflight": 5, "ready": 7, "lag": 12, "later": 0},
    )
    assert (row["consumed"], mismatches) == (3, [])


def test_a_commit_past_the_end_is_clamped_and_reported_ahead():
    row, mismatches = reconcile(
        "g",
        partition(committed=25, pulled=25),
        {"consumed": 20, "inflight": 0, "ready": 0, "lag": 0, "later": 0},
    )
    assert (row["ahead"], mismatches) == (5, [])


def test_without_a_committed_offset_only_what_is_known_is_counted():
    row, mismatches = reconcile(
        "g", partition(committed=None, pulled=None), {"later": 2, "consumed": 0}
    )
    assert (row["consumed"], row["inflight"], row["ready"], row["lag"]) == (None,) * 4
    assert (row["later"], mismatches) == (2, [])


def test_the_groups_minimum_has_no_inflight_nor_ready():
    row, mismatches = reconcile(
        "g",
        partition(member=None, minimum=True, committed=6, pulled=None),
        {"consumed": 6, "lag": 14, "later": 0},
    )
    assert (row["inflight"], row["ready"], row["lag"], mismatches) == (None, None, 14, [])


def test_records_that_could_not_be_placed_are_a_mismatch():
    counted = {"consumed": 8, "inflight": 5, "ready": 7, "lag": 12, "later": 0, "unplaced": 1}
    _, mismatches = reconcile("g", partition(), counted)
    assert [m["range"] for m in mismatches] == ["unplaced"]


CLEAN = AuditReport(
    records=20,
    distinct=20,
    duplicates=0,
    missing=0,
    non_idempotent=0,
    per_topic={"orders": 20},
    producers=1,
    groups=[
        {
            "group": "payments",
            "mode": "clustering",
            "generation": 3,
            "source": "http://sidecar/v1/groups/payments/lag",
            "not_audited": ["refunds"],
        }
    ],
    group_partitions=[
        reconcile(
            "payments",
            partition(),
            {"consumed": 8, "inflight": 5, "ready": 7, "lag": 12, "later": 0},
        )[0]
    ],
)


def test_the_text_report_shows_each_groups_partitions_and_what_it_does_not_audit():
    text = CLEAN.render()
    assert "group payments (clustering, generation 3): offsets from http://sidecar/" in text
    assert "not audited here: refunds" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("orders-0"))
    assert line.split() == ["orders-0", "8", "13", "20", "|", "8", "5", "7", "12", "0"]
    assert "group mismatches    0" in text


def test_a_group_mismatch_fails_the_audit_and_is_shown():
    example = {"group": "payments", "topic": "orders", "partition": 0, "range": "inflight"}
    report = replace(CLEAN, group_mismatches=1, group_examples=[example])
    assert CLEAN.ok
    assert not report.ok
    assert f"GROUP-MISMATCH {json.dumps(example)}" in report.render()
    assert report.to_dict()["group_mismatches"] == 1


def test_a_report_without_groups_says_nothing_of_them():
    assert "group" not in replace(CLEAN, groups=[], group_partitions=[]).render()


def fake_spark(monkeypatch, calls):
    from kop_dedup.spark import jars

    class FakeSpark:
        def stop(self) -> None:
            calls["stopped"] = True

    monkeypatch.setattr(jars, "spark_session", lambda master=None: FakeSpark())


def test_audit_command_passes_the_groups_the_sidecar_and_its_token(monkeypatch, capsys):
    from kop_dedup.spark import audit as audit_module

    calls: dict[str, Any] = {}
    fake_spark(monkeypatch, calls)

    def fake_audit(spark, topics, **kwargs):
        calls.update(topics=topics, **kwargs)
        return CLEAN

    monkeypatch.setattr(audit_module, "audit", fake_audit)
    monkeypatch.setenv("KOP_DEDUP_TOKEN", "s3cret")
    args = build_parser().parse_args(
        ["audit", "orders", "--group", "payments", "--group", "refunds", "--url", "http://sc:1"]
    )
    assert args.func(args) == 0
    assert (calls["groups"], calls["group_url"], calls["group_token"]) == (
        ["payments", "refunds"],
        "http://sc:1",
        "s3cret",
    )
    assert "group payments (clustering" in capsys.readouterr().out


def test_audit_command_exits_2_with_the_reason_when_a_groups_offsets_cannot_be_read(
    monkeypatch, capsys
):
    from kop_dedup.spark import audit as audit_module

    calls: dict[str, Any] = {}
    fake_spark(monkeypatch, calls)

    def failing(spark, topics, **kwargs):
        raise GroupReportError("group 'nobody': http://sc:1/v1/groups/nobody/lag answered 404")

    monkeypatch.setattr(audit_module, "audit", failing)
    args = build_parser().parse_args(["audit", "orders", "--group", "nobody"])
    assert args.func(args) == 2
    assert "answered 404" in capsys.readouterr().err
    assert calls["stopped"]


def test_a_group_report_does_not_go_with_a_stream(capsys):
    args = build_parser().parse_args(["audit", "orders", "--stream", "--group", "payments"])
    assert args.func(args) == 2
    assert "--stream" in capsys.readouterr().err


def test_offsets_can_be_located_from_a_thread_whose_event_loop_runs():
    """A notebook's kernel runs an event loop: asyncio.run() alone would refuse."""
    import asyncio

    from kop_dedup.spark.groups import _run

    async def in_a_notebook() -> int:
        return _run(asyncio.sleep(0, result=7))

    assert _run(asyncio.sleep(0, result=5)) == 5
    assert asyncio.run(in_a_notebook()) == 7
