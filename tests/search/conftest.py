"""Each search test gets its own build store: a repeated sweep reuses a stored search (qbench.execute.jobs), and tests
that patch the search's code or timings would otherwise be served another test's search of the same recipe."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def own_build_store(tmp_path, monkeypatch):
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "qbench_cache"))
