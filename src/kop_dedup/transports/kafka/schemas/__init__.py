"""Kafka messages kafka-python does not ship, decoded and encoded from Kafka's own JSON
schemas (copied unchanged from the Kafka 4.1 clients jar,
``common/message/*.json``): ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

kafka-python builds a message class from the schema named like the class, read from
the package given as ``load_json``: these classes behave as its own (versions, flexible
encoding, nested ``Class.Struct`` types).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]

_HERE = __name__


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass
