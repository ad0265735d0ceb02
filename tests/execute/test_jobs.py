"""Results of jobs that did not measure: a variant identical to another reports its twin's figures under its name."""

from __future__ import annotations

from pathlib import Path

from sweep_factory import make_variant

from qbench.execute.jobs import identical
from qbench.recipe import VariantSpec
from qbench.variants.base import BuiltVariant
from qbench.variants.torch_forms import TORCH_FORM, attach_torch_form


class _Source:
    """A PyTorch source that is never built here (identical() runs nothing)."""

    def build(self) -> None:  # pragma: no cover - not called
        raise AssertionError("identical() must not build the module")


def test_an_identical_variant_carries_only_what_is_true_of_the_form_its_twins_backend_ran(tmp_path: Path) -> None:
    spec = VariantSpec(name="fp16-again", precision="fp16")
    graph_note = "kept in FP32: TopK (FP16 has no kernel for it)"
    built = attach_torch_form(BuiltVariant("fp16-again", "fp16", tmp_path / "m.onnx", params={"converted_nodes": 3},
                                           notes=(graph_note,)), spec, _Source())  # fmt: skip
    on_torch = identical(built, make_variant("fp16", "fp16", backend="torch-cpu"))
    on_ort = identical(built, make_variant("fp16", "fp16", backend="onnxruntime-cpu"))
    assert "converted_nodes" not in on_torch.params and graph_note not in on_torch.notes
    assert on_torch.params[TORCH_FORM] == "fp16: module.half()" and on_torch.params["identical_to"] == "fp16"
    assert on_ort.params["converted_nodes"] == 3 and graph_note in on_ort.notes and TORCH_FORM not in on_ort.params
