"""Builds of models over protobuf's 2 GiB, with the limit simulated at a couple of KiB (tests/protobuf_limit.py,
serialisation included): the pass memo's model key, the FP16 emulation's copy and ONNX Runtime's typing of contrib
operators used to serialise the whole model in memory, which fails over the limit and holds the weights twice more
below it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from protobuf_limit import simulate_protobuf_limit

from qbench.variants.emulate import emulate_float16, emulated_model_path, save_float16_emulation
from qbench.variants.float_support import tensor_types
from qbench.variants.pass_memo import model_digest

LIMIT, WEIGHTLESS = 2000, 100  # each 24x24 weight: 2304 bytes in float32, 1152 in float16 (onnx keeps < 1 KiB inline)


def _mlp(elem: int, *, gelu: bool = False) -> onnx.ModelProto:
    """x[1,24] -> MatMul -> Relu (or com.microsoft Gelu) -> MatMul -> y, in `elem` (float or float16)."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (24, 24)).astype(dtype), f"w{i}") for i in (1, 2)]
    activation = (helper.make_node("Gelu", ["h"], ["a"], name="act", domain="com.microsoft") if gelu
                  else helper.make_node("Relu", ["h"], ["a"], name="act"))  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), activation,
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2")],
        "mlp", [helper.make_tensor_value_info("x", elem, [1, 24])], [helper.make_tensor_value_info("y", elem, [1, 24])],
        weights,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if gelu else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_model_digest_of_a_model_over_protobufs_limit_is_its_digest_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SmoothQuant memo's key serialised the whole model: "exceeds maximum protobuf size" over 2 GiB."""
    model = _mlp(TensorProto.FLOAT)
    expected = model_digest(model)
    simulate_protobuf_limit(monkeypatch, LIMIT, WEIGHTLESS, serialisation=True)
    with pytest.raises(ValueError, match="exceeds maximum protobuf size"):
        model.SerializeToString()  # the simulation holds
    assert model_digest(model) == expected


def test_model_digest_is_the_same_for_the_same_bytes_and_changes_with_one_weight() -> None:
    model = _mlp(TensorProto.FLOAT)
    parsed = onnx.ModelProto.FromString(model.SerializeToString())
    assert model_digest(parsed) == model_digest(model)
    changed = onnx.ModelProto.FromString(model.SerializeToString())
    raw = bytearray(changed.graph.initializer[1].raw_data)
    raw[-1] ^= 1  # one bit of the last weight
    changed.graph.initializer[1].raw_data = bytes(raw)
    assert model_digest(changed) != model_digest(model)
    renamed = onnx.ModelProto.FromString(model.SerializeToString())
    renamed.graph.node[1].name = "other"
    assert model_digest(renamed) != model_digest(model)


def test_fp16_emulation_of_a_model_over_protobufs_limit_is_the_one_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """emulate_float16 copied the FP16 model by serialising and parsing it: over 2 GiB that failed."""
    half = _mlp(TensorProto.FLOAT16)
    expected, expected_count = emulate_float16(half)
    simulate_protobuf_limit(monkeypatch, LIMIT, WEIGHTLESS, serialisation=True)
    emulated, count = emulate_float16(half)
    assert (emulated.graph, count) == (expected.graph, expected_count)
    assert half.graph.initializer[0].data_type == TensorProto.FLOAT16  # the source is left as it was


def test_saved_fp16_emulation_of_a_model_over_protobufs_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saved emulation of an FP16 file over the limit: written with external data, checked by path."""
    half = _mlp(TensorProto.FLOAT16)
    expected, expected_count = emulate_float16(half)
    artifact = tmp_path / "half.onnx"
    onnx.save_model(half, str(artifact))
    simulate_protobuf_limit(monkeypatch, LIMIT, WEIGHTLESS, serialisation=True)
    path, count = save_float16_emulation(artifact)
    assert path == emulated_model_path(artifact) and count == expected_count == 3  # h, a and y
    assert Path(f"{path}.data").exists()  # over the limit: the weights went to external data
    monkeypatch.undo()
    saved = onnx.load(str(path))
    assert list(saved.graph.node) == list(expected.graph.node)
    for tensor, wanted in zip(saved.graph.initializer, expected.graph.initializer, strict=True):
        assert tensor.data_type == TensorProto.FLOAT
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), numpy_helper.to_array(wanted))


def test_runtime_types_of_a_model_over_protobufs_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A com.microsoft Gelu's output has no schema type: ONNX Runtime's answer came from the model serialised whole,
    none at all over the limit, which left the FP16/BF16 converters without the type of what it feeds."""
    model = _mlp(TensorProto.FLOAT, gelu=True)
    expected = tensor_types(model)
    assert expected["a"] == TensorProto.FLOAT
    simulate_protobuf_limit(monkeypatch, LIMIT, WEIGHTLESS, serialisation=True)
    assert tensor_types(model) == expected


def _never_serialising_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serialising a model that holds a weight over 100 bytes fails; tensors over 100 bytes are held back from
    in-memory inference and checks (the weightless size)."""
    from qbench import onnx_read

    serialise = onnx.ModelProto.SerializeToString

    def without_weights(message: onnx.ModelProto, *args: object, **kwargs: object) -> bytes:
        assert not any(len(t.raw_data) > WEIGHTLESS for t in message.graph.initializer), "weights serialised"
        return serialise(message, *args, **kwargs)

    monkeypatch.setattr(onnx_read, "_WEIGHTLESS_BYTES", WEIGHTLESS)
    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", without_weights)


def test_checking_a_model_in_memory_never_serialises_its_weights_and_still_refuses_a_broken_one(monkeypatch):
    """onnx.checker serialised the model it was given (the BF16 and FP8 builds' peak: the weights twice more)."""
    from qbench.variants.onnx_utils import check_model_against

    model, source = _mlp(TensorProto.FLOAT), _mlp(TensorProto.FLOAT)
    broken = _mlp(TensorProto.FLOAT)
    broken.graph.node[1].output[0] = "h"  # `h` now has two producers: not SSA
    _never_serialising_weights(monkeypatch)
    check_model_against(model, source)
    with pytest.raises(onnx.checker.ValidationError, match="h"):
        check_model_against(broken, source)


def test_preprocessing_a_typed_model_never_serialises_it_whole(tmp_path, monkeypatch):
    """ORT's pre-processing, left only to tag a model ONNX inference typed, saved it by serialising it whole (the INT8
    builds' peak below 2 GiB). The tagged model is saved piece by piece, in one file as before."""
    from qbench.variants.calibrate import preprocess_model

    model = _mlp(TensorProto.FLOAT)
    _never_serialising_weights(monkeypatch)
    path, done = preprocess_model(model, tmp_path)
    monkeypatch.undo()
    assert done.startswith("ONNX shape inference (it typed every tensor") and sorted(tmp_path.iterdir()) == [path]
    saved = onnx.load(str(path))
    assert {p.key: p.value for p in saved.metadata_props} == {"onnx.quant.pre_process": "onnxruntime.quant"}
    np.testing.assert_array_equal(numpy_helper.to_array(saved.graph.initializer[0]),
                                  numpy_helper.to_array(_mlp(TensorProto.FLOAT).graph.initializer[0]))  # fmt: skip


def _varied() -> onnx.ModelProto:
    """_mlp with the rest of what a model holds: docs, metadata, value_info, an If with its own initializer, a local
    function, a float_data tensor."""
    model = _mlp(TensorProto.FLOAT)
    graph = model.graph
    branch = helper.make_graph([helper.make_node("Identity", ["k"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])],
                               [helper.make_tensor("k", TensorProto.FLOAT, [1], [2.0])])  # fmt: skip
    graph.initializer.append(helper.make_tensor("flag", TensorProto.BOOL, [], [True]))
    graph.node.append(helper.make_node("If", ["flag"], ["z"], name="if", then_branch=branch, else_branch=branch))
    graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1]))
    graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 24]))
    graph.doc_string = "graph doc"
    model.doc_string, model.producer_name, model.model_version = "model doc", "qbench-test", 7
    helper.set_model_props(model, {"b": "2", "a": "1"})
    model.functions.append(helper.make_function("local", "F", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                                [helper.make_opsetid("", 17)]))  # fmt: skip
    return model


def test_saved_model_is_serialisations_bytes_written_piece_by_piece(tmp_path, monkeypatch):
    """onnx.save_model serialised a model below 2 GiB whole (about three times its weights in memory: the FP16 and
    BF16 builds' peak). save_model writes the very bytes SerializeToString gives, one node or tensor at a time."""
    from qbench.variants.onnx_utils import save_model

    model = _varied()
    expected = model.SerializeToString()
    _never_serialising_weights(monkeypatch)
    path = save_model(model, tmp_path / "m.onnx")
    monkeypatch.undo()
    assert path.read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_raising_the_opset_of_a_model_over_protobufs_limit_is_the_raise_below_it(monkeypatch: pytest.MonkeyPatch):
    """onnx's version converter serialises the model it is given: the FP8 build (opset 21) of a 2.4 GB MLP saved
    with external data failed with "upgrading opset 17 to 21: Unable to parse proto from the given bytes". It now
    converts the typing skeleton and puts the weights back, in their order."""
    from qbench.variants.opset_upgrade import ensure_opset

    model = _mlp(TensorProto.FLOAT)
    expected = ensure_opset(_mlp(TensorProto.FLOAT), 21)
    simulate_protobuf_limit(monkeypatch, LIMIT, WEIGHTLESS, serialisation=True)
    raised = ensure_opset(model, 21)
    monkeypatch.undo()
    assert [(o.domain, o.version) for o in raised.opset_import] == [("", 21)]
    assert raised.graph == expected.graph  # nodes, inputs (no weight as an input), initializers in their order
    assert [t.name for t in raised.graph.initializer] == ["w1", "w2"]
    assert [i.name for i in raised.graph.input] == ["x"]
    assert model.opset_import[0].version == 17  # the source is left as it was
