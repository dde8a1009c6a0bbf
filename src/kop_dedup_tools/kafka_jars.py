"""Apache Kafka's jars from Maven Central, and the ``java`` command lines that run them.

``kop-dedup kafka fetch`` (and ``scripts/bootstrap``) resolve the packaged
``kafka-jars-pom.xml`` once with Maven (through the packaged Maven settings that mirror
every repository to Central) into ``<cache>/kafka/<version>/libs`` (cache:
``$KOP_DEDUP_CACHE`` or ``~/.cache/kop-dedup``): the broker ``org.apache.kafka:kafka_2.13``,
the tools ``org.apache.kafka:kafka-tools``, Kafka Streams ``org.apache.kafka:kafka-streams``
and their runtime dependencies, one classpath, like the distribution's ``libs/``. Later
calls only look at a stamp file.

Where the classes are (4.1.2, listed from the jars):

* ``kafka_2.13``: the broker ``kafka.Kafka`` and ``kafka.tools.StorageTool`` (what
  ``kafka-storage.sh format`` runs);
* ``kafka-tools``: ``org.apache.kafka.tools.VerifiableProducer``, ``.VerifiableConsumer``,
  ``.ProducerPerformance``, ``.TransactionalMessageCopier``,
  ``org.apache.kafka.tools.consumer.ConsoleConsumer``, the operator tools (``TopicCommand``,
  ``TransactionsCommand``, ``DeleteRecordsCommand``, ``GetOffsetShell``,
  ``consumer.group.ConsumerGroupCommand``; ``kafka.admin.ConfigCommand`` is in
  ``kafka_2.13``) and, through its dependencies, Kafka Connect's runtime
  (``org.apache.kafka.connect.cli.ConnectDistributed``);
* ``connect-file``: Connect's file connectors (``FileStreamSourceConnector``,
  ``FileStreamSinkConnector``), which the Connect test runs;
* ``kafka-streams`` (with ``rocksdbjni`` for its state stores): the library of the Kafka
  Streams application that the exactly-once Streams test runs
  (``tests/java/StreamsCount.java``).

The stamp file names the pom's digest: a pom that names other jars (a new artifact, a
new version) is resolved again.

``java_command(VERIFIABLE_PRODUCER, "--topic", "t", ...)`` is a command line for
``subprocess``: the JVM, the classpath (fetched first if needed) and the tools' logging
(stderr, warnings and worse: stdout keeps only the tools' own output).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from importlib import resources as importlib_resources
from pathlib import Path

from kop_dedup import resources
from kop_dedup.resources import cache_dir
from kop_dedup_tools.distribution import file_lock
from kop_dedup_tools.processes import BrokerError

__all__ = [
    "BROKER_MAIN",
    "CONNECT_DISTRIBUTED",
    "CONSOLE_CONSUMER",
    "KAFKA_VERSION",
    "PRODUCER_PERFORMANCE",
    "STORAGE_TOOL",
    "STREAMS_LOG4J",
    "TRANSACTIONAL_MESSAGE_COPIER",
    "VERIFIABLE_CONSUMER",
    "VERIFIABLE_PRODUCER",
    "classpath",
    "compiled_classes",
    "java_command",
    "java_tool",
    "kafka_jars",
    "libs_dir",
    "pom",
    "stamp_line",
]

BROKER_MAIN = "kafka.Kafka"
CONNECT_DISTRIBUTED = "org.apache.kafka.connect.cli.ConnectDistributed"
STORAGE_TOOL = "kafka.tools.StorageTool"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
TRANSACTIONAL_MESSAGE_COPIER = "org.apache.kafka.tools.TransactionalMessageCopier"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"

STREAMS_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p [%t] %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.streams.name = org.apache.kafka.streams
logger.streams.level = info
"""
"""The log4j2 configuration of a Kafka Streams application (``{log}``: its file):
warnings, and Streams' own state changes and restores."""


def pom() -> Path:
    """The packaged pom naming the jars (Maven needs a file, not a stream)."""
    return Path(str(importlib_resources.files("kop_dedup_tools").joinpath("kafka-jars-pom.xml")))


def _pom_version() -> str:
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom().read_text())
    if found is None:  # pragma: no cover - the packaged pom names it
        raise RuntimeError(f"{pom()} names no <kafka.version>")
    return found.group(1)


KAFKA_VERSION = _pom_version()

# Tools print their results as JSON lines on stdout: their own logging goes to stderr,
# warnings and worse only.
_TOOLS_LOG4J = """\
status = warn
appender.err.type = Console
appender.err.name = stderr
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss.SSS} %-5p [%c{1}] %m%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = stderr
"""


def libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_dir() / "kafka" / version / "libs"


def _pom_digest() -> str:
    return hashlib.sha256(pom().read_bytes()).hexdigest()[:16]


def stamp_line(seconds: float, size: int) -> str:
    """What the stamp file says after a resolution of the current pom."""
    return f"{seconds:.1f}s {size} bytes pom={_pom_digest()}\n"


def _resolved(stamp: Path) -> bool:
    with contextlib.suppress(OSError):
        return f"pom={_pom_digest()}" in stamp.read_text()
    return False


def kafka_jars(*, quiet: bool = False) -> list[Path]:
    """The broker, the tools, Kafka Streams and their runtime dependencies, resolved from
    Maven Central once per pom (about 130 MB, RocksDB's native libraries 70 of them); safe
    to call from several processes at once."""
    target = libs_dir()
    stamp = target / ".resolved"
    if not _resolved(stamp):
        with file_lock(target.parent / ".lock"):
            if not _resolved(stamp):
                _resolve(target, quiet=quiet)
    return sorted(target.glob("*.jar"))


def _resolve(target: Path, *, quiet: bool) -> None:
    if not quiet:
        resources.progress(
            f"resolving Apache Kafka {KAFKA_VERSION} (broker, tools, Streams) with Maven..."
        )
    started = time.monotonic()
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        resources.run_maven(
            "-f",
            str(pom()),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
            what=f"resolve Apache Kafka {KAFKA_VERSION}",
        )
    except resources.MavenError as exc:
        raise BrokerError(str(exc)) from exc
    if not (tmp / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        raise BrokerError(f"Maven finished but {tmp} holds no kafka_2.13-{KAFKA_VERSION}.jar")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    size = sum(p.stat().st_size for p in target.glob("*.jar"))
    seconds = time.monotonic() - started
    (target / ".resolved").write_text(stamp_line(seconds, size))


def classpath() -> str:
    """The jars as one ``-cp`` entry (the JVM expands ``dir/*``); fetches them if needed."""
    kafka_jars(quiet=True)
    return str(libs_dir() / "*")


def tools_log_config() -> Path:
    """The log4j2 configuration of the tools (stderr, warnings and worse), kept next to
    the jars and rewritten when this module's text changes."""
    path = libs_dir().parent / "log4j2-tools.properties"
    with contextlib.suppress(OSError):
        if path.read_text() == _TOOLS_LOG4J:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(_TOOLS_LOG4J)
    tmp.replace(path)
    return path


def java_tool(name: str) -> str:
    """The JDK's ``name`` (``java``, ``javac``): ``$JAVA_HOME/bin`` first, then the path."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).exists():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise BrokerError(f"Java 17 or later ({name}) is needed to run Apache Kafka: install it")
    return found


def java_command(
    main_class: str,
    *args: str,
    heap: str = "256m",
    jvm_options: tuple[str, ...] = (),
    log_config: Path | None = None,
    classes: Path | None = None,
) -> list[str]:
    """``java -Xmx<heap> <options> -Dlog4j2.configurationFile=<config> -cp [<classes>:]<jars>
    <main> <args>``; the log configuration defaults to the tools' (stderr only);
    ``classes``, a directory of compiled classes (a test's application), comes first on
    the classpath."""
    java = java_tool("java")
    config = log_config if log_config is not None else tools_log_config()
    return [
        java,
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={config}",
        *jvm_options,
        "-cp",
        classpath() if classes is None else f"{classes}{os.pathsep}{classpath()}",
        main_class,
        *args,
    ]


def compiled_classes(source: Path, name: str) -> Path:
    """``source`` (one Java file against the Kafka jars) compiled once, into a directory
    of the temporary dir named ``name``-<the source's digest>: a source-file launch
    compiles at every start, seconds on a busy machine. Needs ``javac`` (a JDK):
    :class:`BrokerError` without one."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"{name}-{digest}"
    if (target / f"{source.stem}.class").exists():
        return target
    javac = java_tool("javac")
    tmp = target.with_name(f"{target.name}.{os.getpid()}")
    subprocess.run(  # noqa: S603 - the JDK's javac on our own source
        [javac, "-d", str(tmp), "-cp", classpath(), str(source)],
        check=True,
        capture_output=True,
    )
    with contextlib.suppress(OSError):  # another process got there first: the same classes
        tmp.rename(target)
    return target
