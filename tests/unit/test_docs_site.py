"""The docs site builds with ``mkdocs build --strict``: a broken link or anchor, a page
missing from the navigation or a page the navigation names that does not exist fails
it. The configuration page it builds lists every setting (generated at build time)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kop_dedup.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")

pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is in the test extra")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict_with_every_page(site):
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    pages = [p for p in pages if not p.name.startswith("changelog-")]  # notes, not pages
    for page in pages:
        built = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (site / page.parent / built).exists(), page
    assert (site / "bench" / "bench.png").exists()  # the plots the performance pages show
    assert (site / "bench" / "kafka" / "kafka.json").exists()


def test_the_built_configuration_page_lists_every_setting(site):
    html = (site / "reference" / "configuration" / "index.html").read_text()
    for name in Settings.model_fields:
        var = f"KOP_DEDUP_{name.upper()}"
        assert f'id="{var.lower()}"' in html, var
        assert f"<code>{var}</code>" in html, var


def test_a_broken_link_anchor_or_unlisted_page_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    with (docs / "index.md").open("a") as f:
        f.write("\n[gone](no-such-page.md) [no anchor](getting-started.md#no-such-heading)\n")
    (docs / "stray.md").write_text("# A page in no navigation\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("scripts/mkdocs_hooks.py", str(ROOT / "scripts" / "mkdocs_hooks.py"))
    (tmp_path / "mkdocs.yml").write_text(config)
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    log = done.stdout + done.stderr
    assert re.search(r"link 'no-such-page\.md'.*not found", log), log
    assert "does not contain an anchor '#no-such-heading'" in log, log
    assert "stray.md" in log, log


def test_the_readmes_links_into_the_docs_resolve():
    """The README is the front page on the repository host and on PyPI: its relative
    links point at the docs' Markdown sources, which must exist (with their anchors)."""
    from markdown.extensions.toc import slugify

    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) >= 10, local
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.MULTILINE)
            assert anchor in {slugify(h, "-") for h in headings}, link
