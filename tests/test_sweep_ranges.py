"""The range analysis reads what FP16/BF16 builds recorded about the ONNX graph's tensors from the results of backends
that ran that graph: a torch backend's result of the same variant carries no such record and must not hide it."""

from __future__ import annotations

from types import SimpleNamespace

from sweep_factory import make_variant

import qbench.validate.ranges as ranges_module
from qbench.sweep import _range_analysis
from qbench.validate.measure import PhaseClock


def test_a_torch_result_of_an_fp16_variant_does_not_erase_what_its_onnx_build_keeps_in_fp32(tmp_path, monkeypatch):
    seen = {}

    def analyse(*args, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(ranges_module, "analyse_ranges", analyse)
    record = {"tensors": {"big": 70000.0}, "harmless": {}}
    measured = [make_variant("fp16", "fp16", params={"fp16_range": record}),
                make_variant("fp16", "fp16", backend="torch-cpu", params={"torch.form": "fp16: module.half()"})]  # fmt: skip
    recipe = SimpleNamespace(analysis=SimpleNamespace(ranges=True), data=SimpleNamespace(evaluation=SimpleNamespace(
        batch_size=8)), latency=SimpleNamespace(threads=1))  # fmt: skip
    prepared = SimpleNamespace(recipe=recipe, source=SimpleNamespace(onnx_path=tmp_path / "m.onnx"), evaluation_feeds={},
                               slices={}, calibration=SimpleNamespace(per_slice_counts={}), batch=None)  # fmt: skip
    assert _range_analysis(prepared, [], measured, tmp_path, PhaseClock()) is None
    assert seen["fp16_handled"] == {"big": "fp16 keeps it in FP32"}
