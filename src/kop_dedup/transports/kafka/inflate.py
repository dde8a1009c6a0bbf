"""Inflate a compressed record batch's records, stopping at a size limit.

A batch's header says how many records it holds, never how large they are inflated:
gzip, zstd and lz4 expand zeros a thousandfold and more, so one batch of about 1 MiB
on the wire can inflate to gigabytes. Each codec here is read incrementally and given
up on as soon as the output would pass ``limit`` (snappy's blocks state their inflated
length first, so a block too large is refused before it is inflated at all), so at
most ``limit`` bytes plus one step (64 KiB) are ever held. An :class:`InflateBudget`
bounds what the batches of one request inflate to together, charged step by step from
the worker threads that inflate them side by side.

>>> inflate(1, gzip.compress(b"x" * 10), limit=100)
b'xxxxxxxxxx'
>>> inflate(1, gzip.compress(bytes(1 << 20)), limit=1000)
Traceback (most recent call last):
MessageTooLarge: ...

:class:`~kop_dedup.errors.MessageTooLarge` (10) past the limit,
:class:`~kop_dedup.errors.CorruptMessage` (2) for a stream that does not decode.
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Callable

import cramjam
import lz4.frame
import zstandard

from kop_dedup import errors

__all__ = ["CODEC_NAMES", "InflateBudget", "inflate"]

CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_STEP = 64 * 1024
_XERIAL = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_BLOCK_SIZE = struct.Struct(">i")


class InflateBudget:
    """What the compressed batches of one request may inflate to together; thread-safe.

    >>> budget = InflateBudget(1 << 20)
    >>> budget.take(65536); budget.taken
    65536

    :meth:`take` raises MessageTooLarge (10) naming ``setting`` once the request would
    pass ``limit``."""

    def __init__(
        self, limit: int, setting: str = "KOP_DEDUP_KAFKA_MAX_REQUEST_INFLATED_BYTES"
    ) -> None:
        self.limit, self.setting, self.taken = limit, setting, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            if self.taken + n > self.limit:
                raise errors.MessageTooLarge(
                    f"the request's compressed records inflate past {self.limit} bytes "
                    f"together ({self.setting}); send smaller requests"
                )
            self.taken += n

    def give_back(self, n: int) -> None:
        """``n`` bytes taken by a batch that was refused after all (not held)."""
        with self._lock:
            self.taken -= n


_Charge = Callable[[int], None]


def _free(_n: int) -> None:
    pass


def _too_large(codec: int, limit: int) -> errors.MessageTooLarge:
    return errors.MessageTooLarge(
        f"the batch's {CODEC_NAMES[codec]} records inflate past {limit} bytes, the batch "
        "limit (KOP_DEDUP_MAX_BATCH_BYTES)"
    )


def _gzip(data: bytes, limit: int, charge: _Charge) -> bytes:
    out = bytearray()
    rest = data
    while rest:  # members one after another, as Java's GZIPInputStream reads them
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        pending = rest
        while not d.eof:
            got = d.decompress(pending, min(limit + 1 - len(out), _STEP))
            charge(len(got))
            out += got
            if len(out) > limit:
                raise _too_large(1, limit)
            pending = d.unconsumed_tail
            if not pending and not got:
                break
        if not d.eof:
            raise errors.CorruptMessage("the batch's gzip stream ends before its end")
        rest = d.unused_data
    return bytes(out)


def _lz4(data: bytes, limit: int, charge: _Charge) -> bytes:
    out = bytearray()
    rest = data
    while rest:
        d = lz4.frame.LZ4FrameDecompressor()
        chunk = d.decompress(rest, max_length=_STEP)
        while True:
            charge(len(chunk))
            out += chunk
            if len(out) > limit:
                raise _too_large(3, limit)
            if d.eof or d.needs_input:
                break
            chunk = d.decompress(b"", max_length=_STEP)
        if not d.eof:
            raise errors.CorruptMessage("the batch's lz4 frame ends before its end")
        rest = d.unused_data
    return bytes(out)


def _zstd(data: bytes, limit: int, charge: _Charge) -> bytes:
    out = bytearray()
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    while chunk := reader.read(_STEP):
        charge(len(chunk))
        out += chunk
        if len(out) > limit:
            raise _too_large(4, limit)
    return bytes(out)


def _varint(data: bytes | memoryview) -> int:
    """A snappy block's preamble: its inflated length (unsigned LEB128)."""
    value = shift = 0
    for i, byte in enumerate(data[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if i == 4:
            break
    raise errors.CorruptMessage("the batch's snappy block has no length")


def _snappy(data: bytes, limit: int, charge: _Charge) -> bytes:
    view = memoryview(data)
    if not data.startswith(_XERIAL):
        blocks = [view]
    else:  # xerial framing (Kafka's Java clients): 16 header bytes, then sized blocks
        blocks, at = [], _XERIAL_HEADER
        while at < len(view):
            if at + 4 > len(view):
                raise errors.CorruptMessage("the batch's snappy block size is cut short")
            (size,) = _BLOCK_SIZE.unpack_from(view, at)
            if size < 0 or at + 4 + size > len(view):
                raise errors.CorruptMessage("the batch's snappy block overruns the batch")
            blocks.append(view[at + 4 : at + 4 + size])
            at += 4 + size
    total = sum(_varint(b) for b in blocks)  # stated before any block is inflated
    if total > limit:
        raise _too_large(2, limit)
    charge(total)
    return b"".join(bytes(cramjam.snappy.decompress_raw(bytes(b))) for b in blocks)


_CODECS: dict[int, Callable[[bytes, int, _Charge], bytes]] = {
    1: _gzip,
    2: _snappy,
    3: _lz4,
    4: _zstd,
}


def inflate(codec: int, data: bytes, limit: int, budget: InflateBudget | None = None) -> bytes:
    """The records of a batch compressed with ``codec`` (Kafka's attribute value, 1-4),
    inflated; MessageTooLarge once they pass ``limit`` bytes, or once the request's
    ``budget`` is spent (what this batch took of it is given back then)."""
    took = 0

    def charge(n: int) -> None:
        nonlocal took
        if budget is not None:
            budget.take(n)
            took += n

    try:
        return _CODECS[codec](data, limit, charge if budget is not None else _free)
    except errors.KafkaError:
        if budget is not None:
            budget.give_back(took)
        raise
    except Exception as exc:  # zlib.error, zstandard.ZstdError, RuntimeError (lz4), ...
        if budget is not None:
            budget.give_back(took)
        raise errors.CorruptMessage(
            f"the batch's {CODEC_NAMES.get(codec, codec)} records do not decode: {exc}"
        ) from exc
