"""The rows a QAT variant fine-tunes on (qbench.preflight, qbench.data.training_rows): never an evaluation row.

A QAT variant that saw the evaluation rows reports a flattering accuracy, which the gate would pass:
without `qat.train.filter` it trains on every row that is not evaluated, and a filter that selects
evaluation rows is a recipe error naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.data import training_rows
from qbench.errors import RecipeError
from qbench.recipe.spec import load_recipe

torch = pytest.importorskip("torch")

FEATURES = 4
FACTORY = """
from torch import nn

def build():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PyTorch MLP (its factory in the folder: one per process), 40 train / 20 calib / 30 eval rows."""
    root = tmp_path_factory.mktemp("qat_rows")
    (root / "tinymlp.py").write_text(FACTORY)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    torch.save(module.state_dict(), root / "weights.pt")
    x = np.random.default_rng(0).normal(size=(90, FEATURES)).astype(np.float32)
    with torch.no_grad():
        labels = module(torch.from_numpy(x)).argmax(dim=1).numpy()
    split = ["train"] * 40 + ["calib"] * 20 + ["eval"] * 30
    pd.DataFrame({"x": list(x), "label": labels, "split": split}).to_parquet(root / "data.parquet")
    return root


def _recipe(root: Path, name: str, qat: dict[str, Any], evaluation: dict[str, Any]) -> Path:
    recipe = {
        "name": "qat-rows",
        "model": {"torch": "tinymlp:build", "weights": "weights.pt", "example_inputs": {"features": [1, FEATURES]},
                  "output_names": ["scores"]},
        "data": {"path": "data.parquet", "inputs": {"x": "features"}, "label": "label",
                 "calibration": {"filter": {"split": "calib"}, "samples": 16}, "evaluation": evaluation},
        "variants": [{"name": "int8-qat", "precision": "int8", "calibrator": "minmax", "qat": qat}],
        "backends": ["onnxruntime-cpu"],
        "output_dir": "reports",
    }  # fmt: skip
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _training_row_values(prepared: Any) -> set[tuple[float, ...]]:
    return {tuple(row) for row in prepared.training["int8-qat"].feeds["features"].tolist()}


def test_without_a_filter_qat_trains_on_every_row_not_evaluated(project: Path) -> None:
    from qbench.preflight.prepare import prepare

    recipe = _recipe(project, "default", {"loss": "label"}, {"filter": {"split": "eval"}, "limit": 20})
    prepared = prepare(load_recipe(recipe), track=False, destinations=False)
    evaluated = {tuple(row) for row in prepared.evaluation_feeds["features"].tolist()}
    trained = _training_row_values(prepared)
    assert len(evaluated) == 20 and not trained & evaluated
    # every other row: 40 train + 20 calib + the 10 eval rows past the evaluation limit
    assert len(trained) == 70
    assert len(prepared.training["int8-qat"].labels) == 70


def test_a_filter_selecting_evaluation_rows_is_refused_naming_the_field(project: Path) -> None:
    from qbench.preflight.prepare import prepare

    recipe = _recipe(project, "overlap", {"loss": "label", "train": {"filter": {"split": {"ne": "calib"}}}},
                      {"filter": {"split": "eval"}})  # fmt: skip
    with pytest.raises(RecipeError) as error:
        prepare(load_recipe(recipe), track=False, destinations=False)
    assert str(error.value).startswith(
        f"{recipe}: variants[0].qat.train.filter: selects 30 of the 30 evaluation rows (e.g. row 60 of "
    )
    assert "\n" not in str(error.value)


def test_a_filter_apart_from_the_evaluation_rows_is_kept_as_written(project: Path) -> None:
    from qbench.preflight.prepare import prepare

    recipe = _recipe(project, "apart", {"loss": "distill", "train": {"filter": {"split": "train"}, "limit": 25}},
                      {"filter": {"split": "eval"}})  # fmt: skip
    prepared = prepare(load_recipe(recipe), track=False, destinations=False)
    table = pd.read_parquet(project / "data.parquet")
    assert _training_row_values(prepared) == {tuple(row) for row in table["x"][:25].map(list)}


def test_every_row_evaluated_leaves_nothing_to_train_on() -> None:
    table = pd.DataFrame({"split": ["eval"] * 4})
    with pytest.raises(RecipeError, match=r"r\.yaml: variants\[2\]\.qat\.train\.filter: every one of the 4 rows"):
        training_rows(table, None, np.arange(4), field="variants[2].qat.train.filter", recipe_file=Path("r.yaml"))
    kept = training_rows(table, None, np.array([0, 2]), field="f", recipe_file=Path("r.yaml"))
    assert kept.tolist() == [1, 3]


def test_qat_label_loss_reads_one_zero_one_column_per_label(project: Path) -> None:
    """A multilabel recipe naming one 0/1 column per label (qbench.data.labels) trains QAT on them as the rows'
    label lists: the module's 3 outputs read as 3 labels, its arg-max one-hot spread over 3 boolean columns."""
    from qbench.preflight.prepare import prepare
    from qbench.tasks import get_task

    table = pd.read_parquet(project / "data.parquet")
    onehot = np.eye(3, dtype=np.int64)[table["label"].to_numpy()]
    for index, name in enumerate(("a", "b", "c")):
        table[name] = onehot[:, index].astype(bool)
    table.to_parquet(project / "wide.parquet")
    path = _recipe(project, "wide", {"loss": "label", "train": {"filter": {"split": "train"}}},
                   {"filter": {"split": "eval"}})  # fmt: skip
    recipe = yaml.safe_load(path.read_text())
    recipe.update(task="multilabel", gate={"metric": "micro_f1"})
    recipe["data"].update(path="wide.parquet", label=["a", "b", "c"])
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    prepared = prepare(load_recipe(path), track=False, destinations=False)
    trained = prepared.training["int8-qat"].labels
    assert trained.tolist() == onehot[:40].tolist() and prepared.labels.tolist() == onehot[60:].tolist()
    targets = get_task("multilabel").qat_label_targets(trained, torch.zeros(40, 3))
    assert targets.tolist() == onehot[:40].astype(float).tolist()


@pytest.mark.parametrize(("split", "field"),
                         [("train", r"variants\[0\]\.qat\.train\.filter"), ("calib", r"data\.calibration")])
def test_qat_under_keep_refuses_nan_rows_it_would_train_or_calibrate_on(project: Path, split: str, field: str) -> None:
    """`data.nonfinite_inputs: keep` feeds NaN to evaluation and calibration; QAT's fake quantization (in training and
    in the observers that calibrate) would turn it into numbers: a recipe error naming the field and what to do, not
    a message suggesting the `keep` already set, nor a QAT variant calibrated on NaN."""
    from qbench.preflight.prepare import prepare

    table = pd.read_parquet(project / "data.parquet")
    cells = [np.array(cell, dtype=np.float32) for cell in table["x"]]
    first = int(np.flatnonzero(table["split"].to_numpy() == split)[0])
    cells[first][1] = np.nan
    table["x"] = cells
    table.to_parquet(project / f"nan_{split}.parquet")
    path = _recipe(project, f"nan_{split}", {"loss": "label", "train": {"filter": {"split": "train"}}},
                   {"filter": {"split": "eval"}})  # fmt: skip
    recipe = yaml.safe_load(path.read_text())
    recipe["data"].update(path=f"nan_{split}.parquet", nonfinite_inputs="keep")
    recipe["data"]["calibration"]["samples"] = 20  # every calibration row, the NaN one too
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    with pytest.raises(RecipeError, match=rf"nan_{split}\.yaml: {field}: QAT variant 'int8-qat' .*'x': 1 row\b") as error:
        prepare(load_recipe(path), track=False, destinations=False)
    message = str(error.value)
    assert "\n" not in message and "nonfinite_inputs: drop" in message and "(keep: to feed them" not in message
