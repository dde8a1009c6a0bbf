"""Who may write the system namespace: checked at start.

The system namespace holds what the sidecars trust without asking again: the cluster's
members (read from consumer properties), the owners of transactional ids and groups,
the transaction log, the registries. Anyone who may write there can join the cluster
as a node or take names over, so:

- the system namespace must differ from the data namespace (where every application
  role is granted ``produce`` and ``consume``): the sidecar refuses to start otherwise;
- with a Pulsar token set (the broker authenticates, and so may authorize), the system
  namespace's permissions must grant nothing to roles other than the sidecars' own (the
  token's role) and the superusers. Grants to others are logged as an ERROR naming the
  roles and the command that revokes them (``system_namespace_check=warn``, the
  default: a cluster upgraded with such grants keeps running while they are taken
  back), or refuse the start (``refuse``).

The decision is :func:`foreign_grants`, pure:

>>> foreign_grants({"kop": {"produce"}, "app": {"consume"}}, own="kop", superusers={"root"})
{'app': ['consume']}
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Iterable, Mapping

from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.settings import Settings

__all__ = [
    "SystemNamespaceExposed",
    "check_system_namespace",
    "foreign_grants",
    "separation_refusal",
    "token_role",
]

log = logging.getLogger(__name__)


class SystemNamespaceExposed(RuntimeError):
    """The system namespace is the data namespace, or (``system_namespace_check=refuse``)
    roles other than the sidecars' may write it."""


def separation_refusal(settings: Settings) -> str | None:
    """Why the system namespace may not be used as configured (None: it may)."""
    if settings.system_namespace.strip() != settings.namespace.strip():
        return None
    return (
        f"refusing to start: KOP_DEDUP_SYSTEM_NAMESPACE and KOP_DEDUP_NAMESPACE are both "
        f"{settings.tenant}/{settings.namespace}. The system namespace holds the cluster's "
        "members, the owners of transactional ids and groups and the transaction log; "
        "every role that may produce to the data namespace could rewrite them. Give the "
        "sidecars a namespace of their own (the default is kop-dedup-system) that only "
        "their role may write"
    )


def token_role(token: str, claim: str = "sub") -> str | None:
    """The role a Pulsar JWT names (its ``claim``), read without checking its signature
    (the broker checks it; here it only says whose grants are our own); None for a token
    that is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:  # header, claims, signature
        return None
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, binascii.Error):
        return None
    role = claims.get(claim) if isinstance(claims, dict) else None
    return role if isinstance(role, str) and role else None


def foreign_grants(
    grants: Mapping[str, Iterable[str]], *, own: str | None, superusers: Iterable[str]
) -> dict[str, list[str]]:
    """The roles of ``grants`` (role -> actions) other than ``own`` and ``superusers``,
    with what each was granted (sorted)."""
    allowed = set(superusers) | ({own} if own else set())
    return {
        role: sorted(actions) for role, actions in sorted(grants.items()) if role not in allowed
    }


async def check_system_namespace(settings: Settings, admin: PulsarAdmin) -> None:
    """The start's check (see the module docstring): SystemNamespaceExposed when the
    sidecar must not start; logs an ERROR (or a WARNING when the grants cannot be read)
    when it may."""
    refused = separation_refusal(settings)
    if refused is not None:
        raise SystemNamespaceExposed(refused)
    token = settings.pulsar_token()
    if token is None:
        return  # no authentication to Pulsar: its grants decide nothing
    ns = f"{settings.tenant}/{settings.system_namespace}"
    fatal = settings.system_namespace_check == "refuse"
    try:
        grants = await admin.get_json(f"/admin/v2/namespaces/{ns}/permissions")
    except AdminError as exc:
        if exc.status == 404:  # not created yet: nothing granted
            return
        said = (
            f"could not read the permissions of the system namespace {ns} ({exc}): who "
            "may write it is unchecked"
        )
        if fatal:
            raise SystemNamespaceExposed(
                f"{said} (KOP_DEDUP_SYSTEM_NAMESPACE_CHECK=refuse)"
            ) from exc
        log.warning("%s", said)
        return
    own = token_role(token, settings.auth_token_claim)
    superusers = {r.strip() for r in settings.superuser_roles.split(",") if r.strip()}
    foreign = foreign_grants(
        {str(r): [str(a) for a in v] for r, v in (grants or {}).items() if isinstance(v, list)},
        own=own,
        superusers=superusers,
    )
    if not foreign:
        return
    said = (
        f"the system namespace {ns} grants {json.dumps(foreign)} to roles other than the "
        f"sidecars' own ({own or 'unknown: the Pulsar token is not a JWT'}) and the "
        "superusers: those roles can join the cluster as nodes and take transactional ids "
        "and groups over. Revoke them (pulsar-admin namespaces revoke-permission "
        f"{ns} --role <role>) or give the sidecars a system namespace of their own"
    )
    if fatal:
        raise SystemNamespaceExposed(f"refusing to start: {said}")
    log.error("%s (set KOP_DEDUP_SYSTEM_NAMESPACE_CHECK=refuse to refuse to start)", said)
