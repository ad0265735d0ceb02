"""FP32's note on the model outputs a sweep does not evaluate: a second head beside the scored one is compared by no
figure and no gate check, so a variant that breaks it passes; the results and the report say which outputs that is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from qbench.gate.evaluate import EXIT_PASS
from qbench.results.schema import read_results


def _two_head_project(tmp_path: Path, outputs: dict) -> Path:
    """x [n, 4] -> class logits [n, 3] and an 'aux' head [n, 1] (1000 * x0 + 5000, far from 0)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.array([[4, 0, 0], [0, 4, 0], [0, 0, 4], [1, 1, 1]], np.float32), "w"),
               numpy_helper.from_array(np.array([[1000], [0], [0], [0]], np.float32), "v"),
               numpy_helper.from_array(np.array(5000, np.float32), "base")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("MatMul", ["x", "v"], ["a"]),
             helper.make_node("Add", ["a", "base"], ["aux"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3]),
                               helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["n", 1])], weights)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    features = np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32)
    pd.DataFrame({"x": list(features), "y": np.argmax(features[:, :3], axis=1)}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "left_out_metrics.py").write_text("import numpy as np\n\ndef mean_aux(outputs, labels):\n"
                                                  "    return float(np.mean(outputs['aux']))\n")  # fmt: skip
    # gate.unresolved note: 80 rows resolve no drop of 0.01, and the gate's notes are printed with any verdict
    body = {"name": "heads", "model": {"path": "m.onnx", **outputs},
            "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "y"},
            "variants": [{"name": "fp16", "precision": "fp16"}],
            "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2}, "analysis": {"ranges": False},
            "gate": {"unresolved": "note"}}  # fmt: skip
    if "outputs" in outputs:
        body |= {"task": "structured", "metrics": [{"name": "mean_aux", "function": "left_out_metrics:mean_aux",
                                                    "outputs": ["aux"], "higher_is_better": True}]}  # fmt: skip
    else:
        body["task"] = "classification"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    return tmp_path / "r.yaml"


def _reference_notes(tmp_path: Path) -> tuple[tuple[str, ...], str]:
    folder = next((tmp_path / "reports" / "heads").iterdir())
    results = read_results(folder / "results.json")
    return next(v for v in results.variants if v.precision == "fp32").notes, (folder / "report.md").read_text()


def test_an_output_the_recipe_does_not_evaluate_is_named_in_fp32s_notes_the_report_and_the_gate_log(tmp_path, capsys):
    """model.output 'logits' of a model returning 'aux' too: before, nothing in results.json or the report said that
    'aux' was never compared (an INT8 build moved it by up to 912 on a std of 993, and the gate passed, exit 0). Now
    FP32's notes name it, its dtype and shape, and the output judged; the report's footnotes carry the note, and
    `qbench gate` prints one line naming it beside its pass."""
    from qbench.cli.app import main

    recipe = _two_head_project(tmp_path, {"output": "logits"})
    assert main(["sweep", str(recipe), "--no-track"]) == EXIT_PASS
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == EXIT_PASS
    logged = [line for line in capsys.readouterr().out.splitlines() if "not compared with FP32" in line]
    assert logged == ["gate note: output 'aux' not compared with FP32 (no figure reads it): this verdict does not "
                      "cover it, a variant changing it passes; list the outputs to judge in model.outputs"]  # fmt: skip
    notes, report = _reference_notes(tmp_path)
    left_out = [note for note in notes if "not compared with FP32" in note]
    assert left_out == ["output aux (float32, [None, 1]) not compared with FP32: every figure and the gate judge "
                        "'logits' alone, so a variant changing it passes unremarked; expected the outputs to judge "
                        "listed in model.outputs (task structured with a metric of your own reads any of "
                        "them)"]  # fmt: skip
    assert left_out[0] in report


def test_no_note_where_every_output_is_evaluated(tmp_path, capsys):
    from qbench.cli.app import main

    recipe = _two_head_project(tmp_path, {"outputs": ["logits", "aux"]})
    assert main(["sweep", str(recipe), "--no-track"]) == EXIT_PASS
    notes, report = _reference_notes(tmp_path)
    assert not [note for note in notes if "not compared with FP32" in note] and "not compared with FP32" not in report
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == EXIT_PASS
    assert "not compared with FP32" not in capsys.readouterr().out
