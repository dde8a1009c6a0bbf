"""API docs that work without internet: Swagger UI at ``/docs``, ReDoc at ``/redoc``.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN, so in an
air-gapped cluster (where sidecars often run) they are blank. Here both pages
load their scripts, styles and icon from the sidecar itself, under
``/docs/assets/``, from the files the ``fastapi-offline`` package ships; the
pages' URLs are paths on the sidecar (behind a proxy's ``root_path`` too), and
Swagger UI's validator badge, which would call an outside service, is off.

>>> mount_docs(app)  # after FastAPI(docs_url=None, redoc_url=None)
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS", "mount_docs"]

ASSETS = "/docs/assets"
"""Where the Swagger UI and ReDoc files are served (fastapi_offline/static)."""


def mount_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve the two doc pages and their assets from ``app``."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
