"""A tracking server that dies while a sweep runs (a real `mlflow server`, stopped after the first variant is logged):
the sweep still measures every variant, writes complete results, does not sit in MLflow's back-off, and exits 2
saying that MLflow lacks the results."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from server_processes import start_mlflow_server, stop_process_group
from test_explain import INT8, write_fragile_project

from qbench.cli import main
from qbench.results import read_results
from qbench.track import BOUNDED_RETRIES, SweepTracker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="stops the server's process group via /proc")


def test_a_tracking_server_dying_mid_sweep_costs_mlflow_not_the_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "server").mkdir()
    url, server = start_mlflow_server(tmp_path / "server")
    try:
        recipe = write_fragile_project(tmp_path / "project", [INT8, {"name": "fp16", "precision": "fp16"}], fragile=())
        raw = yaml.safe_load(recipe.read_text())
        raw["tracking"] = {"uri": url}
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        monkeypatch.chdir(tmp_path / "project")
        for name in BOUNDED_RETRIES:
            monkeypatch.delenv(name, raising=False)

        died_at: list[float] = []
        logged = SweepTracker.variant_finished

        def logged_then_the_server_dies(self: SweepTracker, *args: object) -> None:
            logged(self, *args)
            if not died_at:
                assert not stop_process_group(server), "the mlflow server survived its stop"
                died_at.append(time.monotonic())

        monkeypatch.setattr(SweepTracker, "variant_finished", logged_then_the_server_dies)
        code = main(["sweep", str(recipe), "--gate"])
        after_death = time.monotonic() - died_at[0]
    finally:
        stop_process_group(server)

    err = capsys.readouterr().err
    assert code == 2
    assert f"MLflow tracking at {url} failed" in err and "the results are complete in" in err
    [results_path] = (tmp_path / "project" / "reports").glob("fragile/*/results.json")
    results = read_results(results_path)
    assert results.complete and sorted(v.variant for v in results.variants) == ["fp16", "fp32", "int8"]
    assert all(v.status == "ok" for v in results.variants)
    assert (results_path.parent / "report.md").is_file()
    assert after_death < 60, after_death  # MLflow's default back-off spends minutes on each call
    assert not set(BOUNDED_RETRIES) & set(os.environ)  # the bound ends with the sweep's runs
