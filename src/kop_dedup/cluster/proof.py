"""Proving that a forwarded request comes from a node of the cluster.

A node forwarding a request names itself in ``x-kop-forwarded-by`` and the request is
then served where it lands, never routed again. Any client can send that header, so a
node that authenticates serves a request as forwarded only when
``x-kop-forwarded-proof`` proves it: an HMAC-SHA256, keyed with the cluster's shared
secret (the nodes' own token, else the JWT secret key), over the forwarding node's id,
the method, the caller's ``Authorization`` and the second it was sent. A proof is good
for :data:`WINDOW_S` either side of the receiver's clock, and only with the same
caller's credentials (a proof seen on the wire does not let another caller in).

>>> value = prove(b"k", "1", "POST", "Bearer t", at_s=1_000)
>>> proved(b"k", "1", "POST", "Bearer t", value, now_s=1_010)
True
>>> proved(b"k", "1", "POST", "Bearer other", value, now_s=1_010)
False
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["PROOF", "WINDOW_S", "prove", "proved"]

PROOF = "x-kop-forwarded-proof"
"""The header carrying the proof (``<unix seconds>.<hex HMAC>``)."""
WINDOW_S = 300
"""How far the sender's second may be from the receiver's clock (either way)."""


def prove(key: bytes, node: str, method: str, authorization: str, at_s: int) -> str:
    """The proof of a request ``node`` forwards at ``at_s`` (unix seconds)."""
    message = "\n".join(("kop-dedup forwarded v1", node, method.upper(), authorization, str(at_s)))
    return f"{at_s}.{hmac.new(key, message.encode(), hashlib.sha256).hexdigest()}"


def proved(
    key: bytes, node: str, method: str, authorization: str, value: str, now_s: float
) -> bool:
    """Whether ``value`` proves the request (see the module)."""
    at, _, _mac = value.partition(".")
    if not at.isdigit() or len(at) > 12 or abs(now_s - int(at)) > WINDOW_S:
        return False
    return hmac.compare_digest(prove(key, node, method, authorization, int(at)), value)
