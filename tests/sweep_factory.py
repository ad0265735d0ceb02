"""Build synthetic SweepResults for tests of the report, the frontier and tracking (and re-sign edited ones).

Importable from any test file (`from sweep_factory import make_sweep`): the
tests/ folder is on sys.path because tests/conftest.py lives there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from qbench.results.schema import (
    AccuracyResult,
    CalibrationRecord,
    LatencyPoint,
    LatencyResult,
    SliceMetrics,
    SweepResults,
    VariantResult,
    canonical_sha256,
    content_digest,
)

REFERENCE_ACCURACY = {"overall": 0.95, "clean": 0.97, "noisy lighting=dark": 0.90}
SLICE_SIZES = {"clean": 300, "noisy lighting=dark": 100}
FP8_NOTE = "FP8 is simulated with Q/DQ on CPU: latency is not representative"


def make_slice(name: str, size: int, accuracy: float, reference: float) -> SliceMetrics:
    """Accuracy and agreement for one slice, with a ±0.02 interval and drops vs `reference`."""
    agreement = 1.0 - abs(reference - accuracy)
    metrics = {"accuracy": accuracy, "agreement": agreement}
    return SliceMetrics(
        name=name,
        size=size,
        metrics=metrics,
        intervals={m: (v - 0.02, min(v + 0.02, 1.0)) for m, v in metrics.items()},
        drops={"accuracy": reference - accuracy, "agreement": 1.0 - agreement},
    )


def make_accuracy(values: Mapping[str, float], nonfinite_outputs: int = 0) -> AccuracyResult:
    """`values` maps 'overall' and each slice name to accuracy; drops are vs REFERENCE_ACCURACY."""
    slices = tuple(make_slice(n, SLICE_SIZES[n], values[n], REFERENCE_ACCURACY[n]) for n in SLICE_SIZES)
    overall = make_slice("overall", sum(SLICE_SIZES.values()), values["overall"], REFERENCE_ACCURACY["overall"])
    return AccuracyResult(rows=overall.size, nonfinite_outputs=nonfinite_outputs, overall=overall, slices=slices)


def make_latency(p50_by_batch: Mapping[int, float], threads: int | None = 2) -> LatencyResult:
    points = tuple(
        LatencyPoint(
            batch_size=bs, warmup=5, iterations=50, p50_ms=p50, p95_ms=p50 * 1.2, p99_ms=p50 * 1.5,
            mean_ms=p50 * 1.1, items_per_s=bs / (p50 / 1000.0) if p50 > 0 else math.nan,
        )
        for bs, p50 in sorted(p50_by_batch.items())
    )  # fmt: skip
    return LatencyResult(threads=threads, session_create_ms=40.0, first_run_ms=5.0, points=points)


def make_variant(
    name: str,
    precision: str,
    *,
    backend: str = "onnxruntime-cpu",
    accuracy: Mapping[str, float] | None = None,
    p50_by_batch: Mapping[int, float] | None = None,
    params: dict[str, Any] | None = None,
    notes: tuple[str, ...] = (),
    error: str | None = None,
    nonfinite_outputs: int = 0,
) -> VariantResult:
    """An ok variant (or a failed one when `error` is given: no accuracy, no latency)."""
    if error is not None:
        return VariantResult(name, backend, precision, "failed", params=params or {}, error=error, notes=notes)
    return VariantResult(
        variant=name,
        backend=backend,
        precision=precision,
        status="ok",
        params=params or {},
        model_path=f"/tmp/{name}.onnx",
        model_bytes=4_000_000 if precision == "fp32" else 1_000_000,
        build_seconds=1.5,
        notes=notes,
        accuracy=make_accuracy(accuracy or REFERENCE_ACCURACY, nonfinite_outputs),
        latency=make_latency(p50_by_batch or {1: 1.0, 32: 20.0}),
    )


def default_variants(backend: str = "onnxruntime-cpu") -> list[VariantResult]:
    """FP32, FP16, INT8 (faster, worse on the noisy slice), FP8 (simulated: slow), INT8 dynamic (failed)."""
    return [
        make_variant("fp32", "fp32", backend=backend, p50_by_batch={1: 1.0, 32: 20.0}),
        make_variant("fp16", "fp16", backend=backend, p50_by_batch={1: 1.1, 32: 21.0},
                     accuracy={"overall": 0.95, "clean": 0.97, "noisy lighting=dark": 0.90}),
        make_variant("int8_minmax", "int8", backend=backend, p50_by_batch={1: 0.6, 32: 12.0},
                     accuracy={"overall": 0.94, "clean": 0.97, "noisy lighting=dark": 0.86},
                     params={"calibrator": "minmax", "reduce_range": True, "exclude_nodes": ["a", "b"]}),
        make_variant("fp8_e4m3", "fp8", backend=backend, p50_by_batch={1: 6.0, 32: 130.0},
                     accuracy={"overall": 0.949, "clean": 0.969, "noisy lighting=dark": 0.899},
                     params={"calibrator": "minmax"}, notes=(FP8_NOTE,)),
        make_variant("int8_dynamic", "int8", backend=backend, params={"calibrator": "dynamic"},
                     error="RuntimeError: ConvInteger is not implemented"),
    ]  # fmt: skip


def make_sweep(
    variants: Sequence[VariantResult] | None = None,
    *,
    name: str = "digits",
    gate_metric: str = "accuracy",
    frontier: tuple = (),
) -> SweepResults:
    return SweepResults(
        qbench_version="0.1.0",
        created_at="2026-01-02T03:04:05+00:00",
        recipe={"name": name, "path": "/tmp/recipe.yaml", "sha256": "ab" * 32, "task": "classification"},
        environment={
            "platform": "Linux-x86_64", "python": "3.11.9", "machine": "x86_64", "cpu": "AMD EPYC test",
            "cpu_count": 2, "cpu_flags": ["avx2", "fma"], "packages": {"onnxruntime": "1.31.0", "mlflow": "3.17.2"},
        },  # fmt: skip
        calibration=CalibrationRecord(
            size=64, seed=7, stratify_by="lighting", row_ids_sha256="cd" * 32,
            per_slice_counts={"clean": 48, "noisy lighting=dark": 16},
        ),  # fmt: skip
        evaluation_rows=400,
        gate_metric=gate_metric,
        reference="fp32",
        variants=tuple(default_variants() if variants is None else variants),
        frontier=frontier,
        timings={"build": 3.0, "evaluate": 2.0, "total": 6.5},
    )


def resign(raw: dict[str, Any]) -> dict[str, Any]:
    """What a careful adversary does after editing a results.json: recompute the embedded recipe's and the file's
    digests (the gate must then catch the edit by what the recipe and its data say, not by the digest)."""
    if "resolved" in raw["recipe"]:
        raw["recipe"]["resolved_sha256"] = canonical_sha256(raw["recipe"]["resolved"])
    raw["digest"] = content_digest(raw)
    return raw
