"""Safe defaults: no listening beyond loopback while anyone may call.

The sidecar refuses to start when it would listen (HTTP API or Kafka listener) on an
address other than loopback with authentication off, unless the operator says so
with ``allow_unauthenticated``. The refusal names the setting that exposes it and the
settings that end the refusal.

>>> exposure_refusal(Settings(host="0.0.0.0", kafka_listener="")) is not None
True
>>> exposure_refusal(Settings(host="127.0.0.1", kafka_listener="127.0.0.1:9092")) is None
True
"""

from __future__ import annotations

import ipaddress

from kop_dedup.security.identity import Authenticator
from kop_dedup.settings import Settings

__all__ = ["Exposed", "exposure_refusal", "is_loopback"]


class Exposed(RuntimeError):
    """The sidecar would serve everyone on a network address."""


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address; a wildcard, another name or address: False."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def exposure_refusal(settings: Settings) -> str | None:
    """Why the sidecar must not start as configured (None: it may)."""
    if settings.allow_unauthenticated or Authenticator.from_settings(settings).enabled:
        return None
    exposed = []
    if not is_loopback(settings.host):
        exposed.append(f"KOP_DEDUP_HOST={settings.host}")
    kafka = settings.kafka_address()
    if kafka is not None and not is_loopback(kafka[0]):
        exposed.append(f"KOP_DEDUP_KAFKA_LISTENER={settings.kafka_listener}")
    if not exposed:
        return None
    return (
        f"refusing to listen on {' and '.join(exposed)} with authentication off: anyone who "
        "can reach it could produce, read and end transactions. Turn authentication on "
        "(KOP_DEDUP_AUTH_TOKENS_FILE, KOP_DEDUP_AUTH_ROLES_FILE or "
        "KOP_DEDUP_AUTH_TOKEN_SECRET_KEY/_PUBLIC_KEY), listen on 127.0.0.1, or set "
        "KOP_DEDUP_ALLOW_UNAUTHENTICATED=true to serve without authentication on purpose"
    )
