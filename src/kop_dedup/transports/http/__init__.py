"""The HTTP edge: FastAPI app, request/response models, routes. Nothing imports it."""

from __future__ import annotations

from kop_dedup.transports.http.app import create_app

__all__ = ["create_app"]
