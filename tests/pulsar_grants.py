"""Pulsar's permissions on one namespace (and its topics), granted and revoked through
the admin API: what the tests of roles give each role before asking the sidecar."""

from __future__ import annotations

import httpx

__all__ = ["Grants"]


class Grants:
    def __init__(self, admin: httpx.Client, namespace: str) -> None:
        self.admin, self.namespace = admin, namespace
        """``admin``: a client of the broker's admin URL; ``namespace``: ``tenant/ns``."""

    def grant(self, role: str, actions: list[str], topic: str | None = None) -> None:
        """Grant ``actions`` (``produce``, ``consume``, ...) on the namespace, or on one
        of its topics."""
        path = f"/admin/v2/namespaces/{self.namespace}/permissions/{role}"
        if topic is not None:
            path = f"/admin/v2/persistent/{self.namespace}/{topic}/permissions/{role}"
        self.admin.post(path, json=actions).raise_for_status()

    def revoke(self, role: str) -> None:
        """Take back what the role was granted on the namespace."""
        self.admin.delete(f"/admin/v2/namespaces/{self.namespace}/permissions/{role}")
