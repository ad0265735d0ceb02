"""The range analysis reads what FP16/BF16 builds recorded about the ONNX graph's tensors from the results of backends
that ran that graph: a torch backend's result of the same variant carries no such record and must not hide it."""

from __future__ import annotations

from types import SimpleNamespace

from sweep_factory import make_variant

import qbench.validate.ranges as ranges_module
from qbench.sweep.runner import _range_analysis
from qbench.validate.clock import PhaseClock


def test_a_torch_result_of_an_fp16_variant_does_not_erase_what_its_onnx_build_keeps_in_fp32(tmp_path, monkeypatch):
    seen = {}

    def analyse(*args, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(ranges_module, "analyse_ranges", analyse)
    record = {"tensors": {"big": 70000.0}, "harmless": {}}
    measured = [make_variant("fp16", "fp16", params={"fp16_range": record}),
                make_variant("fp16", "fp16", backend="torch-cpu",
                             params={"torch.form": "fp16: module.half()"})]  # fmt: skip
    recipe = SimpleNamespace(analysis=SimpleNamespace(ranges=True), data=SimpleNamespace(evaluation=SimpleNamespace(
        batch_size=8)), latency=SimpleNamespace(threads=1))  # fmt: skip
    prepared = SimpleNamespace(recipe=recipe, source=SimpleNamespace(onnx_path=tmp_path / "m.onnx"),
                               evaluation_feeds={},
                               slices={}, calibration=SimpleNamespace(per_slice_counts={}), batch=None)  # fmt: skip
    assert _range_analysis(prepared, [], measured, tmp_path, PhaseClock()) is None
    assert seen["fp16_handled"] == {"big": "fp16 keeps it in FP32"}


def test_a_full_disk_in_the_range_analysis_stops_the_sweep_incomplete_and_resume_finishes_it(
    tmp_path, monkeypatch, capsys
):
    """The range pass saves the exposed FP32 model in the run folder. A full disk there was logged as `range analysis
    failed` and the sweep wrote complete results without the analysis the recipe asked for and exited 0. Now it
    stops, exit 2, naming the file and the disk's reason; the partial results keep every variant measured, the gate
    refuses them, and --resume (disk freed) finishes the run from its records."""
    import errno
    import json
    import os

    from user_model import make_fp16_project

    from qbench.cli.app import main
    from qbench.variants import onnx_utils

    recipe = make_fp16_project(tmp_path)
    save = onnx_utils.write_serialised

    def full_in_the_range_pass(model, file):
        if "qbench-ranges-" in str(file.name):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file.name))
        return save(model, file)

    monkeypatch.setattr(onnx_utils, "write_serialised", full_in_the_range_pass)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    (run,) = (tmp_path / "reports" / "tumour-mlp").iterdir()
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {run}/qbench-ranges-") and line.endswith(
        "/exposed.onnx: cannot write the model: No space left on device")  # fmt: skip
    partial = json.loads((run / "results.json").read_text())
    assert partial["complete"] is False and partial["ranges"] is None
    assert [(v["variant"], v["status"]) for v in partial["variants"]] == [("fp32", "ok"), ("fp16", "ok")]
    assert json.loads((run / "INCOMPLETE").read_text())["state"].endswith("No space left on device")
    assert main(["gate", str(recipe)]) == 2
    assert f"{run}, is incomplete (failed: " in " ".join(capsys.readouterr().err.split())

    monkeypatch.setattr(onnx_utils, "write_serialised", save)
    assert main(["sweep", str(recipe), "--no-track", "--resume"]) == 0
    finished = max((tmp_path / "reports" / "tumour-mlp").iterdir(), key=lambda folder: folder.stat().st_mtime)
    done = json.loads((finished / "results.json").read_text())
    assert finished != run and done["complete"] is True and done["ranges"] is not None
    assert [(v["variant"], v["status"]) for v in done["variants"]] == [("fp32", "ok"), ("fp16", "ok")]
    assert main(["gate", str(recipe)]) == 0
