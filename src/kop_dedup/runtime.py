"""The sidecar's parts wired together, started and stopped in order.

``Runtime.start()`` checks the broker (admin API answers, deduplication on
for the data namespace, enabling it when allowed), prepares the system
namespace (its registry topics compacted by the broker), replays the epoch
registry, and only then lets the API serve.
"""

from __future__ import annotations

import logging

from kop_dedup.coordination.expiry import Bounds
from kop_dedup.coordination.registry import Registry, RegistryBounds
from kop_dedup.observability.stats import Stats
from kop_dedup.produce.service import ProduceService
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import Publisher
from kop_dedup.settings import Settings

__all__ = ["DeduplicationOff", "Runtime", "registry_bounds"]

log = logging.getLogger(__name__)


class DeduplicationOff(RuntimeError):
    """The data namespace has deduplication off and we may not turn it on."""


def registry_bounds(settings: Settings) -> RegistryBounds:
    """The registries' memory bounds from the settings."""
    return RegistryBounds(
        epochs=Bounds(
            expiry_ms=int(settings.producer_epoch_expiry_seconds * 1000),
            max_entries=settings.max_producer_epochs,
        ),
        transactional_ids=Bounds(
            expiry_ms=int(settings.transactional_id_expiry_seconds * 1000),
            max_entries=settings.max_transactional_ids,
        ),
        sweep_interval_s=settings.registry_sweep_seconds,
    )


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.pulsar_token()
        self.naming = Naming(settings.tenant, settings.namespace, settings.producer_name_prefix)
        verify: bool | str = True
        if settings.pulsar_tls_trust_certs_file is not None:
            verify = str(settings.pulsar_tls_trust_certs_file)
        if settings.pulsar_tls_allow_insecure:
            verify = False
        self.admin = PulsarAdmin(
            settings.pulsar_admin_url,
            self.naming,
            token=token,
            verify=verify,
            dedup_ttl_s=settings.dedup_policy_ttl_seconds,
        )
        self.publisher = Publisher(
            settings.pulsar_service_url,
            send_timeout_ms=settings.send_timeout_ms,
            auth_token=token,
            tls_trust_certs_file=(
                str(settings.pulsar_tls_trust_certs_file)
                if settings.pulsar_tls_trust_certs_file
                else None
            ),
            tls_allow_insecure=settings.pulsar_tls_allow_insecure,
            tls_validate_hostname=settings.pulsar_tls_validate_hostname,
        )
        system_ns = f"{settings.tenant}/{settings.system_namespace}"
        self.registry = Registry(
            self.publisher.client,
            system_ns,
            settings.producer_name_prefix,
            bounds=registry_bounds(settings),
            compact=self.admin.compact,
        )
        self.stats = Stats(
            max_topics=settings.stats_max_topics, max_producers=settings.stats_max_producers
        )
        self.service = ProduceService(
            settings, self.publisher, self.admin, self.registry.epochs, self.stats
        )

    async def start(self) -> None:
        s = self.settings
        ns = self.naming.namespace_path
        await self.admin.ensure_namespace(ns, deduplication=s.ensure_deduplication)
        if not await self.admin.deduplication_enabled(ns):
            raise DeduplicationOff(
                f"deduplication is off on namespace {ns}; turn it on "
                f"(pulsar-admin namespaces set-deduplication {ns} --enable) or set "
                "KOP_DEDUP_ENSURE_DEDUPLICATION=true to let the sidecar do it"
            )
        system_ns = f"{s.tenant}/{s.system_namespace}"
        await self.admin.ensure_namespace(system_ns, deduplication=True, infinite_retention=True)
        await self.admin.set_compaction_threshold(system_ns, s.registry_compaction_threshold_bytes)
        await self.registry.start()
        self.service.start()
        log.info("ready: namespace %s has deduplication on", ns)

    async def ready(self) -> tuple[bool, str]:
        """(ready, reason) for /readyz: the broker answers and dedup is on."""
        try:
            if not await self.admin.deduplication_enabled(self.naming.namespace_path):
                return False, "deduplication is off on the namespace"
        except Exception as exc:  # any failure to ask means not ready
            return False, f"Pulsar admin unreachable: {exc}"
        return True, "ok"

    async def close(self) -> None:
        await self.service.close()
        await self.registry.close()
        await self.publisher.close()
        await self.admin.close()
