"""The walkthrough notebook runs top to bottom on the session's broker."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "end-to-end.ipynb"


def test_end_to_end_notebook_runs_unattended(pulsar, tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_SERVICE_URL", pulsar.service_url)
    monkeypatch.setenv("PULSAR_ADMIN_URL", pulsar.admin_url)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=dict(os.environ))
    outputs = "".join(
        o.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
    )
    assert "audit: OK" in outputs
    assert (tmp_path / "notebook-producers.png").stat().st_size > 10_000
