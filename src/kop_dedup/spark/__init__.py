"""The Spark audit job: reads what the sidecar wrote and proves nothing was
duplicated or lost. Never imported by the service; imports pyspark lazily."""

from __future__ import annotations

__all__: list[str] = []
