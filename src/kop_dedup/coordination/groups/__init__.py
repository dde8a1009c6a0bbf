"""Consumer groups with server-side offsets, kept in Pulsar so any sidecar serves any
member of any group; and the offset store that transactions (and, next, Kafka's own
group protocol over the wire) share.

Kafka's split (``GroupCoordinator`` decides, ``GroupMetadataManager`` persists and
loads, ``GroupMetadata`` holds the state and its transitions as pure data):

=====================  ===========================================================
:mod:`.coordinator`    decides: membership, commits; drives pulls and resets
:mod:`.classic`        Kafka classic groups (JoinGroup, SyncGroup, Heartbeat,
                       LeaveGroup, member commits): ``runtime.groups.classic``
:mod:`.pulls`          a pull: plan, read (long poll), record, answer
:mod:`.resets`         server-side resets (RIP-48): resolve, store, status
:mod:`.readers`        the partition readers kept between a member's pulls
:mod:`.lag`            lag, the gauges and the Pulsar subscription that follows commits
:mod:`.retention`      bounded state: expired groups and departed members forgotten
:mod:`.deletion`       DeleteGroups and OffsetDelete (through retention's removal path)
:mod:`.store`          persists and loads: one keyed, compacted log, one owner per
                       partition (:mod:`.view`: what a sidecar read; :mod:`.closing`:
                       handing a partition over cleanly)
:mod:`.offsets`        Kafka-style committed offsets (commit, fetch): usable by any
                       coordinator
:mod:`.pending`        offsets pending in a transaction (KIP-447 markers)
:mod:`.state`, :mod:`.api`  one group's state, typed; the requests and answers
=====================  ===========================================================

The pure rules are in :mod:`kop_dedup.protocol.groups`.

**The surface transports call** (HTTP and the Kafka listener; every coordinator's is
listed in :mod:`kop_dedup.coordination`). Errors are Kafka's (:mod:`kop_dedup.errors`):
``StaleMember`` wraps 22 ILLEGAL_GENERATION or 25 UNKNOWN_MEMBER_ID, ``UnknownGroup``
is 69 GROUP_ID_NOT_FOUND, ``InvalidRequest`` 42, ``OffsetOutOfRange`` 1,
NOT_COORDINATOR and the broker's failures are retriable.

``GroupCoordinator`` (runtime.groups)

- ``configure(group, *, mode, auto_offset_reset, session_timeout_ms,
  broadcast_expire_ms) -> Group`` and ``describe(group) -> Group | None``
- ``join(group, member_id | None, topics) -> Joined`` (member id, generation,
  assignment); ``heartbeat(group, member) -> Joined``; ``leave(group, member)``
- ``pull(group, member, *, max_records, max_bytes, wait_ms, gone) -> PullResult``
  (records with offsets, generation, assignment, resets applied, clamped starts,
  next offsets)
- ``commit(group, member, offsets | None, generation | None) -> list[PartitionOffset]``
  (None: what was answered to the member)
- ``reset(group, ResetRequest) -> list[ResolvedReset]``;
  ``reset_status(group) -> list[ResetStatus]``
- ``check_member(group, member | None, generation | None)``: KIP-447 fencing of a
  transactional offset commit made for a member (raises as its own commit would)

``GroupDeletion`` (runtime.group_deletion): ``delete_group(group)`` (68 with
members, 69 unknown); ``delete_offsets(group, [(topic, [partition])])`` (per
partition: None or 86; 24, 68, 69 for the whole request).

``GroupLag`` (runtime.group_lag): ``lag(group) -> LagReport``; ``rows`` for /metrics.

``GroupStore`` (runtime.offsets): ``commit(group, [StagedOffset])``,
``fetch(group, require_stable=) -> list[CommittedOffset]``; for the transaction
coordinator ``mark_pending`` (a KIP-447 member checked in the same change),
``commit_transaction`` (at most once), ``abort_transaction``.
"""

from __future__ import annotations

__all__: list[str] = []
