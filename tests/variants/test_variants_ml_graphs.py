"""Graphs that are not (only) neural networks: scikit-learn models converted with skl2onnx.

Every variant must build and load in ONNX Runtime; ai.onnx.ml nodes stay FP32; a graph
with nothing to quantize or convert is the FP32 model itself, saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

skl2onnx = pytest.importorskip("skl2onnx")
from sklearn.datasets import make_classification  # noqa: E402
from sklearn.ensemble import RandomForestClassifier  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from qbench.recipe.spec import VariantSpec  # noqa: E402
from qbench.variants import BuildContext, build_variant  # noqa: E402
from qbench.variants.base import BuiltVariant  # noqa: E402

FEATURES = 6
VARIANTS = [
    {"name": "fp16", "precision": "fp16"},
    {"name": "bf16", "precision": "bf16"},
    *({"name": f"int8-{c}", "precision": "int8", "calibrator": c}
      for c in ("minmax", "entropy", "percentile", "dynamic")),
    *({"name": f"fp8-{c}", "precision": "fp8", "calibrator": c} for c in ("minmax", "entropy", "percentile")),
]
MODELS = {
    "forest": lambda: RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0),
    "scaler_logistic": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)),
    "scaler_mlp": lambda: make_pipeline(StandardScaler(), MLPClassifier((16,), max_iter=300, random_state=0)),
}


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    x, _ = make_classification(n_samples=240, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def converted(data: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each scikit-learn model fitted and converted with skl2onnx (probabilities as a tensor, no ZipMap)."""
    _, labels = make_classification(n_samples=240, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    folder = tmp_path_factory.mktemp("sklearn")
    paths = {}
    for name, make in MODELS.items():
        model = make().fit(data, labels)
        onx = skl2onnx.to_onnx(model, data[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3})
        paths[name] = folder / f"{name}.onnx"
        onnx.save(onx, str(paths[name]))
    return paths


def _run(path: Path, x: np.ndarray, hints: dict | None = None) -> list[np.ndarray]:
    options = ort.SessionOptions()
    if (hints or {}).get("graph_optimization_level") == "basic":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"X": x})


def _build(path: Path, data: np.ndarray, workdir: Path, variant: dict):
    calibration = [{"X": data[i : i + 32]} for i in range(0, 128, 32)]
    ctx = BuildContext(reference_path=path, workdir=workdir, calibration=calibration)
    return build_variant(VariantSpec(**variant), ctx)


@pytest.mark.parametrize("variant", VARIANTS, ids=[v["name"] for v in VARIANTS])
@pytest.mark.parametrize("model", ["forest", "scaler_logistic"])
def test_a_pure_ml_graph_is_the_fp32_model_under_every_variant(converted, data, tmp_path, model, variant):
    built = _build(converted[model], data, tmp_path, variant)
    assert built.onnx_path == converted[model].resolve()
    assert "nothing to" in built.params["unchanged"]
    assert any("nothing to" in note and "the variant is the FP32 model" in note for note in built.notes)
    for got, expected in zip(_run(built.onnx_path, data), _run(converted[model], data), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_notes_name_the_ml_operators_that_stay_fp32(converted, data, tmp_path):
    built = _build(converted["forest"], data, tmp_path, {"name": "q", "precision": "int8", "calibrator": "minmax"})
    assert built.notes[0].startswith("nothing to quantize")
    assert "TreeEnsembleClassifier stay FP32" in built.notes[0]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v["name"] for v in VARIANTS])
def test_a_mixed_pipeline_builds_loads_and_keeps_the_scaler_fp32(converted, data, tmp_path, variant):
    """StandardScaler (ai.onnx.ml Scaler) then an MLP (MatMul/Add): only standard-domain nodes change."""
    built = _build(converted["scaler_mlp"], data, tmp_path, variant)
    assert built.onnx_path != converted["scaler_mlp"].resolve()
    model = onnx.load(str(built.onnx_path))
    scaler = next(node for node in model.graph.node if node.op_type == "Scaler")
    producer = {out: node for node in model.graph.node for out in node.output}
    feeding = producer.get(scaler.input[0])
    assert feeding is None or feeding.op_type == "Identity"  # the FP32 graph input, not a rounded copy
    assert not any(node.domain == "ai.onnx.ml" and node.op_type.endswith("Linear") for node in model.graph.node)
    label, probabilities = _run(built.onnx_path, data, built.session_hints)
    _, reference = _run(converted["scaler_mlp"], data)
    assert probabilities.dtype == np.float32 and np.all(np.isfinite(probabilities))
    agreement = float(np.mean(probabilities.argmax(axis=1) == reference.argmax(axis=1)))
    print(f"{variant['name']}: max |p - p_fp32| = "
          f"{np.max(np.abs(probabilities - reference)):.4f}, agreement {agreement:.3f}")
    assert agreement >= 0.9
    if variant["precision"] in ("int8", "fp8"):
        counts = built.params["quantized_op_types"]
        assert counts.get("MatMul", 0) + counts.get("MatMulInteger", 0) == 2
        assert "Scaler" not in counts


def test_fp16_keeps_the_scaler_in_fp32_and_says_why(converted, data, tmp_path):
    built = _build(converted["scaler_mlp"], data, tmp_path, {"name": "h", "precision": "fp16"})
    assert "Scaler" in built.params["blocked_op_types"]
    assert any("kept in FP32" in note and "operator domain ai.onnx.ml" in note for note in built.notes)
    model = onnx.load(str(built.onnx_path))
    matmul_weights = {node.input[1] for node in model.graph.node if node.op_type == "MatMul"}
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert {types[name] for name in matmul_weights} == {onnx.TensorProto.FLOAT16}


@pytest.mark.parametrize("variant", VARIANTS, ids=[v["name"] for v in VARIANTS])
def test_a_float64_mlp_builds_under_every_variant_and_quantizes_nothing(data, tmp_path, variant):
    """skl2onnx with double inputs: MatMul/Add on float64, which ONNX Runtime's quantizers cannot take (the static one
    failed on it with "Only an existing tensor can be modified"). Every variant builds, runs as FP32 does, and says
    that nothing was quantized."""
    from skl2onnx.common.data_types import DoubleTensorType

    from qbench.variants.quantizable import float64_nodes

    _, labels = make_classification(n_samples=240, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    mlp = MLPClassifier((16,), max_iter=300, random_state=0).fit(data, labels)
    onx = skl2onnx.to_onnx(mlp, initial_types=[("X", DoubleTensorType([None, FEATURES]))], options={"zipmap": False},
                           target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    path = tmp_path / "double.onnx"
    onnx.save(onx, str(path))
    assert {n.op_type for n in onx.graph.node if n.name in float64_nodes(onx)} >= {"MatMul", "Add"}
    doubles = data.astype(np.float64)
    calibration = [{"X": doubles[i : i + 32]} for i in range(0, 128, 32)]
    built = build_variant(VariantSpec(**variant), BuildContext(reference_path=path, workdir=tmp_path / "w",
                                                                calibration=calibration))  # fmt: skip
    ran = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"]).run(None, {"X": doubles})
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": doubles})
    np.testing.assert_allclose(ran[1], expected[1], rtol=1e-6)
    unchanged = built.onnx_path == path.resolve() or built.params.get("quantized_nodes") == 0
    assert unchanged and any("nothing to" in note or "no node was quantized" in note for note in built.notes)
    if variant["precision"] in ("int8", "fp8"):  # they said "no MatMul node" or spoke of a Reshape alone
        matmuls = sum(node.op_type == "MatMul" for node in onx.graph.node)
        assert any(re.search(rf"\b{matmuls} MatMul\b[^;]* compute in float64", note) for note in built.notes)


def test_the_reference_says_it_computes_in_float64_where_its_graph_does(tmp_path):
    """computes_in in the FP32 reference's params: 'float64' where every node is, the share where some are (unnamed
    nodes counted too), nothing for a float32 graph; the gate's note on a variant left as the reference reads it."""
    from onnx import TensorProto, helper

    def built(elem: int, cast_at_end: bool) -> BuiltVariant:
        nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["n"])]
        out = "n"
        if cast_at_end:
            nodes.append(helper.make_node("Cast", ["n"], ["y"], to=TensorProto.DOUBLE))
            out = "y"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [None, 2])],
                                  [helper.make_tensor_value_info(out, TensorProto.DOUBLE if cast_at_end else elem,
                                                                 [None, 2])])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        path = tmp_path / f"{elem}-{cast_at_end}.onnx"
        onnx.save(model, str(path))
        return build_variant(VariantSpec(name="fp32", precision="fp32"),
                             BuildContext(reference_path=path, workdir=tmp_path / "w"))

    doubles = built(TensorProto.DOUBLE, False)
    assert doubles.params["computes_in"] == "float64"
    assert doubles.notes == ("the FP32 reference computes in float64",)
    assert built(TensorProto.FLOAT, True).params["computes_in"] == "fp32 and float64 (1 of 3 nodes in float64)"
    floats = built(TensorProto.FLOAT, False)
    assert "computes_in" not in floats.params and not floats.notes


def test_float64_nodes_are_found_only_where_float64_is():
    from onnx import TensorProto, helper

    from qbench.variants.quantizable import float64_nodes

    nodes = [helper.make_node("Cast", ["x"], ["d"], name="to_double", to=TensorProto.DOUBLE),
             helper.make_node("Relu", ["d"], ["r"], name="relu_double"),
             helper.make_node("Cast", ["r"], ["f"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Relu", ["f"], ["y"], name="relu_float")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert float64_nodes(model) == ["to_double", "relu_double", "to_float"]
    del model.graph.node[:3]
    model.graph.node[0].input[0] = "x"
    assert float64_nodes(model) == []


def _unnamed_mixed_precision_model(path: Path) -> Path:
    """A hand-built graph whose nodes have no names: a float32 MatMul, then a float64 MatMul between two Casts."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(FEATURES, 8)).astype(np.float32), "w_float"),
               numpy_helper.from_array(rng.normal(size=(8, 3)).astype(np.float64), "w_double")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["X", "w_float"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Cast", ["r"], ["d"], to=TensorProto.DOUBLE),
             helper.make_node("MatMul", ["d", "w_double"], ["o"]),
             helper.make_node("Cast", ["o"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    graph = helper.make_graph(nodes, "unnamed",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_loaded_models_name_their_nodes_the_same_way_each_time(tmp_path):
    from qbench.variants.onnx_utils import load_model

    path = _unnamed_mixed_precision_model(tmp_path / "unnamed.onnx")
    assert all(not n.name for n in onnx.load(str(path)).graph.node)
    names = [n.name for n in load_model(path).graph.node]
    assert len(set(names)) == len(names) and all(names)
    assert names == [n.name for n in load_model(path).graph.node]


@pytest.mark.parametrize("calibrator", ["minmax", "dynamic"])
def test_unnamed_nodes_are_told_apart_when_quantizing_and_explaining(data, tmp_path, calibrator):
    """Nodes without names: the float64 MatMul is kept out of INT8 (it was not: every exclusion is by name), and the
    quantized nodes explain/fallback list are the float32 MatMul, named as in the reference (they were all '')."""
    from qbench.explain.graph import quantized_nodes
    from qbench.variants.onnx_utils import load_model

    path = _unnamed_mixed_precision_model(tmp_path / "unnamed.onnx")
    built = _build(path, data, tmp_path / "w", {"name": "int8", "precision": "int8", "calibrator": calibrator})
    reference = load_model(path)
    [float_matmul, *_] = [n.name for n in reference.graph.node if n.op_type == "MatMul"]
    assert built.params["quantized_nodes"] == 1
    assert [(q.name, q.op_type) for q in quantized_nodes(reference, built)] == [(float_matmul, "MatMul")]
    ran = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"]).run(None, {"X": data})[0]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": data})[0]
    assert np.abs(ran - expected).max() < 0.05 * np.abs(expected).max()


@pytest.mark.parametrize("head", ["logistic", "forest"])
@pytest.mark.parametrize("calibrator", ["minmax", "percentile"])
def test_a_column_transformer_in_front_of_an_ml_predictor_is_not_quantized(data, tmp_path, head, calibrator):
    """Scaled numbers and a one-hot string column joined by a Concat, then an ONNX-ML predictor (weights in
    attributes): the Concat is preprocessing, which static INT8 leaves float. It was quantized (Q/DQ rounding the
    features on one scale) and the variant was reported as computing in INT8, though no integer kernel ran."""
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder

    from qbench.variants.base import lowered_nothing
    from qbench.variants.quant_scope import preprocessing_nodes

    _, labels = make_classification(n_samples=240, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    colours = np.array(["red", "green", "blue"])[np.arange(len(data)) % 3]
    table = np.concatenate([data.astype(object), colours[:, None]], axis=1)
    columns = ColumnTransformer([("num", StandardScaler(), list(range(FEATURES))),
                                 ("cat", OneHotEncoder(), [FEATURES])])  # fmt: skip
    predictor = MODELS["forest"]() if head == "forest" else LogisticRegression(max_iter=300)
    pipeline = make_pipeline(columns, predictor).fit(table, labels)
    onx = skl2onnx.convert_sklearn(
        pipeline, initial_types=[("num", FloatTensorType([None, FEATURES])), ("cat", StringTensorType([None, 1]))],
        options={id(predictor): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    path = tmp_path / "pipeline.onnx"
    onnx.save(onx, str(path))
    assert "Concat" in {n.op_type for n in onx.graph.node if n.name in preprocessing_nodes(onx)}
    calibration = [{"num": data[i : i + 32], "cat": colours[i : i + 32, None]} for i in range(0, 128, 32)]
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.onnx_path == path.resolve() and lowered_nothing(built.params)
    assert built.notes == ("nothing to quantize (every Concat, Gather, Reshape node is kept float: preprocessing in "
                           "front of every layer with weights): the variant is the FP32 model",)  # fmt: skip


def test_the_kept_note_names_each_reason_with_its_own_op_types(data, tmp_path):
    """A scaler + KNN keeps nodes in FP32 for three reasons; the note listed every op type, then every reason, so which
    op had no FP16 kernel and which was ONNX-ML was left to guess. Each reason now follows its own op types."""
    from sklearn.neighbors import KNeighborsClassifier

    _, labels = make_classification(n_samples=240, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    fitted = make_pipeline(StandardScaler(), KNeighborsClassifier(3)).fit(data, labels)
    onx = skl2onnx.to_onnx(fitted, data[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3})
    onnx.save(onx, str(tmp_path / "knn.onnx"))
    built = _build(tmp_path / "knn.onnx", data, tmp_path / "fp16", {"name": "h", "precision": "fp16"})
    assert "kept in FP32: ArrayFeatureExtractor, Scaler (operator domain ai.onnx.ml); Scan (control flow (its subgraph " \
           "stays FP32)); TopK (no FP16 kernel in ONNX Runtime (the converter's block list))" in built.notes


def _scaled_tree(path: Path, threshold: float) -> None:
    """X -> Mul -> Add (a scaler as skl2onnx writes MinMaxScaler) -> a one-split TreeEnsembleRegressor on feature 0."""
    from onnx import TensorProto, helper

    tree = helper.make_node(
        "TreeEnsembleRegressor", ["scaled"], ["Y"], domain="ai.onnx.ml", name="tree", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[threshold, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[-1.0, 1.0],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "scale"], ["mul"], name="mul"),
         helper.make_node("Add", ["mul", "offset"], ["scaled"], name="add"), tree],
        "scaled_tree",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [2], [1.0, 1.0]),
         helper.make_tensor("offset", TensorProto.FLOAT, [2], [0.0, 0.0])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))


def _tree_then_scaled(path: Path) -> None:
    """A one-split TreeEnsembleRegressor whose prediction is multiplied by a constant 1, as onnxmltools writes a
    LightGBM model's scores (Mul(probabilities, one))."""
    from onnx import TensorProto, helper

    tree = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["raw"], domain="ai.onnx.ml", name="tree", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[0.3, 0.7],
    )  # fmt: skip
    graph = helper.make_graph(
        [tree, helper.make_node("Mul", ["raw", "one"], ["Y"], name="mul")], "tree_then_scaled",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))


@pytest.mark.parametrize("precision", ["int8", "fp16", "bf16"])
def test_a_step_on_a_tree_ensembles_output_does_not_make_it_a_narrower_model(tmp_path, precision):
    """A LightGBM classifier through onnxmltools: its trees, then Mul(scores, 1). Static INT8 quantized that Mul (one
    QLinearMul rounding the scores) and FP16 lowered it, and each was gated as an INT8 / FP16 model that passed, though
    every tree ran in FP32. INT8 now keeps the step float and is the FP32 model; FP16 says it computes in FP32."""
    path = tmp_path / "tree.onnx"
    _tree_then_scaled(path)
    x = np.random.default_rng(0).uniform(size=(128, 2)).astype(np.float32)
    built = _build(path, x, tmp_path / "w", {"name": "v", "precision": precision, "calibrator": "minmax"}
                   if precision == "int8" else {"name": "v", "precision": precision})  # fmt: skip
    if precision == "int8":
        assert built.onnx_path == path.resolve() and built.params["predictor_outputs_kept_float"] == ["mul"]
        assert built.notes == ("nothing to quantize (every Mul node is kept float: steps on the float output of an "
                               "ONNX-ML predictor): the variant is the FP32 model",)  # fmt: skip
        return
    assert built.params["lowered_op_types"] == {"Mul": 1}
    assert built.params["lowered_after_predictors"] == {}  # a Mul by 1 only rounds the scores: no arithmetic on them
    assert (built.params["contractions"], built.params["lowered_contractions"], built.params["fp32_predictors"]) == (
        0, 0, 1)  # fmt: skip
    assert (f"the graph computes in its ONNX-ML TreeEnsembleRegressor, which stay FP32: the variant computes in FP32, "
            f"{precision.upper()} rounds only the nodes above") in " ".join(built.notes)  # fmt: skip


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_scaler_lowered_in_front_of_a_tree_is_named_with_the_tree_reading_its_rounding(tmp_path, precision):
    """A scaler is all a tree pipeline lowers: the notes said only that the trees stay FP32, so the variant read as
    an FP16 model, though its one effect is that the FP32 trees split rounded features (1.0001 is 1.0 in FP16 and
    BF16: a split at 1.00005 sends it the other way). The note and params name what is lowered and who reads it."""
    path = tmp_path / "tree.onnx"
    _scaled_tree(path, threshold=1.00005)
    x = np.array([[1.0001, 0.0], [0.5, 0.0], [2.0, 0.0]], dtype=np.float32)
    built = _build(path, np.tile(x, (43, 1)), tmp_path / "w", {"name": "h", "precision": precision})
    assert built.params["lowered_op_types"] == {"Add": 1, "Mul": 1}
    assert built.params["fp32_nodes_reading_lowered"] == ["tree"]
    upper = precision.upper()
    assert f"lowered to {upper}: 1 Add, 1 Mul; every other node computes in FP32; the FP32 TreeEnsembleRegressor " \
           f"read values rounded to {upper}" in " ".join(built.notes)
    narrow = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}[precision]
    assert float(np.float32(x[0, 0]).astype(narrow)) <= 1.00005 < x[0, 0]  # the rounding the note warns of


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_isolation_forests_score_arithmetic_after_its_trees_is_named_as_lowered(tmp_path, precision):
    """skl2onnx's IsolationForest computes its score from the FP32 trees' path lengths (Sum, Div, Pow, Log, Add): FP16
    and BF16 lower that arithmetic and move the scores, yet the notes (and the gate) said the variant computed in
    FP32, as for a model whose only lowered step multiplies the trees' output by 1."""
    from sklearn.ensemble import IsolationForest

    x = np.random.default_rng(0).normal(size=(128, 4)).astype(np.float32)
    forest = IsolationForest(n_estimators=5, random_state=0).fit(x)
    path = tmp_path / "iso.onnx"
    onnx.save(skl2onnx.to_onnx(forest, x[:1], target_opset={"": 17, "ai.onnx.ml": 3}), str(path))
    built = _build(path, x, tmp_path / "w", {"name": "v", "precision": precision})
    after = built.params["lowered_after_predictors"]
    assert {"Div", "Log", "Pow"} <= set(after) and "Cast" not in after and "Reshape" not in after
    assert built.params["fp32_predictors"] == 5 and built.params["contractions"] == 0
    joined = " ".join(built.notes)
    assert f"compute on what they give in {precision.upper()}" in joined
    assert "the variant computes in FP32" not in joined
    scores = [outputs[1] for outputs in (_run(built.onnx_path, x), _run(path, x))]
    assert np.abs(scores[0] - scores[1]).max() > 0  # the arithmetic the note names moves the scores
