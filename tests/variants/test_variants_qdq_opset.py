"""Q/DQ builds of a model stamped at an opset whose QuantizeLinear/DequantizeLinear the installed ONNX Runtime has
no kernel for: ONNX Runtime 1.32 loads an opset-28 FP32 model but not QuantizeLinear(28), so every static INT8, FP8
and SmoothQuant/`linear` static variant of it failed when measured, after the rest of the sweep. Such a build is
stamped at the lowest opset that keeps every node's operator version (qbench.variants.qdq_opset)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant, qdq_opset
from qbench.variants.onnx_utils import default_opset

NEWEST = onnx.defs.onnx_opset_version()
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8)).astype(np.float32)


def _mlp(path: Path, opset: int, cast: bool = False) -> Path:
    """x [batch, 8] -> MatMul -> Add -> Relu (-> Cast to float, a node whose operator changed at `NEWEST`) -> MatMul."""
    rng = np.random.default_rng(1)  # the same weights at every opset
    weights = {"w1": rng.normal(size=(8, 16)), "b1": 0.1 * rng.normal(size=16), "w2": rng.normal(size=(16, 4))}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r0" if cast else "r"], name="relu")]  # fmt: skip
    if cast:
        nodes.append(helper.make_node("Cast", ["r0"], ["r"], name="cast", to=TensorProto.FLOAT))
    nodes.append(helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(v.astype(np.float32), k)
                               for k, v in weights.items()])  # fmt: skip
    imports = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports))
    onnx.save(model, str(path))
    return path


def _run(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


@pytest.fixture
def runtime_lacks_newest_qdq() -> None:
    if qdq_opset.runtime_runs_qdq(NEWEST):
        pytest.skip(f"this onnxruntime runs QuantizeLinear/DequantizeLinear at opset {NEWEST}, the newest onnx knows")


@pytest.mark.usefixtures("runtime_lacks_newest_qdq")
@pytest.mark.parametrize("variant", [
    {"precision": "int8", "calibrator": "minmax"}, {"precision": "fp8", "calibrator": "minmax"},
    {"precision": "int8", "calibrator": "minmax", "smoothquant": {"alpha": 0.5}}])  # fmt: skip
def test_a_qdq_build_of_a_model_at_an_opset_without_qdq_kernels_loads_and_computes_what_it_computes(tmp_path, variant):
    """At opset 28 on ONNX Runtime 1.32 the static INT8 and FP8 builds did not load (`Could not find an
    implementation for QuantizeLinear(28)`); stamped at 14 (Add and Relu last changed at 14), they load, and give
    what the same build of the model exported at opset 14 gives, bit for bit."""
    newest, older = _mlp(tmp_path / "newest.onnx", NEWEST), _mlp(tmp_path / "older.onnx", 14)
    np.testing.assert_array_equal(_run(newest), _run(older))
    calibration = [{"x": RNG.normal(size=(16, 8)).astype(np.float32)} for _ in range(4)]
    built, reference = (build_variant(VariantSpec(name="v", **variant),
                                      BuildContext(reference_path=path, workdir=tmp_path / path.stem,
                                                   calibration=calibration))
                        for path in (newest, older))  # fmt: skip
    assert default_opset(onnx.load(str(built.onnx_path))) == max(14, default_opset(onnx.load(str(reference.onnx_path))))
    np.testing.assert_array_equal(_run(built.onnx_path), _run(reference.onnx_path))


@pytest.mark.usefixtures("runtime_lacks_newest_qdq")
def test_a_model_whose_own_nodes_need_that_opset_is_one_line_naming_the_node(tmp_path):
    """A Cast (changed at opset 28) holds the model at its opset: no lower stamp keeps what it computes."""
    path = _mlp(tmp_path / "cast.onnx", NEWEST, cast=True)
    with pytest.raises(QbenchError, match=rf"at the model's opset {NEWEST}, and its node Cast 'cast' needs opset "
                                          rf"{NEWEST}, so no lower opset keeps "
                                          r"what the model computes; expected"):  # fmt: skip
        build_variant(VariantSpec(name="v", precision="int8", calibrator="minmax"),
                      BuildContext(reference_path=path, workdir=tmp_path / "w",
                                   calibration=[{"x": X[:16]}]))  # fmt: skip


@pytest.mark.usefixtures("runtime_lacks_newest_qdq")
@pytest.mark.parametrize("variant", [{"precision": "int8", "calibrator": "dynamic"},
                                     {"precision": "int8", "calibrator": "dynamic", "smoothquant": {"alpha": 0.5}}])
def test_a_dynamic_build_writes_no_qdq_and_keeps_the_models_opset(tmp_path, variant):
    """Dynamic INT8 (DynamicQuantizeLinear, MatMulInteger) runs at that opset: such a model, its Cast included,
    still builds, at its own opset, and stays within INT8 rounding of FP32."""
    path = _mlp(tmp_path / "cast.onnx", NEWEST, cast=True)
    built = build_variant(VariantSpec(name="v", **variant),
                          BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=[{"x": X[:16]}]))
    assert default_opset(onnx.load(str(built.onnx_path))) == NEWEST
    expected = _run(path)
    assert 0 < np.abs(_run(built.onnx_path) - expected).max() < 0.05 * np.abs(expected).max()


def test_the_stamp_is_the_newest_operator_version_among_the_nodes_local_functions_included(monkeypatch):
    """A runtime without Q/DQ above 20: a model at 23 whose main graph needs 17 (LayerNormalization) and whose local
    function holds a Gelu (20) is stamped 20, its function's import too; one whose nodes need 17 alone, 17; never
    below the build's own minimum (21 for FP8)."""
    monkeypatch.setattr(qdq_opset, "runtime_runs_qdq", lambda opset: opset <= 20)
    fn = helper.make_function("local", "Act", ["a"], ["b"], [helper.make_node("Gelu", ["a"], ["b"])],
                              opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["n"], name="ln"),
             helper.make_node("Act", ["n"], ["y"], domain="local", name="act")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "g")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("local", 1)],
                              functions=[fn])  # fmt: skip
    stamped, said = qdq_opset.qdq_runnable(model, 11)
    assert (default_opset(stamped), stamped.functions[0].opset_import[0].version) == (20, 20)
    assert said.startswith("opset 23 stamped as 20 ")
    assert default_opset(model) == 23  # the caller's model is left as it was
    without = onnx.ModelProto()
    without.CopyFrom(model)
    del without.functions[:]
    without.graph.node[1].CopyFrom(helper.make_node("Relu", ["n"], ["y"]))
    assert default_opset(qdq_opset.qdq_runnable(without, 11)[0]) == 17
    with pytest.raises(QbenchError, match="the build needs opset 21"):
        qdq_opset.qdq_runnable(without, 21)
