"""Kafka's topic configs as the sidecar serves them (pure: no I/O).

Every config of Kafka 4.1's topic is known here (its type, default and validation,
Kafka's messages), in one of three kinds:

- **applied** (``retention.ms``, ``retention.bytes``, ``cleanup.policy``): mapped onto
  the Pulsar topic's retention policy and compaction (:func:`pulsar_policy`);
- **fixed** by how the sidecar works (``message.timestamp.type`` CreateTime,
  ``compression.type`` producer, ``max.message.bytes`` the sidecar's batch limit,
  ``remote.storage.enable`` false): that value is accepted, any other is INVALID_CONFIG;
- **stored**: every other (segment, flush, index, replication and cleaner tuning that
  Pulsar does its own way). CreateTopics accepts them, as frameworks set them (Kafka
  Streams sets ``segment.bytes`` on its repartition topics), and DescribeConfigs shows
  them, documented as not applied; an alter may remove one or leave it as it is, not
  change it (INVALID_CONFIG naming it and why).

A topic's overrides (what CreateTopics and the alters set) are a ``dict`` name -> value;
:func:`incremental` and :func:`replace` compute the next one (IncrementalAlterConfigs,
AlterConfigs), :func:`describe` the entries DescribeConfigs answers.

>>> incremental({}, [("cleanup.policy", APPEND, "compact")], DEFAULTS)
{'cleanup.policy': 'delete,compact'}
>>> pulsar_policy({"cleanup.policy": "compact"}, DEFAULTS).compacted
True
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kop_dedup.errors import InvalidConfig, InvalidRequest
from kop_dedup.protocol.retention import INFINITE, Retention

__all__ = [
    "APPEND",
    "CONFIGS",
    "DEFAULTS",
    "DELETE",
    "SET",
    "SUBTRACT",
    "ConfigDef",
    "Defaults",
    "Entry",
    "Kind",
    "PulsarPolicy",
    "Source",
    "Type",
    "describe",
    "for_create",
    "incremental",
    "pulsar_policy",
    "replace",
]

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
"""IncrementalAlterConfigs' operations."""
_MINUTE_MS = 60_000
_MB = 1 << 20
_MAX_LONG = str((1 << 63) - 1)


class Kind(enum.Enum):
    APPLIED = "applied"
    FIXED = "fixed"
    STORED = "stored"


class Type(enum.IntEnum):
    """DescribeConfigs' ``config_type``."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class Source(enum.IntEnum):
    """DescribeConfigs' ``config_source``."""

    TOPIC = 1
    NAMESPACE = 3
    """Kafka's DYNAMIC_DEFAULT_BROKER_CONFIG: the data namespace's retention policy, set
    by an operator to other values than the sidecar's settings."""
    STATIC_BROKER = 4
    DEFAULT = 5


@dataclass(frozen=True, slots=True)
class Defaults:
    """The values a topic without overrides has: the sidecar's settings where they set
    one (``*_set``: set explicitly, Kafka's STATIC_BROKER_CONFIG), or the data
    namespace's retention when it is not the settings' (``namespace``)."""

    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    max_message_bytes: int = 1_048_576
    retention_ms_set: bool = False
    retention_bytes_set: bool = False
    namespace: bool = False

    def following(self, policy: Retention | None) -> Defaults:
        """These defaults, with the namespace's retention ``policy`` where it is set and
        keeps another time or size than these (what applies to a topic without its own)."""
        if policy is None or policy == Retention.from_kafka(
            self.retention_ms, self.retention_bytes
        ):
            return self
        return dataclasses.replace(
            self,
            retention_ms=policy.minutes * _MINUTE_MS if policy.minutes >= 0 else -1,
            retention_bytes=policy.megabytes * _MB if policy.megabytes >= 0 else -1,
            namespace=True,
        )


DEFAULTS = Defaults()

Check = Callable[[str], str | None]
"""A validator: None, or why the value is invalid (Kafka's wording)."""


def _number(kind: str, lo: float | None = None, hi: float | None = None) -> Check:
    def check(value: str) -> str | None:
        try:
            number = float(value) if kind == "DOUBLE" else int(value.strip())
        except ValueError:
            return f"Not a number of type {kind}"
        if kind == "INT" and not -(1 << 31) <= number < (1 << 31):
            return f"Not a number of type {kind}"
        if kind == "LONG" and not -(1 << 63) <= number < (1 << 63):
            return f"Not a number of type {kind}"
        if lo is not None and hi is not None and not lo <= number <= hi:
            return f"Value must be no less than {_num(lo)} and no more than {_num(hi)}"
        if lo is not None and number < lo:
            return f"Value must be at least {_num(lo)}"
        return None

    return check


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _boolean(value: str) -> str | None:
    return (
        None
        if value.strip().lower() in {"true", "false"}
        else "Expected value to be either true or false"
    )


def _choice(*values: str) -> Check:
    def check(value: str) -> str | None:
        return None if value in values else f"String must be one of: {', '.join(values)}"

    return check


def _list_of(*values: str) -> Check:
    def check(value: str) -> str | None:
        bad = [v for v in _items(value) if v not in values]
        return None if not bad else f"String must be one of: {', '.join(values)}"

    return check


def _replicas(value: str) -> str | None:
    items = _items(value)
    if items == ["*"] or all(_replica(i) for i in items):
        return None
    return (
        "must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
    )


def _replica(item: str) -> bool:
    partition, sep, broker = item.partition(":")
    return bool(sep) and partition.strip().isdigit() and broker.strip().isdigit()


def _items(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: Type
    default: str
    kind: Kind
    synonym: str | None
    """The broker config Kafka lists as its synonym (the default's source)."""
    check: Check
    doc: str
    """What the config does on Pulsar (DescribeConfigs' documentation)."""


_STORED = "stored and shown as given; not applied: "
_LEDGERS = (
    _STORED + "Pulsar rolls, indexes and syncs ledgers by the broker's managedLedger* settings"
)
_CLEANER = _STORED + "Pulsar compacts a compacted topic by its compaction threshold"
_REPLICAS = (
    _STORED + "replication is the namespace's persistence policy (ensemble, write and ack quorums)"
)
_TIMESTAMPS = _STORED + "timestamps are the producer's (CreateTime) and are not checked"
_REMOTE = _STORED + "tiered storage is Pulsar's offload policy of the namespace"
_CODEC = _STORED + "records are stored decompressed; fetched batches are uncompressed"


_POLICY = (
    "delete: the Pulsar topic's retention policy is retention.ms and retention.bytes; "
    "compact: retention is unbounded and Pulsar compacts the topic (Kafka consumers read the "
    "whole log, every version of a key, in order); both: compaction with retention.ms/bytes; "
    "empty: unbounded retention, no compaction"
)
_A, _F, _S = Kind.APPLIED, Kind.FIXED, Kind.STORED
_L, _I, _B, _T = Type.LONG, Type.INT, Type.BOOLEAN, Type.STRING

# One line per config: name, type, default, kind, the broker synonym, the validator, the
# documentation (what it does on Pulsar).
# fmt: off
_TABLE: tuple[ConfigDef, ...] = (
    ConfigDef("cleanup.policy", Type.LIST, "delete", _A, "log.cleanup.policy",
              _list_of("compact", "delete"), _POLICY),
    ConfigDef("compression.gzip.level", _I, "-1", _S, "compression.gzip.level",
              _number("INT", -1, 9), _CODEC),
    ConfigDef("compression.lz4.level", _I, "9", _S, "compression.lz4.level",
              _number("INT", 1, 17), _CODEC),
    ConfigDef("compression.type", _T, "producer", _F, "compression.type",
              _choice("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
              "producer, the only value served: batches are decompressed when produced, their "
              "records stored one Pulsar message each, and fetched uncompressed"),
    ConfigDef("compression.zstd.level", _I, "3", _S, "compression.zstd.level",
              _number("INT", -131072, 22), _CODEC),
    ConfigDef("delete.retention.ms", _L, "86400000", _S, "log.cleaner.delete.retention.ms",
              _number("LONG", 0), _CLEANER),
    ConfigDef("file.delete.delay.ms", _L, "60000", _S, "log.segment.delete.delay.ms",
              _number("LONG", 0), _LEDGERS),
    ConfigDef("flush.messages", _L, _MAX_LONG, _S, "log.flush.interval.messages",
              _number("LONG", 1), _LEDGERS),
    ConfigDef("flush.ms", _L, _MAX_LONG, _S, None, _number("LONG", 0), _LEDGERS),
    ConfigDef("follower.replication.throttled.replicas", Type.LIST, "", _S, None, _replicas,
              _REPLICAS),
    ConfigDef("index.interval.bytes", _I, "4096", _S, "log.index.interval.bytes",
              _number("INT", 0), _LEDGERS),
    ConfigDef("leader.replication.throttled.replicas", Type.LIST, "", _S, None, _replicas,
              _REPLICAS),
    ConfigDef("local.retention.bytes", _L, "-2", _S, "log.local.retention.bytes",
              _number("LONG", -2), _REMOTE),
    ConfigDef("local.retention.ms", _L, "-2", _S, "log.local.retention.ms",
              _number("LONG", -2), _REMOTE),
    ConfigDef("max.compaction.lag.ms", _L, _MAX_LONG, _S, "log.cleaner.max.compaction.lag.ms",
              _number("LONG", 1), _CLEANER),
    ConfigDef("max.message.bytes", _I, "1048576", _F, "message.max.bytes", _number("INT", 0),
              "the sidecar's KOP_DEDUP_MAX_BATCH_BYTES for every topic (a larger batch is "
              "MESSAGE_TOO_LARGE); only that value is accepted"),
    ConfigDef("message.timestamp.after.max.ms", _L, "3600000", _S,
              "log.message.timestamp.after.max.ms", _number("LONG", 0), _TIMESTAMPS),
    ConfigDef("message.timestamp.before.max.ms", _L, _MAX_LONG, _S,
              "log.message.timestamp.before.max.ms", _number("LONG", 0), _TIMESTAMPS),
    ConfigDef("message.timestamp.type", _T, "CreateTime", _F, "log.message.timestamp.type",
              _choice("CreateTime", "LogAppendTime"),
              "CreateTime, the only value served: a record keeps its producer's timestamp"),
    ConfigDef("min.cleanable.dirty.ratio", Type.DOUBLE, "0.5", _S,
              "log.cleaner.min.cleanable.ratio", _number("DOUBLE", 0, 1), _CLEANER),
    ConfigDef("min.compaction.lag.ms", _L, "0", _S, "log.cleaner.min.compaction.lag.ms",
              _number("LONG", 0), _CLEANER),
    ConfigDef("min.insync.replicas", _I, "1", _S, "min.insync.replicas", _number("INT", 1),
              _REPLICAS),
    ConfigDef("preallocate", _B, "false", _S, "log.preallocate", _boolean, _LEDGERS),
    ConfigDef("remote.log.copy.disable", _B, "false", _S, None, _boolean, _REMOTE),
    ConfigDef("remote.log.delete.on.disable", _B, "false", _S, None, _boolean, _REMOTE),
    ConfigDef("remote.storage.enable", _B, "false", _F, None, _boolean,
              "false, the only value served: offloading to tiered storage is the namespace's "
              "Pulsar offload policy"),
    ConfigDef("retention.bytes", _L, "-1", _A, "log.retention.bytes", _number("LONG"),
              "the Pulsar topic's retention size (per partition, rounded up to MB): what no "
              "subscription holds is deleted a ledger at a time past it; -1 unbounded"),
    ConfigDef("retention.ms", _L, "604800000", _A, "log.retention.ms", _number("LONG", -1),
              "the Pulsar topic's retention time (rounded up to minutes): a ledger no "
              "subscription holds is deleted once it is older; -1 unbounded"),
    ConfigDef("segment.bytes", _I, "1073741824", _S, "log.segment.bytes",
              _number("INT", 1 << 20), _LEDGERS),
    ConfigDef("segment.index.bytes", _I, "10485760", _S, "log.index.size.max.bytes",
              _number("INT", 4), _LEDGERS),
    ConfigDef("segment.jitter.ms", _L, "0", _S, None, _number("LONG", 0), _LEDGERS),
    ConfigDef("segment.ms", _L, "604800000", _S, None, _number("LONG", 1), _LEDGERS),
    ConfigDef("unclean.leader.election.enable", _B, "false", _S,
              "unclean.leader.election.enable", _boolean, _REPLICAS),
)
# fmt: on
CONFIGS: Mapping[str, ConfigDef] = {d.name: d for d in _TABLE}
"""Every topic config of Kafka 4.1, by name."""


def _default(d: ConfigDef, defaults: Defaults) -> tuple[str, Source]:
    if d.name in ("retention.ms", "retention.bytes"):
        ms = d.name == "retention.ms"
        value = defaults.retention_ms if ms else defaults.retention_bytes
        explicit = defaults.retention_ms_set if ms else defaults.retention_bytes_set
        if defaults.namespace:
            return str(value), Source.NAMESPACE
        return str(value), Source.STATIC_BROKER if explicit else Source.DEFAULT
    if d.name == "max.message.bytes":
        return str(defaults.max_message_bytes), Source.STATIC_BROKER
    return d.default, Source.DEFAULT


def _definition(name: str) -> ConfigDef:
    d = CONFIGS.get(name)
    if d is None:
        raise InvalidConfig(f"Unknown topic config name: {name}")
    return d


def _validate(name: str, value: str | None) -> str:
    d = _definition(name)
    if value is None:
        raise InvalidConfig(f"Null value not supported for topic configs: {name}")
    why = d.check(value)
    if why is not None:
        raise InvalidConfig(f"Invalid value {value} for configuration {name}: {why}")
    return value


def _fixed(d: ConfigDef, value: str, defaults: Defaults) -> None:
    if d.kind is Kind.FIXED and value.strip() != _default(d, defaults)[0]:
        raise InvalidConfig(f"{d.name}={value} is not served: {d.doc}")


def _unique(names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidRequest("Error due to duplicate config keys")
        seen.add(name)


def for_create(configs: Iterable[tuple[str, str | None]], defaults: Defaults) -> dict[str, str]:
    """The overrides of a topic created with ``configs``: every one valid, fixed ones at
    their value; stored ones are kept (InvalidConfig or InvalidRequest otherwise)."""
    pairs = list(configs)
    _unique(n for n, _ in pairs)
    out: dict[str, str] = {}
    for name, value in pairs:
        valid = _validate(name, value)
        _fixed(CONFIGS[name], valid, defaults)
        out[name] = valid
    return out


def _change(
    d: ConfigDef, current: Mapping[str, str], value: str | None, defaults: Defaults
) -> None:
    """An alter setting ``d`` to ``value`` (None: removing it): refused unless served."""
    if value is None or d.kind is Kind.APPLIED:
        return
    _fixed(d, value, defaults)
    if d.kind is Kind.STORED and current.get(d.name) != value:
        raise InvalidConfig(f"{d.name} cannot be changed: {d.doc}")


def incremental(
    current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]], defaults: Defaults
) -> dict[str, str]:
    """The overrides after IncrementalAlterConfigs' ``(name, operation, value)`` ops."""
    pending = list(ops)
    _unique(n for n, _, _ in pending)
    out = dict(current)
    for name, op, value in pending:
        d = _definition(name)
        if op == DELETE:
            out.pop(name, None)
            continue
        if op in (APPEND, SUBTRACT):
            if d.type is not Type.LIST:
                verb = "APPEND to" if op == APPEND else "SUBTRACT from"
                raise InvalidConfig(f"Can't {verb} key {name} because its type is not LIST.")
            have = _items(out.get(name, _default(d, defaults)[0]))
            given = _items(value or "")
            if op == APPEND:
                merged = have + [v for v in given if v not in have]
            else:
                merged = [v for v in have if v not in given]
            valid = _validate(name, ",".join(merged))
        elif op == SET:
            valid = _validate(name, value)
        else:
            raise InvalidRequest(f"unknown config operation {op}")
        _change(d, current, valid, defaults)
        out[name] = valid
    return out


def replace(
    current: Mapping[str, str], configs: Iterable[tuple[str, str | None]], defaults: Defaults
) -> dict[str, str]:
    """The overrides after AlterConfigs (the whole set given; what is left out goes)."""
    pairs = list(configs)
    _unique(n for n, _ in pairs)
    out: dict[str, str] = {}
    for name, value in pairs:
        d = _definition(name)
        valid = _validate(name, value)
        _change(d, current, valid, defaults)
        out[name] = valid
    return out


@dataclass(frozen=True, slots=True)
class PulsarPolicy:
    """What a topic's overrides make of its Pulsar topic: its own retention policy (None:
    the namespace's applies) and whether Pulsar compacts it."""

    retention: Retention | None
    compacted: bool


def pulsar_policy(overrides: Mapping[str, str], defaults: Defaults) -> PulsarPolicy:
    """The Pulsar policy a topic's overrides ask for."""
    policy = set(_items(overrides.get("cleanup.policy", "delete")))
    compacted = "compact" in policy
    if "delete" not in policy:  # compact alone, or nothing: nothing is ever deleted
        return PulsarPolicy(INFINITE, compacted)
    if "retention.ms" not in overrides and "retention.bytes" not in overrides:
        return PulsarPolicy(None, compacted)
    ms = int(overrides.get("retention.ms", defaults.retention_ms))
    size = int(overrides.get("retention.bytes", defaults.retention_bytes))
    return PulsarPolicy(Retention.from_kafka(ms, size), compacted)


@dataclass(frozen=True, slots=True)
class Entry:
    """One config as DescribeConfigs answers it."""

    name: str
    value: str
    source: Source
    read_only: bool
    type: Type
    synonyms: tuple[tuple[str, str, Source], ...]
    doc: str


def describe(
    overrides: Mapping[str, str], defaults: Defaults, names: Iterable[str] | None = None
) -> list[Entry]:
    """The entries of ``names`` (None: every config; unknown names are left out, as
    Kafka does), the override where there is one, else the default."""
    wanted = CONFIGS.keys() if names is None else [n for n in names if n in CONFIGS]
    out = []
    for name in dict.fromkeys(wanted):
        d = CONFIGS[name]
        default, source = _default(d, defaults)
        synonyms: list[tuple[str, str, Source]] = []
        if name in overrides:
            synonyms.append((name, overrides[name], Source.TOPIC))
        if d.synonym is not None:
            synonyms.append((d.synonym, default, source))
        value, own = (overrides[name], Source.TOPIC) if name in overrides else (default, source)
        out.append(
            Entry(name, value, own, d.kind is not Kind.APPLIED, d.type, tuple(synonyms), d.doc)
        )
    return out
