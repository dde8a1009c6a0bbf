"""The audit's report and command line without Spark: what fails it, what it prints."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from kop_dedup.cli import build_parser
from kop_dedup.spark.audit import AuditReport, kafka_topic

CLEAN = AuditReport(
    records=10,
    distinct=10,
    duplicates=0,
    missing=0,
    non_idempotent=0,
    per_topic={"orders": 10},
    producers=1,
    txn_records=6,
    txn_committed=2,
    txn_aborted=1,
    decisions_topic="persistent://public/kop-dedup-system/transaction-decisions",
)


@pytest.mark.parametrize(
    "violation",
    [
        {"txn_incomplete": 1},
        {"txn_aborted_visible": 1},
        {"txn_undecided_visible": 1},
        {"duplicates": 1},
        {"missing": 1},
    ],
)
def test_any_violation_fails_the_report(violation):
    assert CLEAN.ok
    report = replace(CLEAN, **violation)
    assert not report.ok
    assert report.to_dict()["ok"] is False
    assert report.render().startswith("audit: FAILED")


def test_an_expired_decision_is_reported_but_no_violation():
    report = replace(CLEAN, txn_decision_expired=3)
    assert report.ok
    assert "txn decision expired  3" in report.render()


def test_a_partly_audited_transaction_is_reported_but_no_violation():
    example = {"kind": "partly-audited", "transactionalId": "t", "ordinal": 3}
    report = replace(CLEAN, txn_partly_audited=1, txn_examples=[example])
    assert report.ok
    text = report.render()
    assert "txn partly audited  1" in text
    assert 'PARTLY-AUDITED {"transactionalId": "t", "ordinal": 3}' in text


def test_the_text_report_names_the_transaction_counts_and_the_decisions_topic():
    text = replace(CLEAN, txn_incomplete=1).render()
    assert "transactions        2 committed, 1 aborted (6 transactional records)" in text
    assert "decisions           persistent://public/kop-dedup-system/transaction-decisions" in text
    assert "txn incomplete      1" in text
    assert "txn decision expired  0" in text
    assert "none (no decisions topic)" in replace(CLEAN, decisions_topic=None).render()


def test_a_full_pulsar_topic_name_is_audited_as_its_kafka_name():
    assert kafka_topic("persistent://public/kafka/orders") == "orders"
    assert kafka_topic("orders") == "orders"


def test_audit_command_passes_the_system_namespace_and_exits_1_on_a_violation(monkeypatch, capsys):
    from kop_dedup.spark import audit as audit_module
    from kop_dedup.spark import jars

    calls: dict[str, Any] = {}

    class FakeSpark:
        def stop(self) -> None:
            calls["stopped"] = True

    def fake_audit(spark, topics, **kwargs):
        calls.update(topics=topics, **kwargs)
        return replace(CLEAN, txn_aborted_visible=1)

    monkeypatch.setattr(jars, "spark_session", lambda master=None: FakeSpark())
    monkeypatch.setattr(audit_module, "audit", fake_audit)
    args = build_parser().parse_args(
        ["audit", "orders", "--json", "--quiet", "--system-namespace", "sys-ns"]
    )
    assert args.func(args) == 1
    assert calls["system_namespace"] == "sys-ns"
    assert calls["topics"] == ["orders"]
    assert calls["stopped"]
    printed = json.loads(capsys.readouterr().out)
    assert (printed["ok"], printed["txn_aborted_visible"]) == (False, 1)


def test_audit_command_defaults_to_the_sidecars_system_namespace(monkeypatch):
    monkeypatch.delenv("KOP_DEDUP_SYSTEM_NAMESPACE", raising=False)
    args = build_parser().parse_args(["audit", "orders"])
    assert args.system_namespace == "kop-dedup-system"
