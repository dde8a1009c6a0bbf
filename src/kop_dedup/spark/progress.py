"""Spark stage progress on stderr while an audit's jobs run."""

from __future__ import annotations

import sys
import threading
from typing import Any, Self

__all__ = ["Progress"]


class Progress:
    """Prints Spark stage progress to stderr every few seconds while a job runs."""

    def __init__(self, spark: Any, enabled: bool, every: float = 3.0) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._enabled, self._every = enabled, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        if self._enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            for stage_id in self._tracker.getActiveStageIds():
                info = self._tracker.getStageInfo(stage_id)
                if info is not None:
                    print(
                        f"audit: stage {stage_id} {info.name[:40]}: "
                        f"{info.numCompletedTasks}/{info.numTasks} tasks",
                        file=sys.stderr,
                        flush=True,
                    )
