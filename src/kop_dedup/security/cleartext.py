"""Tokens never cross the network in cleartext unless the operator says so.

With authentication on, every HTTP request carries a bearer token and every Kafka
connection a SASL/PLAIN password (a token); forwarded requests carry the caller's token
and the nodes' own superuser token. Where one of them would travel without TLS beyond
loopback (the HTTP API or the Kafka listener bound to another address without its
certificate, or an ``http://`` peer URL naming another host), the sidecar refuses to
start, naming the setting, unless ``allow_plaintext_auth`` says that something else
encrypts the traffic (a TLS-terminating proxy, a mesh with mutual TLS); then it starts
and logs one WARNING.

The decision for one listener is :func:`judge`, pure:

>>> judge("0.0.0.0", tls=False, authenticating=True, allowed=False)
<Verdict.REFUSE: 'refuse'>
>>> judge("127.0.0.1", tls=False, authenticating=True, allowed=False)
<Verdict.OK: 'ok'>
"""

from __future__ import annotations

import enum
import urllib.parse

from kop_dedup.security.exposure import is_loopback
from kop_dedup.security.identity import Authenticator
from kop_dedup.settings import Settings

__all__ = ["Verdict", "cleartext_exposures", "judge", "plaintext_auth"]


class Verdict(enum.Enum):
    OK = "ok"
    WARN = "warn"
    """Allowed by ``allow_plaintext_auth``: start, and say so loudly."""
    REFUSE = "refuse"


def judge(host: str, *, tls: bool, authenticating: bool, allowed: bool) -> Verdict:
    """Whether tokens may be taken (or sent) on ``host`` with TLS ``tls``."""
    if not authenticating or tls or is_loopback(host):
        return Verdict.OK
    return Verdict.WARN if allowed else Verdict.REFUSE


def cleartext_exposures(settings: Settings) -> list[str]:
    """Where tokens would travel in cleartext beyond loopback, whatever authentication
    says: one phrase per place, naming its setting and what ends it."""
    found = []
    if not _safe(settings.host, tls=settings.http_tls_cert is not None):
        found.append(
            f"the HTTP API on KOP_DEDUP_HOST={settings.host} without TLS "
            "(set KOP_DEDUP_HTTP_TLS_CERT and KOP_DEDUP_HTTP_TLS_KEY)"
        )
    kafka = settings.kafka_address()
    if kafka is not None and not _safe(kafka[0], tls=settings.kafka_tls_cert is not None):
        found.append(
            f"the Kafka listener on KOP_DEDUP_KAFKA_LISTENER={settings.kafka_listener} "
            "without TLS (set KOP_DEDUP_KAFKA_TLS_CERT and KOP_DEDUP_KAFKA_TLS_KEY: "
            "SASL_SSL)"
        )
    if settings.peer_url:
        url = urllib.parse.urlsplit(settings.peer_url)
        if not _safe(url.hostname or "", tls=url.scheme.lower() == "https"):
            found.append(
                f"forwarding to KOP_DEDUP_PEER_URL={settings.peer_url} (the peers send "
                "callers' tokens and the nodes' superuser token there: use https:// with "
                "KOP_DEDUP_HTTP_TLS_CERT)"
            )
    return found


def _safe(host: str, *, tls: bool) -> bool:
    return judge(host, tls=tls, authenticating=True, allowed=False) is Verdict.OK


def plaintext_auth(settings: Settings) -> tuple[Verdict, str]:
    """The verdict on the whole configuration and its message (empty when OK): a
    refusal to raise, or the WARNING to log once."""
    exposed = cleartext_exposures(settings)
    if not exposed or not Authenticator.from_settings(settings).enabled:
        return Verdict.OK, ""
    where = "; ".join(exposed)
    if settings.allow_plaintext_auth:
        return Verdict.WARN, (
            f"tokens cross the network in cleartext: {where}. Started anyway because "
            "KOP_DEDUP_ALLOW_PLAINTEXT_AUTH=true: anyone who can watch this traffic can "
            "take the tokens, unless a TLS-terminating proxy or a mesh with mutual TLS "
            "carries it"
        )
    return Verdict.REFUSE, (
        f"refusing to start with authentication on: tokens would cross the network in "
        f"cleartext: {where}. Turn TLS on, listen on 127.0.0.1, or put the sidecar "
        "behind TLS termination (a proxy or a mesh with mutual TLS) and set "
        "KOP_DEDUP_ALLOW_PLAINTEXT_AUTH=true"
    )
