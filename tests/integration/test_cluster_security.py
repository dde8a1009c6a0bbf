"""Nodes of one cluster agree on security (issue 36): a node whose authentication differs
from the cluster's is refused at join, and a request claiming to come from another node
(``x-kop-forwarded-by``) is served as one only when a node of the cluster proves it.

Real broker, real sidecars (uvicorn on real sockets) and a real Runtime for the node
that is refused (a refused start is an exception, not a sidecar that never gets ready).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kop_dedup.cluster.members import SecurityMismatch
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

ROLES = "alice:tok-alice\nroot:tok-root\n"


def _roles(tmp_path: Path) -> Path:
    roles = tmp_path / "roles"
    roles.write_text(ROLES)
    return roles


def test_a_node_with_a_roles_file_is_refused_by_a_cluster_whose_node_authenticates_nobody(
    pulsar: Any, tmp_path: Path
) -> None:
    """The confirmed case: an open sidecar already runs in the system namespace; a sidecar
    with a roles file starting there must not join (it would forward its clients' requests
    to a node that authenticates nobody)."""
    ns = uniq("sys")
    with ThreadSidecar(pulsar, system_namespace=ns, node_id=1, cluster_refresh_ms=300) as open_:
        settings = Settings(
            pulsar_service_url=pulsar.service_url,
            pulsar_admin_url=pulsar.admin_url,
            system_namespace=ns,
            node_id=2,
            auth_roles_file=_roles(tmp_path),
            superuser_roles="root",
        )

        async def join() -> None:
            runtime = Runtime(settings)
            try:
                await runtime.start()
                await runtime.join_cluster(None)
            finally:
                await runtime.close()

        with pytest.raises(SecurityMismatch) as refused:
            asyncio.run(join())
        message = str(refused.value)
        assert "authentication" in message, message
        assert "node 1" in message, message
        assert "tok-" not in message  # names the setting, never the secret
        assert open_.runtime.cluster.view.node_ids == (1,)
