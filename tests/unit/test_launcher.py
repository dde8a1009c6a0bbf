from __future__ import annotations

import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kop_dedup_tools.launcher import BrokerError, LocalPulsar


def fake_distribution(tmp_path, conf: str) -> LocalPulsar:
    broker = LocalPulsar(broker_port=16001, web_port=18001, cache=tmp_path / "cache")
    (broker.home / "conf").mkdir(parents=True)
    (broker.home / "conf" / "standalone.conf").write_text(conf)
    (broker.home / ".unpacked").write_text("test")
    return broker


def test_config_overrides_ports_dedup_and_loopback(tmp_path):
    broker = fake_distribution(
        tmp_path,
        "# comment\nbrokerServicePort=6650\nwebServicePort=8080\n"
        "brokerDeduplicationEnabled=false\n#bindAddress=0.0.0.0\nbindAddress=0.0.0.0\n",
    )
    conf = dict(
        line.split("=", 1)
        for line in broker.write_config().read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert conf["brokerServicePort"] == "16001"
    assert conf["webServicePort"] == "18001"
    assert conf["brokerDeduplicationEnabled"] == "true"
    assert conf["transactionCoordinatorEnabled"] == "false"  # Pulsar's are never used
    assert conf["bindAddress"] == "127.0.0.1"
    assert conf["defaultRetentionTimeInMinutes"] == "-1"
    assert conf["zkTimeout"] == "30000"  # the embedded bookie's session (loadConf reads it)


def test_data_dir_defaults_per_web_port_under_the_cache(tmp_path):
    a = LocalPulsar(web_port=18001, cache=tmp_path)
    b = LocalPulsar(web_port=18002, cache=tmp_path)
    assert a.data != b.data
    assert a.data.is_relative_to(tmp_path)
    assert a.service_url == "pulsar://127.0.0.1:6650"


def test_distribution_is_unpacked_once_from_the_maven_cache(tmp_path, monkeypatch):
    src = tmp_path / "src" / "apache-pulsar-9.9.9" / "conf"
    src.mkdir(parents=True)
    (src / "standalone.conf").write_text("x=1\n")
    m2 = tmp_path / "m2"
    tgz = m2 / "org/apache/pulsar/pulsar-server-distribution/9.9.9"
    tgz.mkdir(parents=True)
    with tarfile.open(tgz / "pulsar-server-distribution-9.9.9-bin.tar.gz", "w:gz") as tar:
        tar.add(src.parent, arcname="apache-pulsar-9.9.9")
    monkeypatch.setenv("MAVEN_REPO", str(m2))
    broker = LocalPulsar(version="9.9.9", cache=tmp_path / "cache")
    home = broker.ensure_distribution()
    assert (home / "conf" / "standalone.conf").read_text() == "x=1\n"
    (home / "conf" / "standalone.conf").write_text("changed\n")
    broker.ensure_distribution()  # second call reuses, does not unpack again
    assert (home / "conf" / "standalone.conf").read_text() == "changed\n"


class _FakeAdmin(BaseHTTPRequestHandler):
    """Answers like a broker whose admin API is up; its health check as told."""

    health: tuple[int, bytes] = (200, b"ok")

    def do_GET(self) -> None:
        status, body = (
            (200, b'["standalone"]') if self.path == "/admin/v2/clusters" else self.health
        )
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_ready_means_the_broker_can_store_not_only_that_its_admin_api_answers(tmp_path):
    """After an unclean stop the admin API answers seconds before the bookie has recovered:
    the health check (a round trip through a heartbeat topic) fails with 500 meanwhile."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeAdmin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        broker = LocalPulsar(web_port=server.server_address[1], cache=tmp_path)
        _FakeAdmin.health = (500, b"ManagedLedgerException: Error while recovering ledger")
        assert not broker.is_ready()
        _FakeAdmin.health = (200, b"ok")
        assert broker.is_ready()
    finally:
        server.shutdown()
        server.server_close()


def recording_distribution(tmp_path) -> LocalPulsar:
    """A distribution whose bin/pulsar records how it was started, then fails."""
    broker = fake_distribution(tmp_path, "brokerServicePort=6650\n")
    script = broker.home / "bin" / "pulsar"
    script.parent.mkdir(parents=True)
    script.write_text(
        '#!/bin/sh\necho "zk=$PULSAR_STANDALONE_USE_ZOOKEEPER $*" >> "$PWD/started"\nexit 3\n'
    )
    script.chmod(0o755)
    return broker


def started_with(broker: LocalPulsar) -> list[str]:
    with pytest.raises(BrokerError, match="exited with 3"):
        broker.start(timeout=10)
    return (broker.data / "started").read_text().splitlines()[-1].split()


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_new_data_dir_runs_on_zookeeper_with_its_internal_ports_kept(tmp_path):
    """RocksDB metadata can livelock after a SIGKILL (the bookie's registration lock
    deletes and recreates itself forever), so new data dirs use the embedded ZooKeeper,
    on ports of their own that stay the same across restarts (the bookie's address is
    its identity in every ledger)."""
    broker = recording_distribution(tmp_path)
    first = started_with(broker)
    assert first[0] == "zk=1"
    assert "--metadata-dir" not in first
    assert option(first, "--zookeeper-dir") == str(broker.data / "zookeeper")
    ports = {option(first, "--zookeeper-port"), option(first, "--bookkeeper-port")}
    assert len(ports) == 2
    assert not ports & {"2181", "3181"}  # the defaults, which a second broker would share
    again = started_with(broker)
    assert {option(again, "--zookeeper-port"), option(again, "--bookkeeper-port")} == ports


def test_a_data_dir_with_rocksdb_metadata_keeps_it(tmp_path):
    """Data an older launcher stored under RocksDB metadata stays readable."""
    broker = recording_distribution(tmp_path)
    (broker.data / "metadata").mkdir(parents=True)
    (broker.data / "metadata" / "CURRENT").write_text("MANIFEST-000001\n")
    args = started_with(broker)
    assert args[0] == "zk="
    assert option(args, "--metadata-dir") == str(broker.data / "metadata")
    assert "--zookeeper-port" not in args


def test_a_throwaway_broker_wipes_its_data_but_keeps_its_log(tmp_path):
    broker = LocalPulsar.throwaway(tmp_path / "logs", prefix="kop-dedup-test-")
    assert broker.broker_port != broker.web_port
    assert broker.data.is_dir()
    assert broker.data.name.startswith("kop-dedup-test-")
    assert broker.log_file == tmp_path / "logs" / "pulsar.log"
    broker.log_file.parent.mkdir()
    broker.log_file.write_text("kept\n")
    broker.wipe()  # nothing running: only the data goes
    assert not broker.data.exists()
    assert broker.log_file.read_text() == "kept\n"
