"""The service's one wall clock, in whole milliseconds since the Unix epoch.

Every stored or compared time (transaction starts and timeouts, member last-seen,
commit and retention times, epoch and transactional id expiry) is read here, so the
formula is written once. Intervals and deadlines inside one process use
``time.monotonic()`` instead; this clock is for times that are stored or shared
between sidecars.

A coordinator that takes an injectable clock for its tests (``clock=`` seconds, like
``time.time``) passes it through:

>>> now_ms(lambda: 12.3456)
12345
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["now_ms"]


def now_ms(clock: Callable[[], float] | None = None) -> int:
    """Wall time in milliseconds; ``clock`` (seconds; None: ``time.time``) is read once."""
    return int((clock or time.time)() * 1000)
