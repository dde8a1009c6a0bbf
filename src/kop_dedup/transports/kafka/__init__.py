"""The Kafka wire listener: Kafka clients, unmodified, on the sidecar's coordinators.

A thin transport: Kafka's wire format <-> the domain (``produce/``, ``coordination/``,
the runtime's admin); no business rule lives here and no Pulsar client is imported.

- :mod:`.listener`: the TCP/TLS server (started by ``kop-dedup serve`` beside HTTP, on
  the same :class:`~kop_dedup.runtime.Runtime`).
- :mod:`.connection`: framing, the request header, in-order answers, concurrency per
  connection, the SASL gate, closing where Kafka closes.
- :mod:`.codec`: frames <-> kafka-python messages (Kafka's JSON schemas);
  :mod:`.batches`: RecordBatch v2 <-> :class:`~kop_dedup.protocol.records.KafkaBatch`
  (aiokafka's Cython record batches).
- :mod:`.registry`: :class:`.registry.Api` (what a handler module declares),
  :class:`.registry.Session` (what a handler gets); :mod:`.apis`: the table.
- One handler module per concern: :mod:`.versions` (ApiVersions), :mod:`.metadata`
  (Metadata, FindCoordinator), :mod:`.topics` (CreateTopics, DeleteTopics),
  :mod:`.producer_ids` (InitProducerId), :mod:`.produce` (Produce), :mod:`.sasl`,
  :mod:`.fetch`, :mod:`.list_offsets`, :mod:`.offsets` (OffsetCommit, OffsetFetch),
  :mod:`.groups` (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups,
  ListGroups), :mod:`.group_deletion` (DeleteGroups, OffsetDelete),
  :mod:`.transactions` (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn);
  :mod:`.txn_codes`: what the transaction coordinator's errors are answered as, per
  API and version (Kafka's conversions, in one place).

Adding an API (Fetch, ListOffsets, OffsetCommit, ...): write ``fetch.py`` with

.. code-block:: python

    async def fetch(session: Session, request: Any, version: int) -> Any:
        ...  # call the domain through session.runtime; build FetchResponse(version=...)

    def _error(request: Any, version: int, error: KafkaError) -> Any:
        ...  # a valid FetchResponse carrying error.errno for every partition asked

    APIS = (Api(key=1, name="Fetch", request=FetchRequest, versions=(4, 12),
                handle=fetch, error_answer=_error),)

and add ``fetch.APIS`` to :data:`.apis.API_TABLE`. The connection decodes the request
at its version, calls the handler, frames the answer in order, counts it in
``/metrics`` and logs it at DEBUG. A handler raises
:class:`~kop_dedup.errors.KafkaError` to answer the whole request with one code,
:class:`.registry.CloseConnection` where Kafka closes the connection.
"""

from __future__ import annotations

__all__: list[str] = []  # the listener: kop_dedup.transports.kafka.listener.KafkaListener
