"""`qbench sweep` then `qbench gate` on a PyTorch source.

The gate re-derives what the sweep derived from the module's export. A forward() that never reads one of its inputs
(a row id passed along) has that input left out of the sweep's distinct-input digests, as an ONNX file's is; the gate,
which has no model file in the recipe, counted the id and found every row distinct (`distinct_inputs: got
{'overall': 10, ...}, the data gives {}`): exit 2 on sound results.

A factory that loads its own checkpoint (not through model.weights) is a model whose weights the gate must follow, as
it follows an ONNX file: a checkpoint replaced after the sweep was judged on the old weights' figures (exit 0)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from swept_project import fp16_recipe, swept_project

torch = pytest.importorskip("torch")

from qbench.cli.app import main  # noqa: E402
from qbench.results.schema import read_results  # noqa: E402

PACKAGE = "gate_ids_pkg"
LOADING = "gate_ckpt_pkg"
MODELS = '''
import torch


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, row_id):
        return self.head(x)
'''
LOADS_ITS_CHECKPOINT = '''
from pathlib import Path

import torch


def build():
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(torch.load(Path(__file__).parent / "checkpoint.pt", weights_only=True))
    return model
'''


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """40 rows repeating 10 feature rows, each with its own id fed to `row_id`, swept once (FP16); the recipe file."""
    root = tmp_path_factory.mktemp("ids")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "models.py").write_text(MODELS)
    rng = np.random.default_rng(0)
    features = np.tile(rng.normal(size=(10, 4)).astype(np.float32), (4, 1))
    pd.DataFrame({"x": list(features), "rid": np.arange(40, dtype=np.int64), "label": rng.integers(0, 3, 40),
                  "half": np.where(np.arange(40) % 2 == 0, "a", "b")}).to_parquet(root / "data.parquet")  # fmt: skip
    recipe = fp16_recipe(
        "gate-ids",
        {"torch": f"{PACKAGE}.models:Scorer", "example_inputs": {"x": [1, 4], "row_id": [1]},
         "input_dtypes": {"row_id": "int64"}},
        {"path": "data.parquet", "inputs": {"x": "x", "rid": "row_id"}, "label": "label", "slices": [{"by": "half"}]},
    )  # fmt: skip
    with swept_project(root, recipe, (PACKAGE,)) as recipe_file:
        yield recipe_file


@pytest.fixture
def loads_its_checkpoint(tmp_path: Path) -> Iterator[Path]:
    """A factory loading `checkpoint.pt` beside it, swept once (FP16) on labels its weights give; the recipe file."""
    (tmp_path / LOADING).mkdir()
    (tmp_path / LOADING / "__init__.py").write_text("")
    (tmp_path / LOADING / "models.py").write_text(LOADS_ITS_CHECKPOINT)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    torch.save(model.state_dict(), tmp_path / LOADING / "checkpoint.pt")
    features = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    with torch.no_grad():
        labels = model(torch.from_numpy(features)).argmax(dim=1).numpy()
    pd.DataFrame({"x": list(features), "label": labels.astype(np.int64)}).to_parquet(tmp_path / "data.parquet")
    recipe = fp16_recipe("gate-ckpt", {"torch": f"{LOADING}.models:build", "example_inputs": {"x": [1, 4]}},
                         {"path": "data.parquet", "inputs": {"x": "x"}, "label": "label"},
                         gate_metric="accuracy")  # fmt: skip
    with swept_project(tmp_path, recipe, (LOADING,)) as recipe_file:
        yield recipe_file


def test_a_checkpoint_the_factory_loads_itself_replaced_after_the_sweep_makes_the_results_stale(
    loads_its_checkpoint: Path, capsys
) -> None:
    assert main(["gate", str(loads_its_checkpoint)]) == 0
    capsys.readouterr()
    torch.manual_seed(1)
    torch.save(torch.nn.Linear(4, 3).state_dict(), loads_its_checkpoint.parent / LOADING / "checkpoint.pt")
    assert main(["gate", str(loads_its_checkpoint)]) == 2
    out = capsys.readouterr().out
    assert f"stale results: model.torch read {LOADING}/checkpoint.pt (" in out


def _results(recipe: Path):
    return read_results(next((recipe.parent / "runs" / "gate-ids").glob("*/results.json")))


def test_the_sweep_counts_the_rows_by_the_inputs_forward_reads(swept: Path) -> None:
    assert _results(swept).distinct_inputs == {"overall": 10, "half=a": 5, "half=b": 5}


def test_the_gate_counts_them_from_the_export_the_sweep_measured(swept: Path, capsys) -> None:
    assert main(["gate", str(swept)]) == 0
    out = capsys.readouterr().out
    assert "distinct_inputs" not in out
    assert "10 distinct inputs" in out  # the resolution note counts the inputs, not the ids


def test_with_the_export_gone_the_gate_fails_closed_and_says_why(swept: Path, capsys) -> None:
    """Gated on another machine (no export cache), the ids cannot be told unread: the counts differ, and a note says
    that is why rather than leaving the results looking edited."""
    (fp32,) = [v for v in _results(swept).variants if v.variant == "fp32"]
    export = Path(fp32.model_path)
    moved = export.with_name("moved.onnx")
    shutil.move(export, moved)
    try:
        assert main(["gate", str(swept)]) == 2
    finally:
        shutil.move(moved, export)
    out = capsys.readouterr().out
    assert "distinct_inputs: got {'overall': 10" in out
    assert "re-derived without the ONNX export the sweep measured" in out
