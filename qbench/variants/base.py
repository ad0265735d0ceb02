"""What a variant builder receives and returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from qbench.errors import QbenchError

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import VariantSpec
    from qbench.techniques import TechniqueConfig

Feeds = dict[str, np.ndarray]

# The forms of a variant a backend may run (qbench.backends.base.form_run_by): its ONNX file, or its torch module.
ONNX, TORCH = "onnx", "torch"


@dataclass(frozen=True)
class TrainingData:
    """Rows to fine-tune on (QAT): model feeds and, when the recipe has labels, integer labels."""

    feeds: Feeds
    labels: np.ndarray | None = None
    task: str = "classification"  # the recipe's task: it decides the QAT loss
    output_index: int = 0  # the model output the loss is computed on: the recipe's (first) evaluated output
    probabilities: bool | None = None  # the graph makes that output as probabilities / as logits; None: unstated


@dataclass(frozen=True)
class BuildContext:
    """Everything a builder may use.

    reference_path: the FP32 ONNX model (the recipe's model, or the export of its PyTorch source).
    workdir: a folder the builder may write into (one per variant; it survives the sweep).
    calibration: equal-sized batches of model feeds drawn from the calibration sample
        (the last batch may be smaller; builders that need equal shapes drop or split it).
    torch_model: the PyTorch source (qbench.sources.torch_model.TorchModel), when the recipe has one.
    training: the rows a QAT variant fine-tunes on, when it has a `qat` section.
    fixed_batch: the batch size the model's inputs are fixed to (preflight's `fixed_batch`), None when dynamic:
        a builder that runs parts of a calibration batch must run it whole then.
    """

    reference_path: Path
    workdir: Path
    calibration: Sequence[Feeds] = ()
    torch_model: Any = None
    training: TrainingData | None = None
    fixed_batch: int | None = None


@dataclass(frozen=True)
class BuiltVariant:
    """A variant ready for a backend.

    params: every option that shaped the model, as logged to MLflow and results.json
        (calibrator and its parameters, reduce_range as resolved, excluded nodes...).
    session_hints: what a backend must respect to run it correctly, e.g.
        {"graph_optimization_level": "basic"} for float8 Q/DQ graphs on ORT CPU.
    notes: human-readable caveats shown in the report ("FP8 is simulated on CPU").
    simulation: the ONNX model is an FP32 graph that imitates its precision by rounding (the BF16
        variant): no backend running that graph runs the precision natively, so every figure of it is emulated
        (qbench.validate.fidelity). It says nothing of the torch form (`module.to(torch.bfloat16)` is real BF16).
    torch_module: a factory of the variant as an nn.Module (None when it exists only as ONNX).
    activation_ranges: float tensor name (as in the FP32 model) -> (low, high), the interval a
        static INT8 / FP8 variant's activation quantizer represents; values outside are clipped.
        Empty for variants that clip nothing at a calibrated bound (float casts, dynamic INT8).
    borrowed: onnx_path is not the build's own file but one it reuses, the recipe's FP32 model (FP32 itself, a
        variant with nothing to change): no search, fallback or explain step may ever move or delete it.
    """

    name: str
    precision: str
    onnx_path: Path
    params: dict[str, Any] = field(default_factory=dict)
    build_seconds: float = 0.0
    session_hints: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    simulation: bool = False
    torch_module: Callable[[], Any] | None = None  # the variant as a torch module, for torch backends
    activation_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    borrowed: bool = False
    param_forms: Mapping[str, str] = field(default_factory=dict)
    note_forms: Mapping[str, str] = field(default_factory=dict)

    def as_run_in(self, form: str) -> BuiltVariant:
        """The variant as a backend running its `form` sees it: params and notes of its other form left out, and
        `simulation` (a property of the ONNX graph) false for the torch form."""
        params = {k: v for k, v in self.params.items() if self.param_forms.get(k, form) == form}
        notes = tuple(note for note in self.notes if self.note_forms.get(note, form) == form)
        return replace(self, params=params, notes=notes, simulation=self.simulation and form == ONNX)

    def of_form(self, form: str, later: BuiltVariant, *, since: BuiltVariant) -> BuiltVariant:
        """`later` (this variant after a step that only read `form`) with what that step added to the params and
        notes since `since` marked as describing `form` only."""
        params = {key: form for key in later.params if key not in since.params}
        notes = {note: form for note in later.notes if note not in since.notes}
        return replace(later, param_forms={**later.param_forms, **params}, note_forms={**later.note_forms, **notes})

    @property
    def lowered_nothing(self) -> bool:
        """No node of the graph computes in the variant's precision (see `lowered_nothing`)."""
        return lowered_nothing(self.params)

    def owned_by(self, folder: Path) -> bool:
        """Whether this build's model is a file the caller created inside `folder`, its own work folder: the only
        models a search may move or delete (a borrowed one is the user's, wherever it lies)."""
        return not self.borrowed and self.onnx_path.resolve().is_relative_to(folder.resolve())

    @property
    def dynamic(self) -> bool:
        """Activations quantized per batch at run time (ORT's dynamic INT8, or a linear/SmoothQuant dynamic build)."""
        return self.params.get("calibrator") == "dynamic" or self.params.get("activations") == "dynamic"


def lowered_nothing(params: Mapping[str, Any]) -> bool:
    """Whether a variant with these params computes exactly as FP32 does: its builder changed nothing (`unchanged`),
    or counted no node lowered (`quantized_nodes`: the integer kernels of every INT8 build, the Q/DQ'd layers of an FP8
    build; `quantized_linears` of the linear/SmoothQuant builds; counted on the built graph). Such a variant's pass says
    nothing about its precision."""
    return "unchanged" in params or params.get("quantized_nodes") == 0 or params.get("quantized_linears") == 0


# Why a static build quantized nothing though its graph has nodes to quantize: its calibration gave them no range.
NO_RANGE = "had no usable calibration range"


def unranged_reason(params: Mapping[str, Any]) -> str | None:
    """Why a build left nodes float for want of a calibration range ('2 node(s) had no usable calibration range (x: 0
    on every calibration row, ...)'), None where none was: what to say when such a build quantized nothing, rather
    than blame a graph that has nodes to quantize."""
    unranged = params.get("unranged_nodes_kept_fp32") or []
    if not unranged:
        return None
    first = next(iter((params.get("uncalibrated_tensors") or {}).items()), None)
    return f"{len(unranged)} node(s) {NO_RANGE}" + (f" ({first[0]}: {first[1]})" if first else "")


class VariantBuilder(Protocol):
    def __call__(self, spec: VariantSpec, ctx: BuildContext) -> BuiltVariant: ...


Config = TypeVar("Config", bound="TechniqueConfig")


def technique_of(spec: VariantSpec, kind: type[Config]) -> Config:
    """The variant's technique config, which must be a `kind` (a handler's own config type)."""
    config = spec.technique_config
    if not isinstance(config, kind):
        raise QbenchError(f"variant {spec.name!r}: technique {spec.technique_name!r} is not built by {kind.__name__}")
    return config
