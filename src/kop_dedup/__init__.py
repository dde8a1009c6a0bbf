"""kop-dedup: Kafka-style idempotent produce over HTTP on Apache Pulsar deduplication."""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
