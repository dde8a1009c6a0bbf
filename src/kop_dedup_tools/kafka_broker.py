"""A real Apache Kafka broker on loopback, from Maven Central: the reference the Kafka
listener is judged against.

``kop-dedup kafka fetch|start|stop|status|wipe`` drives :class:`LocalKafka`: one KRaft
node (broker and controller in one JVM, ``kafka.Kafka``) on ``127.0.0.1``, its storage
formatted with a random cluster id (``kafka.tools.StorageTool format``) at the first
start of a data dir, a small heap, and settings for one node: replication factor 1 for
the internal topics, no initial rebalance delay, topics auto-created. Ready when a
Metadata request answers (kafka-python's admin client, ``pip install
'kop-dedup[test]'``). ``stop`` sends SIGTERM, then SIGKILL after a bound. The log
(``<log dir>/kafka.log``) is kept for post-mortems; :meth:`LocalKafka.throwaway` puts
it outside the data dir, so it outlives a wipe.

>>> broker = LocalKafka(port=19092, controller_port=19093)
>>> broker.bootstrap
'127.0.0.1:19092'
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup import resources
from kop_dedup.resources import cache_dir
from kop_dedup_tools import kafka_jars
from kop_dedup_tools.processes import BrokerError, ProcessGroup, free_port

__all__ = [
    "DEFAULT_PORT",
    "LocalKafka",
    "add_cli",
    "metadata_answers",
    "random_cluster_id",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 19092
"""Not Kafka's 9092: that is the sidecar's Kafka listener's default."""

# What a one-node cluster needs besides its listeners, and why.
_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    # one replica of everything: the defaults (3) would leave groups and transactions
    # waiting for brokers that never come
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # the internal topics' first use creates all their partitions: 50 each by default,
    # seconds on a busy 2-core machine; coordinators work the same with 4
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",  # a lone consumer joins at once
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
}

# The broker logs to stdout, which the launcher sends to its log file.
_BROKER_LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = stdout
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = stdout
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""

# Kafka's own scripts' garbage collector settings (kafka-run-class.sh)
_JVM_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
)


def random_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid()`` makes it: 16 random bytes in URL-safe
    base64 without padding, never all zero, never Kafka's metadata topic id (0, 1), never
    starting with ``-`` (it would read as a command-line option)."""
    reserved = {bytes(16), bytes(15) + b"\x01"}
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        if raw not in reserved and not text.startswith("-"):
            return text


def metadata_answers(bootstrap: str, timeout: float = 5.0) -> bool:
    """A Metadata request to ``bootstrap`` (``host:port``) gets an answer within about
    ``timeout`` seconds."""
    host, _, port = bootstrap.rpartition(":")
    try:  # cheap first: no client (and none of its connection-error logs) before a socket
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError):
        return False
    try:
        from kafka import KafkaAdminClient  # noqa: PLC0415 - a test-extra dependency
        from kafka.errors import KafkaError  # noqa: PLC0415
    except ImportError as exc:
        raise BrokerError(
            "the readiness probe needs kafka-python: pip install 'kop-dedup[test]'"
        ) from exc
    ms = int(timeout * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="kop-dedup-probe",
            request_timeout_ms=ms,
            bootstrap_timeout_ms=ms,
        )
    except (KafkaError, OSError):
        return False
    try:
        admin.list_topics()
    except (KafkaError, OSError):
        return False
    else:
        return True
    finally:
        admin.close()


@dataclass
class LocalKafka(ProcessGroup):
    port: int = DEFAULT_PORT
    controller_port: int | None = None
    """Free one picked at the first start and kept in the data dir when not given."""
    data_dir: Path | None = None
    heap: str = "512m"
    transaction_version: int | None = None
    """``transaction.version`` at format time; None keeps Kafka's default (2 in 4.1:
    the Java client then uses KIP-890's transactions v2, librdkafka stays on v1)."""
    cache: Path = field(default_factory=cache_dir)
    log_dir: Path | None = None
    """Where the broker logs (default ``<data dir>/logs``)."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def throwaway(cls, log_dir: Path, **options: Any) -> LocalKafka:
        """One on free ports with a fresh temporary data dir (gone after :meth:`wipe`),
        logging into ``log_dir`` (kept, for post-mortems): for a test session."""
        return cls(
            port=free_port(),
            controller_port=free_port(),
            data_dir=Path(tempfile.mkdtemp(prefix="kop-dedup-kafka-")),
            log_dir=log_dir,
            **options,
        )

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self.data_dir = self.cache / "kafka" / "data" / str(self.port)
        if self.log_dir is None:
            self.log_dir = self.data_dir / "logs"

    # -- where things are ----------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        assert self.data_dir is not None  # set in __post_init__
        return self.data_dir

    @property
    def log_file(self) -> Path:
        assert self.log_dir is not None  # set in __post_init__
        return self.log_dir / "kafka.log"

    @property
    def pid_file(self) -> Path:
        return self.data / "kafka.pid"

    @property
    def log_dirs(self) -> Path:
        """Kafka's ``log.dirs``: the partitions and the metadata log."""
        return self.data / "kraft"

    def controller(self) -> int:
        if self.controller_port is not None:
            return self.controller_port
        path = self.data / "ports.json"
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            self.controller_port = int(json.loads(path.read_text())["controller"])
            return self.controller_port
        self.controller_port = free_port()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"controller": self.controller_port}))
        return self.controller_port

    # -- configure -----------------------------------------------------------------

    def server_properties(self) -> dict[str, str]:
        cport = self.controller()
        return {
            **_SETTINGS,
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.log_dirs),
        }

    def write_config(self) -> Path:
        conf = self.data / "server.properties"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        (self.data / "log4j2.properties").write_text(_BROKER_LOG4J)
        return conf

    def format_storage(self, conf: Path, timeout: float = 120.0) -> bool:
        """Format ``log.dirs`` with a random cluster id unless it already is; True when it
        formatted."""
        if (self.log_dirs / "meta.properties").exists():
            return False
        args = ["format", "--cluster-id", random_cluster_id(), "--config", str(conf)]
        if self.transaction_version is not None:
            args += ["--feature", f"transaction.version={self.transaction_version}"]
        cmd = kafka_jars.java_command(
            kafka_jars.STORAGE_TOOL, *args, log_config=self.data / "log4j2.properties"
        )
        with self.log_file.open("ab") as out:
            try:
                proc = subprocess.run(  # noqa: S603 - Kafka's own storage tool
                    cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise BrokerError(
                    f"formatting {self.log_dirs} took over {timeout:.0f}s; log tail "
                    f"({self.log_file}):\n{self.log_tail()}"
                ) from exc
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting {self.log_dirs} failed (exit {proc.returncode}); log tail "
                f"({self.log_file}):\n{self.log_tail()}"
            )
        return True

    # -- run -----------------------------------------------------------------------

    def is_ready(self, timeout: float = 5.0) -> bool:
        return metadata_answers(self.bootstrap, timeout)

    def start(self, timeout: float = 120.0) -> float:
        """Start (or find running) and wait until a Metadata request answers; returns
        seconds from this call to ready (0 when it was running)."""
        if self.pid() is not None and self.is_ready():
            log.info("Kafka already running (pid %s)", self.pid())
            return 0.0
        started = time.monotonic()
        kafka_jars.kafka_jars()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        conf = self.write_config()
        if self.format_storage(conf):
            log.info("formatted %s in %.1fs", self.log_dirs, time.monotonic() - started)
        cmd = kafka_jars.java_command(
            kafka_jars.BROKER_MAIN,
            str(conf),
            heap=self.heap,
            jvm_options=_JVM_OPTIONS,
            log_config=self.data / "log4j2.properties",
        )
        proc = self.spawn(cmd, cwd=self.data, env=os.environ)
        return self.wait_ready(proc, started, timeout, self.is_ready, name="Kafka")

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (a controlled shutdown: a second or two), then SIGKILL after
        ``timeout``; True when something was running."""
        return super().stop(timeout)

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        return {
            "running": pid is not None,
            "ready": pid is not None and self.is_ready(),
            "pid": pid,
            "bootstrap": self.bootstrap,
            "dataDir": str(self.data),
            "log": str(self.log_file),
            "rssBytes": self.rss_bytes(),
            "version": kafka_jars.KAFKA_VERSION,
        }

    def wipe(self, timeout: float = 30.0) -> None:
        """Stop, then remove the data dir (a log dir outside it stays)."""
        self.stop(timeout)
        shutil.rmtree(self.data, ignore_errors=True)


# -- CLI ---------------------------------------------------------------------------


def _handler(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # kafka-python: the probe's chatter
    if args.action == "fetch":
        jars = kafka_jars.kafka_jars(quiet=False)
        what = f"Apache Kafka {kafka_jars.KAFKA_VERSION} (broker and tools)"
        print(resources.fetched(what, jars, kafka_jars.libs_dir()))
        return 0
    broker = LocalKafka(
        port=args.port,
        data_dir=args.data_dir,
        heap=args.heap,
        transaction_version=args.transaction_version,
    )
    if args.action == "start":
        seconds = broker.start(timeout=args.timeout)
        state = "already running" if seconds == 0 else f"ready in {seconds:.1f}s"
        print(f"Kafka {kafka_jars.KAFKA_VERSION} {state}: bootstrap {broker.bootstrap}")
        print(f"data {broker.data}  log {broker.log_file}")
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running")
    elif args.action == "status":
        status = broker.status()
        print(json.dumps(status, indent=2))
        return 0 if status["ready"] else 3
    elif args.action == "wipe":
        broker.wipe()
        print(f"stopped and removed {broker.data}")
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "kafka",
        help="run a reference Apache Kafka broker (one KRaft node) on loopback",
        description="Fetch (Maven Central), start, stop, inspect or wipe a one-node Apache "
        "Kafka cluster on 127.0.0.1: the reference the Kafka listener is compared with.",
    )
    p.add_argument("action", choices=["fetch", "start", "stop", "status", "wipe"])
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"client port (default {DEFAULT_PORT})"
    )
    p.add_argument("--data-dir", type=Path, default=None, help="default <cache>/kafka/data/<port>")
    p.add_argument("--heap", default="512m", help="broker -Xmx (default 512m)")
    p.add_argument(
        "--transaction-version",
        type=int,
        choices=[0, 1, 2],
        default=None,
        help="transaction.version when formatting a new data dir (default: Kafka's, 2)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for ready")
    p.set_defaults(func=_handler)
