"""Calibration shared by the static INT8 and FP8 builders: pre-process the graph, then compute tensor ranges.

qbench calibrates with ORT's calibrators itself instead of letting
`quantize_static` do it, because `quantize_static(calibrate_method=Entropy)`
cannot pass `num_bins` and silently uses 128 bins, which makes entropy equal
MinMax (trials pitfall 4). The ranges are saved as ORT's calibration cache
(JSON) next to the variant, so the INT8 quantizer reuses exactly these ranges
and a user can inspect them.

Batches are fed one at a time: histogram calibrators stack a call's outputs and
so need equal shapes (pitfall 5); one batch per call lets the short last batch
in without dropping rows and keeps ORT from holding every batch's outputs (ORT
issues #10503, #11020). qbench's histogram collector (`histograms.py`) buffers
the flattened activations up to 64 MB and histograms them together, skipping
tensors a histogram cannot hold.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    quant_pre_process,
)
from onnxruntime.quantization.calibrate import TensorsData, create_calibrator
from onnxruntime.quantization.quant_utils import add_pre_process_metadata

from qbench.errors import QbenchError
from qbench.onnx_read import file_over_protobuf_limit, infer_shapes, over_protobuf_limit
from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.progress import track
from qbench.techniques.calibrators import (
    CALIBRATORS,
    DEFAULT_NUM_BINS,
    DEFAULT_NUM_QUANTIZED_BINS,
    DEFAULT_PERCENTILE,
    Calibration,
)
from qbench.variants.base import Feeds
from qbench.variants.histograms import HISTOGRAM_LIMIT, NONFINITE, UNQUANTIZED, GuardedHistogramCollector
from qbench.variants.nonfinite_scan import holds_nonfinite, nonfinite_tensors
from qbench.variants.onnx_utils import default_opset, load_model, quiet_stdout, save_model
from qbench.variants.opset_upgrade import ensure_opset
from qbench.variants.pass_memo import PassMemo, batches_digest
from qbench.variants.qdq_opset import qdq_runnable


def ort_method(calibrator: str) -> CalibrationMethod:
    """ONNX Runtime's method for the registered `calibrator`, read from the registry when asked (a calibrator
    registered after this module was imported is known too); a QbenchError for one that computes no ranges."""
    entry = CALIBRATORS.get(calibrator) if calibrator in CALIBRATORS else None
    if entry is None or entry.onnxruntime is None:
        ranging = [name for name in CALIBRATORS if CALIBRATORS.get(name).computes_ranges]
        raise QbenchError(f"calibrator {calibrator!r} does not compute ranges; expected one of {', '.join(ranging)}")
    return CalibrationMethod[entry.onnxruntime]


FEEDING = "one batch per calibrator call (histograms merged; no rows dropped)"


@dataclass(frozen=True)
class CalibrationSettings:
    """A calibrator and its parameters, defaults resolved."""

    method: str
    percentile: float = DEFAULT_PERCENTILE
    num_bins: int = DEFAULT_NUM_BINS
    num_quantized_bins: int = DEFAULT_NUM_QUANTIZED_BINS
    symmetric: bool = False
    op_types: tuple[str, ...] | None = None

    @classmethod
    def of(cls, calibration: Calibration, symmetric: bool, op_types: Sequence[str] | None) -> CalibrationSettings:
        """Settings from a technique's calibration; `op_types` are the op types whose tensors get ranges."""
        ort_method(calibration.calibrator)
        return cls(
            method=calibration.calibrator,
            percentile=calibration.percentile,
            num_bins=calibration.num_bins,
            num_quantized_bins=calibration.num_quantized_bins,
            symmetric=symmetric,
            op_types=tuple(op_types) if op_types is not None else None,
        )

    def params(self) -> dict[str, Any]:
        """The parameters this calibrator actually used, for results and MLflow."""
        params: dict[str, Any] = {"calibrator": self.method, "calibration_symmetric": self.symmetric}
        for option in sorted(CALIBRATORS.get(self.method).options):  # the options its registry entry declares
            params[option] = getattr(self, option)
        return params


class _FeedReader(CalibrationDataReader):
    """ORT's reader protocol over a sequence of feed dicts."""

    def __init__(self, feeds: Sequence[Feeds]) -> None:
        self._feeds: Iterator[Feeds] = iter(feeds)

    def get_next(self) -> Feeds | None:
        return next(self._feeds, None)


def require_calibration(variant: str, batches: Sequence[Feeds]) -> None:
    """Raise a QbenchError when a calibrated variant gets no calibration data."""
    if not batches or calibration_rows(batches) == 0:
        raise QbenchError(f"variant {variant!r}: calibration needs data, but the calibration sample is empty")


def calibration_rows(batches: Sequence[Feeds]) -> int:
    """Rows across the batches (the leading dimension of each batch's first input)."""
    return sum(int(next(iter(batch.values())).shape[0]) for batch in batches if batch)


@dataclass(frozen=True)
class Calibrated:
    """Ranges per tensor, and the tensors left without a range (name -> why): those a histogram could not take, and
    those whose range is not finite (an attention mask's -inf, which min/max keeps)."""

    ranges: TensorsData
    skipped: dict[str, str]

    def notes(self) -> list[str]:
        """One note naming the tensors that fell back, for the variant's report."""
        if not self.skipped:
            return []
        listed = "; ".join(f"{name}: {why}" for name, why in list(self.skipped.items())[:5])
        more = len(self.skipped) - 5
        return [f"{len(self.skipped)} tensor(s) not calibrated: {listed}" + (f" (+{more} more)" if more > 0 else "")]


def compute_ranges(
    model_path: Path,
    batches: Sequence[Feeds],
    method: str,
    *,
    percentile: float = DEFAULT_PERCENTILE,
    num_bins: int = DEFAULT_NUM_BINS,
    num_quantized_bins: int = DEFAULT_NUM_QUANTIZED_BINS,
    symmetric: bool = False,
    op_types: Sequence[str] | None = None,
    workdir: Path,
) -> Calibrated:
    """Ranges of the float inputs/outputs of `op_types` nodes (all float tensors when None).

    method: minmax | entropy | percentile. Intermediate models (a shape-inferred copy and
    the augmented graph) live in a temporary folder under `workdir`, removed on return.
    A graph with no tensor to calibrate (nothing quantizable) gets empty ranges without
    running anything. Histogram calibrators skip tensors a histogram cannot hold
    (`histograms.GuardedHistogramCollector`), NaN/inf among them; MinMax skips the tensors holding NaN/inf on any
    batch too (`nonfinite_scan`: its own range would ignore NaN), and a min/max range that is not finite is dropped,
    as a quantization scale of inf would turn the tensor, and whatever reads it, into garbage; so is one reaching a mask
    fill's magnitude, or one 0 on every row (`_representable`). All are named in `skipped`. Remembered for the same
    file content, batches and settings (qbench.variants.pass_memo).
    """
    ort_method(method)
    if not batches:
        raise QbenchError("calibration needs at least one batch of data; the calibration sample is empty")
    options = {
        "num_bins": num_bins,
        "num_quantized_bins": num_quantized_bins,
        "percentile": percentile,
        "symmetric": symmetric,
    }
    from qbench.provenance import model_sha256  # its external data too

    workdir.mkdir(parents=True, exist_ok=True)
    kinds = tuple(op_types) if op_types is not None else None
    key = ("ranges", model_sha256(model_path), batches_digest(batches), method, tuple(sorted(options.items())), kinds)
    return RANGES.get(key, lambda: _compute_ranges(model_path, batches, method, options, op_types, workdir))


RANGES = PassMemo()  # a static candidate, its reduce_range twin and keep-float rebuilds calibrate the same graph


def _compute_ranges(
    model_path: Path, batches: Sequence[Feeds], method: str, options: dict[str, Any], op_types: Sequence[str] | None,
    workdir: Path,
) -> Calibrated:
    skipped: dict[str, str] = {}
    calibrate_method = ort_method(method)
    histogram = calibrate_method != CalibrationMethod.MinMax  # ORT's histogram collector (entropy, percentile...)
    with tempfile.TemporaryDirectory(prefix="calibrate-", dir=workdir) as tmp:
        staged = _in_normal_form(model_path, workdir, Path(tmp))
        with quiet_stdout():
            calibrator = create_calibrator(
                staged,
                list(op_types) if op_types is not None else None,
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=calibrate_method,
                # the augmented copy of a model over protobuf's 2 GiB is written with its weights beside it: ORT
                # writes one file by default, which it then could not parse back ("Protobuf parsing failed")
                use_external_data_format=file_over_protobuf_limit(staged),
                extra_options=options,
            )
            if not calibrator.select_tensors_to_calibrate(calibrator.model)[0]:
                ranges = TensorsData(calibrate_method, {})
            else:
                if histogram:
                    calibrator.collector = GuardedHistogramCollector(
                        calibrate_method.name.lower(), options["symmetric"], options["num_bins"],
                        options["num_quantized_bins"], options["percentile"])  # fmt: skip
                per_call = session_per_call_inputs(calibrator.infer_session)
                for batch in track(batches, f"calibrating ({method})", total=len(batches)):
                    calibrator.collect_data(_FeedReader([dict(fed_per_call(batch, per_call))]))
                ranges = calibrator.compute_data()
                if histogram:
                    skipped = dict(calibrator.collector.skipped)
                else:  # MinMax skips NaN: its range would quantize the tensor and turn NaN into a number
                    scanned = any(holds_nonfinite(batch) for batch in batches)  # else no tensor can be: no load
                    found = nonfinite_tensors(load_model(staged), ranges.keys(), batches, Path(tmp)) if scanned else ()
                    skipped = dict.fromkeys(sorted(found), NONFINITE)
                    ranges = TensorsData(ranges.calibration_method,
                                         {name: data for name, data in ranges.items()
                                          if name not in skipped})  # fmt: skip
        del calibrator  # closes its session before the folder goes
    return _representable(Calibrated(ranges, skipped))


def _in_normal_form(model_path: Path, workdir: Path, tmp: Path) -> Path:
    """The model at `model_path` as `load_model` reads it, for ORT's calibrator, which loads its own copy and writes
    scratch files beside the file it is given. A file already in that form (no local function to inline, every
    node of the main graph named) in the caller's `workdir` (a build's pre-processed model) is that file: saving it
    again would write every weight once more. Any other is saved in that form in `tmp`. Not held here either way."""
    header = onnx.load(str(model_path), load_external_data=False)
    normal = not header.functions and all(node.name for node in header.graph.node)
    del header
    if normal and model_path.resolve().is_relative_to(workdir.resolve()):
        return model_path
    return save_model(load_model(model_path), tmp / "model.onnx")


def _representable(calibrated: Calibrated) -> Calibrated:
    """`calibrated` less the ranges that are not finite, reach a mask fill's magnitude or are zero wide (a tensor that
    is 0 on every calibration row: an all-zero input, a ReLU dead on the sample), named in its `skipped`.

    A min/max range reaching float32's extremes (an attention mask filled with its minimum, and the scores it is added
    to) gives a scale near 1e36: every real value of the tensor (the attention scores) rounds to zero. The histogram
    calibrators already leave such tensors float (`histogram_problem`); MinMax keeps the same rule, so that which
    calibrator is chosen does not decide whether a mask destroys the attention."""
    ranges = calibrated.ranges
    dropped: dict[str, str] = {}
    for name, data in ranges.items():
        bounds = np.concatenate([np.ravel(np.asarray(bound, dtype=np.float64)) for bound in data.range_value])
        if not np.isfinite(bounds).all():
            dropped[name] = f"its range holds NaN or infinity; {UNQUANTIZED}"
        elif bounds.size and float(np.max(np.abs(bounds))) > HISTOGRAM_LIMIT:
            dropped[name] = f"its range reaches {float(np.max(np.abs(bounds))):.3g} (a mask?); {UNQUANTIZED}"
        elif _scale_underflows(bounds):
            dropped[name] = f"{_ZERO_RANGE}; {UNQUANTIZED}"
    if not dropped:
        return calibrated
    kept = TensorsData(ranges.calibration_method, {name: data for name, data in ranges.items() if name not in dropped})
    return Calibrated(kept, {**calibrated.skipped, **dropped})


# Why a tensor whose calibrated range is (about) zero wide is left float.
_ZERO_RANGE = "0 on every calibration row, so no scale can be formed (ONNX Runtime would use 1.0)"


def _scale_underflows(bounds: np.ndarray) -> bool:
    """Whether the 8-bit scale of a range with these bounds (widened to hold 0, as the quantizers do) falls below
    float32's smallest normal value: ONNX Runtime then replaces it by 1.0, an arbitrary step that turns the tensor's
    values into whole numbers and clips it to +-127 (and FP8 has no amax to scale by)."""
    if not bounds.size:
        return False
    width = max(float(np.max(bounds)), 0.0) - min(float(np.min(bounds)), 0.0)
    return width / 255.0 < float(np.finfo(np.float32).tiny)


def compute_ranges_with(
    settings: CalibrationSettings, model_path: Path, batches: Sequence[Feeds], workdir: Path
) -> Calibrated:
    """`compute_ranges` driven by resolved settings."""
    return compute_ranges(
        model_path,
        batches,
        settings.method,
        percentile=settings.percentile,
        num_bins=settings.num_bins,
        num_quantized_bins=settings.num_quantized_bins,
        symmetric=settings.symmetric,
        op_types=settings.op_types,
        workdir=workdir,
    )


def tensor_amax(ranges: TensorsData, name: str) -> float | None:
    """Largest magnitude of a calibrated tensor's range; None when uncalibrated, not finite or zero (no scale)."""
    if name not in ranges:
        return None
    lowest, highest = ranges[name].range_value  # scalars, or 1-element arrays from MinMax
    amax = float(np.max(np.abs(np.concatenate([np.ravel(lowest), np.ravel(highest)]).astype(np.float64))))
    return amax if np.isfinite(amax) and amax > 0 else None


def clipping_ranges(ranges: TensorsData, tensors: Iterable[str], *, symmetric: bool) -> dict[str, tuple[float, float]]:
    """The float interval each quantized tensor's quantizer represents, from its calibrated range.

    The interval is widened to hold 0 (the quantizers make zero exactly representable);
    `symmetric` makes it +-amax. Tensors without a finite, non-empty range are left out
    (the builders do not quantize them).
    """
    clipping: dict[str, tuple[float, float]] = {}
    for name in tensors:
        if name not in ranges:
            continue
        lowest, highest = ranges[name].range_value
        low = min(float(np.min(np.asarray(lowest, dtype=np.float64))), 0.0)
        high = max(float(np.max(np.asarray(highest, dtype=np.float64))), 0.0)
        if symmetric:
            low, high = -max(-low, high), max(-low, high)
        if np.isfinite(low) and np.isfinite(high) and high > low:
            clipping[name] = (low, high)
    return clipping


# ONNX Runtime's quantization pre-processing raises a model below this opset to it (its Q/DQ and fusions need it)
PRE_PROCESSED_OPSET = 11


def preprocess_model(model: onnx.ModelProto, directory: Path, qdq_opset: int | None = None) -> tuple[Path, str]:
    """ORT's quantization pre-processing (shape inference) into `directory`; returns the path and what ran.

    ORT's graph optimiser step is skipped on purpose: it fuses and renames nodes
    (MatMul + Add -> Gemm), so `exclude_nodes` and `op_types` would no longer mean the
    graph the user wrote them for; ORT applies its fusions when it loads the model anyway.
    Symbolic shape inference runs only where ONNX's own leaves a tensor untyped (`typed_by_onnx_inference`), and
    fails on some graphs; ONNX shape inference still runs then. Stale value_info (dynamo exports, pitfall 8) is
    dropped from `model` first (in place): shape inference recomputes it.
    A model below opset 11 is raised to it here (`ensure_opset`: Upsample and Resize compute the same pixels), as
    ORT's pre-processing would: its own conversion stopped at an Upsample ('No Adapter From Version $9 for Resize')
    and wrote a Resize-10 as a Resize-11 sampling other pixels. For a build writing QuantizeLinear/DequantizeLinear
    (`qdq_opset`: the opset it needs at least, 21 for FP8's float8, 13 for per-channel scales; None for a dynamic
    build, which writes none), a model stamped at an opset whose Q/DQ the installed ONNX Runtime lacks is stamped
    lower where its nodes allow (qbench.variants.qdq_opset).
    """
    del model.graph.value_info[:]
    path = directory / "preprocessed.onnx"
    original = default_opset(model)
    model = ensure_opset(model, PRE_PROCESSED_OPSET)
    raised = f"opset {original} raised to {PRE_PROCESSED_OPSET}; " if original < PRE_PROCESSED_OPSET else ""
    if qdq_opset is not None:
        model, stamped = qdq_runnable(model, max(qdq_opset, PRE_PROCESSED_OPSET))
        raised += stamped
    # a model over protobuf's limit is written with its weights beside it, at every step (ORT's default writes one file)
    big = {"save_as_external_data": True, "all_tensors_to_one_file": True,
           "external_data_location": f"{path.name}.data"}  # fmt: skip
    external = big if over_protobuf_limit(model) else {}
    inferred = typed_by_onnx_inference(model)
    if inferred is not None:  # all ORT's pre-processing would do is tag it: tagged and saved here, not serialised whole
        add_pre_process_metadata(inferred)
        save_model(inferred, path)
        done = "ONNX shape inference (it typed every tensor: no symbolic shape inference needed; no graph optimisation)"
        return path, raised + done + _declare_runtime_float_types(path)
    try:
        quant_pre_process(model, path, skip_optimization=True, **external)
        done = "symbolic and ONNX shape inference (no graph optimisation)"
    except Exception:  # noqa: BLE001 (symbolic shape inference raises assorted errors)
        quant_pre_process(model, path, skip_optimization=True, skip_symbolic_shape=True, **external)
        done = "ONNX shape inference (symbolic shape inference failed; no graph optimisation)"
    return path, raised + done + _restore_subgraphs(model, path) + _declare_runtime_float_types(path)


def _restore_subgraphs(original: onnx.ModelProto, path: Path) -> str:
    """Put back, in the preprocessed model at `path`, every If/Loop/Scan subgraph whose nodes shape inference
    changed; returns what it restored for the step's description.

    Shape inference types tensors and adds no node, but ONNX Runtime's symbolic pass copies the branch an `If` with a
    constant condition takes over the one it does not (`_infer_If`), weights included: every INT8 and FP8 variant of
    such a graph stored that branch twice (a model of 22 KB written as 39 KB, and its size reported so) and counted the
    copy's nodes among those left float inside subgraphs."""
    from qbench.variants.onnx_utils import save_model, subgraphs_of

    if not any(subgraphs_of(node) for node in original.graph.node):
        return ""
    processed = onnx.load(str(path), load_external_data=False)  # weights beside it stay there, named as they are
    restored = _restore_changed(processed.graph, original.graph)
    if not restored:
        return ""
    save_model(processed, path)
    return f"; {restored} subgraph(s) that symbolic shape inference rewrote restored"


def _restore_changed(processed: onnx.GraphProto, original: onnx.GraphProto) -> int:
    """Copy each subgraph of `original` whose nodes differ over its counterpart in `processed` (nodes matched by
    their outputs, subgraphs by attribute name), in place, at any depth; how many were copied."""
    by_outputs = {tuple(node.output): node for node in original.node}
    restored = 0
    for node in processed.node:
        before = by_outputs.get(tuple(node.output))
        if before is None:
            continue
        graphs_before = {a.name: a.g for a in before.attribute if a.HasField("g")}
        for attribute in node.attribute:
            if not attribute.HasField("g") or attribute.name not in graphs_before:
                continue
            source = graphs_before[attribute.name]
            if _node_signature(attribute.g) != _node_signature(source):
                attribute.g.CopyFrom(source)
                restored += 1
            else:
                restored += _restore_changed(attribute.g, source)
    return restored


def _node_signature(graph: onnx.GraphProto) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return [(node.domain, node.op_type, tuple(node.input), tuple(node.output)) for node in graph.node]


def typed_by_onnx_inference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` after ONNX's own shape inference when that gives every node output an element type and a rank, in a
    graph of standard operators without subgraphs; else None. ONNX Runtime's symbolic shape inference would add
    nothing its quantizers read there (they look tensors' types up; weights' shapes are their initializers'), and it
    costs its imports (sympy, and torch where installed: seconds in a fresh process) and a pass in Python over every
    node. Contrib operators (no ONNX schema), If/Loop/Scan bodies, local functions and models ONNX cannot infer keep
    the symbolic pass (a model over 2 GiB is inferred without its weights' bytes: qbench.onnx_read.infer_shapes)."""
    graph = model.graph
    if model.functions or any(node.domain not in ("", "ai.onnx") for node in graph.node):
        return None
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for attribute in node.attribute):  # fmt: skip
        return None
    try:
        inferred = infer_shapes(model)
    except Exception:  # noqa: BLE001 - ONNX's checker raises several types
        return None
    known = {value.name: value.type for value in (*inferred.graph.input, *inferred.graph.output,
                                                  *inferred.graph.value_info)}  # fmt: skip
    for node in inferred.graph.node:
        for name in filter(None, node.output):
            kind = known.get(name)
            if kind is None or kind.WhichOneof("value") != "tensor_type":
                return None
            if kind.tensor_type.elem_type == onnx.TensorProto.UNDEFINED or not kind.tensor_type.HasField("shape"):
                return None
    return inferred


def _declare_runtime_float_types(path: Path) -> str:
    """Declare, in the preprocessed model at `path`, the float tensors shape inference left untyped, with the types
    ONNX Runtime gives them (float_support.tensor_types): ONNX knows no com.microsoft schema, so what a contrib
    operator writes (a FusedGemm in a graph ONNX Runtime saved optimised) is untyped, ONNX Runtime's quantizers skip
    an untyped tensor when they calibrate and quantize ("failed to infer the type of tensor"), and its reader then
    failed to build ("Unable to get valid quantization scale ... when quantizing bias"). Returns what it added to
    the step's description."""
    from qbench.variants.float_support import add_missing_float_value_info, tensor_types
    from qbench.variants.onnx_utils import save_model

    model = onnx.load(str(path))
    graph = model.graph
    declared = {v.name for v in (*graph.input, *graph.output, *graph.value_info)} | {t.name for t in graph.initializer}
    if all(name in declared for node in graph.node for name in node.output if name):
        return ""
    before = len(graph.value_info)
    add_missing_float_value_info(model, tensor_types(model))
    if len(graph.value_info) == before:
        return ""
    save_model(model, path)
    return f"; {len(graph.value_info) - before} float tensor type(s) only ONNX Runtime knows declared"
