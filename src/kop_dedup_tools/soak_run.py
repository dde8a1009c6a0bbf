"""One soak run: the steps of ``kop-dedup soak`` (:mod:`kop_dedup_tools.soak`).

A run starts (or is given) a Pulsar broker it may kill, two sidecar processes sharing
one system and one data namespace (:mod:`kop_dedup_tools.soak_cluster`), seeds an input
topic through an idempotent producer, and copies it with two pipelines of transactional
copiers, each a read_committed consumer in a group that commits its offsets in its
transactions (:mod:`kop_dedup_tools.soak_copiers`): Kafka's own
TransactionalMessageCopier and a librdkafka copier, every client bootstrapped with both
sidecars. Meanwhile it applies a schedule of faults drawn from ``--seed``
(:mod:`kop_dedup_tools.soak_faults`: sidecar SIGKILL and SIGTERM, broker SIGKILL and
SIGSTOP, takeovers), adds input while the copiers catch up so that every fault lands on
a busy copy, restarts copiers a fault ended, and watches the read_committed end of
every output partition (:mod:`kop_dedup_tools.soak_watch`). At the end it reads the
input and the outputs, through a read_committed Kafka consumer and from Pulsar directly
(:mod:`kop_dedup_tools.soak_pulsar`), and judges (:mod:`kop_dedup_tools.soak_check`): no
input record duplicated, lost or out of order in an output, no aborted record read, no
read_committed end inside a transaction. Exit status 1 on any violation.

In-process use (the CI test)::

    report = run_soak(SoakConfig(faults=5, records=2000), broker=local_pulsar)
    assert report.ok, report.text()
"""

from __future__ import annotations

import logging
import random
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kop_dedup_tools import soak_check
from kop_dedup_tools.launcher import LocalPulsar
from kop_dedup_tools.soak_check import CHECKS, OutRecord
from kop_dedup_tools.soak_cluster import SoakCluster
from kop_dedup_tools.soak_copiers import Pipeline, Supervisor, java_copier, rdkafka_copier
from kop_dedup_tools.soak_faults import FAULT_KINDS, PlannedFault, describe, plan
from kop_dedup_tools.soak_pulsar import PulsarSide
from kop_dedup_tools.soak_report import AppliedFault, PipelineFigures, SoakReport

if TYPE_CHECKING:  # confluent-kafka is the soak's own dependency: imported when it runs
    from kop_dedup_tools.soak_watch import KafkaSide, Watcher

__all__ = ["SoakConfig", "SoakReport", "run_soak"]

INPUT, OUT_JAVA, OUT_RDKAFKA = "soak-in", "soak-out-java", "soak-out-rdkafka"


@dataclass
class SoakConfig:
    seed: int | None = None
    faults: int = 10
    kinds: list[str] | None = None
    gap_s: tuple[float, float] = (3.0, 8.0)
    records: int = 4000
    """The first wave of input; more waves of ``wave_records`` while faults remain and
    the copiers are near the end."""
    wave_records: int = 2000
    partitions: int = 4
    java_copiers: int = 2
    rdkafka_copiers: int = 2
    transaction_size: int = 50
    batch_records: int = 10
    abort_rate: float = 0.1
    checks: list[str] = field(default_factory=lambda: list(CHECKS))
    drain_s: float = 300.0
    """After the last fault: how long the copiers may take to finish."""
    progress_s: float = 5.0
    workdir: Path | None = None
    sidecar_settings: dict[str, str] = field(default_factory=dict)
    keep_broker: bool = False

    def replay(self, seed: int) -> str:
        """The command that replays this run."""
        parts = ["kop-dedup", "soak", "--seed", str(seed), "--faults", str(self.faults)]
        if self.kinds is not None:
            parts += ["--kinds", ",".join(self.kinds)]
        parts += ["--gap", f"{self.gap_s[0]},{self.gap_s[1]}", "--records", str(self.records)]
        parts += ["--wave-records", str(self.wave_records), "--partitions", str(self.partitions)]
        parts += ["--java-copiers", str(self.java_copiers)]
        parts += ["--rdkafka-copiers", str(self.rdkafka_copiers)]
        parts += [f"--sidecar-setting={k}={v}" for k, v in self.sidecar_settings.items()]
        return shlex.join(parts)


class _Run:
    """One run's state, shared by the steps below."""

    def __init__(self, cfg: SoakConfig, say: Callable[[str], None]) -> None:
        self.cfg, self.say = cfg, say
        self.seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
        self.started = time.monotonic()
        self.workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix=f"kop-dedup-soak-{self.seed}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.schedule = plan(self.seed, cfg.faults, kinds=cfg.kinds, gap_s=cfg.gap_s)
        self.report = SoakReport(
            self.seed,
            cfg.replay(self.seed),
            str(self.workdir),
            [f.to_dict() for f in self.schedule],
        )
        self.clients_log = logging.getLogger(f"kop_dedup_tools.soak.clients.{self.seed}")
        self.clients_log.propagate = False
        handler = logging.FileHandler(self.workdir / "clients.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.clients_log.addHandler(handler)
        self.clients_log.setLevel(logging.INFO)
        self.wave = 0
        self.seeded = 0
        self.acked: set[str] = set()
        self.failed_seeds: list[str] = []
        self.current = "starting"

    def clock(self) -> float:
        return round(time.monotonic() - self.started, 2)


def run_soak(
    cfg: SoakConfig, *, broker: LocalPulsar | None = None, say: Callable[[str], None] = print
) -> SoakReport:
    """One soak run (see the module docstring); ``broker`` is one the caller started
    (it is killed and restarted, and left running), else a throwaway one is started and
    wiped at the end (kept with ``cfg.keep_broker``)."""
    run = _Run(cfg, say)
    unknown = sorted(set(cfg.checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    say(f"soak seed {run.seed} (replay: {run.report.command})")
    say(f"logs in {run.workdir}")
    say(f"schedule of {len(run.schedule)} faults:")
    for fault in run.schedule:
        say(f"  {describe(fault)}")
    owned = broker is None
    if broker is None:
        broker = LocalPulsar.throwaway(run.workdir / "pulsar-logs", prefix="kop-dedup-soak-pulsar-")
        say("starting a Pulsar broker for this run...")
    tag = f"{run.seed}-{uuid.uuid4().hex[:6]}"
    cluster = SoakCluster(
        broker,
        run.workdir,
        system_namespace=f"soak-sys-{tag}",
        namespace=f"soak-{tag}",
        settings=cfg.sidecar_settings,
        clock=run.clock,
    )
    try:
        cluster.start()
        say(f"{run.clock():.0f}s: broker {broker.service_url}, sidecars {cluster.bootstrap}")
        _soak(run, cluster, tag)
    finally:
        cluster.stop()
        run.report.cluster_events = [asdict(e) for e in cluster.events]
        if owned and not cfg.keep_broker:
            broker.wipe(timeout=30)
        run.report.seconds = time.monotonic() - run.started
    return run.report


def _soak(run: _Run, cluster: SoakCluster, tag: str) -> None:
    cfg = run.cfg
    try:
        from kop_dedup_tools.soak_watch import (  # noqa: PLC0415 - the soak's own dependency
            KafkaSide,
            Watcher,
        )
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "kop-dedup soak runs librdkafka clients: pip install 'kop-dedup[soak]' "
            f"(confluent-kafka): {exc}"
        ) from exc
    from kop_dedup_tools.topics import create_topic  # noqa: PLC0415 - keeps imports light

    for topic in (INPUT, OUT_JAVA, OUT_RDKAFKA):
        create_topic(
            cluster.broker.admin_url,
            topic,
            partitions=cfg.partitions,
            namespace=cluster.data_namespace,
        )
    side = KafkaSide(cluster.bootstrap, run.clients_log)
    _seed_wave(run, side, cfg.records)
    pipelines = _pipelines(run, cluster.bootstrap, tag)
    supervisor = Supervisor(
        pipelines,
        committed=lambda group: side.committed(group, INPUT, cfg.partitions),
        input_end=lambda: {
            p: e for (_, p), e in side.ends({INPUT: cfg.partitions}, committed=False).items()
        },
        clock=run.clock,
    )
    outputs = {OUT_JAVA: cfg.partitions, OUT_RDKAFKA: cfg.partitions}
    watcher = Watcher(KafkaSide(cluster.bootstrap, run.clients_log), outputs, run.clock)
    copy_started = run.clock()
    supervisor.start_copiers()
    supervisor.start()
    if "lso" in cfg.checks:
        watcher.start()
    progress = threading.Thread(
        target=_progress, args=(run, supervisor, watcher), name="soak-progress", daemon=True
    )
    progress.start()
    try:
        _warm_up(run, supervisor)
        for fault in run.schedule:
            _fault(run, cluster, side, supervisor, fault)
        run.current = "draining"
        supervisor.input_done.set()
        deadline = time.monotonic() + cfg.drain_s
        while not supervisor.done() and time.monotonic() < deadline:
            time.sleep(0.5)
        for p in supervisor.pipelines:
            if p.done_at is None:
                run.report.stalled.append(
                    f"{p.name} had committed {p.committed} of {supervisor.end} when "
                    f"{cfg.drain_s:.0f}s of draining were up"
                )
    finally:
        run.current = "checking"
        supervisor.halt()
        supervisor.stop_all()
        run.report.restarts = supervisor.restarts
        run.report.hangs = supervisor.hangs
        run.report.notes += [
            f"supervisor asked the cluster and got (while faults lasted) {n}x {e}"
            for e, n in supervisor.errors.most_common(10)
        ]
    run.report.pipelines = [
        PipelineFigures(
            p.name,
            len(p.copiers),
            p.committed_total(),
            None if p.done_at is None else p.done_at - copy_started,
        )
        for p in supervisor.pipelines
    ]
    ends = _settled(side, outputs, run)
    watcher.stop()
    run.report.answers = {
        src: sum(1 for a in watcher.answers if a.source == src)
        for src in ("list-offsets", "consumer-eof")
    }
    if watcher.errors:
        run.report.notes.append(f"watcher errors (faults): {dict(watcher.errors)}")
    _judge(run, cluster, side, supervisor, watcher, ends)
    side.close()


def _warm_up(run: _Run, supervisor: Supervisor, timeout: float = 180.0) -> None:
    """Until every pipeline has committed something: the first fault lands on a copy
    under way, not on copiers still starting."""
    run.current = "warming up"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.committed_total() > 0 for p in supervisor.pipelines):
            return
        time.sleep(0.5)
    run.report.notes.append(f"the copiers had not all committed within {timeout:.0f}s of starting")


def _pipelines(run: _Run, bootstrap: str, tag: str) -> list[Pipeline]:
    cfg = run.cfg
    logs = run.workdir / "copiers"
    java = [
        java_copier(
            f"soak-{tag}-java-{i}",
            bootstrap=bootstrap,
            group=f"soak-{tag}-java",
            input_topic=INPUT,
            output_topic=OUT_JAVA,
            log_dir=logs,
            transaction_size=cfg.transaction_size,
        )
        for i in range(cfg.java_copiers)
    ]
    rdkafka = [
        rdkafka_copier(
            f"soak-{tag}-rdkafka-{i}",
            bootstrap=bootstrap,
            group=f"soak-{tag}-rdkafka",
            input_topic=INPUT,
            output_topic=OUT_RDKAFKA,
            log_dir=logs,
            transaction_size=cfg.transaction_size,
            batch_records=cfg.batch_records,
            abort_rate=cfg.abort_rate,
            seed=run.seed,
        )
        for i in range(cfg.rdkafka_copiers)
    ]
    out = []
    if java:
        out.append(Pipeline("java", f"soak-{tag}-java", OUT_JAVA, java))
    if rdkafka:
        out.append(Pipeline("librdkafka", f"soak-{tag}-rdkafka", OUT_RDKAFKA, rdkafka))
    return out


def _seed_wave(run: _Run, side: KafkaSide, records: int) -> None:
    parts = run.cfg.partitions
    batch = [(i % parts, f"w{run.wave}-p{i % parts}-{i // parts:07d}") for i in range(records)]
    run.wave += 1
    acked, failed = side.produce(INPUT, batch, timeout=120.0)
    run.seeded += len(acked)
    run.acked.update(acked)
    if failed:
        run.failed_seeds += failed
        run.report.notes.append(
            f"wave {run.wave - 1}: {len(failed)} input records not acknowledged (judged by "
            "what the input topic holds)"
        )


def _fault(
    run: _Run, cluster: SoakCluster, side: KafkaSide, supervisor: Supervisor, fault: PlannedFault
) -> None:
    run.current = f"waiting for #{fault.index} {fault.kind}"
    deadline = time.monotonic() + fault.gap_s
    while time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    end = sum(supervisor.end.values()) or run.seeded
    behind = min((end - p.committed_total() for p in supervisor.pipelines), default=0)
    if behind < run.cfg.wave_records // 2:  # keep the copiers busy for the next fault
        _seed_wave(run, side, run.cfg.wave_records)
    run.current = f"#{fault.index} {fault.kind}"
    at = run.clock()
    begun = time.monotonic()
    run.say(f"{at:7.1f}s fault {describe(fault)}")
    error = None
    try:
        FAULT_KINDS[fault.kind].apply(cluster, fault.params)
    except Exception as exc:  # a fault that failed half-way: bring everything back
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        run.say(f"{run.clock():7.1f}s fault #{fault.index} failed ({error}); healing")
        healed = cluster.heal()
        if healed:
            error += f"; healing retried after {healed}"
    run.report.faults.append(
        AppliedFault(
            fault.index,
            fault.kind,
            dict(fault.params),
            at,
            round(time.monotonic() - begun, 2),
            error,
        )
    )


def _progress(run: _Run, supervisor: Supervisor, watcher: Watcher) -> None:
    while run.current != "checking":
        time.sleep(run.cfg.progress_s)
        if run.current == "checking":
            return
        end = sum(supervisor.end.values())
        copied = " ".join(f"{p.name} {p.committed_total()}/{end}" for p in supervisor.pipelines)
        run.say(
            f"{run.clock():7.1f}s {run.current} | faults {len(run.report.faults)}/"
            f"{len(run.schedule)} | committed {copied} | restarts {len(supervisor.restarts)} | "
            f"lso answers {len(watcher.answers)}"
        )


def _settled(side: KafkaSide, outputs: dict[str, int], run: _Run) -> dict[str, dict[int, int]]:
    """The outputs' ends once the last copies have landed: ListOffsets READ_COMMITTED
    equal to the uncommitted end and unchanged for 3 s (up to a minute)."""
    deadline = time.monotonic() + 60
    last: dict[tuple[str, int], int] | None = None
    stable_since = time.monotonic()
    while True:
        try:
            committed = side.ends(outputs, committed=True)
            latest = side.ends(outputs, committed=False)
        except Exception as exc:  # the cluster settling: ask again
            committed, latest = {}, {"error": str(exc)}  # type: ignore[dict-item]
        if committed != last:
            last, stable_since = committed, time.monotonic()
        if committed == latest and time.monotonic() - stable_since >= 3:
            break
        if time.monotonic() > deadline:
            run.report.notes.append(f"outputs never settled: {committed} vs {latest}")
            break
        time.sleep(0.5)
    out: dict[str, dict[int, int]] = {t: {} for t in outputs}
    for (topic, partition), end in (last or {}).items():
        out[topic][partition] = end
    return out


def _aborted_attempts(supervisor: Supervisor) -> set[str]:
    begun: set[str] = set()
    asked: set[str] = set()
    for pipeline in supervisor.pipelines:
        for copier in pipeline.copiers:
            for e in copier.events():
                if e.get("e") == "begin":
                    begun.add(str(e["a"]))
                elif e.get("e") == "commit":
                    asked.add(str(e["a"]))
    return begun - asked


def _judge(
    run: _Run,
    cluster: SoakCluster,
    side: KafkaSide,
    supervisor: Supervisor,
    watcher: Watcher,
    ends: dict[str, dict[int, int]],
) -> None:
    checks = run.cfg.checks
    direct = PulsarSide(
        cluster.broker.service_url, cluster.broker.admin_url, cluster.data_namespace
    )
    inputs, wrong = _read_input(run, direct)
    aborted = _aborted_attempts(supervisor)
    topic_spans: dict[str, Any] = {}
    for pipeline in supervisor.pipelines:
        topic = pipeline.output_topic
        topic_spans[topic], bad = _judge_output(
            run, pipeline.name, topic, ends.get(topic, {}), side, direct, inputs, aborted
        )
        wrong += bad
    if "offsets" in checks:
        _judge_offsets(run, side, supervisor, wrong)
    if "lso" in checks:
        run.report.checks.append(soak_check.lso_violations(watcher.answers, topic_spans))


def _read_input(run: _Run, direct: PulsarSide) -> tuple[dict[int, list[str]], list[str]]:
    """The input as stored (values per partition, in order), and offset disagreements."""
    records, wrong = direct.read(INPUT, run.cfg.partitions, at_least={})
    inputs: dict[int, list[str]] = {p: [] for p in range(run.cfg.partitions)}
    for rec in records:
        inputs[rec.partition].append(rec.value)
    run.report.input_records = len(records)
    held = {r.value for r in records}
    lost_input = run.acked - held
    if lost_input or len(held) != len(records):
        run.report.notes.append(
            f"the input itself: {len(lost_input)} acknowledged records missing, "
            f"{len(records) - len(held)} stored twice (idempotent produce)"
        )
    return inputs, wrong


def _judge_output(
    run: _Run,
    pipeline: str,
    topic: str,
    want: dict[int, int],
    side: KafkaSide,
    direct: PulsarSide,
    inputs: dict[int, list[str]],
    aborted: set[str],
) -> tuple[dict[int, list[soak_check.Span]], list[str]]:
    """One output topic read both ways and counted; its transactions' spans (from the
    Pulsar read) and offset disagreements."""
    from kop_dedup_tools.soak_watch import read_committed  # noqa: PLC0415 - see _soak

    checks = run.cfg.checks
    readers: dict[str, list[OutRecord]] = {}
    try:
        readers["read_committed"] = read_committed(side, topic, want)
    except TimeoutError as exc:  # a reader that cannot reach the end it was told
        run.report.checks.append(
            soak_check.CheckResult(f"lost ({pipeline}, read_committed)", 1, 1, [str(exc)])
        )
    readers["pulsar"], wrong = direct.read(topic, run.cfg.partitions, at_least=want)
    for reader, records in readers.items():
        label = f"{pipeline}, {reader}"
        counts = soak_check.copy_counts(inputs, records, reader=label)
        run.report.checks += [counts[n] for n in ("duplicates", "lost", "order") if n in checks]
        if "aborted" in checks and pipeline == "librdkafka":
            run.report.checks.append(soak_check.aborted_reads(records, aborted, reader=label))
    return soak_check.spans(readers["pulsar"]), wrong


def _judge_offsets(run: _Run, side: KafkaSide, supervisor: Supervisor, wrong: list[str]) -> None:
    parts = run.cfg.partitions
    try:
        end = {p: e for (_, p), e in side.ends({INPUT: parts}, committed=False).items()}
        for pipeline in supervisor.pipelines:
            got = side.committed(pipeline.group, INPUT, parts)
            pipeline.committed = got
            run.report.checks.append(soak_check.committed_offsets(got, end, group=pipeline.name))
    except Exception as exc:  # the listener gone: say so, do not judge blind
        run.report.checks.append(
            soak_check.CheckResult("offsets (asked)", 1, 1, [f"{type(exc).__name__}: {exc}"])
        )
    counted = soak_check.CheckResult("offsets (pulsar index)", len(supervisor.pipelines) + 1, 0)
    for w in wrong:
        counted.note(w)
    run.report.checks.append(counted)
