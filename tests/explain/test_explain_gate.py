"""qbench explain ranks by the gate: a node that breaks one slice ranks above one that costs more overall, within
tolerance. The model is built here: `spread` adds a little error on every row, `rare_only` ruins the rows of one slice
(a branch only those rows use), so the gate breaches on that slice alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import get_backend
from qbench.explain.rank import Score
from qbench.explain.sensitivity import _Evaluator, explain_table, explain_variant
from qbench.gate.tolerance import Tolerances
from qbench.preflight.prepare import prepare
from qbench.recipe.spec import load_recipe
from qbench.variants import BuildContext, build_variant

WIDTH = 16
RARE_SHARE = 0.03  # of the rows: the branch that breaks them costs little overall
GATE = {"metric": "accuracy", "max_drop": 0.06, "max_slice_drop": 0.05}


def slice_breaking_model(path: Path, spread_outlier: float, rare_outlier: float) -> Path:
    """y = head(relu(spread(x) + rare_only(x) * x[:, 15])): each MatMul's input has channel 1 multiplied by its outlier
    (its weights undo that: FP32 is unchanged), so per-tensor INT8 rounds that input's other channels coarsely."""
    rng = np.random.default_rng(0)
    weights: dict[str, np.ndarray] = {}
    nodes = []
    for name, outlier, gain in (("spread", spread_outlier, 1.0), ("rare_only", rare_outlier, 3.0)):
        scale, weight = np.ones(WIDTH), rng.normal(size=(WIDTH, WIDTH)) * gain / 4
        scale[1], weight[1], weight[15] = outlier, weight[1] / outlier, 0.0
        weights |= {f"s_{name}": scale, f"w_{name}": weight}
        nodes += [helper.make_node("Mul", ["x", f"s_{name}"], [f"x_{name}"], name=f"scale_{name}"),
                  helper.make_node("MatMul", [f"x_{name}", f"w_{name}"], [f"h_{name}"], name=name)]  # fmt: skip
    weights["w_head"] = rng.normal(size=(WIDTH, 4)) / 2
    indices = [numpy_helper.from_array(np.array([v], np.int64), k)
               for k, v in (("start", 15), ("end", 16), ("axis", 1))]
    nodes += [helper.make_node("Slice", ["x", "start", "end", "axis"], ["flag"], name="rare_flag"),
              helper.make_node("Mul", ["h_rare_only", "flag"], ["h_masked"], name="mask"),
              helper.make_node("Add", ["h_spread", "h_masked"], ["h"], name="join"),
              helper.make_node("Relu", ["h"], ["r"], name="relu"),
              helper.make_node("MatMul", ["r", "w_head"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "slice_breaking",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()] + indices,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 evaluation rows (3 % of them rare: x[:, 15] = 1), labelled with FP32's class."""
    root = tmp_path_factory.mktemp("slice_breaking")
    model = slice_breaking_model(root / "model.onnx", spread_outlier=12.0, rare_outlier=100.0)
    rng = np.random.default_rng(1)
    rows = 200 + 3000
    x = rng.normal(size=(rows, WIDTH)).astype(np.float32)
    rare = rng.random(rows) < RARE_SHARE
    x[:, 15] = rare
    label = ort.InferenceSession(str(model)).run(None, {"x": x})[0].argmax(1)
    pd.DataFrame({"x": list(x), "label": label, "split": ["calib"] * 200 + ["eval"] * 3000,
                  "kind": np.where(rare, "rare", "normal")}).to_parquet(root / "data.parquet")  # fmt: skip
    recipe = {
        "name": "slice-breaking", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "data.parquet", "inputs": {"x": "x"}, "label": "label",
                 "calibration": {"filter": {"split": "calib"}, "samples": 200},
                 "evaluation": {"filter": {"split": "eval"}, "batch_size": 500}, "slices": [{"by": "kind"}]},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax", "op_types": ["MatMul"]}],
        "gate": GATE, "output_dir": "reports",
    }  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "recipe.yaml"


@pytest.mark.parametrize("method", ["leave_one_out", "one_at_a_time"])
def test_the_node_breaking_the_gate_on_a_slice_ranks_first(project, method):
    """`spread` costs more overall than `rare_only`, within max_drop; only `rare_only` breaches the gate (on
    kind=rare): it is the node to keep float, so it ranks first and the table shows the breach it accounts for."""
    result = explain_variant(load_recipe(project), "int8", method=method)
    costs = {c.group: c for c in result.costs}
    print(method, [(c.group, round(c.breach, 4), round(c.overall, 4), round(c.worst_slice, 4)) for c in result.costs])
    assert result.worst_slice == "kind=rare" and result.breach > 0
    assert costs["spread"].overall > costs["rare_only"].overall  # what the ranking used to put first
    assert result.costs[0].group == "rare_only"
    assert costs["rare_only"].breach > costs["spread"].breach
    header = [column.header for column in explain_table(result, 10).columns]
    assert header[3] == ("breach recovered" if method == "leave_one_out" else "breach alone")


def test_keeping_the_top_node_float_passes_the_gate(project, tmp_path):
    """What the ranking points at is the fix: the variant rebuilt with its first node in `exclude_nodes` is within
    the gate overall and on every slice, and with the node the overall drop ranks first it is not."""
    recipe = load_recipe(project)
    result = explain_variant(recipe, "int8", method="leave_one_out")
    by_overall = max(result.costs, key=lambda c: c.overall).group
    assert by_overall != result.costs[0].group
    prepared = prepare(recipe)
    evaluator = _Evaluator(prepared, get_backend("onnxruntime-cpu"))
    spec = next(v for v in recipe.variants if v.name == "int8")

    def breach(excluded: str) -> float:
        ctx = BuildContext(prepared.source.onnx_path, tmp_path / excluded, prepared.calibration_batches)
        built = build_variant(spec.model_copy(update={"exclude_nodes": [excluded]}), ctx)
        return evaluator.score(built).breach(evaluator.tolerances)

    assert breach(result.costs[0].group) == 0.0
    assert breach(by_overall) > 0.0


def test_breach_sums_what_is_past_each_tolerance():
    tolerances = Tolerances(max_drop=0.02, max_slice_drop=0.05)
    assert Score(0.03, {"a": 0.10, "b": 0.01}, 0.0).breach(tolerances) == pytest.approx(0.01 + 0.05)
    assert Score(0.01, {"a": 0.04}, 0.0).breach(tolerances) == 0.0
    assert math.isnan(Score(0.03, {}, 0.0).breach(None))
