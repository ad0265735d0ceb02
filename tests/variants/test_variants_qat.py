"""QAT variants (torchao PT2E): fine-tuning, the exported QDQ model, its torch form, and the errors.

The task: 6x6 images whose label is the brightest quadrant, learned by a tiny CNN. The FP32
models are pre-trained for a few epochs only, so fine-tuning still has something to learn.
One of them has BatchNorm, to exercise the Conv + BN fusion and folding; it is built once,
because torchao exports a dozen patterns for that fusion (seconds on a loaded 2-core machine).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from pydantic import ValidationError

from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec, load_recipe
from qbench.sources.torch_model import TorchModel
from qbench.variants.base import ONNX, TORCH, BuildContext, BuiltVariant, TrainingData
from qbench.variants.integer_kernels import with_integer_kernels
from qbench.variants.qat import OBSERVERS, TORCH_FORM_NOTE, build_qat
from qbench.variants.torch_forms import FAKE_QUANT
from tests.variants.conftest import ort_integer_kernels

CLASSES = 4
SIDE = 6
ROOT = Path(__file__).resolve().parents[2]


def _quadrant_task(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (rows, 1, 6, 6) in [0, 1) and the index of their brightest 3x3 quadrant."""
    rng = np.random.default_rng(seed)
    images = rng.random((rows, 1, SIDE, SIDE), dtype=np.float32)
    half = SIDE // 2
    quadrants = [images[:, 0, r : r + half, c : c + half].mean(axis=(1, 2)) for r in (0, half) for c in (0, half)]
    return images, np.argmax(np.stack(quadrants, axis=1), axis=1).astype(np.int64)


def _tiny_cnn(batch_norm: bool) -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8) if batch_norm else nn.Identity(), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 3 * 3, CLASSES),
    )  # fmt: skip


def _pretrained(batch_norm: bool, images: np.ndarray, labels: np.ndarray) -> TorchModel:
    """Three epochs of Adam: a model that still has room to improve, as a TorchModel."""
    torch.manual_seed(0)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model = _tiny_cnn(batch_norm)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs, targets = torch.from_numpy(images), torch.from_numpy(labels)
    for _ in range(3):
        for rows in torch.randperm(len(inputs)).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs[rows]), targets[rows]).backward()
            optimizer.step()
    torch.set_num_threads(previous)
    return TorchModel(
        factory="tests:tiny_cnn", input_shapes={"image": (1, 1, SIDE, SIDE)}, input_dtypes={"image": "float32"},
        output_names=("scores",), opset=17, cache_key="tiny", _template=model.eval(),
    )  # fmt: skip


@pytest.fixture(scope="module")
def task() -> dict[str, Any]:
    """Pre-trained FP32 models (with and without BatchNorm) and train / calibration / held-out rows."""
    train_x, train_y = _quadrant_task(512, seed=1)
    calib_x, _ = _quadrant_task(96, seed=2)
    held_out_x, held_out_y = _quadrant_task(256, seed=3)
    return {
        "torch_model": _pretrained(False, train_x, train_y),
        "batch_norm_model": _pretrained(True, train_x, train_y),
        "training": TrainingData(feeds={"image": train_x}, labels=train_y),
        "calibration": [{"image": calib_x[i : i + 32]} for i in range(0, len(calib_x), 32)],
        "held_out": held_out_x,
        "held_out_labels": held_out_y,
    }


def _context(task: dict[str, Any], workdir: Path, **changes: Any) -> BuildContext:
    ctx = BuildContext(
        reference_path=workdir / "unused.onnx", workdir=workdir, calibration=task["calibration"],
        torch_model=task["torch_model"], training=task["training"],
    )  # fmt: skip
    return replace(ctx, **changes)


def _spec(name: str = "int8-qat", calibrator: str = "minmax", **qat: Any) -> VariantSpec:
    settings = {"epochs": 2, "lr": 1e-3, "batch_size": 64, **qat}
    return VariantSpec.model_validate({"name": name, "precision": "int8", "calibrator": calibrator, "qat": settings})


@pytest.fixture(scope="module")
def built(task: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> BuiltVariant:
    """QAT of the BatchNorm model: the variant most tests below inspect."""
    ctx = _context(task, tmp_path_factory.mktemp("qat"), torch_model=task["batch_norm_model"])
    return build_qat(_spec(), ctx)


def _run_onnx(path: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": images})[0]


def _run_torch(variant: BuiltVariant, images: np.ndarray) -> np.ndarray:
    module = variant.torch_module().eval()
    with torch.no_grad():
        return module(torch.from_numpy(images)).numpy()


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray:
    """An initializer or a Constant node's value."""
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    node = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == name)
    return numpy_helper.to_array(node.attribute[0].t)


def _producer(model: onnx.ModelProto, output: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if output in n.output), None)


def _dequantized_weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The head's weight as it computes: its DequantizeLinear's output, or the initializer itself where the exporter
    folded the weight's Q/DQ into a constant (torch 2.11's does)."""
    weight = _producer(model, name)
    if weight is None:
        return _constant(model, name).astype(np.float64)
    assert weight.op_type == "DequantizeLinear"
    scales = np.reshape(_constant(model, weight.input[1]), (-1, 1))
    return _constant(model, weight.input[0]).astype(np.float64) * scales


def _head_error_bound(path: Path, steps: int) -> float:
    """Largest logit change when every element of the head's quantized input moves by `steps` steps:
    steps x input scale x the largest L1 norm of a dequantized weight row (Gemm, transB=1)."""
    model = onnx.load(str(path))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    activation = _producer(model, gemm.input[0])
    assert activation is not None and activation.op_type == "DequantizeLinear"
    input_scale = float(_constant(model, activation.input[1]))
    return steps * input_scale * float(np.abs(_dequantized_weight(model, gemm.input[1])).sum(axis=1).max())


# -- the built variant ---------------------------------------------------------------------------


def test_exports_a_qdq_model_with_batchnorm_folded_and_dynamic_batch(built: BuiltVariant, task: dict[str, Any]) -> None:
    model = onnx.load(str(built.onnx_path))
    ops = [node.op_type for node in model.graph.node]
    assert built.onnx_path.name == "int8-qat.onnx" and built.precision == "int8"
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert "BatchNormalization" not in ops, "BatchNorm should be folded into the convolution at conversion"
    # Conv -> Relu -> Q runs as QLinearConv; the head's Gemm (a float bias, a float output) runs as a float Gemm
    assert with_integer_kernels(built, model).params["quantized_op_types"] == {"Conv": 2}
    assert ort_integer_kernels(built.onnx_path, built.onnx_path.parent) == 2
    assert [i.name for i in model.graph.input] == ["image"] and [o.name for o in model.graph.output] == ["scores"]
    for batch in (1, 5):
        assert _run_onnx(built.onnx_path, task["held_out"][:batch]).shape == (batch, CLASSES)


def test_onnx_runtime_matches_the_fake_quant_torch_form(built: BuiltVariant, task: dict[str, Any]) -> None:
    images = task["held_out"]
    onnx_scores, torch_scores = _run_onnx(built.onnx_path, images), _run_torch(built, images)
    agreement = float(np.mean(onnx_scores.argmax(1) == torch_scores.argmax(1)))
    difference = float(np.abs(onnx_scores - torch_scores).max())
    bound = _head_error_bound(built.onnx_path, steps=2)
    print(f"ORT INT8 vs torch fake-quant: top-1 agreement {agreement:.4f}, "
          f"max |diff| {difference:.4f} (bound {bound:.4f})")
    assert agreement >= 0.99, f"top-1 agreement {agreement:.4f} < 0.99"
    assert difference <= bound, (
        f"max |ORT - torch| {difference:.4f} exceeds 2 quantization steps of the head's input "
        f"propagated through its weights ({bound:.4f})"
    )


def test_qat_keeps_accuracy_on_held_out_rows(built: BuiltVariant, task: dict[str, Any]) -> None:
    labels = task["held_out_labels"]
    with torch.no_grad():
        fp32 = task["batch_norm_model"].build()(torch.from_numpy(task["held_out"])).numpy()
    fp32_accuracy = float(np.mean(fp32.argmax(1) == labels))
    qat_accuracy = float(np.mean(_run_onnx(built.onnx_path, task["held_out"]).argmax(1) == labels))
    print(f"held-out accuracy: FP32 {fp32_accuracy:.4f}, QAT INT8 {qat_accuracy:.4f}")
    assert qat_accuracy >= fp32_accuracy - 0.03, f"QAT {qat_accuracy:.4f} vs FP32 {fp32_accuracy:.4f}"


def test_params_record_training_route_and_scheme(built: BuiltVariant) -> None:
    params = built.params
    assert params["qat.epochs"] == 2 and params["qat.lr"] == 1e-3 and params["qat.batch_size"] == 64
    assert params["qat.loss"] == "label" and params["qat.seed"] == 0 and params["qat.train_rows"] == 512
    assert len(params["qat.loss_per_epoch"]) == 2 and all(np.isfinite(params["qat.loss_per_epoch"]))
    assert params["qat.train_seconds"] > 0 and built.build_seconds > params["qat.train_seconds"]
    assert params["route"].startswith("torchao PT2E")
    assert params["calibrator"] == "minmax" and params["observer"] == "MinMaxObserver"
    assert params["observer_mapping"] == {name: observer.__name__ for name, observer in OBSERVERS.items()}
    assert params["calibration_rows"] == 96 and params["calibration_batches"] == 3
    expected_range = [-64, 63] if params["reduce_range"] else [-128, 127]
    assert params["weight_range"] == expected_range and params["reduce_range_source"].startswith("auto")
    assert params[FAKE_QUANT] is True


def test_torch_form_is_a_fresh_fake_quant_module_each_call(built: BuiltVariant, task: dict[str, Any]) -> None:
    first, second = built.torch_module(), built.torch_module()
    assert first is not second and first.eval() is first  # backends call .eval(); the graph ignores it
    assert any("fake-quant" in note for note in built.notes)
    images = torch.from_numpy(task["held_out"][:8])
    with torch.no_grad():
        np.testing.assert_array_equal(first(images).numpy(), second(images).numpy())


@pytest.mark.gpu
def test_torch_form_runs_on_cuda_as_on_cpu(built: BuiltVariant, task: dict[str, Any]) -> None:
    images = task["held_out"]
    module = built.torch_module().to("cuda").eval()
    with torch.no_grad():
        on_gpu = module(torch.from_numpy(images).to("cuda")).cpu().numpy()
    on_cpu = _run_torch(built, images)
    agreement = float(np.mean(on_gpu.argmax(1) == on_cpu.argmax(1)))
    bound = _head_error_bound(built.onnx_path, steps=1)
    assert agreement >= 0.99, f"CUDA vs CPU fake-quant top-1 agreement {agreement:.4f} < 0.99"
    assert float(np.abs(on_gpu - on_cpu).max()) <= bound, "CUDA vs CPU differ by more than one step of the head's input"


# -- training ------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["label", "distill"])
def test_loss_decreases_over_epochs_and_threads_are_restored(loss: str, task: dict[str, Any], tmp_path: Path) -> None:
    torch.set_num_threads(2)
    variant = build_qat(_spec(f"q-{loss}", loss=loss, epochs=3), _context(task, tmp_path))
    assert torch.get_num_threads() == 2, "QAT trains on one thread and must restore the caller's count"
    losses = variant.params["qat.loss_per_epoch"]
    print(f"{loss} loss per epoch: {losses}, trained in {variant.params['qat.train_seconds']:.2f} s")
    assert losses[-1] < losses[0], f"{loss} loss did not decrease: {losses}"


def test_same_seed_gives_the_same_model(task: dict[str, Any], tmp_path: Path) -> None:
    spec = _spec("seeded", epochs=1)
    first = build_qat(spec, _context(task, tmp_path / "a"))
    second = build_qat(spec, _context(task, tmp_path / "b"))
    assert first.params["qat.loss_per_epoch"] == second.params["qat.loss_per_epoch"]
    np.testing.assert_array_equal(_run_onnx(first.onnx_path, task["held_out"]),
                                  _run_onnx(second.onnx_path, task["held_out"]))  # fmt: skip


def test_entropy_maps_to_the_histogram_observer_with_per_channel_weights(task: dict[str, Any], tmp_path: Path) -> None:
    spec = _spec("hist", calibrator="entropy", epochs=1).model_copy(update={"per_channel": True, "num_bins": 512})
    variant = build_qat(spec, _context(task, tmp_path))
    assert variant.params["observer"] == "HistogramObserver" and variant.params["observer_bins"] == 512
    model = onnx.load(str(variant.onnx_path))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    weight_scales = _constant(model, _producer(model, gemm.input[1]).input[1])
    assert weight_scales.shape == (CLASSES,), "per-channel weights: one scale per output feature"


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"torch_model": None}, "needs a PyTorch model source"),
        ({"training": None}, "no training rows"),
        ({"training": TrainingData(feeds={"image": np.zeros((0, 1, SIDE, SIDE), np.float32)})}, "no training rows"),
        ({"training": TrainingData(feeds={"image": np.zeros((4, 1, SIDE, SIDE), np.float32)})}, "needs labels"),
        ({"calibration": []}, "calibration sample is empty"),
    ],
    ids=["no-torch-model", "no-training", "zero-rows", "no-labels", "no-calibration"],
)
def test_missing_inputs_are_user_errors(task: dict[str, Any], tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(QbenchError, match=rf"variant 'int8-qat': .*{message}"):
        build_qat(_spec(), _context(task, tmp_path, **changes))


def test_labels_outside_the_model_classes_are_a_user_error(task: dict[str, Any], tmp_path: Path) -> None:
    images = task["training"].feeds["image"][:8]
    training = TrainingData(feeds={"image": images}, labels=np.full(8, CLASSES, dtype=np.int64))
    with pytest.raises(QbenchError, match=r"one label in 0\.\.3 per training row"):
        build_qat(_spec(), _context(task, tmp_path, training=training))


class _FeaturesThenScores(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return image.flatten(1), self.model(image)


def test_the_loss_is_computed_on_the_recipes_output(task: dict[str, Any]) -> None:
    """A model returning (features, scores) with model.output = the scores: the loss was taken on the 36 feature
    columns (labels 0..3 fit in them, so nothing complained)."""
    from qbench.variants.qat import _training_set

    source = replace(task["torch_model"], _template=_FeaturesThenScores(task["torch_model"].build()).eval(),
                     output_names=("features", "scores"))  # fmt: skip
    data = replace(task["training"], output_index=1)
    training = _training_set("int8-qat", _spec().qat, source, data, ["image"])
    rows = torch.arange(64)
    with torch.no_grad():
        scores = task["torch_model"].build()(training.inputs[0][rows])
        expected = torch.nn.functional.cross_entropy(scores, torch.as_tensor(data.labels[:64]))
        assert float(training.loss_on(source.build(), rows)) == pytest.approx(float(expected), rel=1e-5)


def test_the_label_loss_of_a_softmax_model_reads_its_probabilities(task: dict[str, Any], tmp_path: Path) -> None:
    """forward() ends in a softmax: cross-entropy took the probabilities as logits (a loss of at least 0.74 with 4
    classes however right the model), so the recorded loss said nothing and the gradients were flattened."""
    from qbench.variants.qat import _training_set

    softmax = torch.nn.Sequential(task["torch_model"].build(), torch.nn.Softmax(dim=-1)).eval()
    source = replace(task["torch_model"], _template=softmax)
    training = _training_set("int8-qat", _spec().qat, source, task["training"], ["image"])
    rows = torch.arange(64)
    with torch.no_grad():
        probabilities = softmax(training.inputs[0][rows]).numpy().astype(np.float64)
        loss = float(training.loss_on(source.build(), rows))
    labels = task["training"].labels[:64]
    assert loss == pytest.approx(-np.mean(np.log(probabilities[np.arange(64), labels])), rel=1e-5)
    variant = build_qat(_spec(epochs=1), _context(task, tmp_path, torch_model=source))
    assert variant.params["qat.scores"] == "probabilities (the loss reads them as logits)"


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"calibrator": "auto"}, "calibrator: QAT starts from one calibration: choose entropy, minmax or percentile"),
        ({"exclude_nodes": ["/0/Conv"]}, "exclude_nodes: does not apply to QAT variants"),
        ({"weight_type": "uint8"}, "weight_type: QAT builds int8 symmetric weights"),
    ],
    ids=["auto-calibrator", "exclude-nodes", "uint8-weights"],
)
def test_options_qat_cannot_honour_are_refused_when_the_recipe_loads(update: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        VariantSpec.model_validate({**_spec().model_dump(exclude_unset=True), **update})


# -- the demo case (qbench.demo.qat_case) ----------------------------------------------------------


def test_massive_activation_cnn_has_the_digits_cnn_outputs() -> None:
    from qbench.demo.digits import digits_cnn
    from qbench.demo.qat_case import (
        MASSIVE_VALUE,
        check_same_outputs,
        massive_activation_cnn,
        massive_activation_weights,
    )

    torch.manual_seed(0)
    digits = digits_cnn().eval()
    massive = massive_activation_cnn().eval()
    massive.load_state_dict(massive_activation_weights(digits.state_dict()))
    assert check_same_outputs(digits, massive) <= 1e-3
    with torch.no_grad():
        features = massive[:6](torch.rand(3, 1, 8, 8))  # after the last ReLU
    assert torch.all(features[:, -1] == MASSIVE_VALUE) and float(features[:, :-1].max()) < MASSIVE_VALUE / 10


def test_demo_recipe_loads_and_fine_tunes_without_eval_rows() -> None:
    recipe_path = ROOT / "recipes" / "digits-qat.yaml"
    if not (ROOT / "models" / "digits-massive.pt").is_file():
        pytest.skip("demo assets not built: python -m qbench.demo.digits "
                    "--out . && python -m qbench.demo.qat_case --out .")
    recipe = load_recipe(recipe_path)
    qat = next(v for v in recipe.variants if v.qat is not None)
    assert recipe.model.torch == "qbench.demo.qat_case:massive_activation_cnn"
    assert qat.qat.train.filter == {"split": {"in": ["train", "calib"]}}
    assert recipe.data.evaluation.filter == {"split": "eval"}


def test_each_form_shows_only_the_params_and_notes_true_of_it(built: BuiltVariant) -> None:
    on_torch, on_onnx = built.as_run_in(TORCH), built.as_run_in(ONNX)
    assert TORCH_FORM_NOTE in on_torch.notes and TORCH_FORM_NOTE not in on_onnx.notes
    assert on_torch.params[FAKE_QUANT] is True and FAKE_QUANT not in on_onnx.params
    for key in ("quant_format", "opset"):  # the exported graph's
        assert key in on_onnx.params and key not in on_torch.params
    for key in ("qat.epochs", "calibrator", "qat.train_rows"):  # training shaped both forms
        assert key in on_onnx.params and key in on_torch.params
    assert any(note.startswith("QAT:") for note in on_torch.notes) and any(n.startswith("QAT:") for n in on_onnx.notes)
