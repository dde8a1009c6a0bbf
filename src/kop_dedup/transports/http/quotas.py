"""``/v1/quotas``: the per-role quotas over HTTP, the same ones Kafka's client-quota
APIs read and write (:mod:`kop_dedup.transports.kafka.client_quotas`).

``GET`` answers the byte rates kept (each role's and the default's: every one to the
tenant's admin role or a superuser, a role's own and the default to anyone else) and
each role's share of the global caps (``ROLE_QUOTA_PERCENT``). ``PUT`` (the tenant's
admin role or a superuser, else 403 with 31 CLUSTER_AUTHORIZATION_FAILED) sets or
removes byte rates of one user (``"user": null``: the default), validated as Kafka's
AlterClientQuotas validates (400 with 42 INVALID_REQUEST and Kafka's message);
``validateOnly`` checks without storing.

>>> PUT /v1/quotas {"user": "alice", "set": {"producer_byte_rate": 1048576}}
{"user": "alice", "quotas": {"producer_byte_rate": 1048576.0}, "validateOnly": false}
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from kop_dedup import errors
from kop_dedup.protocol.client_quotas import USER, check_alteration
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.client_quotas import ClientQuotas
from kop_dedup.security.quotas import owner_quotas, share
from kop_dedup.transports.http.answers import (
    AUTH_RESPONSES,
    INVALID_RESPONSE,
    JSON_OBJECT,
    TOO_LARGE_RESPONSE,
)
from kop_dedup.transports.http.bodies import body_spec, parsed_body, register_bodies
from kop_dedup.transports.http.deps import Authorized, CallerDep, RuntimeDep, refused_with

__all__ = ["QuotasIn", "router"]

router = APIRouter(tags=["quotas"], dependencies=[Authorized])  # before the body is read


class QuotasIn(BaseModel):
    """One user's byte rates to change."""

    model_config = ConfigDict(extra="forbid")

    user: str | None
    """The role (null: the default user, for every role without its own)."""
    set: dict[str, float] = Field(default_factory=dict, max_length=16)
    """Quotas to set: ``producer_byte_rate``, ``consumer_byte_rate`` (bytes a second)."""
    remove: list[str] = Field(default_factory=list, max_length=16)
    """Quotas to remove."""
    validateOnly: bool = False  # noqa: N815 (the API's JSON casing)
    """Check, do not store."""


register_bodies(QuotasIn)


def _store(runtime: Any) -> ClientQuotas:
    quotas: ClientQuotas | None = runtime.authorizer.client_quotas
    if quotas is None:
        raise errors.KafkaStorageError("client quotas are not kept on this node")
    return quotas


def _shares(runtime: Any) -> dict[str, Any]:
    settings = runtime.settings
    percent = settings.role_quota_percent
    held = {kind: q.limit for kind, q in owner_quotas(settings).items()}
    return {
        "roleQuotaPercent": percent,
        "perRole": {
            "transactionalIds": held.get("txn"),
            "groups": held.get("group"),
            "kafkaConnections": share(settings.kafka_max_connections, percent)
            if percent < 100
            else None,
        },
    }


def _check(user: str | None, ops: list[tuple[str, float, bool]]) -> None:
    """42 INVALID_REQUEST with Kafka's message for a change AlterClientQuotas refuses."""
    problem = check_alteration([(USER, user)], ops)
    if problem is not None:
        raise errors.InvalidRequest(problem)


_REFUSED: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    503: {"description": "Pulsar did not answer (a retriable Kafka code)", **JSON_OBJECT},
}


@router.get("/v1/quotas", responses=_REFUSED)
async def get_quotas(runtime: RuntimeDep, who: CallerDep) -> JSONResponse:
    """The byte rates kept (``user`` null: the default) and each role's share of the
    global caps (null: no share, the whole cap)."""
    try:
        described = await _store(runtime).describe()
        admin = await runtime.authorizer.is_admin(who)
    except Exception as exc:  # Kafka errors pass through; Pulsar trouble is translated
        return refused_with(translate(exc, "reading the quotas"))
    users = sorted(
        (u for u in described if admin or u is None or u == who.role),
        key=lambda u: (u is not None, u),
    )
    return JSONResponse(
        {
            "quotas": [{"user": u, "quotas": described[u]} for u in users],
            **_shares(runtime),
        }
    )


@router.put(
    "/v1/quotas",
    openapi_extra=body_spec(QuotasIn),
    responses={
        **_REFUSED,
        **TOO_LARGE_RESPONSE,
        **INVALID_RESPONSE,
        400: {"description": "refused as AlterClientQuotas refuses it (42)", **JSON_OBJECT},
        403: {"description": "not the tenant's admin role (31), or a bad token", **JSON_OBJECT},
    },
)
async def put_quotas(
    who: CallerDep,
    body: Annotated[QuotasIn, Depends(parsed_body(QuotasIn))],
    runtime: RuntimeDep,
) -> JSONResponse:
    """Set or remove one user's byte rates (the tenant's admin role or a superuser)."""
    ops = [(k, v, False) for k, v in body.set.items()] + [(k, 0.0, True) for k in body.remove]
    try:
        await runtime.authorizer.require_admin(
            who, "alter quotas", errors.ClusterAuthorizationFailed
        )
        _check(body.user, ops)
        store = _store(runtime)
        if body.validateOnly:
            quotas = (await store.describe()).get(body.user, {})
        else:
            quotas = await store.alter(body.user, body.set, body.remove)
    except Exception as exc:  # Kafka errors pass through; Pulsar trouble is translated
        return refused_with(translate(exc, "altering the quotas"))
    return JSONResponse({"user": body.user, "quotas": quotas, "validateOnly": body.validateOnly})
