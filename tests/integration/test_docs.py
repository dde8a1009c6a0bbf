"""The API docs pages work without internet: every script, style and icon they load
comes from the sidecar itself (real uvicorn socket)."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = pytest.mark.integration


class _Assets(HTMLParser):
    """The URLs a page loads: <script src>, <link href>, ReDoc's spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "redoc": "spec-url"}.get(tag)
        self.urls += [v for k, v in attrs if k == wanted and v]


def page_assets(api: httpx.Client, path: str) -> tuple[str, list[str]]:
    r = api.get(path)
    assert r.status_code == 200, r.text
    parser = _Assets()
    parser.feed(r.text)
    return r.text, parser.urls


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/docs", {"swagger-ui-bundle.js": b"SwaggerUIBundle", "swagger-ui.css": b".swagger-ui"}),
        ("/redoc", {"redoc.standalone.js": b"Redoc", "openapi.json": b'"/v1/produce"'}),
    ],
)
def test_docs_pages_load_every_asset_from_the_sidecar(api, path, expected):
    html, urls = page_assets(api, path)
    assert "http://" not in html, html  # nothing from another host, not even a font
    assert "https://" not in html, html
    assert "'/openapi.json'" in html or 'spec-url="/openapi.json"' in html
    names = {urlsplit(u).path.rsplit("/", 1)[-1]: u for u in urls}
    assert set(expected) <= set(names), urls
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme, url
        assert not parts.netloc, url
        assert parts.path.startswith("/"), url  # a path on the sidecar
        asset = api.get(url)
        assert asset.status_code == 200, (url, asset.status_code)
        assert asset.content, url
    for name, marker in expected.items():
        assert marker in api.get(names[name]).content, name
    assert "javascript" in api.get(names[next(iter(expected))]).headers["content-type"]


def test_swagger_ui_does_not_call_the_public_validator(api):
    html, _ = page_assets(api, "/docs")
    assert '"validatorUrl": null' in html
