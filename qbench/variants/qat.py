"""INT8 quantization-aware training: fine-tune the recipe's PyTorch model with fake quantization, export QDQ ONNX.

Route: torchao PT2E (trials pitfall 11), whose Q/DQ pattern ONNX Runtime CPU fuses into
QLinearConv (ModelOpt's QAT pattern ran 0.35x FP32 there; torch.ao eager QAT is deprecated).

1. capture    `torch.export` with a dynamic batch; BatchNorm folded into its Conv / Linear with
              its running statistics (torchao's own folds, as its PTQ `prepare_pt2e` does), so
              fine-tuning trains the weights that get deployed and torchao's QAT Conv + BN
              fusion, which traces ~100 patterns (30 s here), is not needed;
2. prepare    `prepare_qat_pt2e`, X86InductorQuantizer's annotations placed as ONNX Runtime fuses them
              (OnnxRuntimePlacement), with a config mirroring the ONNX Runtime
              PTQ variant of the same recipe options: activations uint8 (or int8) per tensor,
              asymmetric unless `symmetric_activations`; weights int8 symmetric, per tensor
              unless `per_channel`, 7-bit when `reduce_range` resolves on (pitfall 2);
3. calibrate  fake quantization off, observers on: activation ranges start where PTQ with the
              variant's calibrator puts them (OBSERVERS), then stay fixed while the weights adapt;
4. fine-tune  Adam over seeded shuffles of the training rows, one torch thread (pitfall 1),
              the graph in eval mode (dropout off); weight ranges follow the weights;
5. convert    `convert_pt2e`, exported by the source's TorchScript exporter with symbolics for
              torchao's quantized_decomposed ops (QuantizeLinear / DequantizeLinear).
"""

from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from qbench.errors import QbenchError
from qbench.progress import track
from qbench.recipe.spec import VariantSpec
from qbench.sources.torch_model import single_torch_thread
from qbench.sources.torch_outputs import flatten_outputs
from qbench.tasks import Task, get_task
from qbench.techniques.calibrators import CALIBRATORS
from qbench.techniques.options import QatSpec
from qbench.techniques.qat import Qat
from qbench.variants.base import ONNX, TORCH, BuildContext, BuiltVariant, Feeds, TrainingData, technique_of
from qbench.variants.calibrate import calibration_rows, require_calibration
from qbench.variants.int8 import resolve_reduce_range
from qbench.variants.onnx_utils import Stopwatch, build_step, default_opset, output_path
from qbench.variants.qat_export import InferenceModule, export_onnx
from qbench.variants.torch_forms import FAKE_QUANT, TORCH_COMPILE, TORCH_DEVICES, TORCH_FORM, import_torchao

import_torchao()  # first: it silences torchao's import-time warnings about CUDA kernels this machine lacks
from torchao.quantization.pt2e import (  # noqa: E402
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    disable_fake_quant,
    disable_observer,
    enable_fake_quant,
    enable_observer,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    QuantizationAnnotation,
    QuantizationConfig,
    QuantizationSpec,
)
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer  # noqa: E402
from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_  # noqa: E402

logger = logging.getLogger(__name__)

ROUTE = "torchao PT2E: prepare_qat_pt2e (X86InductorQuantizer) -> convert_pt2e -> TorchScript ONNX export (QDQ)"
# calibrator -> the torchao observer that sets the starting activation ranges. torchao has no entropy
# or percentile observer; its histogram observer searches the range of least quantization error (L2),
# which clips rare outliers as both of those do.
_OBSERVER_CLASSES = {cls.__name__: cls for cls in (MinMaxObserver, HistogramObserver)}
OBSERVERS: dict[str, type] = {
    name: _OBSERVER_CLASSES[CALIBRATORS.get(name).torchao_observer] for name in CALIBRATORS
    if CALIBRATORS.get(name).torchao_observer
}
SCALE_EPS = 2**-12  # smallest scale, as in torchao's x86 config
_ANNOTATION = "quantization_annotation"  # torchao's node.meta key
# activations ONNX Runtime folds into the QuantizeLinear after them (ReLU; ReLU6 and clamps as Clip)
_ACTIVATIONS = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default, torch.ops.aten.hardtanh.default,
                torch.ops.aten.hardtanh_.default, torch.ops.aten.clamp.default}
TORCH_FORM_NOTE = "torch form: the QAT model with Q/DQ computed in float (fake-quant): accuracy only, no INT8 kernels"


@dataclass(frozen=True)
class QatScheme:
    """The fake-quantization scheme, every recipe option resolved."""

    calibrator: str
    num_bins: int
    activation_type: str  # uint8 | int8
    symmetric_activations: bool
    per_channel: bool
    reduce_range: bool
    reduce_range_source: str

    @classmethod
    def of(cls, config: Qat) -> QatScheme:
        """The scheme of a QAT config (whose checks already ran when the recipe loaded)."""
        reduce_range, source = resolve_reduce_range(config.reduce_range)
        return cls(
            config.calibration.calibrator, config.calibration.num_bins, config.activation_type,
            config.symmetric_activations, config.per_channel, reduce_range, source,
        )  # fmt: skip

    @property
    def observer(self) -> type:
        return OBSERVERS[self.calibrator]

    @property
    def weight_range(self) -> tuple[int, int]:
        """7-bit weights with reduce_range: ORT's u8s8 kernels cannot saturate on CPUs without VNNI."""
        return (-64, 63) if self.reduce_range else (-128, 127)

    def quantization_config(self) -> QuantizationConfig:
        """Activations: fake-quant with the calibrator's observer. Weights: fake-quant whose range is the current
        weights' (averaging_constant=1), per tensor or per output channel."""
        observer = self.observer.with_args(bins=self.num_bins) if self.observer is HistogramObserver else self.observer
        unsigned = self.activation_type == "uint8"
        activation = QuantizationSpec(
            dtype=torch.uint8 if unsigned else torch.int8,
            quant_min=0 if unsigned else -128,
            quant_max=255 if unsigned else 127,
            qscheme=torch.per_tensor_symmetric if self.symmetric_activations else torch.per_tensor_affine,
            observer_or_fake_quant_ctr=FakeQuantize.with_args(observer=observer, eps=SCALE_EPS),
        )
        weight = QuantizationSpec(
            dtype=torch.int8,
            quant_min=self.weight_range[0],
            quant_max=self.weight_range[1],
            qscheme=torch.per_channel_symmetric if self.per_channel else torch.per_tensor_symmetric,
            ch_axis=0,
            observer_or_fake_quant_ctr=FusedMovingAvgObsFakeQuantize.with_args(
                observer=MovingAveragePerChannelMinMaxObserver if self.per_channel else MovingAverageMinMaxObserver,
                averaging_constant=1.0,
                eps=SCALE_EPS,
            ),
        )
        return QuantizationConfig(activation, activation, weight, None, is_qat=True)

    def params(self) -> dict[str, Any]:
        histogram = self.observer is HistogramObserver
        return {
            "calibrator": self.calibrator,
            "observer": self.observer.__name__,
            "observer_mapping": {name: observer.__name__ for name, observer in OBSERVERS.items()},
            "observer_bins": self.num_bins if histogram else None,
            "activation_type": self.activation_type,
            "symmetric_activations": self.symmetric_activations,
            "activation_ranges": "calibrated, then fixed during fine-tuning",
            "weight_type": "int8",
            "weight_range": list(self.weight_range),
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "reduce_range_source": self.reduce_range_source,
        }


class OnnxRuntimePlacement(X86InductorQuantizer):
    """X86InductorQuantizer's Q/DQ, placed where ONNX Runtime fuses them into integer kernels.

    X86's patterns are Inductor's: a Conv or Linear followed by an add (a residual) is one pattern, and a pattern's
    output is quantized only where the next op reads INT8. ONNX Runtime fuses a Conv / Gemm / MatMul into an integer
    kernel only between DequantizeLinear and QuantizeLinear, so every other layer ran in float on dequantized
    weights: a residual CNN of 8 convolutions got 5 fused and ran at FP32's speed (99 vs 97 ms at batch 32, one
    thread), where its INT8 PTQ ran in 28 ms. Here each Conv / Linear ends its own pattern (the add reads their
    dequantized outputs) and every pattern's output is quantized (8 of 8 fused: 35 ms) but the model's own outputs:
    the head stays a float Gemm, as X86 left it (quantized, an embedding MLP's QAT cosine fell from 0.99998 to
    0.99988, a regression MLP's MAE rose 1 %), and it is a small share of the time. The overrides name
    torchao 0.18's pattern methods; were they renamed, the fused patterns would come back and cost speed only, not
    correctness (the export is checked against the module either way).
    """

    def _annotate_conv2d_binary_unary(self, *args: Any, **kwargs: Any) -> None:
        return None

    def _annotate_conv2d_binary(self, *args: Any, **kwargs: Any) -> None:
        return None

    def _annotate_linear_binary_unary(self, *args: Any, **kwargs: Any) -> None:
        return None

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = super().annotate(model)
        for node in list(model.graph.nodes):
            annotation = node.meta.get(_ANNOTATION)
            if getattr(annotation, "_is_output_of_quantized_pattern", False) and annotation.output_qspec is None:
                self._quantize_output(node)
        return model

    def _quantize_output(self, node: torch.fx.Node) -> None:
        """Quantize the output of the pattern `node` ends, or that of the one activation reading it: X86 pairs a layer
        with nn.ReLU, not with torch.relu, and a grid before the ReLU also spans the negative half (QAT of an MLP lost
        up to 1.7 points of accuracy, three seeds). ONNX Runtime folds that activation into the Q after it."""
        users = list(node.users)
        fused = len(users) == 1 and users[0].target in _ACTIVATIONS and _ANNOTATION not in users[0].meta
        end = users[0] if fused else node
        if all(user.op == "output" for user in end.users):
            return  # the model's output: kept float
        if end is node:
            node.meta[_ANNOTATION].output_qspec = self.global_config.output_activation
        else:
            end.meta[_ANNOTATION] = QuantizationAnnotation(output_qspec=self.global_config.output_activation,
                                                           _annotated=True)


@dataclass(frozen=True)
class QatModuleFactory:
    """The converted QAT module (Q/DQ ops computed in float), copied afresh for every caller."""

    module: torch.fx.GraphModule  # from convert_pt2e, never handed out
    compile: bool = False

    def __call__(self) -> torch.nn.Module:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's pytree internals, while copying the graph
            module = InferenceModule(copy.deepcopy(self.module))
        return torch.compile(module) if self.compile else module


@dataclass(frozen=True)
class TrainingSet:
    """The training rows as tensors, and what the task's loss compares the student's first output with."""

    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor  # from the task: labels (loss "label") or the FP32 teacher's outputs ("distill")
    loss: str
    task: Task
    output_index: int = 0  # which of forward()'s outputs the loss is computed on
    probabilities: bool = False  # that output holds probabilities: the loss reads it through task.qat_logits

    @property
    def rows(self) -> int:
        return int(self.inputs[0].shape[0])

    def scores(self, output: torch.Tensor) -> torch.Tensor:
        return self.task.qat_logits(output) if self.probabilities else output

    def loss_on(self, module: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        output = flatten_outputs(module(*(tensor[rows] for tensor in self.inputs)))[self.output_index]
        return self.task.qat_loss(self.loss, self.scores(output), self.targets[rows])


def build_qat(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Fine-tune ctx.torch_model with INT8 fake quantization on ctx.training; write `<workdir>/<name>.onnx`."""
    clock = Stopwatch()
    config = technique_of(spec, Qat)
    qat = _require_inputs(spec.name, config.qat, ctx)
    scheme = QatScheme.of(config)
    names = tuple(ctx.torch_model.input_names)
    target = output_path(spec.name, ctx)
    with single_torch_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(qat.seed)
        with build_step(spec.name, "reading the training rows"):
            training = _training_set(spec.name, qat, ctx.torch_model, ctx.training, names)
        with build_step(spec.name, "preparing the model for QAT (torch.export, prepare_qat_pt2e)"):
            prepared = _prepare(ctx.torch_model, scheme)
        with build_step(spec.name, f"{scheme.calibrator} calibration"):
            calibrate(prepared, ctx.calibration, names, f"{spec.name}: calibrating ({scheme.calibrator})")
        started = time.perf_counter()
        with build_step(spec.name, "fine-tuning"):
            losses = fine_tune(prepared, training, qat, spec.name)
        train_seconds = time.perf_counter() - started
        with build_step(spec.name, "converting (convert_pt2e)"):
            converted = _convert(prepared, ctx.calibration[0], names)
        with build_step(spec.name, "exporting to ONNX"):
            export_onnx(converted, ctx.torch_model, target)
    exported = onnx.load(str(target), load_external_data=False)
    params: dict[str, Any] = {
        "route": ROUTE,
        **scheme.params(),
        "qat.epochs": qat.epochs,
        "qat.lr": qat.lr,
        "qat.optimizer": "Adam",
        "qat.batch_size": qat.batch_size,
        "qat.loss": qat.loss,
        "qat.seed": qat.seed,
        "qat.train_rows": training.rows,
        "qat.scores": "probabilities (the loss reads them as logits)" if training.probabilities else "as output",
        "qat.train_seconds": round(train_seconds, 3),
        "qat.loss_per_epoch": [round(loss, 6) for loss in losses],
        "calibration_batches": len(ctx.calibration),
        "calibration_rows": calibration_rows(ctx.calibration),
        "quant_format": "QDQ",
        "opset": default_opset(exported),
        FAKE_QUANT: True,
        TORCH_FORM: "QAT module from convert_pt2e: int8 weights and Q/DQ ops, computed in float",
        TORCH_DEVICES: ["cpu", "cuda"],
        TORCH_COMPILE: spec.compile,
    }
    return BuiltVariant(
        name=spec.name,
        precision="int8",
        onnx_path=target,
        params=params,
        build_seconds=clock.seconds(),
        notes=tuple(_notes(scheme, qat)),
        torch_module=QatModuleFactory(converted, compile=spec.compile),
        # training and calibration shaped both forms; the rest describes one of them
        param_forms={**dict.fromkeys(("quant_format", "opset"), ONNX),
                     **dict.fromkeys((FAKE_QUANT, TORCH_FORM, TORCH_DEVICES, TORCH_COMPILE), TORCH)},
        note_forms={TORCH_FORM_NOTE: TORCH},
    )  # fmt: skip


def _require_inputs(name: str, qat: QatSpec, ctx: BuildContext) -> QatSpec:
    """The variant's QAT settings, once the context holds what QAT needs (else a QbenchError saying what is missing)."""
    if ctx.torch_model is None:
        raise QbenchError(f"variant {name!r}: QAT needs a PyTorch model source (model.torch)")
    if ctx.training is None or _rows(ctx.training.feeds) == 0:
        raise QbenchError(f"variant {name!r}: QAT has no training rows (check qat.train.filter)")
    if qat.loss == "label" and ctx.training.labels is None:
        raise QbenchError(f"variant {name!r}: qat.loss 'label' needs labels (data.label); use 'distill' without them")
    require_calibration(name, ctx.calibration)
    return qat


def _rows(feeds: Feeds) -> int:
    return int(next(iter(feeds.values())).shape[0]) if feeds else 0


def _tensors(feeds: Feeds, input_names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    missing = [name for name in input_names if name not in feeds]
    if missing:
        raise QbenchError(f"QAT: the data has no feed for model input(s) {', '.join(missing)}")
    return tuple(torch.as_tensor(np.array(feeds[name])) for name in input_names)  # a copy: feeds may be read-only


def _training_set(
    name: str, qat: QatSpec, torch_model: Any, data: TrainingData, input_names: Sequence[str]
) -> TrainingSet:
    """Training rows as tensors with the task's targets: labels, checked against the output, or the teacher's."""
    inputs, step, index = _tensors(data.feeds, input_names), qat.batch_size, data.output_index
    task = get_task(data.task)
    teacher = torch_model.build()
    with torch.no_grad():
        outputs = torch.cat([flatten_outputs(teacher(*(t[i : i + step] for t in inputs)))[index]
                             for i in range(0, len(inputs[0]), step)])  # fmt: skip
    probabilities = task.qat_reads_probabilities(outputs.numpy(), data.probabilities)
    if qat.loss == "distill":
        targets = task.qat_distill_targets(task.qat_logits(outputs) if probabilities else outputs)
        return TrainingSet(inputs, targets, "distill", task, index, probabilities)
    output = outputs[:2]
    if data.labels is None or len(data.labels) != len(inputs[0]):
        count = 0 if data.labels is None else len(data.labels)
        raise QbenchError(f"variant {name!r}: qat.loss 'label' got {count} labels for {len(inputs[0])} rows")
    try:
        targets = task.qat_label_targets(data.labels, output)
    except QbenchError as exc:
        raise QbenchError(f"variant {name!r}: {exc}") from None
    return TrainingSet(inputs, targets, "label", task, index, probabilities)


def _prepare(torch_model: Any, scheme: QatScheme) -> torch.fx.GraphModule:
    """Capture the FP32 model with a dynamic batch (and the dynamic lengths of its export), fold BatchNorm, insert
    fake quantization."""
    example = torch_model.example_inputs()
    dims = {name: torch.export.Dim(name) for axes in torch_model.dynamic_axes().values() for name in axes.values()}
    shapes = tuple({axis: dims[dim] for axis, dim in torch_model.dynamic_axes()[name].items()}
                   for name in torch_model.input_names)
    graph = torch.export.export(torch_model.build(), example, dynamic_shapes=shapes).module()
    _fuse_conv_bn_(graph)
    _fuse_linear_bn_(graph)
    quantizer = OnnxRuntimePlacement().set_global(scheme.quantization_config())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's FutureWarnings about pytree internals
        return prepare_qat_pt2e(graph, quantizer)


def calibrate(prepared: torch.fx.GraphModule, batches: Sequence[Feeds], input_names: Sequence[str], label: str) -> None:
    """PTQ calibration: with fake quantization off, observers see the float activations of every batch; then each
    activation range is computed once and frozen, and fake quantization is switched on.

    Activation observers are fed by a hook, not by their FakeQuantize, which would recompute the range
    after every batch (seconds per batch for the histogram observer). Weights use the fused subclass.
    """
    activations = [m for m in prepared.modules() if type(m) is FakeQuantize]
    prepared.apply(disable_fake_quant)
    prepared.apply(enable_observer)  # weight ranges follow the weights from here on
    for module in activations:
        module.disable_observer()
    hooks = [module.register_forward_pre_hook(_observe) for module in activations]
    try:
        with torch.no_grad():
            for batch in track(batches, label, total=len(batches)):
                prepared(*_tensors(batch, input_names))
    finally:
        for hook in hooks:
            hook.remove()
    for module in activations:
        scale, zero_point = module.calculate_qparams()
        module.scale.resize_(scale.shape).copy_(scale)
        module.zero_point.resize_(zero_point.shape).copy_(zero_point)
    prepared.apply(enable_fake_quant)


def _observe(module: FakeQuantize, args: tuple[torch.Tensor, ...]) -> None:
    module.activation_post_process(args[0].detach())


def fine_tune(prepared: torch.fx.GraphModule, training: TrainingSet, qat: QatSpec, label: str) -> list[float]:
    """`qat.epochs` epochs of Adam over seeded shuffles of the rows; returns the mean loss per epoch."""
    optimizer = torch.optim.Adam(prepared.parameters(), lr=qat.lr)
    generator = torch.Generator().manual_seed(qat.seed)
    batches_per_epoch = max(1, math.ceil(training.rows / qat.batch_size))
    losses: list[float] = []
    for epoch in range(1, qat.epochs + 1):
        # near-equal batches: no trailing batch of one row
        batches = torch.tensor_split(torch.randperm(training.rows, generator=generator), batches_per_epoch)
        previous = f", loss {losses[-1]:.4f}" if losses else ""
        total = 0.0
        for rows in track(batches, f"{label}: QAT epoch {epoch}/{qat.epochs}{previous}", total=len(batches)):
            optimizer.zero_grad()
            loss = training.loss_on(prepared, rows)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(rows)
        losses.append(total / training.rows)
        logger.info("  QAT epoch %d/%d: %s loss %.4f", epoch, qat.epochs, qat.loss, losses[-1])
    return losses


def _convert(prepared: torch.fx.GraphModule, batch: Feeds, input_names: Sequence[str]) -> torch.fx.GraphModule:
    """Q/DQ module with int8 weights. One forward first: the weight ranges become those of the final weights
    (the last optimizer step came after the last observation)."""
    with torch.no_grad():
        prepared(*_tensors(batch, input_names))
    prepared.apply(disable_observer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_pt2e(prepared)


def _notes(scheme: QatScheme, qat: QatSpec) -> list[str]:
    trained = (
        f"QAT: {qat.epochs} epoch(s) of {qat.loss} fine-tuning from {scheme.calibrator} calibration "
        f"({scheme.observer.__name__}); activation ranges fixed after calibration"
    )
    notes = [trained, TORCH_FORM_NOTE]
    if scheme.calibrator == "percentile":
        notes.append("percentile maps to torchao's HistogramObserver (there is "
                     "no percentile observer): the percentile value is not used")
    return notes
