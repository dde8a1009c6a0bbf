"""Request bodies read by hand (one pydantic pass, the house 422), and the OpenAPI
schemas of every body and answer the routes register.

>>> register_bodies(SomeIn)
>>> @router.post("/x", openapi_extra=body_spec(SomeIn))
... async def x(body: Annotated[SomeIn, Depends(parsed_body(SomeIn))]): ...
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

__all__ = ["body_schemas", "body_spec", "parsed_body", "register_answers", "register_bodies"]

M = TypeVar("M", bound=BaseModel)
_BODIES: list[type[BaseModel]] = []
_ANSWERS: list[type[BaseModel]] = []


def register_bodies(*models: type[BaseModel]) -> None:
    _BODIES.extend(m for m in models if m not in _BODIES)


def register_answers(*models: type[BaseModel]) -> None:
    _ANSWERS.extend(m for m in models if m not in _ANSWERS)


def body_spec(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def body_schemas() -> dict[str, Any]:
    """OpenAPI component schemas for the registered bodies (validation) and answers
    (serialization)."""
    out: dict[str, Any] = {}
    for models, mode in ((_BODIES, "validation"), (_ANSWERS, "serialization")):
        for model in models:
            schema = model.model_json_schema(
                ref_template="#/components/schemas/{model}",
                mode=mode,  # type: ignore[arg-type]
            )
            out.update(schema.pop("$defs", {}))
            out[model.__name__] = schema
    return out


def parsed_body(model: type[M]) -> Callable[[Request], Coroutine[Any, Any, M]]:
    """A dependency that parses and validates the body in one pass with pydantic.

    Every body problem (not JSON, not UTF-8, wrong shape) becomes one 422 in
    the house shape: FastAPI's own parser answers a body that is not UTF-8
    with a bare 400.
    """

    async def parse(request: Request) -> M:
        raw = await request.body()
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            ) from exc

    return parse
