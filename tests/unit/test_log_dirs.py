"""DescribeLogDirs' partition sizes from Pulsar's partitioned stats."""

from __future__ import annotations

from kop_dedup.transports.kafka.log_dirs import partition_sizes


def test_each_partitions_storage_size_by_index():
    stats = {
        "storageSize": 30,
        "partitions": {
            "persistent://public/kafka/orders-partition-0": {"storageSize": 10},
            "persistent://public/kafka/orders-partition-12": {"storageSize": 20},
            "persistent://public/kafka/orders-partition-1": {},
            "persistent://public/kafka/orders": {"storageSize": 99},  # not a partition
        },
    }
    assert partition_sizes(stats) == {0: 10, 12: 20, 1: 0}


def test_a_topic_pulsar_does_not_know_has_no_partitions():
    assert partition_sizes({}) == {}
