"""The soak's cluster: a Pulsar broker it may kill and pause, and sidecar processes
sharing one system namespace and one data namespace (so they serve the same topics,
transactions and groups, and each can take over the other's state partitions).

It is the :class:`~kop_dedup_tools.soak_faults.FaultTarget` the faults act on; every
action is noted in :attr:`SoakCluster.events` with its time into the run, for the report.

>>> cluster = SoakCluster(broker, log_dir, sidecars=2, system_namespace="soak-sys-1",
...                       namespace="soak-1").start()
>>> cluster.bootstrap          # "127.0.0.1:A,127.0.0.1:B": every sidecar's Kafka listener
>>> cluster.kill_sidecar(0); cluster.start_sidecar(0)
>>> cluster.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from kop_dedup_tools.launcher import LocalPulsar
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["ClusterEvent", "SoakCluster"]


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    at_s: float
    what: str
    seconds: float
    """How long the action took (a restart: until ready)."""


class SoakCluster:
    def __init__(
        self,
        broker: LocalPulsar,
        log_dir: Path,
        *,
        sidecars: int = 2,
        system_namespace: str,
        namespace: str,
        tenant: str = "public",
        settings: Mapping[str, Any] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.broker = broker
        self.tenant, self.namespace, self.system_namespace = tenant, namespace, system_namespace
        started = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - started)
        common = {
            "tenant": tenant,
            "namespace": namespace,
            "system_namespace": system_namespace,
            "log_level": "INFO",
            **(settings or {}),
        }
        self.sidecars = [
            SidecarProcess(broker.service_url, broker.admin_url, log_dir=log_dir, **common)
            for _ in range(sidecars)
        ]
        self.events: list[ClusterEvent] = []
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        return ",".join(sc.kafka_bootstrap for sc in self.sidecars)

    @property
    def data_namespace(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    def _note(self, what: str, action: Callable[[], object]) -> None:
        begun = time.monotonic()
        at = self._clock()
        try:
            action()
        finally:
            with self._lock:
                self.events.append(ClusterEvent(round(at, 2), what, time.monotonic() - begun))

    def start(self) -> Self:
        """Start the broker (when it is not running) and the sidecars side by side."""
        if not self.broker.is_ready():
            self._note("broker start", self.broker.start)
        with ThreadPoolExecutor(len(self.sidecars)) as pool:
            for future in [pool.submit(sc.start, 120.0) for sc in self.sidecars]:
                future.result()
        return self

    def stop(self) -> None:
        """Stop the sidecars (the broker is the caller's: it may be someone else's)."""
        for sc in self.sidecars:
            sc.stop()

    # -- the FaultTarget ------------------------------------------------------------

    def kill_sidecar(self, index: int) -> None:
        self._note(f"SIGKILL sidecar {index}", self.sidecars[index].kill)

    def terminate_sidecar(self, index: int) -> None:
        sc = self.sidecars[index]
        self._note(f"SIGTERM sidecar {index}", lambda: sc.stop(timeout=40.0))

    def start_sidecar(self, index: int) -> None:
        self._note(f"start sidecar {index}", lambda: self.sidecars[index].start(120.0))

    def kill_broker(self) -> None:
        self._note("SIGKILL broker", self.broker.kill)

    def start_broker(self) -> None:
        self._note("start broker", lambda: self.broker.start(timeout=240.0))

    def pause_broker(self) -> None:
        self._note("SIGSTOP broker", self.broker.pause)

    def resume_broker(self) -> None:
        self._note("SIGCONT broker", self.broker.resume)

    def heal(self, attempts: int = 5) -> list[str]:
        """After a fault that failed half-way: the broker resumed and running, every
        sidecar running; each step tried up to ``attempts`` times. Returns what failed on
        the way (a sidecar that exits at start while the broker's admin API does not
        answer yet is started again)."""
        failures: list[str] = []
        for _ in range(attempts):
            try:
                self.broker.resume()
                if self.broker.pid() is None or not self.broker.is_ready(timeout=10.0):
                    if self.broker.pid() is not None:
                        self.broker.kill()
                    self.start_broker()
                for index, sc in enumerate(self.sidecars):
                    if not sc.running():
                        self.start_sidecar(index)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                time.sleep(2.0)
                continue
            return failures
        raise RuntimeError(f"the cluster could not be brought back: {failures}")
