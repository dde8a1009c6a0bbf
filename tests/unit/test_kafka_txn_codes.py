"""What the transaction coordinator's errors are answered as on the Kafka wire (Kafka's
per-version conversions), and how TxnOffsetCommit's group metadata is read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kop_dedup import errors
from kop_dedup.transports.kafka import txn_codes
from kop_dedup.transports.kafka.transactions import _member

FENCED_FROM = [
    ("InitProducerId", 4),
    ("AddPartitionsToTxn", 2),
    ("AddOffsetsToTxn", 2),
    ("EndTxn", 2),
]


@pytest.mark.parametrize(("api", "since"), FENCED_FROM)
def test_producer_fenced_is_invalid_producer_epoch_to_versions_that_predate_it(api, since):
    fenced = errors.ProducerFenced("epoch 3 is fenced")
    for version in range(since):
        answered = txn_codes.for_api(api, version, fenced)
        assert answered.errno == errors.InvalidProducerEpoch.errno
        assert answered.message == "epoch 3 is fenced"
    for version in range(since, since + 3):
        assert txn_codes.for_api(api, version, fenced).errno == errors.ProducerFenced.errno


def test_txn_offset_commit_answers_a_fenced_producer_invalid_producer_epoch_at_every_version():
    for version in range(5):
        answered = txn_codes.for_api("TxnOffsetCommit", version, errors.ProducerFenced())
        assert answered.errno == errors.InvalidProducerEpoch.errno


@pytest.mark.parametrize(
    ("raised", "answered"),
    [
        (errors.RequestTimedOut(), errors.CoordinatorNotAvailable),
        (errors.NotEnoughReplicas(), errors.CoordinatorNotAvailable),
        (TimeoutError(), errors.CoordinatorNotAvailable),  # Pulsar failures translated first
        (errors.NotLeaderOrFollower(), errors.NotCoordinator),
        (errors.KafkaStorageError(), errors.NotCoordinator),
        (RuntimeError("disk on fire"), errors.NotCoordinator),  # untranslated: storage
        (errors.ConcurrentTransactions(), errors.ConcurrentTransactions),
        (errors.InvalidTxnState(), errors.InvalidTxnState),
        (errors.InvalidProducerIdMapping(), errors.InvalidProducerIdMapping),
        (errors.InvalidTransactionTimeout(), errors.InvalidTransactionTimeout),
        (errors.UnknownMemberId(), errors.UnknownMemberId),
    ],
)
def test_transaction_apis_answer_storage_trouble_as_a_coordinator_to_find_again(raised, answered):
    for api in txn_codes.FENCED_FROM:
        assert txn_codes.for_api(api, 3, raised).errno == answered.errno
        assert answered.retriable == txn_codes.for_api(api, 3, raised).retriable


@pytest.mark.parametrize(
    ("raised", "version", "answered"),
    [
        (errors.ProducerFenced(), 9, errors.InvalidProducerEpoch),
        (errors.InvalidProducerEpoch(), 9, errors.InvalidProducerEpoch),
        (errors.ConcurrentTransactions(), 9, errors.NotEnoughReplicas),
        (errors.NotCoordinator(), 11, errors.NotEnoughReplicas),
        (errors.InvalidTxnState(), 3, errors.InvalidTxnState),
        (errors.InvalidTxnState(), 10, errors.InvalidTxnState),
        (errors.InvalidTxnState(), 11, errors.TransactionAbortable),
        (errors.InvalidProducerIdMapping(), 11, errors.InvalidProducerIdMapping),
        (errors.DuplicateSequenceNumber(), 9, errors.DuplicateSequenceNumber),
        (errors.OutOfOrderSequenceNumber(), 9, errors.OutOfOrderSequenceNumber),
        (errors.RequestTimedOut(), 9, errors.RequestTimedOut),
    ],
)
def test_a_transactional_batch_gets_the_code_kafka_answers_at_that_produce_version(
    raised, version, answered
):
    assert txn_codes.for_produce(version, raised).errno == answered.errno


def test_every_code_a_transactional_produce_answers_is_retriable_or_one_clients_act_on():
    """librdkafka retries 19 and treats 47 as fenced (fatal), 48/120 abortable; nothing
    the coordinator raises comes out as 51 or 16, which Produce clients do not retry."""
    raised = [cls() for cls in errors.BY_CODE.values()]
    for version in (3, 9, 10, 11, 12):
        for error in raised:
            code = txn_codes.for_produce(version, error).errno
            assert code not in {errors.ConcurrentTransactions.errno, errors.NotCoordinator.errno}
            assert code != errors.ProducerFenced.errno


def _request(member: str | None, generation: int) -> SimpleNamespace:
    return SimpleNamespace(member_id=member, generation_id=generation)


@pytest.mark.parametrize(
    ("version", "member", "generation", "checked"),
    [
        (2, "m-1", 4, (None, None)),  # no group metadata before v3
        (3, "", -1, (None, None)),  # sendOffsetsToTransaction(offsets, groupId)
        (3, None, -1, (None, None)),
        (3, "m-1", 4, ("m-1", 4)),  # KIP-447: the member's own commit
        (4, "m-1", -1, ("m-1", -1)),  # a member without its generation: 22 from the group
        (3, "", 4, ("", 4)),  # a generation without a member: 25 from the group
    ],
)
def test_txn_offset_commit_checks_a_member_only_when_the_client_names_one(
    version, member, generation, checked
):
    assert _member(_request(member, generation), version) == checked
