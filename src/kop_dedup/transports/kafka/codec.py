"""Frames <-> kafka-python messages: the request header, bodies, framed answers.

kafka-python (3.0) decodes requests and encodes responses from Kafka's own JSON
schemas, flexible versions included; this module only splits a frame into its header
and body and frames the answer. The header's layout depends on the API and version
(header v2, with tagged fields, for flexible versions), so the first 8 bytes are read
before the rest. The ApiVersions response header is always v0 (kafka-python's
``ApiVersionsResponse`` knows).

>>> header = parse_header(frame, flexible=True)          # ids, client id, body offset
>>> body = decode_body(MetadataRequest, frame, header)   # FrameError if it does not parse
>>> encode_answer(response, header.api_version, header.correlation_id)  # framed bytes
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_header import RequestHeader
from kafka.protocol.data_container import DataContainer

__all__ = [
    "FrameError",
    "Header",
    "decode_body",
    "encode_answer",
    "error_codes",
    "parse_header",
    "peek_ids",
]

_FIXED = struct.Struct(">hhi")


class FrameError(Exception):
    """A frame whose header or body does not parse: Kafka closes the connection."""


@dataclass(frozen=True, slots=True)
class Header:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body_offset: int
    """Where the body starts in the frame."""


def peek_ids(frame: bytes) -> tuple[int, int, int] | None:
    """(api key, version, correlation id) of a frame, None when it is too short."""
    if len(frame) < _FIXED.size:
        return None
    key, version, correlation = _FIXED.unpack_from(frame)
    return int(key), int(version), int(correlation)


def parse_header(frame: bytes, flexible: bool) -> Header:
    """The request header (v1, or v2 with tagged fields when ``flexible``)."""
    ids = peek_ids(frame)
    if ids is None:
        raise FrameError(f"a request of {len(frame)} bytes has no complete header")
    data = io.BytesIO(frame)
    try:
        header = RequestHeader.decode(data, flexible=flexible)
    except Exception as exc:  # the library raises what the bytes make it raise
        raise FrameError(f"the request header does not parse: {exc!r}") from exc
    return Header(ids[0], ids[1], ids[2], header.client_id or "", data.tell())


def decode_body(request_class: Any, frame: bytes, header: Header) -> Any:
    """The request body at the header's version; FrameError when it does not parse."""
    try:
        return request_class.decode(
            memoryview(frame)[header.body_offset :], version=header.api_version
        )
    except Exception as exc:  # struct.error, ValueError, IndexError, UnicodeDecodeError...
        raise FrameError(
            f"the body of a {request_class.name} v{header.api_version} request does not "
            f"parse: {exc!r}"
        ) from exc


def encode_answer(response: Any, version: int, correlation_id: int) -> bytes:
    """The framed answer (size, response header, body) at ``version``."""
    response.API_VERSION = version
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def error_codes(message: Any) -> Iterator[int]:
    """Every error code a response carries, top level and per item."""
    for name in type(message).fields:
        value = getattr(message, name, None)
        if name.endswith("error_code") and isinstance(value, int):
            yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, DataContainer):
                    yield from error_codes(item)
