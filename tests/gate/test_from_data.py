"""`qbench gate` re-derives from the recipe's data what the sweep derived from it (the evaluation rows: filter, then
the NaN/inf input policy, then the limit; the slices over those rows and their sizes), and judges a metric the data
leaves undefined on a slice as not judgeable there. Real sweeps of tiny linear models built here (a few seconds each).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from sweep_factory import resign

from qbench.cli.app import main

ROWS = 160
CALIBRATION = 60  # the first rows are split=calib, the others split=eval
KINDS = ("a", "b")


def linear_model(path: Path, weights: np.ndarray, output: str) -> None:
    import onnx

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], [output])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weights.shape[0]])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", weights.shape[1]])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def classifier_project(root: Path, *, edit: Callable[[pd.DataFrame], None] | None = None, table: str = "rows.parquet",
                       data: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """A 4 -> 3 linear classifier (labels: its own top-1), FP32 and FP16, sliced by `kind`; `edit` changes the table."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(4, 3))
    linear_model(root / "model.onnx", weights, "logits")
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    rows = pd.DataFrame({"x": list(x), "y": np.argmax(x @ weights, axis=1),
                         "kind": [KINDS[i % 2] for i in range(ROWS)],
                         "split": ["calib" if i < CALIBRATION else "eval" for i in range(ROWS)]})  # fmt: skip
    if edit is not None:
        edit(rows)
    if table.endswith(".jsonl"):
        rows.to_json(root / table, orient="records", lines=True)  # keeps 1 and '1' apart
    else:
        rows.to_parquet(root / table)
    body = {"data": {"path": table, "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "kind"}], **(data or {})}}
    return write_recipe(root, body, gate={"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5})


def write_recipe(root: Path, body: dict[str, Any], *, gate: dict[str, Any], task: str = "classification") -> Path:
    body["data"] |= {"calibration": {"filter": {"split": "calib"}, "samples": CALIBRATION},
                     "evaluation": {"filter": {"split": "eval"}}}  # fmt: skip
    recipe = {"name": "tiny", "task": task, "model": {"path": "model.onnx"}, **body,
              "variants": [{"name": "fp16", "precision": "fp16"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1},
              "analysis": {"ranges": False}, "gate": gate, "output_dir": "reports"}  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def swept(recipe: Path, *flags: str) -> Path:
    assert main(["sweep", str(recipe), "--no-track", *flags]) == 0
    [results] = sorted((recipe.parent / "reports").glob("*/*/results.json"))
    return results


def forged(results: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    raw = copy.deepcopy(json.loads(results.read_text()))
    edit(raw)
    path = results.parent.parent / "forged.json"
    path.write_text(json.dumps(resign(raw)))
    return path


def without_slice(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        for variant in raw["variants"]:
            variant["accuracy"]["slices"] = [s for s in variant["accuracy"]["slices"] if s["name"] != name]

    return edit


def shown(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


# -- the slices a sweep makes are the gate's -------------------------------------------------------


def many_calibration_sites(rows: pd.DataFrame) -> None:
    """2 sites among the evaluation rows, 60 more among calibration's (over the 50 slices a column may make)."""
    rows["site"] = [f"s{i}" if i < CALIBRATION else ("east" if i % 2 else "west") for i in range(ROWS)]


def text_one_in_calibration(rows: pd.DataFrame) -> None:
    """Evaluation rows hold 1 (a number) and 'x'; calibration rows the text '1': both would be slice 'tag=1'."""
    rows["site"] = pd.Series(["1" if i < CALIBRATION else (1 if i % 2 else "x") for i in range(ROWS)], dtype=object)


@pytest.mark.parametrize(
    ("edit", "table"),
    [(many_calibration_sites, "rows.parquet"), (text_one_in_calibration, "rows.jsonl")],
    ids=["over-50-values-among-calibration-rows", "1-and-text-1-apart-in-calibration-rows"],
)
def test_slices_made_only_of_evaluation_rows_give_the_sweeps_verdict(tmp_path: Path, capsys, edit, table):
    """A `by` column's values only calibration rows hold make no slice, in the sweep and in the gate alike."""
    recipe = classifier_project(tmp_path, edit=edit, table=table, data={"slices": [{"by": "site"}]})
    swept(recipe, "--gate")
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 0, shown(capsys)
    assert "gate: PASS — 1 variant × 3 scopes" in shown(capsys)


def one_nan_evaluation_row(rows: pd.DataFrame) -> None:
    rows.at[ROWS - 1, "x"] = np.array([np.nan, 0.0, 0.0, 0.0], np.float32)


@pytest.mark.parametrize(
    ("edit", "data", "flags"),
    [
        (one_nan_evaluation_row, {"nonfinite_inputs": "drop"}, ()),
        (one_nan_evaluation_row, {"nonfinite_inputs": "drop"}, ("--no-staleness-check",)),
        (None, {}, ("--no-staleness-check",)),
    ],
    ids=["nan-row-dropped", "nan-row-dropped-staleness-unchecked", "staleness-unchecked"],
)
def test_results_without_a_slice_the_data_makes_are_unusable(tmp_path: Path, capsys, edit, data, flags):
    """Re-signed results that leave out a `by` slice (on every variant) are caught, also when rows were dropped for
    NaN inputs and when staleness is not checked: the slices come from the data whenever it can be read."""
    recipe = classifier_project(tmp_path, edit=edit, data=data)
    results = swept(recipe)
    capsys.readouterr()
    assert main(["gate", str(recipe), "--results", str(forged(results, without_slice("kind=b"))), *flags]) == 2
    assert "fp16@onnxruntime-cpu: slice 'kind=b' missing (the recipe defines it)" in shown(capsys)


def test_a_slice_only_fp32_lacks_is_unusable_without_the_data(tmp_path: Path, capsys):
    """Without the data file (--no-staleness-check) the gate requires the recipe's named slices alone; results whose
    FP32 lacks a `by` slice its variant has judged the variant on FP32's slices only and passed (exit 0), the
    variant's slice unjudged. Every variant is measured on the same rows, so a slice either side lacks is unusable."""
    recipe = classifier_project(tmp_path)
    results = swept(recipe)

    def fp32_without_kind_b(raw: dict[str, Any]) -> None:
        [fp32] = [v for v in raw["variants"] if v["variant"] == "fp32"]
        fp32["accuracy"]["slices"] = [s for s in fp32["accuracy"]["slices"] if s["name"] != "kind=b"]

    forged_results = forged(results, fp32_without_kind_b)
    (tmp_path / "rows.parquet").unlink()
    capsys.readouterr()
    assert main(["gate", "--results", str(forged_results), "--no-staleness-check"]) == 2
    assert "fp16@onnxruntime-cpu: slice 'kind=b' missing from FP32's results" in shown(capsys)


def test_the_rows_left_out_for_nan_inputs_are_the_datas(tmp_path: Path, capsys):
    recipe = classifier_project(tmp_path, edit=one_nan_evaluation_row, data={"nonfinite_inputs": "drop"})
    results = swept(recipe)
    assert main(["gate", str(recipe)]) == 0
    capsys.readouterr()
    unrecorded = forged(results, lambda raw: raw["dropped_nonfinite"].pop("evaluation"))
    assert main(["gate", str(recipe), "--results", str(unrecorded)]) == 2
    assert "dropped_nonfinite.evaluation: got {}, the data gives {'x': 1}" in shown(capsys)


def test_without_the_data_the_gate_says_the_slices_were_not_re_derived(tmp_path: Path, capsys):
    recipe = classifier_project(tmp_path)
    results = swept(recipe)
    (tmp_path / "rows.parquet").unlink()
    capsys.readouterr()
    assert main(["gate", "--results", str(results), "--no-staleness-check"]) == 0
    assert f"gate note: slices not re-derived: the data file {tmp_path / 'rows.parquet'} is gone" in shown(capsys)


# -- a metric the data leaves undefined ------------------------------------------------------------


def test_r2_undefined_on_a_constant_target_slice_is_not_judged_there(tmp_path: Path, capsys):
    """An offline sensor's target always reads 0 (its inputs are noise): R² is undefined on that slice for FP32 and
    FP16 alike. The slice is shown as not judged (never passed), the rest is judged; results that are not tampered
    with are not called unusable for it, but FP16's pass says nothing of the offline rows, so it is no pass (exit 2;
    it was exit 0) until a gated metric defined there judges them (gate.metrics: r2 and mae, exit 0) or
    gate.unresolved: note lets it count (exit 0)."""
    rng = np.random.default_rng(1)
    weights = np.array([[2.0], [-1.0], [0.5]])
    linear_model(tmp_path / "model.onnx", weights, "y")
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    offline = np.arange(ROWS) % 5 == 0
    x[offline] = rng.normal(scale=0.01, size=(int(offline.sum()), 3))
    target = (x @ weights)[:, 0] + rng.normal(scale=0.1, size=ROWS)
    target[offline] = 0.0
    table = pd.DataFrame({"x": list(x), "y": target, "sensor": np.where(offline, "offline", "online"),
                          "split": ["calib" if i < CALIBRATION else "eval" for i in range(ROWS)]})  # fmt: skip
    table.to_parquet(tmp_path / "rows.parquet")
    body = {"data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "sensor"}]}}
    r2 = {"metric": "r2", "max_drop": 0.01, "max_slice_drop": 0.01}
    recipe = write_recipe(tmp_path, copy.deepcopy(body), gate=r2, task="regression")
    swept(recipe)
    report = tmp_path / "gate.json"
    capsys.readouterr()
    assert main(["gate", str(recipe), "--json", str(report)]) == 2
    assert "UNUSABLE fp16@onnxruntime-cpu: not judged on sensor=offline (r2 is undefined on this scope for FP32 too): " \
           "no gated metric can show a drop there" in shown(capsys)  # fmt: skip
    write_recipe(tmp_path, copy.deepcopy(body), gate={**r2, "unresolved": "note"}, task="regression")
    assert main(["gate", str(recipe), "--json", str(report)]) == 0, shown(capsys)
    assert "(1 skipped: sensor=offline not judged: r2 is undefined on this scope for FP32 too)" in shown(capsys)
    checks = {c["scope"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["sensor=offline"]["status"] == "skipped"
    assert checks["sensor=offline"]["reason"] == "not judged: r2 is undefined on this scope for FP32 too"
    assert checks["sensor=online"]["status"] == checks["overall"]["status"] == "pass"
    both = {"metrics": [r2, {"metric": "mae", "max_drop": 0.01, "max_slice_drop": 0.01}]}
    write_recipe(tmp_path, copy.deepcopy(body), gate=both, task="regression")
    assert main(["gate", str(recipe), "--json", str(report)]) == 0, shown(capsys)
    offline_checks = {c["metric"]: c["status"] for c in json.loads(report.read_text())["checks"]
                      if c["scope"] == "sensor=offline"}  # fmt: skip
    assert offline_checks == {"r2": "skipped", "mae": "pass"}


# -- copies of an input ------------------------------------------------------------------------------


def every_evaluation_input_three_times(rows: pd.DataFrame) -> None:
    """Evaluation rows 60..159 are 34 inputs, each fed 3 times (the last twice): kind a 17 of them, kind b 17."""
    source = [CALIBRATION + (i - CALIBRATION) // 3 * 3 for i in range(ROWS)]
    for i in range(CALIBRATION, ROWS):
        rows.at[i, "x"], rows.at[i, "y"], rows.at[i, "kind"] = rows.at[source[i], "x"], rows.at[source[i], "y"], \
            rows.at[source[i], "kind"]


def every_evaluation_input_three_times_in_float64(rows: pd.DataFrame) -> None:
    """As every_evaluation_input_three_times, written as float64 rows whose copies differ below float32's precision
    (scaled by 1, 1 + 1e-12, 1 + 2e-12): the float32 input gets each input's copies alike."""
    every_evaluation_input_three_times(rows)
    for i in range(ROWS):
        rows.at[i, "x"] = np.asarray(rows.at[i, "x"], dtype=np.float64) * (1 + (i % 3) * 1e-12)


@pytest.mark.parametrize("copies", [every_evaluation_input_three_times, every_evaluation_input_three_times_in_float64])
def test_copies_of_an_input_do_not_resolve_a_tolerance_they_cannot(tmp_path: Path, capsys, copies):
    """100 evaluation rows of 34 distinct inputs: with max_drop 0.05 (59 rows needed) FP16's pass counted the 100
    rows and resolved it (exit 0); a variant breaking 5 % of the inputs leaves all 34 unchanged with probability
    0.95^34 = 17.5 %. The sweep records each scope's distinct inputs and the gate counts those (exit 2); results
    whose count is not the data's are unusable. Copies written in float64 values that differ where float32 cannot
    tell them apart are copies too (counted as written, 100 inputs: exit 0)."""
    recipe = classifier_project(tmp_path, edit=copies)
    raw = yaml.safe_load(recipe.read_text())
    raw["gate"] = {"metric": "accuracy", "max_drop": 0.05, "max_slice_drop": 0.5}
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2
    [results] = sorted((tmp_path / "reports").glob("*/*/results.json"))
    assert json.loads(results.read_text())["distinct_inputs"] == {"overall": 34, "kind=a": 17, "kind=b": 17}
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 2
    assert ("overall accuracy on 100 rows (34 distinct inputs: the others repeat them) < 59 needed for a drop of 0.05 "
            "(a variant changing 0.05 of the inputs leaves all 34 unchanged with probability 17.5% > "
            "5%)") in shown(capsys)  # fmt: skip
    assert main(["gate", str(recipe), "--results", str(forged(results, lambda r: r.pop("distinct_inputs")))]) == 2
    assert ("distinct_inputs: the results record none, the data gives {'overall': 34, 'kind=a': 17, 'kind=b': 17}"
            in shown(capsys))


@pytest.mark.parametrize(("stated", "inputs"), [({}, 2), ({"features": "int64"}, 3)])
def test_the_gate_counts_a_pytorch_sources_inputs_as_its_export_takes_them(tmp_path: Path, stated, inputs):
    """Without an ONNX file to read, a PyTorch source's input types are model.input_dtypes' (float32 by default):
    ids 2**24 and 2**24 + 1 are one float32 input, two int64 ones. The sweep counts them as its export takes them."""
    from qbench.gate.checks import evaluation_from_data
    from qbench.recipe.spec import load_recipe

    pd.DataFrame({"x": [[2**24], [2**24 + 1], [5]], "y": [0.0, 0.0, 1.0]}).to_parquet(tmp_path / "rows.parquet")
    model = {"torch": "absent_pkg.factory:build", "example_inputs": {"features": [1, 1]}, "input_dtypes": stated}
    recipe = {"name": "tiny", "task": "regression", "model": model, "variants": [{"name": "fp16", "precision": "fp16"}],
              "data": {"path": "rows.parquet", "inputs": {"x": "features"}, "label": "y"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    counted = evaluation_from_data(load_recipe(tmp_path / "recipe.yaml")).distinct_inputs
    assert counted == ({"overall": inputs} if inputs < 3 else {})
