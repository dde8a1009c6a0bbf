"""The Kafka test tooling without a JVM: what the tools print parses into typed results
(lines as Kafka 4.1.2's tools printed them), the reference broker's configuration, its
cluster ids, and the ``kop-dedup kafka`` command on a broker that is not running."""

from __future__ import annotations

import base64
import json
import re
import socket
import sys
from pathlib import Path

import pytest

from kop_dedup.cli import main
from kop_dedup_tools import kafka_jars
from kop_dedup_tools.kafka_broker import (
    LocalKafka,
    metadata_answers,
    random_cluster_id,
)
from kop_dedup_tools.processes import BrokerError, free_port
from tests.kafka_perf_copier import copier_report, perf_report
from tests.kafka_tools import consumer_report, parse_lines, producer_report

PRODUCER_OUT = """\
{"timestamp":1795534747177,"name":"startup_complete"}
{"timestamp":1795534750663,"name":"producer_send_success","key":null,"value":"0","offset":0,"topic":"vp2","partition":0}
{"timestamp":1795534750680,"name":"producer_send_success","key":"3","value":"7.1","offset":1,"topic":"vp2","partition":1}
{"timestamp":1795534750690,"name":"producer_send_error","key":null,"value":"2","topic":"vp2","exception":"class org.apache.kafka.common.errors.TimeoutException","message":"Expiring 1 record(s)"}
{"timestamp":1795534751234,"name":"shutdown_complete"}
{"timestamp":1795534751328,"name":"tool_data","sent":3,"acked":2,"target_throughput":-1,"avg_throughput":240.38}
"""

CONSUMER_OUT = """\
{"timestamp":1795534761527,"name":"startup_complete"}
{"timestamp":1795534766408,"name":"partitions_assigned","partitions":[{"topic":"vp2","partition":1},{"topic":"vp2","partition":0}]}
{"timestamp":1795534767237,"name":"record_data","key":null,"value":"0","topic":"vp2","partition":0,"offset":0}
{"timestamp":1795534767240,"name":"record_data","key":"k","value":"1","topic":"vp2","partition":1,"offset":0}
{"timestamp":1795534767454,"name":"records_consumed","count":2,"partitions":[{"topic":"vp2","partition":0,"count":1,"minOffset":0,"maxOffset":0},{"topic":"vp2","partition":1,"count":1,"minOffset":0,"maxOffset":0}]}
{"timestamp":1795534767605,"name":"offsets_committed","offsets":[{"topic":"vp2","partition":0,"offset":1},{"topic":"vp2","partition":1,"offset":1}],"success":true}
{"timestamp":1795534767606,"name":"offsets_committed","offsets":[{"topic":"vp2","partition":0,"offset":1}],"error":"Commit cannot be completed","success":false}
{"timestamp":1795534768334,"name":"partitions_revoked","partitions":[{"topic":"vp2","partition":0}]}
{"timestamp":1795534768576,"name":"shutdown_complete"}
"""

PERF_OUT = """\
SLF4J: a line that is not a result
24993 records sent, 4998.6 records/sec (0.48 MB/sec), 3.1 ms avg latency, 210.0 ms max latency.
5000 records sent, 2007.2 records/sec (0.19 MB/sec), 477.54 ms avg latency, 2139.00 ms max latency, 497 ms 50th, 689 ms 95th, 724 ms 99th, 731 ms 99.9th.
"""

COPIER_OUT = """\
{"transactionalId":"copier-1","stage":"ProcessLoop","time":"2026/11/24 15:48:05:384","totalProcessed":0,"consumed":0,"remaining":300}
{"transactionalId":"copier-1","stage":"ProcessLoop","time":"2026/11/24 15:48:06:403","totalProcessed":50,"consumed":50,"remaining":250}
{"transactionalId":"copier-1","stage":"ShutdownComplete","time":"2026/11/24 15:48:07:601","totalProcessed":300,"consumed":300,"remaining":0}
"""


def events(text: str) -> list[dict]:
    return parse_lines(text.splitlines())[0]


def test_parse_lines_keeps_json_objects_and_sets_other_lines_aside():
    found, other = parse_lines(['{"a": 1}', "", "Bad data can't be written as json", "[1]", "{"])
    assert found == [{"a": 1}]
    assert other == ["Bad data can't be written as json", "[1]", "{"]


def test_verifiable_producer_output_gives_acked_failed_and_the_summary():
    report = producer_report(events(PRODUCER_OUT))
    assert [(r.key, r.value, r.partition, r.offset) for r in report.acked] == [
        (None, "0", 0, 0),
        ("3", "7.1", 1, 1),
    ]
    assert [(f.value, f.exception.rsplit(".", 1)[-1]) for f in report.failed] == [
        ("2", "TimeoutException")
    ]
    assert (report.sent, report.acked_count, report.shutdown_complete) == (3, 2, True)


def test_a_verifiable_producer_killed_early_has_no_summary():
    report = producer_report(events(PRODUCER_OUT.split("\n", 2)[0]))
    assert (report.acked, report.sent, report.acked_count, report.shutdown_complete) == (
        (),
        None,
        None,
        False,
    )


def test_verifiable_consumer_output_gives_records_commits_and_assignment():
    report = consumer_report(events(CONSUMER_OUT))
    assert [(r.partition, r.key, r.value, r.offset) for r in report.records] == [
        (0, None, "0", 0),
        (1, "k", "1", 0),
    ]
    assert report.consumed == 2
    assert report.commits == ((("vp2", 0, 1), ("vp2", 1, 1)),)
    assert report.failed_commits == ("Commit cannot be completed",)
    assert report.assigned == (("vp2", 0), ("vp2", 1))
    assert report.shutdown_complete


def test_producer_performance_lines_give_windows_and_the_total():
    report = perf_report(PERF_OUT.splitlines())
    assert [(w.records, w.records_per_sec, w.percentiles_ms) for w in report.windows] == [
        (24993, 4998.6, None)
    ]
    assert report.total is not None
    assert (report.total.records, report.total.avg_latency_ms, report.total.max_latency_ms) == (
        5000,
        477.54,
        2139.0,
    )
    assert report.total.percentiles_ms == (497, 689, 724, 731)
    assert perf_report(PERF_OUT.splitlines()[:2]).total is None


def test_transactional_message_copier_statuses_end_with_its_total():
    report = copier_report(events(COPIER_OUT))
    assert [s.stage for s in report.statuses] == ["ProcessLoop", "ProcessLoop", "ShutdownComplete"]
    assert report.total_processed == 300
    assert report.shutdown_complete
    assert copier_report([]).total_processed == 0


def test_cluster_ids_are_kafka_uuids_that_never_read_as_an_option():
    for _ in range(3000):
        cid = random_cluster_id()
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid)
        assert not cid.startswith("-")
        raw = base64.urlsafe_b64decode(cid + "==")
        assert len(raw) == 16
        assert raw not in (bytes(16), bytes(15) + b"\x01")


def test_the_broker_is_one_loopback_kraft_node_with_single_replica_internal_topics(tmp_path):
    broker = LocalKafka(port=19111, controller_port=19112, data_dir=tmp_path / "d")
    props = broker.server_properties()
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19112"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19111,CONTROLLER://127.0.0.1:19112"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19111"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert props[key] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"
    assert props["log.dirs"] == str(tmp_path / "d" / "kraft")
    written = dict(line.split("=", 1) for line in broker.write_config().read_text().splitlines())
    assert written == props
    assert broker.bootstrap == "127.0.0.1:19111"


def test_a_data_dir_keeps_its_controller_port_across_launchers(tmp_path):
    first = LocalKafka(port=19113, data_dir=tmp_path / "d").controller()
    assert LocalKafka(port=19113, data_dir=tmp_path / "d").controller() == first
    assert json.loads((tmp_path / "d" / "ports.json").read_text()) == {"controller": first}


def test_a_formatted_data_dir_is_not_formatted_again(tmp_path, monkeypatch):
    broker = LocalKafka(port=19114, controller_port=19115, data_dir=tmp_path / "d")
    (broker.log_dirs).mkdir(parents=True)
    (broker.log_dirs / "meta.properties").write_text("cluster.id=x\n")
    monkeypatch.setattr(kafka_jars, "java_command", lambda *a, **k: pytest.fail("ran java"))
    assert broker.format_storage(broker.write_config()) is False


def test_the_jar_pom_names_the_version_the_tools_use():
    assert re.fullmatch(r"4\.1\.\d+", kafka_jars.KAFKA_VERSION)
    pom = kafka_jars.pom().read_text()
    assert f"<kafka.version>{kafka_jars.KAFKA_VERSION}</kafka.version>" in pom
    for artifact in ("kafka_2.13", "kafka-tools", "connect-file", "log4j-slf4j-impl"):
        assert f"<artifactId>{artifact}</artifactId>" in pom


def test_java_commands_use_the_cached_jars_and_keep_tool_logs_off_stdout(tmp_path, monkeypatch):
    monkeypatch.setenv("KOP_DEDUP_CACHE", str(tmp_path))
    libs = kafka_jars.libs_dir()
    libs.mkdir(parents=True)
    (libs / ".resolved").write_text(kafka_jars.stamp_line(0, 0))  # cached: nothing is fetched
    cmd = kafka_jars.java_command(kafka_jars.VERIFIABLE_PRODUCER, "--topic", "t", heap="64m")
    assert cmd[-3:] == [kafka_jars.VERIFIABLE_PRODUCER, "--topic", "t"]
    assert cmd[cmd.index("-cp") + 1] == f"{libs}/*"
    assert "-Xmx64m" in cmd
    [config] = [a.split("=", 1)[1] for a in cmd if a.startswith("-Dlog4j2.configurationFile=")]
    text = Path(config).read_text()
    assert "SYSTEM_ERR" in text
    assert "SYSTEM_OUT" not in text


def test_a_stamp_of_another_pom_resolves_the_jars_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KOP_DEDUP_CACHE", str(tmp_path))
    libs = kafka_jars.libs_dir()
    libs.mkdir(parents=True)
    (libs / ".resolved").write_text("0.0s 0 bytes\n")  # a stamp from before connect-file
    resolved: list[Path] = []
    monkeypatch.setattr(kafka_jars, "_resolve", lambda target, quiet: resolved.append(target))
    kafka_jars.kafka_jars(quiet=True)
    assert resolved == [libs]
    (libs / ".resolved").write_text(kafka_jars.stamp_line(1, 2))
    kafka_jars.kafka_jars(quiet=True)
    assert resolved == [libs]  # the current pom's stamp: nothing resolved


def test_nothing_listening_means_not_ready():
    assert metadata_answers(f"127.0.0.1:{free_port()}", timeout=1.0) is False


def test_the_probe_says_what_to_install_without_kafka_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "kafka", None)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with pytest.raises(BrokerError, match=r"pip install 'kop-dedup\[test\]'"):
            metadata_answers(f"127.0.0.1:{server.getsockname()[1]}", timeout=1.0)


def test_kafka_status_of_a_broker_that_is_not_running_exits_3(tmp_path, capsys):
    code = main(["kafka", "status", "--port", str(free_port()), "--data-dir", str(tmp_path)])
    assert code == 3
    status = json.loads(capsys.readouterr().out)
    assert (status["running"], status["ready"], status["pid"]) == (False, False, None)
    assert status["version"] == kafka_jars.KAFKA_VERSION
    assert main(["kafka", "stop", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "not running"
