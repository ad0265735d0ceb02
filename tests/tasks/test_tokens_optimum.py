"""Token labels against a decoder step as optimum exports it (decoder_with_past_model.onnx, logits ['batch_size', '1',
vocabulary]): a tiny T5 built from a config, exported by optimum itself. The mechanism is tested without optimum in
test_tokens.py (a decoder step whose token axis the graph leaves symbolic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from qbench.cli.app import main
from tests.tasks.task_projects import plain_ort, said

pytest.importorskip("optimum.exporters.onnx", reason="optimum-onnx is not installed (pip install optimum-onnx)")

ROWS, SOURCE, LAYERS = 40, 6, 2


def _exported_t5(root: Path) -> Path:
    import torch
    from optimum.exporters.onnx import main_export
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=LAYERS, num_heads=2,
                      decoder_start_token_id=0)  # fmt: skip
    T5ForConditionalGeneration(config).eval().save_pretrained(root / "t5")
    main_export(str(root / "t5"), output=str(root / "onnx"), task="text2text-generation-with-past", opset=17,
                do_validation=False)  # fmt: skip
    return root / "onnx"


def test_optimums_decoder_step_is_judged_on_token_labels_of_one_per_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _exported_t5(tmp_path)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 64, size=(ROWS, SOURCE))
    mask = np.ones_like(ids)
    hidden = plain_ort(folder / "encoder_model.onnx", {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
    first = plain_ort(folder / "decoder_model.onnx", {"input_ids": np.zeros((ROWS, 1), dtype=np.int64),
                                                      "encoder_hidden_states": hidden,
                                                      "encoder_attention_mask": mask})  # fmt: skip
    feeds = {"encoder_attention_mask": mask, "input_ids": first["logits"].argmax(-1)}
    feeds.update({f"past_key_values.{name[len('present.'):]}": value for name, value in first.items()
                  if name.startswith("present.")})  # fmt: skip
    step = folder / "decoder_with_past_model.onnx"
    logits = plain_ort(step, feeds)["logits"]
    assert logits.shape[1] == 1
    labels = logits.argmax(-1)
    labels[::4] = (labels[::4] + 1) % 64  # a quarter of the rows wrong: FP32's accuracy 0.75
    np.savez(tmp_path / "step.npz", y=labels, **feeds)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "t5-step", "task": "classification", "model": {"path": str(step)},
        "data": {"path": "step.npz", "inputs": {name: name for name in feeds}, "label": "y",
                 "calibration": {"samples": 8, "overlap": "allow"}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "dynamic"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3},
        "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5, "unresolved": "note"},
        "output_dir": str(tmp_path / "reports"),
    }))  # fmt: skip
    assert main(["validate", str(recipe)]) == 0, capsys.readouterr()
    np.savez(tmp_path / "step.npz", y=labels[:, 0], **feeds)
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("hold one class id per row, but output 'logits'", err) and "a list of one class id per token" in err, err
