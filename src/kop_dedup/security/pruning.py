"""Owners follow the names they own: a group or a transactional id that is forgotten
(expired, deleted) loses its owner too, as Kafka's expiry forgets the id whole.

The coordinators know nothing of roles; each offers one hook, called under the lock of
the state it removes, which :func:`prune_owners` points at the owners table:

- a group forgotten (``group_retention_ms`` with no members and nothing done, or
  DeleteGroups): its ``group:`` row; and a group claimed over ``group_retention_ms`` ago
  and never stored (no key in the store, no Kafka member): its row, by the same sweep;
- a transactional id expired (``transactional_id_expiry_seconds`` after its last
  transaction ended): its ``txn:`` row and its producer id's ``pid:`` row (its next
  init starts afresh with a new producer id, as Kafka's).

With authentication off there are no owners, and nothing is wired.

>>> prune_owners(runtime.authorizer, runtime.group_retention, runtime.transactions.state)
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from kop_dedup.security.authorizer import GROUP, PRODUCER, TXN, Authorizer

if TYPE_CHECKING:
    from kop_dedup.coordination.groups.retention import GroupRetention
    from kop_dedup.coordination.transactions.state import TransactionStateManager
    from kop_dedup.protocol.transactions import Transaction

__all__ = ["prune_owners", "release_transactional_id"]

log = logging.getLogger(__name__)


async def release_transactional_id(authorizer: Authorizer, txn: Transaction) -> str | None:
    """Forget the owners of ``txn``'s transactional id and of its producer id; the role
    that owned the id (None: nobody)."""
    owner = await authorizer.released(TXN, txn.transactional_id)
    await authorizer.released(PRODUCER, str(txn.producer_id))
    log.info("transactional id %r: its owner %r forgotten", txn.transactional_id, owner)
    return owner


def prune_owners(
    authorizer: Authorizer, groups: GroupRetention, transactions: TransactionStateManager
) -> None:
    """Point the coordinators' forget hooks at ``authorizer``'s owners table."""
    if not authorizer.has_owners:
        return
    groups.release = partial(authorizer.released, GROUP)
    groups.claimed_before = partial(authorizer.claimed_before, GROUP)
    transactions.on_forget = partial(release_transactional_id, authorizer)
