"""The digits demo's model, data table and recipe, and the "user's own model" fixture project."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest

from qbench.demo import digits
from qbench.errors import MissingExtraError
from qbench.recipe.spec import load_recipe

REPO_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits.yaml"
MIN_SLICE_ROWS = 100
MIN_CLEAN_ACCURACY = 0.95


def _table(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / digits.DATA_FILE)


def _predict(model_path: Path, rows: pd.DataFrame) -> np.ndarray:
    images = np.stack(rows["pixels"].to_list()).astype(np.float32).reshape(-1, 1, 8, 8)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"input": images})
    return logits


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


# -- model ------------------------------------------------------------------------------------


def test_model_has_the_documented_interface_and_a_dynamic_batch(digits_project: Path) -> None:
    model = onnx.load(str(digits_project / digits.MODEL_FILE))
    onnx.checker.check_model(model)
    (graph_input,) = model.graph.input
    (graph_output,) = model.graph.output
    input_dims = [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    output_dims = [d.dim_param or d.dim_value for d in graph_output.type.tensor_type.shape.dim]
    assert (graph_input.name, input_dims) == ("input", ["batch", 1, 8, 8])
    assert (graph_output.name, output_dims) == ("logits", ["batch", 10])
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == digits.OPSET

    rows = _table(digits_project).iloc[:7]
    assert _predict(digits_project / digits.MODEL_FILE, rows).shape == (7, 10)


def test_fp32_accuracy_on_clean_eval_rows_reaches_the_bar(digits_project: Path) -> None:
    table = _table(digits_project)
    evaluation = table[table["split"] == "eval"].reset_index(drop=True)
    correct = _predict(digits_project / digits.MODEL_FILE, evaluation).argmax(axis=1) == evaluation["label"].to_numpy()
    per_slice = {
        f"{column}={value}": float(correct[group.index].mean())
        for column in ("condition", "contrast")
        for value, group in evaluation.groupby(column)
    }
    print(f"FP32 eval accuracy {correct.mean():.3f}, per slice {per_slice}")
    assert per_slice["condition=clean"] >= MIN_CLEAN_ACCURACY


def test_export_check_rejects_a_model_that_differs_from_the_onnx_file(digits_project: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(123)
    untrained = digits.digits_cnn().eval()
    images = np.zeros((4, 1, 8, 8), dtype=np.float32) + 0.5
    with pytest.raises(RuntimeError, match="differ from torch"):
        digits.check_onnx_matches_torch(untrained, digits_project / digits.MODEL_FILE, images)


# -- data table -------------------------------------------------------------------------------


def test_table_has_the_columns_and_types_the_recipe_uses(digits_project: Path) -> None:
    table = _table(digits_project)
    assert set(table.columns) == {"source_index", "pixels", "label", "split", "condition", "contrast", "ink"}
    pixels = np.stack(table["pixels"].to_list())
    assert pixels.shape == (len(table), 64)
    assert pixels.dtype == np.float32
    assert pixels.min() >= 0.0 and pixels.max() <= 1.0
    assert table["label"].dtype == np.int64
    assert set(table["label"]) == set(range(10))
    assert np.allclose(table["ink"].to_numpy(), pixels.mean(axis=1), atol=1e-6)


def test_splits_are_disjoint_by_source_image(digits_project: Path) -> None:
    table = _table(digits_project)
    images, _ = digits.load_digits_images()
    members = {name: set(rows["source_index"]) for name, rows in table.groupby("split")}
    assert set(members) == {"train", "calib", "eval"}
    assert members["train"].isdisjoint(members["calib"])
    assert members["train"].isdisjoint(members["eval"])
    assert members["calib"].isdisjoint(members["eval"])
    assert set().union(*members.values()) == set(range(len(images)))
    assert (len(members["train"]), len(members["calib"])) == (digits.TRAIN_IMAGES, digits.CALIB_IMAGES)


def test_perturbations_land_only_where_documented(digits_project: Path) -> None:
    table = _table(digits_project)
    by_split = {name: rows for name, rows in table.groupby("split")}
    train = by_split["train"]
    assert set(train["condition"]) == {"clean"} and set(train["contrast"]) == {"normal"}
    assert set(by_split["calib"]["contrast"]) == {"normal"}
    for name in ("calib", "eval"):
        noisy_share = (by_split[name]["condition"] == "noisy").mean()
        assert abs(noisy_share - digits.NOISY_FRACTION) < 0.01, (name, noisy_share)
    low_share = (by_split["eval"]["contrast"] == "low").mean()
    assert abs(low_share - digits.LOW_CONTRAST_FRACTION) < 0.01

    # Clean, normal-contrast rows are the source images untouched; the others were changed.
    images, labels = digits.load_digits_images()
    source = images[table["source_index"].to_numpy()]
    stored = np.stack(table["pixels"].to_list())
    untouched = ((table["condition"] == "clean") & (table["contrast"] == "normal")).to_numpy()
    assert np.array_equal(stored[untouched], source[untouched])
    assert not np.isclose(stored[~untouched], source[~untouched]).all(axis=1).any()
    assert np.array_equal(table["label"].to_numpy(), labels[table["source_index"].to_numpy()])


def test_table_is_deterministic_per_seed() -> None:
    images, labels = digits.load_digits_images()
    first, again = digits.build_digits_table(images, labels, seed=0), digits.build_digits_table(images, labels, seed=0)
    other = digits.build_digits_table(images, labels, seed=1)
    pd.testing.assert_frame_equal(first.drop(columns="pixels"), again.drop(columns="pixels"))
    assert np.array_equal(np.stack(first["pixels"].to_list()), np.stack(again["pixels"].to_list()))
    assert not first["split"].equals(other["split"])


def test_command_line_rebuilds_identical_assets(digits_project: Path, tmp_path: Path) -> None:
    assert digits.main(["--out", str(tmp_path), "--seed", "0"]) == 0
    pd.testing.assert_frame_equal(_table(tmp_path), _table(digits_project))
    rebuilt, original = _initializers(tmp_path / digits.MODEL_FILE), _initializers(digits_project / digits.MODEL_FILE)
    assert rebuilt.keys() == original.keys()
    assert all(np.array_equal(rebuilt[name], original[name]) for name in original)


def test_missing_torch_names_the_demo_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"qbench\[demo\]"):
        digits.make_digits_demo(Path("unused"))


# -- recipe -----------------------------------------------------------------------------------


def test_recipe_resolves_to_the_generated_assets(digits_project: Path) -> None:
    recipe_path = digits_project / digits.RECIPE_FILE
    assert recipe_path.read_bytes() == REPO_RECIPE.read_bytes()
    recipe = load_recipe(recipe_path)
    assert recipe.model_path == (digits_project / digits.MODEL_FILE).resolve()
    assert recipe.data_path == (digits_project / digits.DATA_FILE).resolve()
    assert [v.name for v in recipe.all_variants()] == [
        "fp32", "fp16", "int8-minmax", "int8-entropy", "int8-p99.9", "int8-dynamic", "fp8"
    ]  # fmt: skip
    gated = [v.name for v in recipe.all_variants() if recipe.gate.applies(v.name)]
    assert gated == ["int8-minmax", "int8-entropy", "int8-p99.9", "int8-dynamic", "fp8"]


def test_recipe_slices_are_real_sub_populations(digits_project: Path) -> None:
    from qbench.preflight.prepare import prepare

    prepared = prepare(load_recipe(digits_project / digits.RECIPE_FILE))
    sizes = {name: int(mask.sum()) for name, mask in prepared.slices.items()}
    print(f"slice sizes over {len(prepared.evaluation_rows)} eval rows: {sizes}")
    assert set(sizes) == {"condition=clean", "condition=noisy", "contrast=low", "contrast=normal", "faint"}
    assert min(sizes.values()) >= MIN_SLICE_ROWS
    assert 0.15 <= sizes["faint"] / len(prepared.evaluation_rows) <= 0.25
    assert prepared.evaluation_feeds["input"].shape == (len(prepared.evaluation_rows), 1, 8, 8)


# -- the user's own project -------------------------------------------------------------------


def test_user_project_is_a_complete_recipe_with_its_own_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from user_model import make_user_project

    from qbench.preflight.prepare import prepare

    recipe = load_recipe(make_user_project(tmp_path))
    assert recipe.model_path.is_relative_to(tmp_path.resolve())
    assert recipe.tracking.uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert recipe.gate.metric == "agreement"

    session = ort.InferenceSession(str(recipe.model_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["features"]
    assert [o.name for o in session.get_outputs()] == ["scores"]

    prepared = prepare(recipe)
    table = pd.read_parquet(recipe.data_path)
    assert set(table["subset"]) == {"calib", "test"}
    assert set(prepared.slices) == {"band=small", "band=medium", "band=large"}
    (scores,) = session.run(["scores"], {"features": prepared.evaluation_feeds["features"][:16]})
    assert scores.shape == (16, 2)
    accuracy = (session.run(["scores"], prepared.evaluation_feeds)[0].argmax(axis=1) == prepared.labels).mean()
    print(f"user model FP32 test accuracy {accuracy:.3f}")
    assert accuracy > 0.9
