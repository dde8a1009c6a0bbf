"""Pulsar's permissions on one namespace (and its topics), granted and revoked through
the admin API: what the tests of roles give each role before asking the sidecar; and
:class:`KafkaRoles`, the same with a sidecar's Kafka listener and the configuration of a
confluent-kafka client that logs in with one token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from tests.sidecar import ThreadSidecar

__all__ = ["Grants", "KafkaRoles"]


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


class KafkaRoles(Grants):
    """:class:`Grants` on a sidecar's data namespace, and its Kafka clients' logins."""

    def __init__(self, sc: ThreadSidecar, namespace: str, admin: httpx.Client) -> None:
        super().__init__(admin, namespace)
        self.sc = sc

    def conf(self, token: str, **extra: Any) -> dict[str, Any]:
        """A confluent-kafka configuration logging in with ``token`` (SASL/PLAIN)."""
        return {
            "bootstrap.servers": self.sc.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "anyone",
            "sasl.password": token,
            **extra,
        }
