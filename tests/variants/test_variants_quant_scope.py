"""Static INT8 leaves the preprocessing before any layer with weights in float (qbench.variants.quant_scope)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.quant_scope import predictor_output_nodes, preprocessing_nodes, table_lookups
from tests.variants.conftest import save_graph

RNG = np.random.default_rng(0)


def _weights(*shape: int) -> np.ndarray:
    return RNG.normal(0, 0.5, shape).astype(np.float32)


def _tabular_graph(path: Path, *, weights_as_inputs: bool = False) -> onnx.ModelProto:
    """Two raw columns concatenated and scaled (preprocessing), then a two-layer MLP; an unnamed Mul included."""
    nodes = [
        helper.make_node("Concat", ["age", "income"], ["raw"], axis=1, name="join"),
        helper.make_node("Mul", ["raw", "scale"], ["scaled"]),
        helper.make_node("MatMul", ["scaled", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Concat", ["r", "scaled"], ["wide"], axis=1, name="skip"),
        helper.make_node("MatMul", ["wide", "w2"], ["y"], name="mm2"),
    ]
    weights = {"scale": np.array([1 / 40, 1e-5], np.float32), "w1": _weights(2, 8), "w2": _weights(10, 2)}
    save_graph(path, nodes, weights, {"age": 1, "income": 1}, {"y": 2})
    model = onnx.load(str(path))
    if weights_as_inputs:  # old exporters list initializers as graph inputs too
        model.graph.input.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in weights)
    return model


def test_preprocessing_is_what_computes_before_any_layer_with_weights(tmp_path: Path) -> None:
    model = _tabular_graph(tmp_path / "m.onnx")
    assert preprocessing_nodes(model) == ["join", "Mul_1"]  # the unnamed Mul is named so it can be excluded
    assert model.graph.node[1].name == "Mul_1"


def test_initializers_listed_as_graph_inputs_are_still_weights(tmp_path: Path) -> None:
    assert preprocessing_nodes(_tabular_graph(tmp_path / "m.onnx", weights_as_inputs=True)) == ["join", "Mul_1"]


def test_a_graph_without_weights_has_no_preprocessing(tmp_path: Path) -> None:
    save_graph(tmp_path / "m.onnx", [helper.make_node("Add", ["a", "b"], ["y"], name="add")], {}, {"a": 2, "b": 2},
               {"y": 2})  # fmt: skip
    assert preprocessing_nodes(onnx.load(str(tmp_path / "m.onnx"))) == []


def test_an_embedding_lookup_is_a_layer_with_weights(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=onnx.TensorProto.INT64, name="cast"),
        helper.make_node("Gather", ["table", "ids64"], ["emb"], name="lookup"),
        helper.make_node("Relu", ["emb"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", onnx.TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
        initializer=[onnx.numpy_helper.from_array(_weights(5, 4), "table")],
    )  # fmt: skip
    assert preprocessing_nodes(helper.make_model(graph)) == ["cast"]


def _accuracy_of(path: Path, feeds: dict[str, np.ndarray], labels: np.ndarray) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return float((session.run(None, feeds)[0].argmax(axis=1) == labels).mean())


def test_int8_keeps_a_features_concat_float_and_the_network_quantized(tmp_path: Path) -> None:
    """Raw columns of very different ranges joined by a Concat: quantized on the Concat's one scale, the age
    column (18..80 beside incomes of 2e3..2e5) rounded to 0 and the model's answers depended on income alone."""
    ages = RNG.uniform(18, 80, (600, 1)).astype(np.float32)
    incomes = RNG.lognormal(10, 1, (600, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Concat", ["age", "income"], ["raw"], axis=1, name="join"),
        helper.make_node("Mul", ["raw", "scale"], ["scaled"], name="norm"),
        helper.make_node("MatMul", ["scaled", "w"], ["y"], name="head"),
    ]
    weights = {"scale": np.array([1 / 40, 1 / 40000], np.float32), "w": np.array([[1, -1], [-1, 1]], np.float32)}
    path = save_graph(tmp_path / "tab.onnx", nodes, weights, {"age": 1, "income": 1}, {"y": 2})
    feeds = {"age": ages, "income": incomes}
    labels = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0].argmax(axis=1)
    context = BuildContext(reference_path=path, workdir=tmp_path / "out",
                           calibration=[{"age": ages[i:i + 100], "income": incomes[i:i + 100]} for i in (0, 100)])
    built = build_variant(VariantSpec.model_validate({"name": "int8", "precision": "int8", "calibrator": "minmax"}),
                          context)  # fmt: skip
    assert built.params["preprocessing_kept_float"] == ["join", "norm"]
    assert built.params["quantized_op_types"] == {"MatMul": 1}
    assert _accuracy_of(built.onnx_path, feeds, labels) >= 0.97



def _embedding_graph(path: Path) -> Path:
    """Token ids -> an embedding Gather (also an output: the rows it read) -> mean over tokens -> a MatMul head."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed"),
             helper.make_node("ReduceMean", ["rows"], ["pooled"], axes=[1], keepdims=0, name="pool"),
             helper.make_node("MatMul", ["pooled", "head"], ["y"], name="classify")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "embedding", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, ["batch", 4, 8])],
        [onnx.numpy_helper.from_array(_weights(20, 8), "table"), onnx.numpy_helper.from_array(_weights(8, 3), "head")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.mark.parametrize("calibrator", ["dynamic", "minmax"])
def test_an_embedding_lookup_stays_float_unless_op_types_name_it(tmp_path, calibrator):
    """A Gather only copies rows of its table out: no integer kernel, so by default its table stays float (the rows
    read are FP32's exactly) and the params and a note say so; a recipe naming Gather in op_types gets it quantized."""
    reference = _embedding_graph(tmp_path / "e.onnx")
    ids = RNG.integers(0, 20, size=(16, 4))
    ctx = BuildContext(reference, tmp_path / "w", [{"ids": ids}] if calibrator != "dynamic" else [])

    def rows(spec: VariantSpec):
        built = build_variant(spec, ctx)
        session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
        return built, session.run(["rows"], {"ids": ids})[0]

    fp32 = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(["rows"], {"ids": ids})[0]
    default, kept = rows(VariantSpec(name="default", precision="int8", calibrator=calibrator))
    assert default.params["lookups_kept_float"] == {"Gather": 1} and default.params["quantized_nodes"] >= 1
    assert any("1 Gather kept float" in note for note in default.notes)
    assert np.array_equal(kept, fp32)
    named, rounded = rows(VariantSpec(name="named", precision="int8", calibrator=calibrator,
                                      op_types=["MatMul", "Gather"]))  # fmt: skip
    assert "lookups_kept_float" not in named.params and not np.array_equal(rounded, fp32)
    assert table_lookups(onnx.load(str(reference)), ("MatMul",)) == {}  # only the op types asked about


def test_steps_on_an_onnx_ml_predictors_output_are_found_until_a_layer_with_weights():
    """Tree scores scaled (onnxmltools' Mul by 1), then a MatMul stacked on them and its bias: only the Mul computes
    on the predictor's float output alone; the MatMul is a layer, the Add its output. Preprocessing is unchanged."""
    tree = helper.make_node("TreeEnsembleRegressor", ["scaled"], ["raw"], domain="ai.onnx.ml", name="tree", n_targets=2,
                            nodes_treeids=[0], nodes_nodeids=[0], nodes_featureids=[0], nodes_modes=["LEAF"],
                            nodes_values=[0.0], nodes_truenodeids=[0], nodes_falsenodeids=[0], target_treeids=[0, 0],
                            target_nodeids=[0, 0], target_ids=[0, 1], target_weights=[0.5, 1.5])  # fmt: skip
    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"], name="scale_x"), tree,
             helper.make_node("Mul", ["raw", "one"], ["scores"], name="times_one"),
             helper.make_node("MatMul", ["scores", "w"], ["h"], name="stack"),
             helper.make_node("Add", ["h", "b"], ["y"], name="bias")]  # fmt: skip
    weights = {"scale": np.array([2.0, 2.0], np.float32), "one": np.array(1.0, np.float32), "w": _weights(2, 2),
               "b": _weights(2)}  # fmt: skip
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, 2])],
                              [onnx.numpy_helper.from_array(value, name)
                               for name, value in weights.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    assert predictor_output_nodes(model) == ["times_one"]
    assert preprocessing_nodes(model) == ["scale_x"]
