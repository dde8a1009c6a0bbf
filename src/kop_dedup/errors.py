"""Kafka error codes and the exception tree: the only place codes live.

Every error the sidecar answers with is one of these classes. Each class
carries its Kafka error code (``errno``) and whether a Kafka client retries it
(``retriable``); :data:`BY_CODE` is derived from the classes, so a code can
never be written twice. Routes never build codes by hand: they catch
:class:`KafkaError` and render ``errno``/``name``/``message``.

The tree::

    KafkaError (UNKNOWN_SERVER_ERROR, -1)
    +-- OffsetOutOfRange (1)
    +-- CorruptMessage (2, retriable)
    +-- UnknownTopicOrPartition (3, retriable)
    +-- NotLeaderOrFollower (6, retriable)
    +-- RequestTimedOut (7, retriable)
    +-- MessageTooLarge (10)
    +-- OffsetMetadataTooLarge (12)
    +-- CoordinatorLoadInProgress (14, retriable)
    +-- CoordinatorNotAvailable (15, retriable)
    +-- NotCoordinator (16, retriable)
    +-- InvalidTopic (17)
    +-- NotEnoughReplicas (19, retriable)
    +-- InvalidRequiredAcks (21)
    +-- IllegalGeneration (22)
    +-- InconsistentGroupProtocol (23)
    +-- InvalidGroupId (24)
    +-- UnknownMemberId (25)
    +-- InvalidSessionTimeout (26)
    +-- RebalanceInProgress (27)
    +-- TopicAuthorizationFailed (29)
    +-- GroupAuthorizationFailed (30)
    +-- ClusterAuthorizationFailed (31)
    +-- UnsupportedSaslMechanism (33)
    +-- IllegalSaslState (34)
    +-- UnsupportedVersion (35)
    +-- TopicAlreadyExists (36)
    +-- InvalidPartitions (37)
    +-- InvalidReplicationFactor (38)
    +-- InvalidReplicaAssignment (39)
    +-- InvalidConfig (40)
    +-- InvalidRequest (42)
    +-- PolicyViolation (44)
    +-- OutOfOrderSequenceNumber (45)
    +-- DuplicateSequenceNumber (46)
    +-- InvalidProducerEpoch (47)
    +-- InvalidTxnState (48)
    +-- InvalidProducerIdMapping (49)
    +-- InvalidTransactionTimeout (50)
    +-- ConcurrentTransactions (51, retriable)
    +-- TransactionalIdAuthorizationFailed (53)
    +-- SecurityDisabled (54)
    +-- OperationNotAttempted (55)
    +-- KafkaStorageError (56, retriable)
    +-- SaslAuthenticationFailed (58)
    +-- UnknownProducerId (59)
    +-- NonEmptyGroup (68)
    +-- GroupIdNotFound (69)
    +-- FetchSessionIdNotFound (70, retriable)
    +-- FencedLeaderEpoch (74, retriable)
    +-- UnknownLeaderEpoch (75, retriable)
    +-- UnsupportedCompressionType (76)
    +-- MemberIdRequired (79)
    +-- GroupMaxSizeReached (81)
    +-- FencedInstanceId (82)
    +-- GroupSubscribedToTopic (86)
    +-- InvalidRecord (87)
    +-- ThrottlingQuotaExceeded (89)
    +-- UnstableOffsetCommit (88, retriable)
    +-- ProducerFenced (90)
    +-- ResourceNotFound (91)
    +-- DuplicateResource (92)
    +-- UnknownTopicId (100, retriable)
    +-- TransactionalIdNotFound (105)
    +-- FencedMemberEpoch (110)
    +-- UnreleasedInstanceId (111)
    +-- UnsupportedAssignor (112)
    +-- StaleMemberEpoch (113)
    +-- MismatchedEndpointType (114)
    +-- TransactionAbortable (120)
    +-- InvalidRegularExpression (128)

Success has no class: its code and name are :data:`NONE_ERRNO` and
:data:`NONE_NAME` (Kafka's ``NONE``, 0).

``DuplicateSequenceNumber`` is an error code but not a failure: Kafka's Java
producer and librdkafka both treat it as "already delivered".
"""

from __future__ import annotations

from typing import ClassVar, Final

__all__ = [
    "BY_CODE",
    "NONE_ERRNO",
    "NONE_NAME",
    "ClusterAuthorizationFailed",
    "ConcurrentTransactions",
    "CoordinatorLoadInProgress",
    "CoordinatorNotAvailable",
    "CorruptMessage",
    "DuplicateResource",
    "DuplicateSequenceNumber",
    "FencedInstanceId",
    "FencedLeaderEpoch",
    "FetchSessionIdNotFound",
    "GroupAuthorizationFailed",
    "GroupIdNotFound",
    "GroupMaxSizeReached",
    "GroupSubscribedToTopic",
    "IllegalGeneration",
    "IllegalSaslState",
    "InconsistentGroupProtocol",
    "InvalidConfig",
    "InvalidGroupId",
    "InvalidPartitions",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidRecord",
    "InvalidRegularExpression",
    "InvalidReplicaAssignment",
    "InvalidReplicationFactor",
    "InvalidRequest",
    "InvalidRequiredAcks",
    "InvalidSessionTimeout",
    "InvalidTopic",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "KafkaError",
    "KafkaStorageError",
    "MemberIdRequired",
    "MessageTooLarge",
    "MismatchedEndpointType",
    "NonEmptyGroup",
    "NotCoordinator",
    "NotEnoughReplicas",
    "NotLeaderOrFollower",
    "OffsetMetadataTooLarge",
    "OffsetOutOfRange",
    "OperationNotAttempted",
    "OutOfOrderSequenceNumber",
    "PolicyViolation",
    "ProducerFenced",
    "RebalanceInProgress",
    "RequestTimedOut",
    "ResourceNotFound",
    "SaslAuthenticationFailed",
    "SecurityDisabled",
    "ThrottlingQuotaExceeded",
    "TopicAlreadyExists",
    "TopicAuthorizationFailed",
    "TransactionAbortable",
    "TransactionalIdAuthorizationFailed",
    "TransactionalIdNotFound",
    "UnknownLeaderEpoch",
    "UnknownMemberId",
    "UnknownProducerId",
    "UnknownTopicId",
    "UnknownTopicOrPartition",
    "UnreleasedInstanceId",
    "UnstableOffsetCommit",
    "UnsupportedCompressionType",
    "UnsupportedSaslMechanism",
    "UnsupportedVersion",
    "error_for_code",
]


NONE_ERRNO: Final = 0
NONE_NAME: Final = "NONE"
"""Kafka's code and name for "no error"."""


class KafkaError(Exception):
    """Base class; also UNKNOWN_SERVER_ERROR (-1) when raised as itself."""

    errno: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class OffsetOutOfRange(KafkaError):
    errno, name = 1, "OFFSET_OUT_OF_RANGE"


class CorruptMessage(KafkaError):
    errno, name, retriable = 2, "CORRUPT_MESSAGE", True


class UnknownTopicOrPartition(KafkaError):
    errno, name, retriable = 3, "UNKNOWN_TOPIC_OR_PARTITION", True


class NotLeaderOrFollower(KafkaError):
    errno, name, retriable = 6, "NOT_LEADER_OR_FOLLOWER", True


class RequestTimedOut(KafkaError):
    errno, name, retriable = 7, "REQUEST_TIMED_OUT", True


class MessageTooLarge(KafkaError):
    errno, name = 10, "MESSAGE_TOO_LARGE"


class OffsetMetadataTooLarge(KafkaError):
    errno, name = 12, "OFFSET_METADATA_TOO_LARGE"


class CoordinatorLoadInProgress(KafkaError):
    errno, name, retriable = 14, "COORDINATOR_LOAD_IN_PROGRESS", True


class CoordinatorNotAvailable(KafkaError):
    errno, name, retriable = 15, "COORDINATOR_NOT_AVAILABLE", True


class NotCoordinator(KafkaError):
    errno, name, retriable = 16, "NOT_COORDINATOR", True


class InvalidTopic(KafkaError):
    errno, name = 17, "INVALID_TOPIC_EXCEPTION"


class NotEnoughReplicas(KafkaError):
    errno, name, retriable = 19, "NOT_ENOUGH_REPLICAS", True


class InvalidRequiredAcks(KafkaError):
    errno, name = 21, "INVALID_REQUIRED_ACKS"


class IllegalGeneration(KafkaError):
    errno, name = 22, "ILLEGAL_GENERATION"


class InconsistentGroupProtocol(KafkaError):
    errno, name = 23, "INCONSISTENT_GROUP_PROTOCOL"


class InvalidGroupId(KafkaError):
    errno, name = 24, "INVALID_GROUP_ID"


class UnknownMemberId(KafkaError):
    errno, name = 25, "UNKNOWN_MEMBER_ID"


class InvalidSessionTimeout(KafkaError):
    errno, name = 26, "INVALID_SESSION_TIMEOUT"


class RebalanceInProgress(KafkaError):
    errno, name = 27, "REBALANCE_IN_PROGRESS"


class TopicAuthorizationFailed(KafkaError):
    errno, name = 29, "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailed(KafkaError):
    errno, name = 30, "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailed(KafkaError):
    errno, name = 31, "CLUSTER_AUTHORIZATION_FAILED"


class UnsupportedSaslMechanism(KafkaError):
    errno, name = 33, "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslState(KafkaError):
    errno, name = 34, "ILLEGAL_SASL_STATE"


class UnsupportedVersion(KafkaError):
    errno, name = 35, "UNSUPPORTED_VERSION"


class TopicAlreadyExists(KafkaError):
    errno, name = 36, "TOPIC_ALREADY_EXISTS"


class InvalidPartitions(KafkaError):
    errno, name = 37, "INVALID_PARTITIONS"


class InvalidReplicationFactor(KafkaError):
    errno, name = 38, "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignment(KafkaError):
    errno, name = 39, "INVALID_REPLICA_ASSIGNMENT"


class InvalidConfig(KafkaError):
    errno, name = 40, "INVALID_CONFIG"


class InvalidRequest(KafkaError):
    errno, name = 42, "INVALID_REQUEST"


class PolicyViolation(KafkaError):
    errno, name = 44, "POLICY_VIOLATION"


class OutOfOrderSequenceNumber(KafkaError):
    errno, name = 45, "OUT_OF_ORDER_SEQUENCE_NUMBER"


class DuplicateSequenceNumber(KafkaError):
    errno, name = 46, "DUPLICATE_SEQUENCE_NUMBER"


class InvalidProducerEpoch(KafkaError):
    errno, name = 47, "INVALID_PRODUCER_EPOCH"


class InvalidTxnState(KafkaError):
    errno, name = 48, "INVALID_TXN_STATE"


class InvalidProducerIdMapping(KafkaError):
    errno, name = 49, "INVALID_PRODUCER_ID_MAPPING"


class InvalidTransactionTimeout(KafkaError):
    errno, name = 50, "INVALID_TRANSACTION_TIMEOUT"


class ConcurrentTransactions(KafkaError):
    errno, name, retriable = 51, "CONCURRENT_TRANSACTIONS", True


class TransactionalIdAuthorizationFailed(KafkaError):
    errno, name = 53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class SecurityDisabled(KafkaError):
    errno, name = 54, "SECURITY_DISABLED"


class OperationNotAttempted(KafkaError):
    errno, name = 55, "OPERATION_NOT_ATTEMPTED"


class KafkaStorageError(KafkaError):
    errno, name, retriable = 56, "KAFKA_STORAGE_ERROR", True


class SaslAuthenticationFailed(KafkaError):
    errno, name = 58, "SASL_AUTHENTICATION_FAILED"


class UnknownProducerId(KafkaError):
    errno, name = 59, "UNKNOWN_PRODUCER_ID"


class NonEmptyGroup(KafkaError):
    errno, name = 68, "NON_EMPTY_GROUP"


class GroupIdNotFound(KafkaError):
    errno, name = 69, "GROUP_ID_NOT_FOUND"


class FetchSessionIdNotFound(KafkaError):
    errno, name, retriable = 70, "FETCH_SESSION_ID_NOT_FOUND", True


class FencedLeaderEpoch(KafkaError):
    errno, name, retriable = 74, "FENCED_LEADER_EPOCH", True


class UnknownLeaderEpoch(KafkaError):
    errno, name, retriable = 75, "UNKNOWN_LEADER_EPOCH", True


class UnsupportedCompressionType(KafkaError):
    errno, name = 76, "UNSUPPORTED_COMPRESSION_TYPE"


class MemberIdRequired(KafkaError):
    errno, name = 79, "MEMBER_ID_REQUIRED"


class GroupMaxSizeReached(KafkaError):
    errno, name = 81, "GROUP_MAX_SIZE_REACHED"


class FencedInstanceId(KafkaError):
    errno, name = 82, "FENCED_INSTANCE_ID"


class GroupSubscribedToTopic(KafkaError):
    errno, name = 86, "GROUP_SUBSCRIBED_TO_TOPIC"


class InvalidRecord(KafkaError):
    errno, name = 87, "INVALID_RECORD"


class ThrottlingQuotaExceeded(KafkaError):
    errno, name = 89, "THROTTLING_QUOTA_EXCEEDED"


class UnstableOffsetCommit(KafkaError):
    errno, name, retriable = 88, "UNSTABLE_OFFSET_COMMIT", True


class ProducerFenced(KafkaError):
    errno, name = 90, "PRODUCER_FENCED"


class ResourceNotFound(KafkaError):
    errno, name = 91, "RESOURCE_NOT_FOUND"


class DuplicateResource(KafkaError):
    errno, name = 92, "DUPLICATE_RESOURCE"


class UnknownTopicId(KafkaError):
    errno, name, retriable = 100, "UNKNOWN_TOPIC_ID", True


class TransactionalIdNotFound(KafkaError):
    errno, name = 105, "TRANSACTIONAL_ID_NOT_FOUND"


class FencedMemberEpoch(KafkaError):
    errno, name = 110, "FENCED_MEMBER_EPOCH"


class UnreleasedInstanceId(KafkaError):
    errno, name = 111, "UNRELEASED_INSTANCE_ID"


class UnsupportedAssignor(KafkaError):
    errno, name = 112, "UNSUPPORTED_ASSIGNOR"


class StaleMemberEpoch(KafkaError):
    errno, name = 113, "STALE_MEMBER_EPOCH"


class MismatchedEndpointType(KafkaError):
    errno, name = 114, "MISMATCHED_ENDPOINT_TYPE"


class TransactionAbortable(KafkaError):
    errno, name = 120, "TRANSACTION_ABORTABLE"


class InvalidRegularExpression(KafkaError):
    errno, name = 128, "INVALID_REGULAR_EXPRESSION"


def _all_subclasses(cls: type[KafkaError]) -> list[type[KafkaError]]:
    out: list[type[KafkaError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_CLASSES: list[type[KafkaError]] = [KafkaError, *_all_subclasses(KafkaError)]
BY_CODE: dict[int, type[KafkaError]] = {c.errno: c for c in _CLASSES}
"""Kafka error code -> exception class, derived from the classes above."""


def error_for_code(code: int) -> type[KafkaError]:
    """The class for a Kafka error code (UNKNOWN_SERVER_ERROR for unknown codes)."""
    return BY_CODE.get(code, KafkaError)
