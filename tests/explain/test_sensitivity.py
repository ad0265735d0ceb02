"""qbench explain: per-node sensitivity of an INT8 variant, measured on a tiny model with a deliberately fragile node.

`write_fragile_project` is shared with test_fallback.py (tests/ is on sys.path: no __init__.py files).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.explain.graph import QuantizedNode
from qbench.explain.rank import group_key
from qbench.explain.sensitivity import explain_variant, run_explain
from qbench.recipe.spec import VariantSpec, load_recipe
from qbench.variants import BuildContext, build_variant
from qbench.variants.qdq_bypass import bypass_qdq

WIDTH = 16
OUTLIER = 1000.0  # one channel this much larger than the rest: per-tensor INT8 rounds the others to zero


def fragile_model(path: Path, fragile: Sequence[str]) -> Path:
    """x -> mm1 -> Relu -> two branches (scale_a -> branch_a, scale_b -> branch_b) -> Add -> head -> y[4].

    A branch named in `fragile` multiplies one channel by OUTLIER before its MatMul (whose weights
    undo it), so FP32 is unchanged while that MatMul's per-tensor INT8 input range is ruined."""
    rng = np.random.default_rng(0)
    weights: dict[str, np.ndarray] = {"w1": rng.normal(size=(WIDTH, WIDTH)) / 4, "w3": rng.normal(size=(WIDTH, 4)) / 4}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu")]
    for branch in ("a", "b"):
        scale, weight = np.ones(WIDTH), rng.normal(size=(WIDTH, WIDTH)) / 4
        if branch in fragile:
            scale[0], weight[0, :] = OUTLIER, weight[0, :] / OUTLIER
        weights |= {f"s_{branch}": scale, f"w_{branch}": weight}
        nodes += [helper.make_node("Mul", ["r1", f"s_{branch}"], [f"o_{branch}"], name=f"scale_{branch}"),
                  helper.make_node("MatMul", [f"o_{branch}", f"w_{branch}"], [f"h_{branch}"],
                                   name=f"branch_{branch}")]  # fmt: skip
    nodes += [helper.make_node("Add", ["h_a", "h_b"], ["h2"], name="join"),
              helper.make_node("MatMul", ["h2", "w3"], ["y"], name="head")]
    return _saved_graph(path, "fragile", nodes, weights)


# the fragile project's 48 selection rows resolve no share-of-rows tolerance of its gate (0.03 needs 99 rows): a pass
# there is no pass under `fail` for the search, `calibrator: auto` and `fallback:` (tests/search/test_resolved_pass.py,
# test_fallback_resolved.py); tests of their other decisions let it count, as the 200 evaluation rows resolve it
NOTED_GATE = {"metric": "agreement", "max_drop": 0.03, "max_slice_drop": 0.05, "unresolved": "note"}
# search.time_budget_s for searches whose budget is not what a test is about: one no test machine reaches (a search
# cut by its budget stops at whichever candidate that machine's speed and load reached, and its pick changes with it)
SEARCH_BUDGET_S = 3600


def write_fragile_project(
    root: Path, variants: list[dict[str, Any]], *, fragile: Sequence[str] = ("a",), gate: dict[str, Any] | None = None
) -> Path:
    """A recipe over `fragile_model`: 96 calibration rows, 200 evaluation rows in slices half=first/second."""
    root.mkdir(parents=True, exist_ok=True)
    fragile_model(root / "model.onnx", fragile)
    rng = np.random.default_rng(1)
    rows = 296
    pd.DataFrame({
        "x": list(rng.normal(size=(rows, WIDTH)).astype(np.float32)),
        "split": ["calib"] * 96 + ["eval"] * 200,
        "half": ["first"] * 196 + ["second"] * 100,
    }).to_parquet(root / "data.parquet")  # fmt: skip
    recipe = {
        "name": "fragile", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "data.parquet", "inputs": {"x": "x"},
                 "calibration": {"filter": {"split": "calib"}, "samples": 96},
                 "evaluation": {"filter": {"split": "eval"}, "batch_size": 50}, "slices": [{"by": "half"}]},
        "variants": variants, "latency": {"batch_sizes": [1, 8], "warmup": 2, "iterations": 10, "threads": 1},
        "gate": gate or {"metric": "agreement", "max_drop": 0.03, "max_slice_drop": 0.05},
        "tracking": {"uri": f"sqlite:///{(root / 'mlflow.db').as_posix()}"}, "output_dir": "reports",
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _saved_graph(path: Path, name: str, nodes: list, weights: dict[str, np.ndarray]) -> Path:
    """`nodes` from x [batch, WIDTH] to y [batch, 4] with `weights` as float32 initializers, saved at `path`."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def one_gemm_model(path: Path) -> Path:
    """x -> scale (channel 0 times OUTLIER) -> Gemm `fc` (its weights undo it) -> Relu -> Transpose -> MatMul
    `weight_first` (W @ x) -> Transpose -> y[4]: the same inputs and outputs as `fragile_model`.

    ORT's dynamic INT8 quantizes `fc` alone (a MatMul whose weight comes first stays float), and the outlier makes it
    lose agreement; with `fc` kept float the graph is not FP32's bytes (the Gemm became MatMul + Add) but computes
    in FP32."""
    rng = np.random.default_rng(2)
    scale, weight = np.ones(WIDTH), rng.normal(size=(WIDTH, WIDTH)) / 4
    scale[0], weight[0, :] = OUTLIER, weight[0, :] / OUTLIER
    weights = {"s": scale, "w": weight, "b": rng.normal(size=WIDTH) / 10, "w_out": rng.normal(size=(4, WIDTH)) / 4}
    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"], name="scale"),
             helper.make_node("Gemm", ["xs", "w", "b"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["rt"], name="t1", perm=[1, 0]),
             helper.make_node("MatMul", ["w_out", "rt"], ["yt"], name="weight_first"),
             helper.make_node("Transpose", ["yt"], ["y"], name="t2", perm=[1, 0])]  # fmt: skip
    return _saved_graph(path, "one_gemm", nodes, weights)


INT8 = {"name": "int8", "precision": "int8", "calibrator": "minmax", "op_types": ["MatMul"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fragile_project(tmp_path_factory.mktemp("fragile"), [INT8])


@pytest.mark.parametrize("method", ["leave_one_out", "one_at_a_time", "sqnr"])
def test_every_method_ranks_the_fragile_node_first(project, method):
    result = explain_variant(load_recipe(project), "int8", method=method)
    ranked = [cost.group for cost in result.costs]
    print(method, [(c.group, round(c.overall, 3), round(c.nsr, 4)) for c in result.costs])
    assert ranked[0] == "branch_a"
    assert sorted(ranked) == ["branch_a", "branch_b", "head", "mm1"]
    assert result.drop > 0.1 and result.worst_slice in ("half=first", "half=second")
    if method != "sqnr":
        top = result.costs[0]
        assert top.overall > 0.5 * result.drop and top.share > 0.5
        assert all(c.overall < top.overall for c in result.costs[1:])


def test_grouping_by_op_type_and_max_nodes_bound_the_work(project):
    by_op = explain_variant(load_recipe(project), "int8", group_by="op_type")
    assert [c.group for c in by_op.costs] == ["MatMul"] and len(by_op.costs[0].nodes) == 4
    capped = explain_variant(load_recipe(project), "int8", max_nodes=1)
    assert [c.group for c in capped.costs] == ["branch_a"]
    assert any("1 noisiest of 4" in note for note in capped.notes)


@pytest.mark.parametrize(("group_by", "expected"), [
    ("node", "/encoder/layer.3/output/dense/MatMul"),
    ("op_type", "MatMul"),
    ("layer", "/encoder/layer.3"),
    ("pattern", "/encoder/layer.#/output/dense/MatMul"),
])  # fmt: skip
def test_group_keys(group_by, expected):
    assert group_key(QuantizedNode("/encoder/layer.3/output/dense/MatMul", "MatMul"), group_by) == expected



def _exported_flat(path: Path) -> None:
    """`fragile_model` named as torch.onnx's dynamo exporter names nodes (flat: node_linear, node_linear_1, ...), with
    the module path each came from in its metadata, as that exporter records it: the two branches are layers 0 and 1
    of `blocks`, the stem and the head modules of their own."""
    model = onnx.load(str(path))
    modules = {"mm1": "stem", "branch_a": "blocks.0.fc", "branch_b": "blocks.1.fc", "head": "head"}
    for index, node in enumerate(n for n in model.graph.node if n.name in modules):
        parents = modules[node.name].split(".")
        scopes = ["", *(".".join(parents[: i + 1]) for i in range(len(parents))), f"linear_{index}"]
        node.name = f"node_linear_{index}"
        node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
    onnx.save(model, str(path))


@pytest.mark.parametrize(("group_by", "expected", "first"), [
    ("layer", ["blocks.0", "blocks.1", "head", "stem"], "blocks.0"),
    ("pattern", ["blocks.#.fc/MatMul", "head/MatMul", "stem/MatMul"], "blocks.#.fc/MatMul"),
])  # fmt: skip
def test_layers_of_a_flat_named_export_are_the_modules_its_exporter_recorded(tmp_path, group_by, expected, first):
    """torch.onnx's dynamo exporter (torch 2.9+'s default) names nodes node_linear_14: by name, `--group layer` made
    every node a layer of its own (node_linear_1, node_linear_2...) and `--group pattern` put every Linear of the
    model in one role (node_linear_#). The module path it records per node gives the layers and roles."""
    project = write_fragile_project(tmp_path, [INT8])
    _exported_flat(tmp_path / "model.onnx")
    result = explain_variant(load_recipe(project), "int8", method="sqnr", group_by=group_by)
    assert sorted(c.group for c in result.costs) == expected
    assert result.costs[0].group == first


def test_bypass_restores_a_relu_the_quantizer_folded_away(tmp_path):
    """With default op types ORT folds mm1's Relu into its output Q; keeping every node float must put it
    back, leaving only the rounding of the quantized graph output y (half a step at most)."""
    path = fragile_model(tmp_path / "model.onnx", fragile=())
    x = {"x": np.random.default_rng(2).normal(size=(64, WIDTH)).astype(np.float32)}
    spec = VariantSpec(name="q", precision="int8", calibrator="minmax")
    built = build_variant(spec, BuildContext(path, tmp_path, [x]))
    quantized, reference = onnx.load(str(built.onnx_path)), onnx.load(str(path))
    assert "Relu" not in [n.op_type for n in quantized.graph.node]
    every = [n.name for n in quantized.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    bypassed = bypass_qdq(quantized, reference, every)
    assert "Relu" in [n.op_type for n in bypassed.graph.node]
    onnx.checker.check_model(bypassed)

    def run(model: onnx.ModelProto) -> np.ndarray:
        return ort.InferenceSession(model.SerializeToString()).run(None, x)[0]

    fp32, int8, kept_float = run(reference), run(quantized), run(bypassed)
    y_step = float(numpy_helper.to_array(next(t for t in quantized.graph.initializer if t.name == "y_scale")))
    error, int8_error = np.abs(kept_float - fp32).max(), np.abs(int8 - fp32).max()
    print(f"max error: int8 {int8_error:.4f}, every node kept float {error:.4f}, half a y step {y_step / 2:.4f}")
    assert error <= y_step / 2 + 1e-5 < int8_error


@pytest.mark.parametrize("kept", [["softmax"], ["softmax", "argmax"], ["argmax"]])
def test_a_bypass_computes_what_a_rebuild_with_the_nodes_excluded_computes(tmp_path, kept):
    """fc -> Softmax -> Identity -> scores (a graph output) -> ArgMax, as skl2onnx writes a classifier: static INT8
    rounds the Softmax's output and, for the ArgMax, the Identity's. Kept float, a node leaves unrounded what only
    it wanted rounded (also through the Identity, which computes in float): the bypass gives the rebuild's scores."""
    w = np.random.default_rng(3).normal(size=(WIDTH, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
         helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=-1),
         helper.make_node("Identity", ["p"], ["scores"], name="copy"),
         helper.make_node("ArgMax", ["scores"], ["label"], name="argmax", axis=1)], "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch", 1])],
        initializer=[numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    x = {"x": np.random.default_rng(2).normal(size=(64, WIDTH)).astype(np.float32)}
    spec = VariantSpec(name="q", precision="int8", calibrator="minmax")
    built = build_variant(spec, BuildContext(path, tmp_path / "q", [x]))
    rebuilt = build_variant(spec.model_copy(update={"exclude_nodes": kept}), BuildContext(path, tmp_path / "x", [x]))
    quantized, reference = onnx.load(str(built.onnx_path)), onnx.load(str(path))
    bypassed = bypass_qdq(quantized, reference, kept, built.params["op_types"])
    onnx.checker.check_model(bypassed)

    def scores(model: onnx.ModelProto) -> np.ndarray:
        return ort.InferenceSession(model.SerializeToString()).run(["scores"], x)[0]

    expected, fp32 = scores(onnx.load(str(rebuilt.onnx_path))), scores(reference)
    print(kept, np.abs(scores(quantized) - fp32).max(), np.abs(expected - fp32).max())
    np.testing.assert_allclose(scores(bypassed), expected, atol=1e-6)


def test_cli_explain_writes_table_plot_and_json(project, monkeypatch, capsys):
    monkeypatch.chdir(project.parent)
    code = main(["explain", str(project), "--variant", "int8", "--top", "3", "--no-track"])
    assert code == 0
    folders = list((project.parent / "reports" / "fragile").glob("explain-int8-*"))
    assert len(folders) == 1
    saved = json.loads((folders[0] / "explain.json").read_text())
    assert saved["method"] == "leave_one_out" and saved["costs"][0]["group"] == "branch_a"
    assert (folders[0] / "explain.png").stat().st_size > 1000
    table = (folders[0] / "table.txt").read_text()
    assert "branch_a" in table and "head" in table and "explains only" not in table
    assert "branch_a" in capsys.readouterr().out
    assert saved["explained_share"] > 0.5 and not saved["explains_little"]  # one fragile node: it recovers the drop


def test_leave_one_out_says_when_its_ranking_explains_little_of_the_drop(tmp_path, monkeypatch, capsys):
    """Two branches each ruin the output alone: kept float one at a time, each recovered little of the 0.46 drop
    (+0.14 and +0.005), and the table showed those as the whole story."""
    recipe = write_fragile_project(tmp_path / "both", [INT8], fragile=("a", "b"))
    monkeypatch.chdir(recipe.parent)
    assert main(["explain", str(recipe), "--variant", "int8", "--no-track"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    [folder] = (recipe.parent / "reports" / "fragile").glob("explain-int8-*")
    saved = json.loads((folder / "explain.json").read_text())
    recovered = sum(c["overall"] for c in saved["costs"])
    assert saved["explained_share"] == pytest.approx(recovered / saved["drop"]) and saved["explained_share"] < 0.5
    assert saved["explains_little"]
    [note] = [n for n in saved["notes"] if n.startswith("leave_one_out explains only")]
    assert "--method one_at_a_time or --group layer|pattern" in note and note in shown
    assert "the ranking explains only" in " ".join((folder / "table.txt").read_text().split())
    together = explain_variant(load_recipe(recipe), "int8", method="one_at_a_time")
    assert {c.group for c in together.costs[:2]} == {"branch_a", "branch_b"}  # the suggestion finds both
    assert math.isnan(together.explained_share) and not together.explains_little


def test_explains_started_in_the_same_second_write_their_own_folders(project, monkeypatch):
    monkeypatch.chdir(project.parent)
    frozen = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    frozen_clock = type("Frozen", (), {"now": staticmethod(lambda tz=None: frozen)})
    monkeypatch.setattr("qbench.explain.sensitivity.datetime", frozen_clock)
    first = run_explain(load_recipe(project), "int8", method="sqnr", track=False)
    second = run_explain(load_recipe(project), "int8", method="sqnr", track=False)
    assert first.directory != second.directory
    assert first.directory.name.startswith("explain-int8-20260102-030405-")
    assert (first.directory / "explain.json").is_file() and (second.directory / "explain.json").is_file()


def test_validate_and_explain_with_no_track_leave_an_unwritable_tracking_store_alone(tmp_path, monkeypatch, capsys):
    """Since the default tracking store ($MLFLOW_TRACKING_URI, else ./mlflow.db) is checked at the start, a CI job
    whose store cannot be written ran `qbench explain --no-track` into `tracking.uri: ... or run with --no-track`
    (exit 2): explain checked the store whatever --no-track said. `qbench validate` had no --no-track at all, so a
    job validating for a `sweep --no-track` in such a directory failed; it checks the store unless told so."""
    path = write_fragile_project(tmp_path / "p", [INT8])
    raw = yaml.safe_load(path.read_text())
    del raw["tracking"]  # the default store
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(path)]) == 2  # a sweep that tracks could not: said before it runs
    assert f"tracking.uri: {blocker} is a file" in capsys.readouterr().err
    assert main(["validate", str(path), "--no-track"]) == 0
    assert main(["explain", str(path), "--variant", "int8", "--method", "sqnr", "--no-track"]) == 0, capsys.readouterr()
    assert main(["explain", str(path), "--variant", "int8", "--method", "sqnr"]) == 2


def test_cli_explain_refuses_a_variant_it_cannot_explain(project, capsys):
    assert main(["explain", str(project), "--variant", "int9", "--no-track"]) == 2
    assert "did you mean 'int8'" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "technique"), [({"precision": "fp16"}, "fp16"),
                                                    ({"precision": "fp8", "calibrator": "minmax"}, "fp8")])  # fmt: skip
def test_explain_names_the_technique_it_cannot_explain(project, options, technique):
    """A QAT variant of a PyTorch model was refused as 'not an ONNX Runtime INT8 variant', though ONNX Runtime runs
    its INT8 Q/DQ export: the refusal now names the variant's technique and those explain ranks."""
    recipe = load_recipe(project)
    recipe = recipe.model_copy(update={"variants": [*recipe.variants, VariantSpec(name="other", **options)]})
    expected = rf"'other' is a {technique} variant; .* \(ort-static, ort-dynamic, linear, smoothquant\)"
    with pytest.raises(QbenchError, match=expected):
        explain_variant(recipe, "other")


def test_explain_is_logged_to_mlflow(project, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(project.parent)
    outcome = run_explain(load_recipe(project), "int8", method="sqnr", track=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{(project.parent / 'mlflow.db').as_posix()}")
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.run_name == "explain int8" and run.data.params["method"] == "sqnr"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"explain.json", "explain.png", "table.txt", "recipe.yaml"} <= artifacts


def test_dynamic_int8_ranks_the_gemms_it_quantized_as_matmul(tmp_path: Path) -> None:
    """A torch Linear exports as Gemm; dynamic INT8 quantizes it as MatMul under its name, so explain can rank it."""
    from qbench.explain.graph import quantized_nodes

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2"], ["y"], name="fc2")]  # fmt: skip
    weights = {"w1": rng.normal(size=(16, 8)), "b1": rng.normal(size=(16,)), "w2": rng.normal(size=(16, 4))}
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    reference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(reference, str(tmp_path / "mlp.onnx"))
    spec = VariantSpec(name="dyn", precision="int8", calibrator="dynamic")
    built = build_variant(spec, BuildContext(reference_path=tmp_path / "mlp.onnx", workdir=tmp_path / "work"))
    assert quantized_nodes(reference, built) == [QuantizedNode("fc1", "Gemm"), QuantizedNode("fc2", "Gemm")]


@pytest.mark.parametrize("smoothquant", [True, False], ids=["smoothquant", "linear-dynamic"])
def test_linear_and_smoothquant_builds_name_their_quantized_nodes_and_are_rebuilt_not_bypassed(
    project, tmp_path, smoothquant
):
    """SmoothQuant scales the weights (FP32's are no longer their source, so bypassing Q/DQ with them would rank
    another model) and dynamic builds have no Q/DQ: both are ranked through rebuilds, over the Linears they
    quantized."""
    from qbench.explain.graph import Rebuild, float_keeper, quantized_nodes
    from qbench.preflight.prepare import prepare

    recipe = load_recipe(project)
    options = ({"calibrator": "minmax", "smoothquant": {"alpha": 0.5}} if smoothquant
               else {"calibrator": "dynamic", "technique": "linear"})  # fmt: skip
    spec = VariantSpec(name="lin", precision="int8", **options)
    prepared = prepare(recipe, track=False)
    ctx = BuildContext(prepared.source.onnx_path, tmp_path / "work", prepared.calibration_batches)
    built = build_variant(spec, ctx)
    reference = onnx.load(str(prepared.source.onnx_path))
    assert {n.name for n in quantized_nodes(reference, built)} == {"branch_a", "branch_b", "head", "mm1"}
    assert isinstance(float_keeper(spec, ctx, built), Rebuild)
    method = "leave_one_out" if smoothquant else "sqnr"  # SQNR cannot compare smoothed tensors with FP32's
    result = explain_variant(recipe.model_copy(update={"variants": [*recipe.variants, spec]}), "lin", method=method)
    assert sorted(cost.group for cost in result.costs) == ["branch_a", "branch_b", "head", "mm1"]


@pytest.mark.parametrize("options", [{"method": "sqnr"}, {"max_nodes": 2}], ids=["sqnr", "max-nodes"])
def test_sqnr_refuses_a_smoothquant_variant_whose_tensors_are_not_fp32s(project, options):
    """SmoothQuant folds each Linear's input scaling into the producer, so the tensors between Linears are FP32's
    divided per channel: SQNR ranked a two-Linear PyTorch MLP's first Linear at 24 % noise, 100 % of the total,
    and the noisiest one (by leave-one-out) at 0 %. It is now refused in one line naming what works."""
    recipe = load_recipe(project)
    spec = VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": 0.5})
    recipe = recipe.model_copy(update={"variants": [*recipe.variants, spec]})
    with pytest.raises(QbenchError, match=r"cannot rank 'sq': its build rescaled the tensors .* leave_one_out"):
        explain_variant(recipe, "sq", **options)


def test_keeping_a_dynamic_variants_only_node_float_leaves_the_users_model_in_place(tmp_path):
    """Leave-one-out on a variant with one quantized node rebuilds it with that node float: the builder hands back
    the recipe's model itself (nothing to quantize), which explain used to delete after measuring it."""
    variant = {"name": "int8", "precision": "int8", "calibrator": "dynamic", "op_types": ["MatMul"]}
    path = write_fragile_project(tmp_path, [variant])
    _saved_graph(tmp_path / "model.onnx", "one", [helper.make_node("MatMul", ["x", "w"], ["y"], name="only")],
                 {"w": np.random.default_rng(0).normal(size=(WIDTH, 4))})  # fmt: skip
    result = explain_variant(load_recipe(path), "int8", method="leave_one_out", workdir=tmp_path / "explained")
    assert [cost.group for cost in result.costs] == ["only"]
    assert (tmp_path / "model.onnx").is_file()


def test_sqnr_ranks_a_model_whose_quantized_nodes_include_one_with_an_integer_output(tmp_path):
    """A classifier's ArgMax (skl2onnx writes one after the scores, its class ids read by later nodes) reads quantized
    scores and writes int64: SQNR used to expose every node output as float, so ONNX Runtime refused the model (and
    where the ids were a graph output, ranked their 'noise'); a class id has no noise ratio, so ArgMax's is measured
    where it reaches the float outputs, as every node's: nowhere (its noise where it computes is not measurable)."""
    path = write_fragile_project(tmp_path, [{"name": "int8", "precision": "int8", "calibrator": "minmax"}])
    model = onnx.load(str(tmp_path / "model.onnx"))
    model.graph.node.extend([helper.make_node("ArgMax", ["y"], ["class_id"], name="argmax", axis=1, keepdims=0),
                             helper.make_node("Identity", ["class_id"], ["label"], name="label")])
    model.graph.output.append(helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]))
    onnx.save(model, str(tmp_path / "model.onnx"))
    recipe = load_recipe(path)
    recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"output": "y"})})
    result = explain_variant(recipe, "int8", method="sqnr")
    costs = {cost.group: cost.nsr for cost in result.costs}
    assert costs["argmax"] == 0.0  # keeping it float changes no float output
    assert result.costs[0].group == "branch_a" and np.isfinite(result.costs[0].nsr)



def test_sqnr_measures_the_nodes_after_a_fused_contrib_operator(tmp_path):
    """ONNX's shape inference knows no com.microsoft schema, so in a graph ONNX Runtime's transformer optimizer fused
    (Attention, SkipLayerNormalization, BiasGelu) it typed nothing after the first fused node: SQNR exposed none of
    those tensors and ranked every quantized MatMul of an optimised BERT as not measurable ("—"). Here a fused Gelu
    sits between the first MatMul and the branches: the fragile branch must still be measured, and ranked first."""
    path = write_fragile_project(tmp_path, [INT8])
    model = onnx.load(str(tmp_path / "model.onnx"))
    relu = next(node for node in model.graph.node if node.name == "relu")
    relu.output[0] = "r0"
    model.graph.node.insert(list(model.graph.node).index(relu) + 1,
                            helper.make_node("Gelu", ["r0"], ["r1"], name="fused_gelu", domain="com.microsoft"))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(tmp_path / "model.onnx"))
    result = explain_variant(load_recipe(path), "int8", method="sqnr")
    costs = {cost.group: cost.nsr for cost in result.costs}
    assert {"branch_a", "branch_b", "head"} <= costs.keys()
    assert all(np.isfinite(costs[name]) for name in ("branch_a", "branch_b", "head"))
    assert result.costs[0].group == "branch_a"


def test_calibrator_auto_is_explained_with_the_calibrator_the_sweep_keeps(tmp_path, monkeypatch):
    """`calibrator: auto` was explained with minmax whatever the sweep kept: on a model where dynamic INT8 is the
    closest to FP32, explain reported minmax's drop, not the one the sweep measured for the variant."""
    from qbench.sweep.runner import run_sweep

    monkeypatch.chdir(tmp_path)
    variant = {"name": "int8", "precision": "int8", "calibrator": "auto", "op_types": ["MatMul"]}
    recipe = load_recipe(write_fragile_project(tmp_path, [variant], gate={"metric": "agreement", "max_drop": 0.0}))
    swept = run_sweep(recipe, track=False).results.find("int8", "onnxruntime-cpu")
    kept = swept.params["calibrator"]
    result = explain_variant(recipe, "int8")
    print(kept, result.notes, result.drop, swept.accuracy.overall.drops["agreement"])
    assert kept != "minmax"  # the case the old explain got wrong
    assert result.calibrator == kept and result.notes[0].startswith(f"calibrator auto: explained with {kept}")
    assert result.drop == pytest.approx(swept.accuracy.overall.drops["agreement"])


def test_explain_table_prints_small_costs_with_their_digits_and_unmeasurable_noise_as_a_dash():
    """A kl_mean gate gives drops of 1e-5: the table read '+0.0000' for every node (and 'nan' for a node whose noise
    is not measurable)."""
    from rich.console import Console

    from qbench.explain.rank import NodeCost
    from qbench.explain.sensitivity import ExplainResult, explain_table

    def result(method: str) -> ExplainResult:
        costs = (NodeCost("fc", ("fc",), ("MatMul",), 3.2e-5, 4.1e-5, 0.97, 2e-4),
                 NodeCost("argmax", ("argmax",), ("ArgMax",), -1.5e-6, -2e-6, -0.03, float("nan")))  # fmt: skip
        return ExplainResult("r", "int8", "minmax", method, "node", "kl_mean", "onnxruntime-cpu", 100,
                             3.3e-5, "half=first", 4.6e-5, 2, costs)  # fmt: skip

    console = Console(width=200, record=True)
    console.print(explain_table(result("leave_one_out"), 10))
    console.print(explain_table(result("sqnr"), 10))
    text = " ".join(console.export_text().split())  # the title wraps to the table's width
    assert "drops +3.30e-05 overall and +4.60e-05 on half=first" in text
    assert "+3.20e-05" in text and "+4.10e-05" in text and "-1.50e-06" in text and "+0.0000" not in text
    assert "nan" not in text


def test_a_node_kept_float_by_explain_leaves_its_output_unrounded_as_a_rebuild_does(tmp_path, monkeypatch):
    """x -> MatMul -> Softmax -> y: static INT8 rounds the Softmax's output (the graph's scores) for the Softmax's own
    sake. Kept float by `exclude_nodes`, the output is not rounded; explain's candidate bypassed only the Softmax's
    input, so on a tf2onnx CNN it measured keeping the Softmax float as making KL worse (-2.56e-07 recovered) where
    the rebuild recovers 85 % of it. Explain's figure is now the rebuilt variant's."""
    from qbench.sweep.runner import run_sweep

    monkeypatch.chdir(tmp_path)
    gate = {"metric": "kl_mean", "max_drop": 1.0, "max_slice_drop": 1.0}
    variants = [{"name": "int8", "precision": "int8", "calibrator": "minmax"},
                {"name": "int8-x", "precision": "int8", "calibrator": "minmax",
                 "exclude_nodes": ["softmax"]}]  # fmt: skip
    path = write_fragile_project(tmp_path, variants, gate=gate)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    _saved_graph(tmp_path / "model.onnx", "scores", nodes, {"w": np.random.default_rng(3).normal(size=(WIDTH, 4))})
    results = run_sweep(load_recipe(path), track=False).results
    quantized, rebuilt = (results.find(name, "onnxruntime-cpu").accuracy.overall.drops["kl_mean"]
                          for name in ("int8", "int8-x"))  # fmt: skip
    assert rebuilt < 0.5 * quantized  # the rounded scores are most of the error
    result = explain_variant(load_recipe(path), "int8")
    softmax = next(cost for cost in result.costs if cost.group == "softmax")
    assert result.drop == pytest.approx(quantized)
    assert result.drop - softmax.overall == pytest.approx(rebuilt, rel=1e-6, abs=1e-9)


def test_calibrator_auto_explains_the_calibrator_the_sweep_kept_not_the_most_accurate(tmp_path, monkeypatch):
    """With several calibrators passing, the sweep keeps the fastest; explain rebuilt them all and explained the one
    with the smallest drop, another variant than the one the sweep reported, and said so only in a note. It now takes
    the calibrator from the recipe's newest fresh results, and the table's title names it. Here the fastest try is
    made the least accurate one, so the two choices differ. The model has no outlier (fragile=()): with one, INT8
    minmax, percentile and dynamic lose most of a class's rows (decisions_kept), which no tolerance lets pass."""
    from rich.console import Console

    from qbench import fallback
    from qbench.explain.sensitivity import explain_table
    from qbench.sweep.runner import run_sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fallback.Trial, "p50_ms", property(lambda trial: -trial.drop))  # the worst passing is fastest
    variant = {"name": "int8", "precision": "int8", "calibrator": "auto", "op_types": ["MatMul"]}
    recipe = load_recipe(write_fragile_project(tmp_path, [variant], fragile=(),
                                               gate={"metric": "kl_mean", "max_drop": 10.0, "max_slice_drop": 10.0}))
    swept = run_sweep(recipe, track=False).results.find("int8", "onnxruntime-cpu")
    steps = swept.params["search.steps"]
    print([(s["calibrator"], s["drop"], s["passed"]) for s in steps])
    kept = swept.params["calibrator"]
    worst, best = (pick(steps, key=lambda s: s["drop"])["calibrator"] for pick in (max, min))
    assert kept == worst != best
    result = explain_variant(recipe, "int8")
    assert result.calibrator == kept
    assert result.notes[0].startswith(f"calibrator auto: explained with {kept}, the calibrator the sweep kept")
    assert result.drop == pytest.approx(swept.accuracy.overall.drops["kl_mean"])
    console = Console(width=200, record=True)
    console.print(explain_table(result, 5))
    assert console.export_text().startswith(f"int8 ({kept}): leave_one_out by node")


def test_explain_leaves_out_the_slices_the_gate_leaves_out_by_the_units_a_figure_rests_on():
    """A slice of 40 rows whose kl_mean rests on 3 scored tokens is under min_slice_size 10 for the gate: explain's
    ranking must not count its drop either (it counted 40 rows)."""
    from qbench.explain.rank import score_accuracy
    from qbench.recipe.spec import GateSpec
    from qbench.results.schema import AccuracyResult, SliceMetrics

    def scope(name: str, rows: int, tokens: int) -> SliceMetrics:
        return SliceMetrics(name, rows, {"kl_mean": 0.5}, drops={"kl_mean": 0.5}, denominators={"kl_mean": tokens})

    accuracy = AccuracyResult(50, 0, scope("overall", 50, 23), (scope("sparse", 40, 3), scope("dense", 10, 20)))
    score = score_accuracy(accuracy, GateSpec(metric="kl_mean", min_slice_size=10), 0.0)
    assert list(score.slices) == ["dense"]


def test_an_explain_file_meeting_a_full_disk_is_one_error_naming_it_and_leaves_no_partial_file(project, monkeypatch):
    """explain.json and table.txt are written whole or not at all, a full disk named with the file (qbench.files)."""
    import errno

    from qbench.errors import QbenchError

    monkeypatch.chdir(project.parent)
    real_write_text = Path.write_text

    def full_disk_for_the_table(path: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if path.name.startswith(".table.txt."):
            real_write_text(path, text[: len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(path, text, *args, **kwargs)

    def folders() -> set[Path]:
        return {p for p in (project.parent / "reports").rglob("explain-int8-*") if p.is_dir()}

    before = folders()
    monkeypatch.setattr(Path, "write_text", full_disk_for_the_table)
    with pytest.raises(QbenchError, match=r"table\.txt.*No space left on device") as raised:
        run_explain(load_recipe(project), "int8", method="sqnr", track=False)
    assert "\n" not in str(raised.value)
    [folder] = folders() - before
    assert (folder / "explain.json").is_file() and not list(folder.glob("*table.txt*"))


def _explain_table_text(costs: tuple, worst_slice: str) -> str:
    """explain's table of `costs` (an INT8 MinMax leave-one-out result whose worst slice is `worst_slice`, dropping
    0.07 there) as a 250-column terminal shows it."""
    from rich.console import Console

    from qbench.explain.sensitivity import ExplainResult, explain_table

    result = ExplainResult("r", "int8", "minmax", "leave_one_out", "node", "accuracy", "onnxruntime-cpu", 100,
                           0.03, worst_slice, 0.07, 2, costs)  # fmt: skip
    console = Console(width=250, record=True)
    console.print(explain_table(result, 10))
    return console.export_text()


def test_explain_table_prints_node_and_slice_names_as_they_are_never_as_markup():
    """A tf2onnx-style node 'while[/body]/MatMul' stopped `qbench explain` with rich's MarkupError once every
    candidate was measured; a slice 'grp=[unknown]' printed as 'grp=' in the title and its column; a node name
    holding a newline was split over two rows."""
    from qbench.explain.rank import NodeCost

    costs = (NodeCost("while[/body]/MatMul", ("while[/body]/MatMul",), ("MatMul",), 0.02, 0.05, 0.7, 1e-3),
             NodeCost("fc\nPASS", ("fc\nPASS",), ("Gemm",), 0.01, 0.02, 0.3, 1e-3))  # fmt: skip
    text = _explain_table_text(costs, "grp=[unknown]")
    assert "while[/body]/MatMul" in text and "'fc\\nPASS'" in text
    assert "+0.0700 on grp=[unknown]" in " ".join(text.split()) and "recovered on grp=[unknown]" in text
    assert not any(line.lstrip("│ ").startswith("PASS") for line in text.splitlines())


def test_explain_table_quotes_a_worst_slice_name_holding_a_newline():
    """A slice value 'a\nb' (the data's) split the table's title and its column header over two lines, 'b' reading as
    a line of its own; quoted with escapes as node names are."""
    from qbench.explain.rank import NodeCost

    text = _explain_table_text((NodeCost("fc", ("fc",), ("Gemm",), 0.02, 0.05, 1.0, 1e-3),), "grp=a\nb")
    assert "+0.0700 on 'grp=a\\nb'" in text and "recovered on 'grp=a\\nb'" in text
    assert not any(line.lstrip("│ ").startswith("b") for line in text.splitlines())
