"""Kafka's topic configs on Pulsar (pure): what is applied, fixed or only stored, Kafka's
validation messages, the alters' rules, the Pulsar policy a topic's overrides make, and
retention in Pulsar's units with the start-up verdict on the data namespace."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol import topic_configs as tc
from kop_dedup.protocol.retention import INFINITE, Retention, Verdict, namespace_plan
from kop_dedup.settings import Settings

D = tc.DEFAULTS

# -- retention ---------------------------------------------------------------------------


def test_kafka_retention_rounds_up_to_pulsars_units_and_keeps_unbounded():
    assert Retention.from_kafka(604_800_000, -1) == Retention(10080, -1)
    assert Retention.from_kafka(1, 1) == Retention(1, 1)  # never down to "delete at once"
    assert Retention.from_kafka(0, 0) == Retention(0, 0)
    assert Retention.from_kafka(60_001, (1 << 20) + 1) == Retention(2, 2)


@given(
    st.integers(-1, 10**6), st.integers(-1, 10**6), st.integers(-1, 10**6), st.integers(-1, 10**6)
)
def test_keeps_at_least_is_a_limit_by_limit_order_with_minus_one_on_top(a, b, c, d):
    left, right = Retention(a, b), Retention(c, d)

    def covers(have: int, want: int) -> bool:
        return have == -1 or (want != -1 and have >= want)

    assert left.keeps_at_least(right) == (covers(a, c) and covers(b, d))
    assert left.keeps_at_least(left)
    assert INFINITE.keeps_at_least(left)


def test_an_unset_namespace_gets_kafkas_retention_and_a_set_longer_one_is_kept():
    wanted = Retention(10080, -1)
    assert namespace_plan("public/kafka", None, wanted).verdict is Verdict.SET
    assert namespace_plan("public/kafka", Retention(-1, -1), wanted).verdict is Verdict.KEEP
    assert namespace_plan("public/kafka", Retention(20000, -1), wanted).verdict is Verdict.KEEP


def test_a_shorter_namespace_policy_is_reported_with_the_command_that_fixes_it():
    plan = namespace_plan("public/kafka", Retention(0, 0), Retention(10080, -1), "http://a:8080")
    assert plan.verdict is Verdict.SHORT
    assert "pulsar-admin namespaces set-retention public/kafka --time 10080m --size -1" in (
        plan.message
    )
    assert "POST http://a:8080/admin/v2/namespaces/public/kafka/retention" in plan.message
    # a size limit alone is shorter too
    assert namespace_plan("n/s", Retention(-1, 10), Retention(10080, -1)).verdict is Verdict.SHORT


# -- create ------------------------------------------------------------------------------


def test_create_validates_as_kafka_words_it():
    with pytest.raises(errors.InvalidConfig, match=r"Unknown topic config name: foo\.bar"):
        tc.for_create([("foo.bar", "1")], D)
    with pytest.raises(errors.InvalidConfig, match="Not a number of type LONG"):
        tc.for_create([("retention.ms", "abc")], D)
    with pytest.raises(errors.InvalidConfig, match="Value must be at least -1"):
        tc.for_create([("retention.ms", "-5")], D)
    with pytest.raises(errors.InvalidConfig, match="String must be one of: compact, delete"):
        tc.for_create([("cleanup.policy", "foo")], D)
    with pytest.raises(errors.InvalidConfig, match="Value must be at least 1048576"):
        tc.for_create([("segment.bytes", "100")], D)
    with pytest.raises(errors.InvalidRequest, match="duplicate config keys"):
        tc.for_create([("retention.ms", "1"), ("retention.ms", "2")], D)


def test_create_keeps_what_frameworks_set_and_refuses_what_cannot_be_served():
    # Kafka Streams' repartition topic: stored, the timestamp type is what we do anyway
    given = [
        ("cleanup.policy", "delete"),
        ("segment.bytes", "52428800"),
        ("retention.ms", "-1"),
        ("message.timestamp.type", "CreateTime"),
    ]
    assert tc.for_create(given, D) == dict(given)
    with pytest.raises(errors.InvalidConfig, match=r"message\.timestamp\.type=LogAppendTime"):
        tc.for_create([("message.timestamp.type", "LogAppendTime")], D)
    with pytest.raises(errors.InvalidConfig, match="KOP_DEDUP_MAX_BATCH_BYTES"):
        tc.for_create([("max.message.bytes", "10485760")], D)


# -- alters ------------------------------------------------------------------------------


def test_incremental_set_delete_append_subtract():
    current = tc.incremental({}, [("retention.ms", tc.SET, "120000")], D)
    assert current == {"retention.ms": "120000"}
    current = tc.incremental(current, [("cleanup.policy", tc.APPEND, "compact")], D)
    assert current["cleanup.policy"] == "delete,compact"  # appended to the default
    current = tc.incremental(current, [("cleanup.policy", tc.SUBTRACT, "delete")], D)
    assert current["cleanup.policy"] == "compact"
    assert tc.incremental(current, [("retention.ms", tc.DELETE, None)], D) == {
        "cleanup.policy": "compact"
    }


def test_incremental_refusals_change_nothing_and_name_the_config():
    with pytest.raises(errors.InvalidConfig, match=r"Can't APPEND to key retention\.ms"):
        tc.incremental({}, [("retention.ms", tc.APPEND, "5")], D)
    with pytest.raises(errors.InvalidConfig, match=r"segment\.bytes cannot be changed"):
        tc.incremental({}, [("segment.bytes", tc.SET, "2097152")], D)
    with pytest.raises(errors.InvalidRequest, match="duplicate config keys"):
        tc.incremental({}, [("retention.ms", tc.SET, "1"), ("retention.ms", tc.SET, "2")], D)
    with pytest.raises(errors.InvalidRequest):
        tc.incremental({}, [("retention.ms", 7, "1")], D)
    stored = {"segment.bytes": "52428800"}
    assert tc.incremental(stored, [("segment.bytes", tc.SET, "52428800")], D) == stored
    assert tc.incremental(stored, [("segment.bytes", tc.DELETE, None)], D) == {}


def test_replace_sets_the_whole_set_and_may_drop_a_stored_config():
    stored = {"segment.bytes": "52428800", "retention.ms": "1000"}
    assert tc.replace(stored, [("retention.bytes", "1000")], D) == {"retention.bytes": "1000"}
    with pytest.raises(errors.InvalidConfig, match=r"segment\.bytes"):
        tc.replace(stored, [("segment.bytes", "2097152")], D)


# -- the Pulsar policy -------------------------------------------------------------------


def test_the_pulsar_policy_of_a_topics_overrides():
    assert tc.pulsar_policy({}, D) == tc.PulsarPolicy(None, compacted=False)
    assert tc.pulsar_policy({"cleanup.policy": "compact"}, D) == tc.PulsarPolicy(INFINITE, True)
    assert tc.pulsar_policy({"cleanup.policy": ""}, D) == tc.PulsarPolicy(INFINITE, False)
    assert tc.pulsar_policy({"retention.ms": "3600000"}, D) == tc.PulsarPolicy(
        Retention(60, -1), compacted=False
    )
    both = {"cleanup.policy": "compact,delete", "retention.bytes": "1048576"}
    assert tc.pulsar_policy(both, D) == tc.PulsarPolicy(Retention(10080, 1), compacted=True)
    # a compacted topic keeps everything whatever retention.ms says (Kafka compacts instead)
    compact = {"cleanup.policy": "compact", "retention.ms": "1"}
    assert tc.pulsar_policy(compact, D).retention == INFINITE


# -- describe ----------------------------------------------------------------------------


def test_describe_answers_every_kafka_topic_config_with_its_source():
    entries = {e.name: e for e in tc.describe({"retention.ms": "5"}, D)}
    assert len(entries) == 33  # Kafka 4.1's topic configs
    assert entries["retention.ms"].value == "5"
    assert entries["retention.ms"].source is tc.Source.TOPIC
    assert entries["retention.ms"].synonyms[0] == ("retention.ms", "5", tc.Source.TOPIC)
    assert entries["retention.bytes"].source is tc.Source.DEFAULT
    assert not entries["cleanup.policy"].read_only
    assert entries["segment.bytes"].read_only
    assert "not applied" in entries["segment.bytes"].doc


def test_describe_names_a_sidecar_setting_as_a_static_broker_config():
    defaults = tc.Defaults(retention_ms=3_600_000, retention_ms_set=True)
    (entry,) = tc.describe({}, defaults, ["retention.ms", "no.such"])
    assert (entry.value, entry.source) == ("3600000", tc.Source.STATIC_BROKER)


# -- settings ------------------------------------------------------------------------------


def test_journal_retention_follows_the_longest_transaction_timeout():
    assert Settings().journal_retention == 1440
    flink = Settings(max_transaction_timeout_ms=3_600_000)
    assert flink.journal_retention == 1440  # a day covers twice an hour
    long = Settings(max_transaction_timeout_ms=24 * 3_600_000, journal_retention_minutes=60)
    assert long.journal_retention == 2 * 24 * 60


def test_the_journals_are_kept_as_long_as_the_settings_say_they_follow():
    from kop_dedup.runtime import txn_settings

    settings = Settings(max_transaction_timeout_ms=24 * 3_600_000, journal_retention_minutes=60)
    assert txn_settings(settings).decisions_retention_minutes == 2 * 24 * 60


def test_defaults_follow_a_namespace_policy_that_keeps_otherwise():
    assert D.following(None) is D
    assert D.following(Retention(10080, -1)) is D  # the settings' own
    zero = D.following(Retention(0, 0))
    (ms, size) = tc.describe({}, zero, ["retention.ms", "retention.bytes"])
    assert (ms.value, ms.source) == ("0", tc.Source.NAMESPACE)
    assert (size.value, size.source) == ("0", tc.Source.NAMESPACE)
    kept = D.following(Retention(-1, 20480))
    assert (kept.retention_ms, kept.retention_bytes) == (-1, 20480 << 20)
    # a topic with retention.ms only takes the size that applies to it
    assert tc.pulsar_policy({"retention.ms": "60000"}, kept).retention == Retention(1, 20480)
