"""Results of jobs that did not measure: a variant identical to another reports its twin's figures under its name;
what makes two variants identical depends on the form the backend runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sweep_factory import make_variant

from qbench.execute.jobs import identical, identities
from qbench.provenance import model_bytes, model_sha256
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import ONNX, TORCH, BuiltVariant
from qbench.variants.torch_forms import TORCH_FORM, attach_torch_form


class _Source:
    """A PyTorch source that is never built here (identical() runs nothing)."""

    def build(self) -> None:  # pragma: no cover - not called
        raise AssertionError("identical() must not build the module")


def _relu(path: Path, doc: str = "") -> Path:
    """A one-Relu ONNX model saved at `path`; `doc` changes its bytes, not its graph or weights."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], doc_string=doc), str(path))
    return path


def test_an_identical_variant_carries_only_what_is_true_of_the_form_its_twins_backend_ran(tmp_path: Path) -> None:
    spec = VariantSpec(name="fp16-again", precision="fp16")
    graph_note = "kept in FP32: TopK (FP16 has no kernel for it)"
    built = attach_torch_form(BuiltVariant("fp16-again", "fp16", _relu(tmp_path / "m.onnx"),
                                           params={"converted_nodes": 3},
                                           notes=(graph_note,)), spec, _Source())  # fmt: skip
    on_torch = identical(built, make_variant("fp16", "fp16", backend="torch-cpu"))
    on_ort = identical(built, make_variant("fp16", "fp16", backend="onnxruntime-cpu"))
    assert "converted_nodes" not in on_torch.params and graph_note not in on_torch.notes
    assert on_torch.params[TORCH_FORM] == "fp16: module.half()" and on_torch.params["identical_to"] == "fp16"
    assert on_ort.params["converted_nodes"] == 3 and graph_note in on_ort.notes and TORCH_FORM not in on_ort.params


def test_a_compiled_twin_of_a_variant_is_identical_on_onnx_runtime_but_not_where_its_torch_form_runs(tmp_path: Path) -> None:
    path = _relu(tmp_path / "m.onnx")
    eager, compiled = (
        identities(attach_torch_form(BuiltVariant(name, "fp32", path), VariantSpec(name=name, precision="fp32",
                                                                                   compile=flag), _Source()))
        for name, flag in (("fp32", False), ("fp32-compile", True))
    )  # fmt: skip
    assert eager[ONNX] == compiled[ONNX]  # the same graph on ONNX Runtime: timed once
    assert eager[TORCH] != compiled[TORCH]  # torch.compile'd code is not the eager module's: timed on its own


def test_an_identical_variant_records_the_size_and_digest_of_the_file_it_names(tmp_path: Path) -> None:
    """A re-saved twin (same graph and weights, other bytes) was recorded with its own path but the twin's digest:
    `qbench gate` then found the file 'replaced or edited after the sweep' and the results unusable."""
    twin_file, own = _relu(tmp_path / "fp32.onnx"), _relu(tmp_path / "int8.onnx", doc="re-saved by a quantizer")
    twin = replace(make_variant("fp32", "fp32"), model_path=str(twin_file), model_sha256=model_sha256(twin_file),
                   model_bytes=model_bytes(twin_file))  # fmt: skip
    result = identical(BuiltVariant("int8", "int8", own), twin)
    assert model_sha256(own) != twin.model_sha256
    assert (result.model_path, result.model_sha256, result.model_bytes) == (str(own), model_sha256(own),
                                                                            model_bytes(own))
    assert result.accuracy == twin.accuracy and result.latency == twin.latency
