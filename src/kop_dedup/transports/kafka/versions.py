"""ApiVersions: the versions of every API the listener advertises.

The table comes from the handler modules' :class:`~kop_dedup.transports.kafka.registry.Api`
declarations, so what is advertised is what is served (Produce 0-2 excepted: advertised
and refused, as Kafka 4 does for librdkafka's sake, KAFKA-18659). Clients enable features
from this answer: librdkafka needs Produce >= 3 and Fetch >= 4 for idempotence, an
advertised FindCoordinator for LZ4, Produce >= 7 and Fetch >= 10 for ZSTD. No feature
flags are advertised: without ``transaction.version`` the Java client keeps
transactions v1.

An ApiVersions request at a version above ours is answered with version 0 and
UNSUPPORTED_VERSION, listing the ranges, so the client retries within them; the
connection answers it so (it is the one request served at any version). A v3+ request
whose client software name or version is not Kafka's shape is INVALID_REQUEST.
"""

from __future__ import annotations

import re
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from kop_dedup import errors
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "api_versions", "supported"]

_SOFTWARE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$")
_OWN = (0, 4)


def supported(session: Session) -> list[Any]:
    """The ApiVersion entries of every advertised API, by key."""
    return [
        ApiVersionsResponse.ApiVersion(
            api_key=api.key, min_version=api.versions[0], max_version=api.versions[1]
        )
        for api in sorted(session.shared.apis.values(), key=lambda a: a.key)
        if api.advertised
    ]


def _answer(session: Session | None, version: int, error: errors.KafkaError | None) -> Any:
    return ApiVersionsResponse(
        version=version,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        api_keys=[] if session is None else supported(session),
        throttle_time_ms=0,
    )


async def api_versions(session: Session, request: Any, version: int) -> Any:
    if request is None or not _OWN[0] <= version <= _OWN[1]:  # a version above ours
        return _answer(session, 0, errors.UnsupportedVersion())
    if version >= 3 and not (
        _SOFTWARE.match(request.client_software_name or "")
        and _SOFTWARE.match(request.client_software_version or "")
    ):
        return _answer(session, version, errors.InvalidRequest())
    return _answer(session, version, None)


def _error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _answer(None, version if _OWN[0] <= version <= _OWN[1] else 0, error)


APIS = (
    Api(
        key=18,
        name="ApiVersions",
        request=ApiVersionsRequest,
        versions=_OWN,
        handle=api_versions,
        error_answer=_error,
        before_auth=True,
    ),
)
