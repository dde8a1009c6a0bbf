"""A load (:func:`~kop_dedup_tools.load_driver.run_load`) in a thread with its own event
loop, watched while it runs: what the fault tests inject their faults beside.

>>> with BackgroundLoad(config) as load:       # in a thread with its own loop
...     load.wait_for(lambda r: r.answered >= 20, timeout=60)
...     ...                                    # inject a fault
...     load.stop()                            # no new batches; in-flight ones finish
>>> report = load.report
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Self

from kop_dedup_tools.load_driver import LoadRun
from kop_dedup_tools.load_types import LoadConfig, LoadReport

__all__ = ["BackgroundLoad"]


class BackgroundLoad:
    """:func:`run_load` in a thread with its own event loop; watch it while it runs.

    ``snapshot()`` is a live :class:`LoadReport`; ``stop()`` asks for no new
    batches; ``join()`` waits for the final report (and re-raises the load's
    exception, if any).
    """

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._load: LoadRun | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._report: LoadReport | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kop-dedup-load", daemon=True)

    def _main(self) -> None:
        async def body() -> LoadReport:
            self._loop = asyncio.get_running_loop()
            self._load = LoadRun(self.config, self._stop)
            self._ready.set()
            return await self._load.run()

        try:
            self._report = asyncio.run(body())
        except BaseException as exc:  # handed to join()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(30)
        return self

    def snapshot(self) -> LoadReport:
        if self._report is not None:
            return self._report
        load, loop = self._load, self._loop
        if load is None or loop is None:
            return LoadReport()

        async def take() -> LoadReport:
            return load.snapshot()

        try:
            return asyncio.run_coroutine_threadsafe(take(), loop).result(10)
        except RuntimeError:  # the loop closed in between: the final report is there
            return self._report if self._report is not None else LoadReport()

    def wait_for(
        self, predicate: Callable[[LoadReport], bool], timeout: float, poll: float = 0.05
    ) -> LoadReport:
        """Poll until ``predicate(snapshot)`` holds; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.snapshot()
            if predicate(report):
                return report
            if self._error is not None:
                raise self._error
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError(f"load did not get there within {timeout}s: {report.to_dict()}")
            time.sleep(poll)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> LoadReport:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the load did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report

    @property
    def report(self) -> LoadReport:
        return self.join(0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(self.config.delivery_timeout_s + 30)
