"""DescribeCluster (v0-2): the cluster id, the controller and the brokers, from the
same list Metadata answers (:func:`~kop_dedup.transports.kafka.topology.brokers`), so
both change together. The brokers are never fenced. Authorized operations, when asked,
are every cluster operation, as a Kafka broker without an authorizer answers (SASL
authenticates; nothing here authorizes per operation). Controllers (endpoint type 2)
are asked of a controller: MISMATCHED_ENDPOINT_TYPE, as a Kafka broker answers.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from kop_dedup import errors
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.topology import brokers, controller

__all__ = ["APIS", "describe_cluster"]

_BROKERS = 1  # the endpoint type a broker answers (2: controllers)
_ALL_CLUSTER_OPERATIONS = frozenset({5, 7, 8, 9, 10, 11, 12})
"""CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
IDEMPOTENT_WRITE: what Kafka answers when no authorizer is configured."""


async def describe_cluster(session: Session, request: Any, version: int) -> Any:
    endpoint = request.endpoint_type if version >= 1 else _BROKERS
    if endpoint != _BROKERS:
        return _answer(
            session,
            version,
            errors.MismatchedEndpointType(
                "The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                "of type CONTROLLER"
            ),
            endpoint,
        )
    answer = _answer(session, version, None, endpoint)
    if request.include_cluster_authorized_operations:
        answer.authorized_operations = set(_ALL_CLUSTER_OPERATIONS)
    return answer


def _answer(
    session: Session | None, version: int, error: errors.KafkaError | None, endpoint: int
) -> Any:
    listed = (
        []
        if session is None or error is not None
        else [
            DescribeClusterResponse.DescribeClusterBroker(
                broker_id=b.node_id, host=b.host, port=b.port, rack=None, is_fenced=False
            )
            for b in brokers(session)
        ]
    )
    return DescribeClusterResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        error_message=None if error is None else error.message,
        endpoint_type=endpoint,
        cluster_id="" if session is None else session.shared.node.cluster_id,
        controller_id=-1 if session is None or error is not None else controller(session),
        brokers=listed,
        authorized_operations=None,  # not asked: INT32_MIN on the wire
    )


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    endpoint = request.endpoint_type if version >= 1 else _BROKERS
    return _answer(None, version, error, endpoint)


APIS = (
    Api(
        key=60,
        name="DescribeCluster",
        request=DescribeClusterRequest,
        versions=(0, 2),
        handle=describe_cluster,
        error_answer=_error,
    ),
)
