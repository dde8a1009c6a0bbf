"""Shared hypothesis strategies for Kafka sequences, batches and records."""

from __future__ import annotations

from hypothesis import strategies as st

from kop_dedup.protocol.records import SEQ_MODULUS, Header, KafkaRecord

sequences = st.integers(min_value=0, max_value=SEQ_MODULUS - 1)
"""Any legal Kafka sequence."""

near_wrap = st.integers(min_value=SEQ_MODULUS - 50, max_value=SEQ_MODULUS - 1) | st.integers(
    min_value=0, max_value=50
)
"""Sequences on either side of the 2^31 wrap, where mistakes live."""

extended = st.integers(min_value=0, max_value=(1 << 40))
"""Extended (unwrapped) sequences, several wraps deep."""

counts = st.integers(min_value=1, max_value=1000)

opt_bytes = st.none() | st.binary(max_size=64)

headers = st.lists(st.builds(Header, key=st.text(max_size=16), value=opt_bytes), max_size=4).map(
    tuple
)

records = st.builds(
    KafkaRecord,
    key=opt_bytes,
    value=opt_bytes,
    headers=headers,
    timestamp=st.none() | st.integers(min_value=0, max_value=(1 << 62)),
)

ledger_ids = st.integers(min_value=-1, max_value=(1 << 63) - 1)
"""Pulsar ledger and entry ids (-1: before the first entry, as ``lastMessageId`` says)."""

entry_positions = st.tuples(ledger_ids, ledger_ids)
"""``(ledger, entry)``: an EntryPosition."""

message_positions = st.tuples(
    ledger_ids, ledger_ids, st.integers(min_value=-1, max_value=(1 << 31) - 1)
)
"""``(ledger, entry, batch index)``: a MessagePosition (batch -1: not batched)."""
