"""The table of every API the listener serves: the handler modules' ``APIS``, by key.

To serve a new API: write a module with its handler(s) and ``APIS = (Api(...),)``
(see :mod:`kop_dedup.transports.kafka.registry`), and add the module here. ApiVersions
advertises whatever is in the table.
"""

from __future__ import annotations

from collections.abc import Mapping

from kop_dedup.transports.kafka import (
    acls,
    client_quotas,
    cluster,
    configs,
    fetch,
    group_deletion,
    groups,
    list_offsets,
    log_dirs,
    metadata,
    offsets,
    partitions,
    produce,
    producer_ids,
    sasl,
    throttle,
    topics,
    transactions,
    txn_admin,
    txn_markers,
    versions,
)
from kop_dedup.transports.kafka.registry import Api

__all__ = ["API_TABLE", "build_table"]


def build_table(*groups: tuple[Api, ...]) -> Mapping[int, Api]:
    """The table by API key; ValueError when two modules declare one key."""
    table: dict[int, Api] = {}
    for group in groups:
        for api in group:
            if api.key in table:
                raise ValueError(f"API key {api.key} ({api.name}) is declared twice")
            table[api.key] = api
    return table


API_TABLE = build_table(
    versions.APIS,
    sasl.APIS,
    metadata.APIS,
    topics.APIS,
    producer_ids.APIS,
    throttle.throttled(produce.APIS, throttle.PRODUCER_BYTE_RATE, throttle.request_bytes),
    throttle.throttled(fetch.APIS, throttle.CONSUMER_BYTE_RATE, throttle.answer_bytes),
    list_offsets.APIS,
    offsets.APIS,
    groups.APIS,
    group_deletion.APIS,
    transactions.APIS,
    configs.APIS,
    partitions.APIS,
    cluster.APIS,
    txn_admin.APIS,
    txn_markers.APIS,
    acls.APIS,
    log_dirs.APIS,
    client_quotas.APIS,
)
