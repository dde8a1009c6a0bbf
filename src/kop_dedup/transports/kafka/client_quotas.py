"""DescribeClientQuotas (48, v0-1), AlterClientQuotas (49, v0-1) and
DescribeUserScramCredentials (50, v0): what ``kafka-configs --entity-type users``
(and ``clients``) calls, over the per-role client quotas
(:mod:`kop_dedup.security.client_quotas`; the rules in
:mod:`kop_dedup.protocol.client_quotas`).

A ``user`` entity is a role (no name: the default user). ``producer_byte_rate`` and
``consumer_byte_rate`` are kept and enforced (:mod:`.throttle`); every other entity
type or key is refused per entry with INVALID_REQUEST (42), Kafka's code, and a message
saying what is served. ``validate_only`` checks without storing. There are no SCRAM
credentials here (SASL/PLAIN with tokens): DescribeUserScramCredentials answers as
Kafka does when none exist (no users listed; a named user 91 RESOURCE_NOT_FOUND).
All three need the tenant's admin role (or a superuser), else 31
CLUSTER_AUTHORIZATION_FAILED, as Kafka needs ``DESCRIBE_CONFIGS``/``ALTER_CONFIGS``
on the cluster.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)

from kop_dedup import errors
from kop_dedup.protocol.client_quotas import USER, check_alteration, check_filter, matches
from kop_dedup.security.client_quotas import ClientQuotas
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "quotas_of"]

_Entry = DescribeClientQuotasResponse.EntryData
_Altered = AlterClientQuotasResponse.EntryData
_Result = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult


def quotas_of(session: Session) -> ClientQuotas:
    """The node's client quotas (56 KAFKA_STORAGE_ERROR, retriable, when none are kept:
    never on a running sidecar)."""
    quotas = session.runtime.authorizer.client_quotas
    if quotas is None:
        raise errors.KafkaStorageError("client quotas are not kept on this node")
    return quotas


async def _require_admin(session: Session, what: str) -> None:
    if not session.forwarded:
        await session.runtime.authorizer.require_admin(
            session.identity, what, errors.ClusterAuthorizationFailed
        )


# -- DescribeClientQuotas -------------------------------------------------------------------


async def describe_client_quotas(session: Session, request: Any, version: int) -> Any:
    await _require_admin(session, "describe client quotas")
    flt = check_filter(
        ((c.entity_type, c.match_type, c.match) for c in request.components), request.strict
    )
    described = await quotas_of(session).describe()
    users = sorted((u for u in described if matches(flt, u)), key=lambda u: (u is not None, u))
    return DescribeClientQuotasResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO,
        error_message=None,
        entries=[
            _Entry(
                entity=[_Entry.EntityData(entity_type=USER, entity_name=user)],
                values=[
                    _Entry.ValueData(key=k, value=v) for k, v in sorted(described[user].items())
                ],
            )
            for user in users
        ],
    )


def _describe_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeClientQuotasResponse(
        version=version,
        throttle_time_ms=0,
        error_code=error.errno,
        error_message=error.message,
        entries=None,
    )


# -- AlterClientQuotas ----------------------------------------------------------------------


def _entity(entry: Any) -> list[Any]:
    return [
        _Altered.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
        for e in entry.entity
    ]


async def alter_client_quotas(session: Session, request: Any, version: int) -> Any:
    await _require_admin(session, "alter client quotas")
    quotas = quotas_of(session)
    answered = []
    for entry in request.entries:
        entity = [(e.entity_type, e.entity_name) for e in entry.entity]
        ops = [(o.key, float(o.value), bool(o.remove)) for o in entry.ops]
        problem = check_alteration(entity, ops)
        error: errors.KafkaError | None = (
            None if problem is None else errors.InvalidRequest(problem)
        )
        if error is None and not request.validate_only:
            put = {key: value for key, value, remove in ops if not remove}
            await quotas.alter(entity[0][1], put, [key for key, _, remove in ops if remove])
        answered.append(
            _Altered(
                error_code=errors.NONE_ERRNO if error is None else error.errno,
                error_message=None if error is None else error.message,
                entity=_entity(entry),
            )
        )
    return AlterClientQuotasResponse(version=version, throttle_time_ms=0, entries=answered)


def _alter_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return AlterClientQuotasResponse(
        version=version,
        throttle_time_ms=0,
        entries=[
            _Altered(error_code=error.errno, error_message=error.message, entity=_entity(e))
            for e in request.entries
        ],
    )


# -- DescribeUserScramCredentials -----------------------------------------------------------


async def describe_scram(session: Session, request: Any, version: int) -> Any:
    await _require_admin(session, "describe SCRAM credentials")
    names = [u.name for u in request.users or ()]
    results = []
    for name in dict.fromkeys(names):
        error: errors.KafkaError
        if names.count(name) > 1:
            error = errors.DuplicateResource(
                "Cannot describe SCRAM credentials for the same user twice in a single "
                f"request: {name}"
            )
        else:
            error = errors.ResourceNotFound(
                f"Attempt to describe a user credential that does not exist: {name}"
            )
        results.append(
            _Result(
                user=name, error_code=error.errno, error_message=error.message, credential_infos=[]
            )
        )
    return DescribeUserScramCredentialsResponse(
        version=version, throttle_time_ms=0, error_code=0, error_message=None, results=results
    )


def _scram_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeUserScramCredentialsResponse(
        version=version,
        throttle_time_ms=0,
        error_code=error.errno,
        error_message=error.message,
        results=[],
    )


APIS = (
    Api(
        key=48,
        name="DescribeClientQuotas",
        request=DescribeClientQuotasRequest,
        versions=(0, 1),
        handle=describe_client_quotas,
        error_answer=_describe_error,
    ),
    Api(
        key=49,
        name="AlterClientQuotas",
        request=AlterClientQuotasRequest,
        versions=(0, 1),
        handle=alter_client_quotas,
        error_answer=_alter_error,
    ),
    Api(
        key=50,
        name="DescribeUserScramCredentials",
        request=DescribeUserScramCredentialsRequest,
        versions=(0, 0),
        handle=describe_scram,
        error_answer=_scram_error,
    ),
)
