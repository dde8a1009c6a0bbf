"""A real Apache Pulsar standalone broker on loopback, from Maven Central.

``kop-dedup pulsar start|stop|status|wipe|fetch`` drives :class:`LocalPulsar`, a
:class:`~kop_dedup_tools.processes.ProcessGroup` (the process control) over a
distribution unpacked once (:mod:`kop_dedup_tools.distribution`):

* ``fetch`` resolves ``org.apache.pulsar:pulsar-server-distribution:<v>:tar.gz:bin``
  with Maven (into ``~/.m2``, through the packaged ``kop_dedup/resources/maven-settings.xml``, which
  mirrors every repository to Central) and unpacks it once into the cache
  (``$KOP_DEDUP_CACHE`` or ``~/.cache/kop-dedup``); later starts reuse it.
* ``start`` writes a standalone.conf for this instance into its data dir
  (dedup and the transaction coordinator on, topics never deleted, infinite
  retention, small caches, loopback only), starts ``bin/pulsar standalone
  -nfw -nss`` on the embedded ZooKeeper in its own process group and waits
  until the admin API lists the ``standalone`` cluster and the broker's
  health check passes. On failure it raises with the broker log's tail.
* ``stop`` sends SIGTERM to the group, then SIGKILL after a bound.

Two instances never collide when their ports and data dirs differ; the data
dir defaults to ``<cache>/data/<web port>``.

>>> broker = LocalPulsar(broker_port=16650, web_port=18080)
>>> broker.service_url
'pulsar://127.0.0.1:16650'
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup import resources
from kop_dedup.resources import cache_dir
from kop_dedup_tools.distribution import fetch_artifact, maven_file, unpack_once
from kop_dedup_tools.processes import BrokerError, ProcessGroup, free_port

__all__ = [
    "DEFAULT_VERSION",
    "BrokerError",
    "LocalPulsar",
    "add_cli",
    "broker_ready",
    "cache_dir",
    "free_port",
]

log = logging.getLogger(__name__)

DEFAULT_VERSION = "4.0.8"

# What differs from the distribution's standalone.conf, and why.
_OVERRIDES = {
    "brokerDeduplicationEnabled": "true",  # the mechanism this project rests on
    # kop-dedup keeps its transactions itself (a journal and a copy) and never uses
    # Pulsar's. With Pulsar's on, every topic's transaction buffer recovers from the
    # namespace's snapshot topic before the broker answers GetLastMessageId, and a topic
    # deleted while a neighbour recovers leaves that neighbour's recovery hung (12% of
    # tries here; apache/pulsar 4.0.8): read_committed readers then stall for good.
    # See the limits page, section Pulsar transactions on the broker.
    "transactionCoordinatorEnabled": "false",
    "brokerDeleteInactiveTopicsEnabled": "false",  # data under test must stay
    "defaultRetentionTimeInMinutes": "-1",
    "defaultRetentionSizeInMB": "-1",
    "bindAddress": "127.0.0.1",  # loopback only
    "advertisedAddress": "127.0.0.1",
    "allowAutoTopicCreation": "true",
    # Kafka-style integer offsets for consumer groups: every entry carries the index of
    # its last message (see kop_dedup.pulsar.positions)
    "brokerEntryMetadataInterceptors": (
        "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor"
    ),
    "managedLedgerCacheSizeMB": "64",  # a 2-core, 24 GiB box shared with Spark
    "dbStorage_writeCacheMaxSizeMb": "64",
    "dbStorage_readAheadCacheMaxSizeMb": "64",
    "dbStorage_rocksDB_blockCacheSize": "33554432",
    "numIOThreads": "2",
    "numHttpServerThreads": "4",
    # a sidecar that hangs (paused, frozen VM) holds its consumer on the membership topic
    # until the broker's keepalive drops its connection: two missed pings, 10 s here
    # instead of 60 s, before the cluster moves its partitions (docs/operations/cluster.md)
    "keepAliveIntervalSeconds": "5",
    # the embedded bookie's ZooKeeper session (10 s by default): a broker JVM starved for
    # 10 s on a loaded 2-core box lost it, the bookie shut down under a read, and
    # BookKeeper's read cache crashed the JVM (IllegalReferenceCountException, then a
    # native crash) in the middle of a CI soak
    "zkTimeout": "30000",
}


def broker_ready(admin_url: str, timeout: float = 2.0, cluster: str | None = None) -> bool:
    """The admin API at ``admin_url`` answers (listing ``cluster``, when given) and the
    broker can store: its health check (a round trip through a heartbeat topic) passes.
    After an unclean stop the admin API answers seconds before the bookie has recovered
    its ledgers."""
    base = admin_url.rstrip("/")
    try:
        with urllib.request.urlopen(  # noqa: S310 - an http URL the user gave or we built
            f"{base}/admin/v2/clusters", timeout=timeout
        ) as resp:
            if cluster is not None and cluster not in json.loads(resp.read() or b"[]"):
                return False
        with urllib.request.urlopen(  # noqa: S310 - an http URL the user gave or we built
            f"{base}/admin/v2/brokers/health", timeout=max(timeout, 10.0)
        ) as resp:
            health: bytes = resp.read()
            return health.strip() == b"ok"
    except urllib.error.HTTPError as exc:  # an answer (a broker still starting): close it
        exc.close()
        return False
    except (OSError, ValueError, urllib.error.URLError):
        return False


@dataclass
class LocalPulsar(ProcessGroup):
    broker_port: int = 6650
    web_port: int = 8080
    version: str = DEFAULT_VERSION
    data_dir: Path | None = None
    heap: str = "768m"
    cache: Path = field(default_factory=cache_dir)
    log_dir: Path | None = None
    """Where the broker logs (default ``<data dir>/logs``); outside the data dir, the
    log outlives a wipe."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def throwaway(cls, log_dir: Path, prefix: str = "kop-dedup-pulsar-") -> LocalPulsar:
        """One on free ports with a fresh temporary data dir (gone after :meth:`wipe`),
        logging into ``log_dir`` (kept, for post-mortems): for a test session or a run."""
        return cls(
            broker_port=free_port(),
            web_port=free_port(),
            data_dir=Path(tempfile.mkdtemp(prefix=prefix)),
            log_dir=log_dir,
        )

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self.data_dir = self.cache / "data" / str(self.web_port)
        if self.log_dir is None:
            self.log_dir = self.data_dir / "logs"

    # -- where things are ----------------------------------------------------------

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def data(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir

    @property
    def home(self) -> Path:
        return self.cache / "pulsar" / f"apache-pulsar-{self.version}"

    @property
    def log_file(self) -> Path:
        assert self.log_dir is not None  # set in __post_init__
        return self.log_dir / "pulsar.log"

    @property
    def pid_file(self) -> Path:
        return self.data / "pulsar.pid"

    def internal_ports(self) -> dict[str, int]:
        """The embedded ZooKeeper's and bookie's ports: free ones picked at the first
        start and kept in the data dir, since the bookie's identity (and every ledger's
        ensemble) is its address and must not change across restarts."""
        path = self.data / "ports.json"
        with contextlib.suppress(OSError, ValueError):
            ports: dict[str, int] = json.loads(path.read_text())
            if {"zookeeper", "bookie"} <= ports.keys():
                return ports
        ports = {"zookeeper": free_port(), "bookie": free_port()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ports))
        return ports

    def metadata_store(self) -> str:
        """``zookeeper`` for a new data dir; ``rocksdb`` for one an older launcher made.

        Standalone's default RocksDB metadata store can livelock after an unclean
        stop: the stale bookie registration it deletes at start invalidates the
        new registration lock, which then deletes and recreates itself hundreds of
        times a second (apache/pulsar#17759), and ledger creation fails
        ("Not enough non-faulty bookies") until the broker is stopped. The
        embedded ZooKeeper registers the bookie through BookKeeper's own driver.
        """
        rocksdb = self.data / "metadata"
        if rocksdb.is_dir() and any(rocksdb.iterdir()):
            return "rocksdb"
        return "zookeeper"

    def tarball(self) -> Path:
        return maven_file(
            "org.apache.pulsar", "pulsar-server-distribution", self.version, "tar.gz", "bin"
        )

    # -- fetch -------------------------------------------------------------------

    def ensure_distribution(self) -> Path:
        """The unpacked distribution, downloading and unpacking it at most once."""
        return unpack_once(
            self.tarball(), self.home, lock=self.cache / "pulsar" / ".lock", fetch=self._download
        )

    def _download(self) -> None:
        artifact = f"org.apache.pulsar:pulsar-server-distribution:{self.version}:tar.gz:bin"
        resources.progress(f"fetching {artifact} from Maven Central (about 245 MB)...")
        fetch_artifact(artifact, self.tarball())

    # -- configure ---------------------------------------------------------------

    def write_config(self) -> Path:
        """This instance's standalone.conf, derived from the distribution's."""
        base = (self.home / "conf" / "standalone.conf").read_text().splitlines()
        overrides = {
            **_OVERRIDES,
            "brokerServicePort": str(self.broker_port),
            "webServicePort": str(self.web_port),
        }
        seen: set[str] = set()
        out: list[str] = []
        for line in base:
            key = line.split("=", 1)[0].strip()
            if not line.lstrip().startswith("#") and "=" in line and key in overrides:
                out.append(f"{key}={overrides[key]}")
                seen.add(key)
            else:
                out.append(line)
        out += [f"{k}={v}" for k, v in overrides.items() if k not in seen]
        conf = self.data / "standalone.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("\n".join(out) + "\n")
        return conf

    # -- run ---------------------------------------------------------------------

    def is_ready(self, timeout: float = 2.0) -> bool:
        """See :func:`broker_ready` (this broker's cluster is ``standalone``)."""
        return broker_ready(self.admin_url, timeout, cluster="standalone")

    def start(self, timeout: float = 180.0) -> float:
        """Start (or find running) and wait until ready; returns seconds to ready."""
        if self.pid() is not None and self.is_ready():
            log.info("Pulsar already running (pid %s)", self.pid())
            return 0.0
        home = self.ensure_distribution()
        conf = self.write_config()
        env = {
            **os.environ,
            "PULSAR_MEM": f"-Xms256m -Xmx{self.heap} -XX:MaxDirectMemorySize=512m",
            "PULSAR_GC": "-XX:+UseG1GC -XX:MaxGCPauseMillis=50",
            "PULSAR_GC_LOG": " ",
            "PULSAR_LOG_DIR": str(self.log_file.parent),
            "PULSAR_STANDALONE_CONF": str(conf),
        }
        store = self.metadata_store()
        if store == "zookeeper":
            ports = self.internal_ports()
            env["PULSAR_STANDALONE_USE_ZOOKEEPER"] = "1"
            store_args = [
                "--zookeeper-dir",
                str(self.data / "zookeeper"),
                "--zookeeper-port",
                str(ports["zookeeper"]),
                "--bookkeeper-port",
                str(ports["bookie"]),
            ]
        else:
            log.warning(
                "%s holds a RocksDB metadata store (made by an older kop-dedup); it may "
                "livelock after an unclean stop: `kop-dedup pulsar wipe` moves to ZooKeeper",
                self.data,
            )
            store_args = ["--metadata-dir", str(self.data / "metadata")]
        started = time.monotonic()
        proc = self.spawn(
            [
                str(home / "bin" / "pulsar"),
                "standalone",
                "-nfw",
                "-nss",
                "--config",
                str(conf),
                "-a",
                "127.0.0.1",
                "--bookkeeper-dir",
                str(self.data / "bookkeeper"),
                *store_args,
            ],
            cwd=self.data,
            env=env,
        )
        return self.wait_ready(proc, started, timeout, self.is_ready, name="Pulsar")

    def restart(self, timeout: float = 180.0) -> float:
        self.stop()
        return self.start(timeout)

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        return {
            "running": pid is not None,
            "ready": pid is not None and self.is_ready(),
            "pid": pid,
            "serviceUrl": self.service_url,
            "adminUrl": self.admin_url,
            "dataDir": str(self.data),
            "rssBytes": self.rss_bytes(),
            "version": self.version,
        }

    def wipe(self, timeout: float = 60.0) -> None:
        """Stop, then remove the data dir (a log dir outside it stays)."""
        self.stop(timeout)
        shutil.rmtree(self.data, ignore_errors=True)


# -- CLI ---------------------------------------------------------------------------


def _handler(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    broker = LocalPulsar(
        broker_port=args.broker_port,
        web_port=args.web_port,
        version=args.version,
        data_dir=args.data_dir,
        heap=args.heap,
    )
    if args.action == "fetch":
        print(f"Apache Pulsar {args.version} at {broker.ensure_distribution()}")
    elif args.action == "start":
        seconds = broker.start(timeout=args.timeout)
        state = "already running" if seconds == 0 else f"ready in {seconds:.1f}s"
        print(f"Pulsar {state}: service {broker.service_url}  admin {broker.admin_url}")
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
        "pulsar",
        help="run a local Apache Pulsar standalone broker (dedup on)",
        description="Fetch (Maven Central), start, stop, inspect or wipe a local Pulsar "
        "standalone broker on loopback with deduplication enabled.",
    )
    p.add_argument("action", choices=["fetch", "start", "stop", "status", "wipe"])
    p.add_argument(
        "--broker-port", type=int, default=int(os.environ.get("KOP_DEDUP_PULSAR_PORT", "6650"))
    )
    p.add_argument(
        "--web-port", type=int, default=int(os.environ.get("KOP_DEDUP_PULSAR_WEB_PORT", "8080"))
    )
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--version", default=DEFAULT_VERSION)
    p.add_argument("--heap", default="768m", help="broker -Xmx (default 768m)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for ready")
    p.set_defaults(func=_handler)
