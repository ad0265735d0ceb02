"""`import qbench` (and the recipe/gate path the CLI takes first) must not load heavy SDKs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from sweep_factory import make_sweep

from qbench.provenance import recipe_record
from qbench.recipe.spec import load_recipe
from qbench.results.schema import write_results
from qbench.runs import RESULTS_FILE, TRACKING_FILE

HEAVY = ("torch", "onnxruntime", "mlflow", "modelopt", "tensorrt")


def imported_after(statement: str, among: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of the packages `among` (or those modules themselves) a fresh process holds after `statement`."""
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [m for m in json.loads(output) if m in among or m.split(".")[0] in among]


def test_import_qbench_loads_no_heavy_sdk():
    assert imported_after("import qbench") == []


def test_every_entry_point_the_package_names_resolves_to_that_function():
    """README's notebook example imports these from `qbench`; `qbench.run_gate` once named a module lacking it."""
    import qbench
    from qbench.errors import QbenchError
    from qbench.gate.run import run_gate
    from qbench.recipe.spec import load_recipe
    from qbench.sweep.runner import run_sweep

    expected = {"load_recipe": load_recipe, "run_sweep": run_sweep, "run_gate": run_gate, "QbenchError": QbenchError}
    assert {name: getattr(qbench, name) for name in qbench.__all__ if name != "__version__"} == expected


def test_recipe_gate_and_registries_load_no_heavy_sdk():
    statement = ("import qbench.recipe.spec, qbench.gate.evaluate, qbench.cli, "
                 "qbench.variants, qbench.backends, qbench.results.schema")
    assert imported_after(statement) == []


def test_loading_a_recipe_loads_no_table_library(tmp_path: Path) -> None:
    """`qbench gate RECIPE` loads the recipe before anything else (and refuses a bad one there): the built-in tasks it
    checks the gate's metric against read label cells with pandas only once a table holds them."""
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    statement = f"from qbench.recipe.spec import load_recipe\nload_recipe({str(tmp_path / 'recipe.yaml')!r})"
    assert imported_after(statement, among=("pandas", "pyarrow")) == []


def test_the_sweeps_work_process_imports_no_runtime_sdk():
    """Backends, techniques and tasks are registered as "module:attr" targets: listing or checking their names
    imports none of them, so the runtimes load when a job needs them."""
    assert imported_after("import qbench.cli.app, qbench.sweep.runner") == []


def test_the_sweeps_work_process_imports_no_http_client_nor_xml_parser():
    """What `qbench sweep`'s work process imports before the sweep starts (qbench.cli.child): an HTTP client (a
    tracking server's health check, a file: URI's path) and an XML parser (reading back a JUnit report) are imported
    where they are used, not by every sweep."""
    unused = ("urllib.request", "http.client", "xml.etree.ElementTree")
    assert imported_after("import qbench.cli.app, qbench.sweep.runner", among=unused) == []


def gate_loads(
    recipe_body: dict, tracking_record: str | None, folder: Path, among: tuple[str, ...] = HEAVY, *, data: bool = True
) -> list[str]:
    """The modules of the packages `among` `qbench gate RECIPE --results FILE` loads, on results in a run folder that
    holds `tracking_record` as its tracking.json (None: no such file, as an older qbench's folder); data=False: the
    recipe's data file is gone, and `qbench gate --results FILE` judges them by the recipe they record (the recipe
    file itself no longer loads)."""
    (folder / "model.onnx").write_bytes(b"model")
    (folder / "rows.parquet").write_bytes(b"rows")
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_body))
    results = folder / "run" / RESULTS_FILE
    made = make_sweep()
    write_results(replace(made, recipe={**made.recipe, **recipe_record(load_recipe(recipe))}), results)
    if tracking_record is not None:
        (results.parent / TRACKING_FILE).write_text(tracking_record)
    if not data:
        (folder / "rows.parquet").unlink()
    argv = ["gate", *([str(recipe)] if data else []), "--results", str(results), "--no-staleness-check"]
    code = f"import sys, json\nfrom qbench.cli.app import main\nmain({argv!r})\nprint(json.dumps(sorted(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=folder).stdout
    return [m for m in json.loads(output.splitlines()[-1]) if m in among or m.split(".")[0] in among]


RECIPE = {"name": "digits", "model": {"path": "model.onnx"},
          "data": {"path": "rows.parquet", "inputs": {"x": "input"}, "label": "y"},
          "gate": {"metric": "accuracy", "max_drop": 0.01, "max_slice_drop": 0.02}}  # fmt: skip


def test_gate_loads_no_mlflow_where_the_recipes_store_does_not_exist(tmp_path: Path) -> None:
    """Nothing was ever tracked here (no mlflow.db in the working directory): MLflow could find no run to tag."""
    assert gate_loads(RECIPE, None, tmp_path) == []
    assert not (tmp_path / "mlflow.db").exists()


def test_gate_loads_no_mlflow_for_a_run_folder_that_records_it_was_not_tracked(tmp_path: Path) -> None:
    """The store exists (other sweeps were tracked there), but this run's sweep ran with --no-track."""
    recipe = {**RECIPE, "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    (tmp_path / "mlflow.db").write_bytes(b"")
    assert gate_loads(recipe, '{"mlflow": false}\n', tmp_path) == []


@pytest.mark.parametrize("record", ['{"mlflow": true}\n', None])
def test_gate_looks_in_an_existing_store_for_a_run_folder_that_may_be_tracked(tmp_path: Path,
                                                                              record: str | None) -> None:
    """A run tracked, or one whose folder does not say (an older qbench's): its runs' gate tags are brought up to
    date."""
    recipe = {**RECIPE, "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    (tmp_path / "mlflow.db").write_bytes(b"")
    assert "mlflow" in gate_loads(recipe, record, tmp_path)


def test_a_gate_that_reads_no_data_table_loads_no_table_library_nor_xml_writer(tmp_path: Path) -> None:
    """The data file is gone (--no-staleness-check): judging the recorded figures by the recorded recipe needs neither
    pandas nor pyarrow, which are loaded only where the gate re-derives the slices from the data (importing the gate
    once loaded them, ~1 s of every `qbench gate`); without --junit, no XML writer either."""
    unused = ("pandas", "pyarrow", "xml.etree.ElementTree")
    assert gate_loads(RECIPE, None, tmp_path, among=unused, data=False) == []
