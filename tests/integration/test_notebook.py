"""The walkthrough notebook runs top to bottom on the session's broker."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import delete_namespace, uniq

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "end-to-end.ipynb"


def test_end_to_end_notebook_runs_unattended(pulsar, tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_SERVICE_URL", pulsar.service_url)
    monkeypatch.setenv("PULSAR_ADMIN_URL", pulsar.admin_url)
    # the notebook's sidecars (settings from the environment) keep their transaction log
    # to themselves: other sidecars sharing the broker would take its partitions over
    namespace = uniq("kop-dedup-notebook")
    monkeypatch.setenv("KOP_DEDUP_SYSTEM_NAMESPACE", namespace)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute(env=dict(os.environ))
    finally:
        delete_namespace(pulsar.admin_url, f"public/{namespace}")
    outputs = "".join(
        o.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
    )
    # the idempotent topic, the transactional ones, the consumer group's
    assert outputs.count("audit: OK") == 3
    assert "transactions        22 committed, 1 aborted" in outputs
    assert "group mismatches    0" in outputs
    assert (tmp_path / "notebook-producers.png").stat().st_size > 10_000
    assert (tmp_path / "notebook-transactions.png").stat().st_size > 10_000
    assert (tmp_path / "notebook-groups.png").stat().st_size > 10_000
