"""DescribeAcls, CreateAcls, DeleteAcls (v1-3, flexible from v2): ``kafka-acls``.

Kafka's ACLs are a view of Pulsar's permissions and the owners table
(:mod:`kop_dedup.security.acls` says what maps to what and what is refused, per entry,
with INVALID_REQUEST and the reason). Only the tenant's admin roles and superusers may
call them (else CLUSTER_AUTHORIZATION_FAILED, checked in
:mod:`~kop_dedup.transports.kafka.authorize`, as Kafka asks Describe or Alter on the
cluster). With authentication off there is nothing to describe or change: every answer
is SECURITY_DISABLED (54) "No Authorizer is configured.", as a Kafka broker without an
authorizer answers (DescribeAcls: "... configured on the broker", Kafka's words there).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

from kop_dedup import errors
from kop_dedup.security.acl_store import AclStore
from kop_dedup.security.acls import Binding, Filter
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "create_acls", "delete_acls", "describe_acls"]

_VERSIONS = (1, 3)
_NO_AUTHORIZER = "No Authorizer is configured."
_Resource = DescribeAclsResponse.DescribeAclsResource
_Description = _Resource.AclDescription
_FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
_Matching = _FilterResult.DeleteAclsMatchingAcl


def _store(session: Session, *, describe: bool = False) -> AclStore:
    store = session.runtime.authorizer.acls
    if store is None:  # Kafka's two wordings, DescribeAcls's and the changes'
        raise errors.SecurityDisabled(
            "No Authorizer is configured on the broker" if describe else _NO_AUTHORIZER
        )
    return store


def _filter(f: Any) -> Filter:
    """A DescribeAcls request's filter, or one of a DeleteAcls request (same fields)."""
    return Filter(
        f.resource_type_filter,
        f.resource_name_filter,
        f.pattern_type_filter,
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


def _code(error: errors.KafkaError | None) -> tuple[int, str | None]:
    return (errors.NONE_ERRNO, None) if error is None else (error.errno, error.message)


# -- DescribeAcls ------------------------------------------------------------------


async def describe_acls(session: Session, request: Any, version: int) -> Any:
    try:
        found = await _store(session, describe=True).describe(_filter(request))
    except errors.KafkaError as exc:
        return _described(version, [], exc)
    return _described(version, found, None)


def _described(version: int, found: list[Binding], error: errors.KafkaError | None) -> Any:
    resources: dict[tuple[int, str, int], list[Any]] = {}
    for b in found:
        resources.setdefault((b.resource_type, b.name, b.pattern), []).append(
            _Description(
                principal=b.principal,
                host=b.host,
                operation=b.operation,
                permission_type=b.permission,
            )
        )
    code, message = _code(error)
    return DescribeAclsResponse(
        version=version,
        throttle_time_ms=0,
        error_code=code,
        error_message=message,
        resources=[
            _Resource(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
            for (t, n, p), acls in resources.items()
        ],
    )


def _describe_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _described(version, [], error)


# -- CreateAcls --------------------------------------------------------------------


async def create_acls(session: Session, request: Any, version: int) -> Any:
    creations = list(request.creations or ())
    try:
        store = _store(session)
    except errors.KafkaError as exc:
        return _create_error(request, version, exc)
    bindings = [
        Binding(
            c.resource_type,
            c.resource_name,
            c.resource_pattern_type,
            c.principal,
            c.host,
            c.operation,
            c.permission_type,
        )
        for c in creations
    ]
    outcome = await store.create(bindings)
    return _created(version, outcome)


def _created(version: int, outcome: list[errors.KafkaError | None]) -> Any:
    results = []
    for error in outcome:
        code, message = _code(error)
        results.append(CreateAclsResponse.AclCreationResult(error_code=code, error_message=message))
    return CreateAclsResponse(version=version, throttle_time_ms=0, results=results)


def _create_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return _created(version, [error for _ in request.creations or ()])


# -- DeleteAcls --------------------------------------------------------------------


async def delete_acls(session: Session, request: Any, version: int) -> Any:
    filters = [_filter(f) for f in request.filters or ()]
    try:
        deleted = await _store(session).delete(filters)
    except errors.KafkaError as exc:
        return _delete_error(request, version, exc)
    results = []
    for error, hits in deleted:
        code, message = _code(error)
        matching = []
        for b, failed in hits:
            hit_code, hit_message = _code(failed)
            matching.append(
                _Matching(
                    error_code=hit_code,
                    error_message=hit_message,
                    resource_type=b.resource_type,
                    resource_name=b.name,
                    pattern_type=b.pattern,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
            )
        results.append(
            _FilterResult(error_code=code, error_message=message, matching_acls=matching)
        )
    return DeleteAclsResponse(version=version, throttle_time_ms=0, filter_results=results)


def _delete_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    code, message = _code(error)
    return DeleteAclsResponse(
        version=version,
        throttle_time_ms=0,
        filter_results=[
            _FilterResult(error_code=code, error_message=message, matching_acls=[])
            for _ in request.filters or ()
        ],
    )


APIS = (
    Api(
        key=29,
        name="DescribeAcls",
        request=DescribeAclsRequest,
        versions=_VERSIONS,
        handle=describe_acls,
        error_answer=_describe_error,
        response=DescribeAclsResponse,
    ),
    Api(
        key=30,
        name="CreateAcls",
        request=CreateAclsRequest,
        versions=_VERSIONS,
        handle=create_acls,
        error_answer=_create_error,
        response=CreateAclsResponse,
    ),
    Api(
        key=31,
        name="DeleteAcls",
        request=DeleteAclsRequest,
        versions=_VERSIONS,
        handle=delete_acls,
        error_answer=_delete_error,
        response=DeleteAclsResponse,
    ),
)
