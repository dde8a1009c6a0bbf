"""The HTTP edge's JSON answers, each rendered in one place from the domain object.

Codes and names come from the result object (whose error is an
:mod:`kop_dedup.errors` class) or from the error classes; nothing here writes
a code by hand.

>>> batch_answer(BatchResult("orders", 0, None, "12:0:-1:0"))["errorCode"]
0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from kop_dedup import errors
from kop_dedup.produce.service import BatchResult

__all__ = [
    "AUTH_RESPONSES",
    "INVALID_RESPONSE",
    "JSON_OBJECT",
    "TOO_LARGE_RESPONSE",
    "batch_answer",
    "invalid_request",
    "over_setting",
    "too_large",
]

# How the answers other than a route's own are documented in the OpenAPI document.
JSON_OBJECT: dict[str, Any] = {"content": {"application/json": {"schema": {"type": "object"}}}}
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing bearer token (when tokens are configured)", **JSON_OBJECT},
    403: {"description": "bearer token not accepted", **JSON_OBJECT},
    503: {"description": "the sidecar is starting", **JSON_OBJECT},
}
TOO_LARGE_RESPONSE: dict[int | str, dict[str, Any]] = {
    413: {
        "description": "body over KOP_DEDUP_MAX_REQUEST_BYTES (init-producer-id, end-txn and "
        "txn-offset-commit: KOP_DEDUP_MAX_TXN_REQUEST_BYTES), or a produce request with "
        "more batches than KOP_DEDUP_MAX_BATCHES_PER_REQUEST (errorCode 42)",
        **JSON_OBJECT,
    }
}
INVALID_RESPONSE: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "the body is not JSON (or not UTF-8) or not the documented shape: "
        f'error "{errors.InvalidRequest.name}", errorCode {errors.InvalidRequest.errno}, '
        "errorMessage, and detail per problem",
        **JSON_OBJECT,
    }
}


def batch_answer(result: BatchResult) -> dict[str, Any]:
    """One produce result as the API's ``BatchOut``; ``messageId`` whenever it is known
    (a stored batch, and a retry of a recent one answered 46 with its position)."""
    error = result.error
    return {
        "topic": result.topic,
        "partition": result.partition,
        "errorCode": result.error_code,
        "error": result.error_name,
        "messageId": result.message_id,
        "errorMessage": None if error is None else error.message,
    }


def invalid_request(problems: Iterable[Mapping[str, Any]]) -> JSONResponse:
    """422 in the house shape for pydantic-style problems (``loc``, ``msg``, ``type``):
    ``errorMessage`` names each field path, e.g. ``body.batches.0.producerEpoch: Field
    required``."""
    listed = list(problems)
    described = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in listed]
    return JSONResponse(
        {
            "error": errors.InvalidRequest.name,
            "errorCode": errors.InvalidRequest.errno,
            "errorMessage": "; ".join(described[:20]) or "invalid request body",
            "detail": [
                {"loc": e.get("loc"), "msg": e.get("msg"), "type": e.get("type")}
                for e in listed[:50]
            ],
        },
        status_code=422,
    )


def over_setting(field: str, value: int, limit: int, setting: str) -> JSONResponse | None:
    """The 422 for a body field above the setting that caps it (the OpenAPI document
    shows the same maximum), or None when it is within."""
    if value <= limit:
        return None
    return invalid_request(
        [
            {
                "loc": ("body", field),
                "msg": f"Input should be less than or equal to {limit} (KOP_DEDUP_{setting})",
                "type": "less_than_equal",
            }
        ]
    )


def too_large(limit: int, setting: str) -> JSONResponse:
    """413 for a body over ``limit`` bytes, naming the setting that sets it (refused
    before the body is parsed)."""
    return JSONResponse(
        {
            "error": "REQUEST_TOO_LARGE",
            "errorMessage": f"request body exceeds {limit} bytes (KOP_DEDUP_{setting}); "
            "send fewer or smaller batches",
        },
        status_code=413,
    )
