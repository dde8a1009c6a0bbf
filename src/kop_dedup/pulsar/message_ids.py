"""Where things sit in a Pulsar topic: the two position types and their stored text.

Two meanings, two names (the broker's ``MessageId`` carries both):

- :data:`EntryPosition` ``(ledger, entry)``: one broker entry (a batch entry holds many
  messages). The order of entries within a topic (ledger ids only grow within a topic,
  entry ids within a ledger). Entry -1 is "before the first entry of that ledger",
  which the admin API's ``lastMessageId`` answers for a ledger still empty. Stored as
  ``"<ledger>:<entry>"`` (transaction journal and data ranges, see
  ``coordination/transactions``).
- :data:`MessagePosition` ``(ledger, entry, batch index)``: one message, where a reader
  starts (inclusive); batch index -1 is a message sent without batching, and
  ``(L, E, n)`` with ``n`` the entry's message count means "after entry E". Stored as
  ``"<ledger>:<entry>:<batch>"`` (group offsets, deliveries and resets, see
  ``pulsar/positions.py``).

The text forms are stored in Pulsar (compacted tables, journals): they never change,
so data written by any earlier version still reads.

>>> encode_entry_position((12, 3)), decode_entry_position("12:3")
('12:3', (12, 3))
>>> encode_message_position((12, 3, -1)), decode_message_position("12:3:-1")
('12:3:-1', (12, 3, -1))
"""

from __future__ import annotations

__all__ = [
    "EntryPosition",
    "MessagePosition",
    "decode_entry_position",
    "decode_message_position",
    "encode_entry_position",
    "encode_message_position",
    "handed_out_already",
]

EntryPosition = tuple[int, int]
"""``(ledger, entry)``: one broker entry."""

MessagePosition = tuple[int, int, int]
"""``(ledger, entry, batch index)``: one message (or the place after an entry)."""


def handed_out_already(position: MessagePosition, last: MessagePosition | None) -> bool:
    """Whether a reader that handed out the message at ``last`` has handed out the one at
    ``position`` too: it is not after it (batch index -1, a message sent without batching,
    is its entry's only one). The client sends such a message again: a reader opened with
    ``start_message_id_inclusive`` subscribes again after a reconnection at the last
    message it handed out, inclusive, and hands that message out a second time.

    >>> handed_out_already((12, 3, 4), (12, 3, 4)), handed_out_already((12, 3, 5), (12, 3, 4))
    (True, False)
    >>> handed_out_already((12, 4, -1), (12, 4, -1)), handed_out_already((12, 4, 0), None)
    (True, False)
    """
    if last is None:
        return False
    return (position[0], position[1], max(position[2], 0)) <= (last[0], last[1], max(last[2], 0))


def encode_entry_position(position: EntryPosition) -> str:
    return f"{position[0]}:{position[1]}"


def decode_entry_position(text: str) -> EntryPosition:
    ledger, _, entry = text.partition(":")
    return int(ledger), int(entry)


def encode_message_position(position: MessagePosition) -> str:
    return f"{position[0]}:{position[1]}:{position[2]}"


def decode_message_position(text: str) -> MessagePosition:
    ledger, entry, batch = text.split(":")
    return int(ledger), int(entry), int(batch)
