"""Fresh results: code the recipe's code imports is an input too. A PyTorch project keeps its model's class in one
module (`layers.py`) and the factory the recipe names in another; a custom metric calls a helper module. The gate
compared only the named modules' files, so an edit to the class left the old figures judged: exit 0 on results of
a model no longer in the project."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from swept_project import fp16_recipe, swept_project

from qbench.cli.app import main
from qbench.provenance import PROJECT_MODULE_INPUT
from qbench.results.schema import read_results

PACKAGE = "fresh_gate_pkg"
METRICS = "fresh_gate_metrics"
HELPER = "fresh_gate_metric_helper"
LAZY = "fresh_gate_lazy_helper"  # imported by the metric when first called: by the dry run, after the preparation
LAYERS = '''\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, features):
        return self.head(torch.relu(self.hidden(features)))
'''
FACTORY = f"from {PACKAGE}.layers import Net\n\n\ndef build():\n    return Net()\n"
METRIC = (f"from {HELPER} import share_decided\n\n\ndef decided(outputs, labels):\n    from {LAZY} import scaled\n\n"
          "    return scaled(share_decided(outputs, labels))\n")  # fmt: skip
LAZY_SOURCE = "def scaled(share):\n    return share\n"
HELPER_SOURCE = "def share_decided(outputs, labels):\n    return float((outputs.argmax(axis=1) == labels).mean())\n"


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A torch project whose factory builds a class of another module, with a custom metric calling a helper module,
    swept once (FP16 on ONNX Runtime); the folder swept."""
    root = tmp_path_factory.mktemp("swept")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "layers.py").write_text(LAYERS)
    (root / PACKAGE / "factory.py").write_text(FACTORY)
    (root / f"{METRICS}.py").write_text(METRIC)
    (root / f"{HELPER}.py").write_text(HELPER_SOURCE)
    (root / f"{LAZY}.py").write_text(LAZY_SOURCE)
    namespace: dict[str, object] = {}
    exec(compile(LAYERS, "layers.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Net"]().eval()  # type: ignore[operator]
    torch.save(model.state_dict(), root / "weights.pt")
    features = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
    with torch.no_grad():
        labels = model(torch.from_numpy(features)).argmax(dim=1).numpy()
    pd.DataFrame({"x": list(features), "label": labels.astype(np.int64)}).to_parquet(root / "data.parquet")
    recipe = fp16_recipe(
        "fresh-gate",
        {"torch": f"{PACKAGE}.factory:build", "weights": "weights.pt", "example_inputs": {"features": [1, 8]},
         "output_names": ["scores"]},
        {"path": "data.parquet", "inputs": {"x": "features"}, "label": "label"},
        metrics=[{"name": "decided", "function": f"{METRICS}:decided", "higher_is_better": True}],
    )  # fmt: skip
    with swept_project(root, recipe, (PACKAGE, METRICS, HELPER, LAZY)):
        yield root


@pytest.fixture
def checkout(swept: Path, tmp_path: Path) -> Path:
    """The swept project with its run folder, copied elsewhere (as a CI job checks a project out and downloads its
    runs); its recipe file."""
    shutil.copytree(swept, tmp_path / "project")
    return tmp_path / "project" / "recipe.yaml"


def test_the_results_record_every_module_of_the_project_the_recipes_code_imported(swept: Path) -> None:
    results = read_results(next((swept / "runs" / "fresh-gate").glob("*/results.json")))
    modules = {name.removeprefix(PROJECT_MODULE_INPUT) for name in results.inputs
               if name.startswith(PROJECT_MODULE_INPUT)}  # fmt: skip
    assert modules == {PACKAGE, f"{PACKAGE}.layers", HELPER, LAZY}  # the factory's and the metric's are inputs already


def test_unchanged_code_of_a_project_checked_out_elsewhere_is_fresh(checkout: Path, capsys) -> None:
    assert main(["gate", str(checkout)]) == 0
    assert "stale" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edited", "module"),
    [(f"{PACKAGE}/layers.py", f"{PACKAGE}.layers"), (f"{HELPER}.py", HELPER), (f"{LAZY}.py", LAZY)],
    ids=["the model's class", "a custom metric's helper", "a helper the metric imports as it runs"],
)
def test_an_edit_to_a_module_the_recipes_code_imports_makes_the_results_stale(
    checkout: Path, capsys, edited: str, module: str
) -> None:
    """The module's code now computes something else (here: one line more); the results describe the code swept."""
    path = checkout.parent / edited
    path.write_text(path.read_text() + "\nEDITED = True\n")
    assert main(["gate", str(checkout)]) == 2
    out = capsys.readouterr().out
    assert f"stale results: {PROJECT_MODULE_INPUT}{module} (" in out
    assert "changed since the sweep" in out


def test_a_module_no_import_finds_now_makes_the_results_stale(checkout: Path, capsys, monkeypatch) -> None:
    """The helper was deleted from the checkout (the metric's module now computes its figure another way): its
    file where the sweep ran says nothing of the project judged. A gate runs in a new process, where no import of
    the sweep's is left (the fixture's sweep ran in this one)."""
    (checkout.parent / f"{HELPER}.py").unlink()
    monkeypatch.delitem(sys.modules, HELPER)
    assert main(["gate", str(checkout)]) == 2
    assert HELPER in capsys.readouterr().out
