"""The reference's normal form every variant is built from, and the check of every built model
(qbench.variants.reference).

Graphs ONNX Runtime runs but ONNX's tools and ORT's converters do not expect: nodes out of topological order, a graph
input listed as an output under its own name, an initializer listed as an output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.emulate import save_float16_emulation
from qbench.variants.onnx_utils import check_model_against
from qbench.variants.reference import load_reference

FEATURES, HIDDEN, CLASSES = 8, 16, 3
RNG = np.random.default_rng(3)
WEIGHTS = {
    "w1": RNG.normal(size=(FEATURES, HIDDEN)).astype(np.float32) * 0.5,
    "b1": RNG.normal(size=HIDDEN).astype(np.float32) * 0.1,
    "w2": RNG.normal(size=(HIDDEN, CLASSES)).astype(np.float32) * 0.5,
}
PRIOR = np.arange(CLASSES, dtype=np.float32)  # an initializer some graphs list as an output
X = RNG.normal(size=(96, FEATURES)).astype(np.float32)
NODES = [
    helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
    helper.make_node("Add", ["a", "b1"], ["a2"], name="add"),
    helper.make_node("Relu", ["a2"], ["r"], name="relu"),
    helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
]
VARIANTS = {
    "fp16": {"precision": "fp16"},
    "bf16": {"precision": "bf16"},
    "int8-minmax": {"precision": "int8", "calibrator": "minmax"},
    "int8-dynamic": {"precision": "int8", "calibrator": "dynamic"},
    "fp8": {"precision": "fp8", "calibrator": "minmax"},
}
LOGITS = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])


def _save(path: Path, nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], prior: bool = False) -> Path:
    """The MLP with `nodes` in the given order (ORT runs it; the checker is not asked) and `outputs`."""
    weights = {**WEIGHTS, "prior": PRIOR} if prior else WEIGHTS
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _session(path_or_model: Path | onnx.ModelProto) -> ort.InferenceSession:
    source = str(path_or_model) if isinstance(path_or_model, Path) else path_or_model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def _build(path: Path, workdir: Path, name: str) -> BuiltVariant:
    calibration = [{"x": X[i : i + 32]} for i in range(0, len(X), 32)]
    spec = VariantSpec(name=name, **VARIANTS[name])
    return build_variant(spec, BuildContext(reference_path=path, workdir=workdir, calibration=calibration))


def _outputs(path: Path) -> list[tuple[str, str]]:
    return [(o.name, o.type) for o in _session(path).get_outputs()]


def test_a_cycle_is_one_line_naming_the_file(tmp_path):
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="one"), helper.make_node("Relu", ["a"], ["b"], name="two"),
             helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
             helper.make_node("MatMul", ["h", "w2"], ["logits"])]  # fmt: skip
    path = _save(tmp_path / "cycle.onnx", nodes, [LOGITS])
    with pytest.raises(QbenchError, match=r"cycle.onnx: the graph has a cycle"):
        load_reference(path)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_builds_from_a_graph_whose_nodes_are_out_of_order(tmp_path, name):
    """ORT runs a graph with its nodes in reverse order; BF16 (onnx checker) and FP8 (version converter) failed on it,
    and the FP16 converter writes such graphs itself (its saved model is now sorted and checked)."""
    path = _save(tmp_path / "reversed.onnx", NODES[::-1], [LOGITS])
    built = _build(path, tmp_path / "w", name)
    onnx.checker.check_model(str(built.onnx_path))
    expected = _session(path).run(None, {"x": X})[0]
    ran = _session(built.onnx_path).run(None, {"x": X})[0]
    assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9
    assert np.abs(ran - expected).max() < 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_graph_input_listed_as_an_output_is_carried_over_by_every_variant(tmp_path, name):
    """No node produces output `x` (the input itself): FP16's converter wrote an invalid model and static INT8 failed
    ('Graph is not a DAG'). Every variant keeps the output, in its place, equal to the input."""
    passthrough = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])
    path = _save(tmp_path / "passthrough.onnx", NODES, [passthrough, LOGITS])
    built = _build(path, tmp_path / "w", name)
    onnx.checker.check_model(str(built.onnx_path))
    assert _outputs(built.onnx_path) == _outputs(path)
    echoed, logits = _session(built.onnx_path).run(None, {"x": X})
    np.testing.assert_array_equal(echoed, X)
    assert np.mean(logits.argmax(1) == _session(path).run(None, {"x": X})[1].argmax(1)) > 0.9


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_initializer_listed_as_an_output_is_produced_in_every_variant(tmp_path, name):
    """FP16's saved model defined `prior` twice (ORT refused it) although the build said built."""
    prior = helper.make_tensor_value_info("prior", TensorProto.FLOAT, [CLASSES])
    path = _save(tmp_path / "prior.onnx", NODES, [prior, LOGITS], prior=True)
    built = _build(path, tmp_path / "w", name)
    onnx.checker.check_model(str(built.onnx_path))
    assert _outputs(built.onnx_path) == _outputs(path)
    np.testing.assert_array_equal(_session(built.onnx_path).run(None, {"x": X})[0], PRIOR)


def test_the_normal_form_computes_what_the_file_does(tmp_path):
    """Sorting, the Identity for an initializer output and the set-aside input output change no value: the outputs
    left are the file's, in order, and the normal form passes the checker."""
    passthrough = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])
    prior = helper.make_tensor_value_info("prior", TensorProto.FLOAT, [CLASSES])
    nodes = [*NODES[::-1], helper.make_node("Mul", ["logits", "prior"], ["weighted"], name="weigh")]
    weighted = helper.make_tensor_value_info("weighted", TensorProto.FLOAT, ["N", CLASSES])
    path = _save(tmp_path / "all.onnx", nodes, [prior, passthrough, LOGITS, weighted], prior=True)
    model = load_reference(path)
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["prior", "logits", "weighted"]
    assert {n.name for n in NODES} | {"weigh"} <= {n.name for n in model.graph.node}
    original = dict(zip(["prior", "x", "logits", "weighted"], _session(path).run(None, {"x": X})))
    for output, value in zip(["prior", "logits", "weighted"], _session(model).run(None, {"x": X})):
        np.testing.assert_array_equal(value, original[output])
    mul = next(n for n in model.graph.node if n.name == "weigh")
    assert mul.input[1] in {t.name for t in model.graph.initializer}, "readers still read the initializer itself"


def test_a_built_model_the_checker_refuses_fails_the_build_in_one_line(tmp_path, monkeypatch, mlp):
    """A builder that saves an invalid model no longer gets it reported built (it failed later, when measured)."""
    import qbench.variants

    def broken(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
        node = helper.make_node("Relu", ["nowhere"], ["y"], name="reads_nothing")
        graph = helper.make_graph([node], "broken", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        target = ctx.workdir / f"{spec.name}.onnx"
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(target))
        return BuiltVariant(spec.name, spec.precision, target)

    monkeypatch.setattr(qbench.variants, "builder_for", lambda spec: broken)
    with pytest.raises(QbenchError) as caught:
        build_variant(VariantSpec(name="half", precision="fp16"), mlp.context(tmp_path))
    message = str(caught.value)
    assert message.startswith("variant 'half': the built model half.onnx is not valid ONNX:")
    assert "nowhere" in message and "\n" not in message


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_builds_from_an_ir3_model_listing_its_initializers_as_inputs(tmp_path, name):
    """IR 3 (ONNX 1.3, opset 8: old exporters, model zoos) requires every initializer to be a graph input too: the
    scales and zero points static INT8 adds made the saved model invalid, and dynamic INT8's Gemm rewrite failed."""
    weights = [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES]),
              *(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims)) for w in weights)]  # fmt: skip
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["a2"], name="gemm"), *NODES[2:]]
    model = helper.make_model(helper.make_graph(nodes, "old", inputs, [LOGITS], weights),
                              opset_imports=[helper.make_opsetid("", 8)], ir_version=3)  # fmt: skip
    onnx.checker.check_model(model)
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))
    built = _build(path, tmp_path / "w", name)
    onnx.checker.check_model(str(built.onnx_path))
    expected = _session(path).run(None, {"x": X})[0]
    ran = _session(built.onnx_path).run(["logits"], {"x": X})[0]
    assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9
    assert np.abs(ran - expected).max() < 0.1 * np.abs(expected).max()


def _with_initializer_inputs(path: Path, opset: int, ir_version: int) -> Path:
    """The MLP times an optional input `scale` (an initializer default, 2.0) with every initializer listed as a graph
    input, as IR 3 requires and old exporters (keep_initializers_as_inputs) write at any IR."""
    weights = [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()]
    weights.append(numpy_helper.from_array(np.array([2.0], dtype=np.float32), "scale"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES]),
              *(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims)) for w in weights)]  # fmt: skip
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["a2"], name="gemm"), NODES[2],
             helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
             helper.make_node("Mul", ["m", "scale"], ["logits"], name="scaled")]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "old", inputs, [LOGITS], weights),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)  # fmt: skip
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("opset", "ir_version"), [(9, 3), (13, 7)])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_initializers_listed_as_inputs_are_constants_every_variant_converts_alike(tmp_path, name, opset, ir_version):
    """Initializers listed as graph inputs (weights and an optional `scale`) stayed inputs in the normal form: static
    INT8 dropped them all, dynamic INT8 the weights it quantized, FP16 kept the weights float32 behind Casts (a file
    larger than FP32's) and FP8 left them unquantized. They are constants in every variant alike, which takes the
    inputs a caller feeds FP32 (x), converts the weights as its precision does and says so in its params and notes."""
    path = _with_initializer_inputs(tmp_path / "old.onnx", opset, ir_version)
    built = _build(path, tmp_path / "w", name)
    model = onnx.load(str(built.onnx_path))
    assert [value.name for value in model.graph.input] == ["x"]
    assert built.params["constant_inputs"] == ["w1", "b1", "w2", "scale"]
    assert any("lists 4 initializer(s) as graph inputs (w1, b1, w2, scale)" in note for note in built.notes)
    types = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    if name == "fp16":
        assert types["w1"] == types["w2"] == TensorProto.FLOAT16
        assert built.onnx_path.stat().st_size < path.stat().st_size
    elif name != "bf16":  # BF16 rounds float32 weights; INT8 and FP8 store the quantized weights instead
        assert "w1" not in types and "w2" not in types
    expected = _session(path).run(None, {"x": X})[0]
    ran = _session(built.onnx_path).run(["logits"], {"x": X})[0]
    assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9
    assert np.abs(ran - expected).max() < 0.1 * np.abs(expected).max()


def test_a_built_model_that_does_not_take_the_fp32_models_inputs_fails_the_build(tmp_path, monkeypatch, mlp):
    """A build that drops an input FP32 is fed would be measured and served as if the input did not matter."""
    import qbench.variants

    def forgetful(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
        node = helper.make_node("Relu", ["z"], ["y"], name="other_input")
        graph = helper.make_graph([node], "forgetful",
                                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        target = ctx.workdir / f"{spec.name}.onnx"
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(target))
        return BuiltVariant(spec.name, spec.precision, target)

    monkeypatch.setattr(qbench.variants, "builder_for", lambda spec: forgetful)
    with pytest.raises(QbenchError, match=r"^variant 'half': the built model half.onnx takes the inputs z; expected "
                       r"the FP32 model's x, in that order$"):  # fmt: skip
        build_variant(VariantSpec(name="half", precision="fp16"), mlp.context(tmp_path))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_builds_from_a_graph_input_of_unknown_rank(tmp_path, name):
    """An input declared without a shape: ORT runs the model, the onnx checker refuses it ('Field 'shape' of 'type'
    is required'), and every build failed on that error it inherited. Kept from the reference, it is not the build's;
    the variant computes what the reference computes (FP16's CPU emulation too)."""
    graph = helper.make_graph(NODES, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], [LOGITS],
                              [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "unranked.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(str(path))
    built = _build(path, tmp_path / "w", name)
    expected = _session(path).run(None, {"x": X})[0]
    runs = [built.onnx_path]
    if name == "fp16":
        runs.append(save_float16_emulation(built.onnx_path)[0])
    for run in runs:
        ran = _session(run).run(None, {"x": X})[0]
        assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9
        assert np.abs(ran - expected).max() < 0.1 * np.abs(expected).max()


def test_a_checker_error_the_reference_does_not_have_still_fails_the_build():
    """Only the reference's own checker error is let through: the same defect in a build of a valid reference fails."""
    def mlp(declared: onnx.ValueInfoProto) -> onnx.ModelProto:
        graph = helper.make_graph(NODES, "mlp", [declared], [LOGITS],
                                  [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    valid = mlp(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES]))
    unranked = mlp(helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    check_model_against(unranked, unranked)
    with pytest.raises(onnx.checker.ValidationError, match="shape"):
        check_model_against(unranked, valid)


def _type_as_weights(path: Path) -> Path:
    """The MLP with its weight matrices stored in float16 and widened by CastLike(w, x), as PyTorch's dynamo exporter
    writes `w.type_as(x)`."""
    stored = [numpy_helper.from_array(WEIGHTS[name].astype(np.float16), f"{name}_stored") for name in ("w1", "w2")]
    widen = [helper.make_node("CastLike", [f"{name}_stored", "x"], [name], name=f"widen_{name}")
             for name in ("w1", "w2")]  # fmt: skip
    graph = helper.make_graph([*widen, *NODES], "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [LOGITS], [*stored, numpy_helper.from_array(WEIGHTS["b1"], "b1")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_a_cast_like_of_a_weight_is_the_cast_it_stands_for_in_the_normal_form(tmp_path):
    path = _type_as_weights(tmp_path / "type_as.onnx")
    model = load_reference(path)
    assert {node.op_type for node in model.graph.node} == {"Cast", "MatMul", "Add", "Relu"}
    casts = [a.i for node in model.graph.node if node.op_type == "Cast" for a in node.attribute]
    assert casts == [TensorProto.FLOAT] * 2
    expected = _session(path).run(None, {"x": X})[0]
    np.testing.assert_array_equal(_session(model).run(None, {"x": X})[0], expected)


@pytest.mark.parametrize("name", ["int8-minmax", "fp8"])
def test_weights_widened_by_cast_like_are_quantized_as_weights(tmp_path, name):
    """CastLike(w, x) read the activation x, so folding left the weight computed from it: static INT8 and FP8
    quantized both MatMul inputs as activations (the calibrator's range, per tensor, no weight of the layer counted as
    quantized: weights_as_built held the Add only) and computed another model than the INT8/FP8 one deployed."""
    built = _build(_type_as_weights(tmp_path / "type_as.onnx"), tmp_path / "w", name)
    assert built.params["folded_weights"] == ["w1", "w2"]
    assert sum(built.params["weights_as_built"]["MatMul"].values()) == 2
