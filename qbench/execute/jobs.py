"""What one job does, wherever it runs: build a variant, or measure a built variant on one backend.

These functions are the only place variants are built and measured; the local executor calls them in
the sweep's process, the Ray executor in a worker (qbench.execute.ray_executor). They report through
their return value (a `BuildOutput` / `MeasureOutput`), never by writing the run folder: the driver
records what finished. One variant's failure is a result with status "failed", not an exception.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from qbench.backends import Backend, Runner, get_backend
from qbench.backends.base import RunOptions
from qbench.errors import QbenchError
from qbench.execute.store import BuildStore, build_environment, manifest_of
from qbench.preflight import Prepared
from qbench.provenance import model_sha256
from qbench.recipe import VariantSpec
from qbench.results import AccuracyResult, LatencyResult, VariantResult
from qbench.slo import serving_figures
from qbench.validate.accuracy import evaluate_accuracy, run_outputs, with_drops
from qbench.validate.fidelity import plan_measurement
from qbench.validate.latency import (
    latency_points,
    measure_cold_start,
    measure_samples,
    stability_rule,
    take_batch,
)
from qbench.variants import BuildContext, BuiltVariant, build_variant

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]  # evaluated output name -> values over the evaluation rows


@dataclass
class Clock:
    """Seconds spent per phase, so the sweep's own overhead can be reported."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, started: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    def merge(self, seconds: dict[str, float]) -> None:
        for phase, value in seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + value


@dataclass(frozen=True)
class Reference:
    """FP32's figures a measurement is compared with: its outputs (first backend) and its accuracy (same backend)."""

    outputs: Outputs | None = None
    accuracy: AccuracyResult | None = None


@dataclass(frozen=True)
class BuildOutput:
    """A finished build: the manifest of its files in the store (None when it failed) and its torch form."""

    variant: str
    manifest: dict[str, Any] | None
    error: str | None = None
    torch_module: Any = None  # an in-memory torch form (QAT, ModelOpt), which the store cannot hold
    seconds: dict[str, float] = field(default_factory=dict)
    where: str = ""


@dataclass(frozen=True)
class MeasureOutput:
    """A finished measurement; `outputs` are kept only when the job was asked to (FP32's, the reference)."""

    result: VariantResult
    outputs: Outputs | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    where: str = ""


def worker_name() -> str:
    """Which machine and process ran a job, for the progress lines."""
    return f"{socket.gethostname()}:{os.getpid()}"


# -- build ---------------------------------------------------------------------------------------


def run_build(
    spec: VariantSpec,
    prepared: Prepared,
    store: BuildStore,
    key: str,
    search: tuple[str, Reference] | None = None,
) -> BuildOutput:
    """Build `spec` in a private folder, publish its files to `store` under `key`, return their manifest.

    `search` (first backend, FP32 reference) serves variants with `fallback` or `calibrator: auto`, whose
    candidates are measured while building."""
    clock = Clock()
    folder = Path(tempfile.mkdtemp(prefix=f"qbench-build-{spec.name}-"))
    try:
        evaluate = _search_evaluator(search, prepared, clock) if search is not None else _no_search(spec)
        built, error = _build(spec, prepared, folder, clock, evaluate)
        if built is None:
            return BuildOutput(spec.name, None, error, seconds=clock.seconds, where=worker_name())
        own_torch = built.torch_module is not None and not _torch_form_from_source(built, prepared)
        t = time.perf_counter()
        try:
            manifest = manifest_of(built, folder, build_environment(), reusable=not own_torch)
            store.publish(key, folder, manifest)
        except Exception as exc:  # noqa: BLE001 - a store that cannot be written fails this build, not the sweep
            error = f"publishing the build to {store.root} failed: {describe_error(exc)}"
            logger.error("  build failed: %s", error)
            return BuildOutput(spec.name, None, error, seconds=clock.seconds, where=worker_name())
        finally:
            clock.add("store", t)
        module = built.torch_module if own_torch else None
        return BuildOutput(
            spec.name,
            manifest,
            torch_module=module,
            seconds=clock.seconds,
            where=worker_name(),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _torch_form_from_source(built: BuiltVariant, prepared: Prepared) -> bool:
    """Whether the torch form is the recipe's module transformed (rebuilt anywhere from the source)."""
    from qbench.variants.torch_forms import TorchFormFactory

    return prepared.source.torch is not None and isinstance(built.torch_module, TorchFormFactory)


def with_torch_form(built: BuiltVariant, spec: VariantSpec, prepared: Prepared, module: Any = None) -> BuiltVariant:
    """`built` (read back from a manifest) with its torch form: the one its build made, else the source's."""
    if module is not None:
        return replace(built, torch_module=module)
    if prepared.source.torch is None:
        return built
    from qbench.variants.torch_forms import attach_torch_form

    return attach_torch_form(built, spec, prepared.source.torch)


def _no_search(spec: VariantSpec) -> Callable[[BuiltVariant], VariantResult]:
    def refuse(candidate: BuiltVariant) -> VariantResult:
        raise QbenchError(f"variant {spec.name!r}: a search build was planned without its reference")

    return refuse


def _search_evaluator(
    search: tuple[str, Reference], prepared: Prepared, clock: Clock
) -> Callable[[BuiltVariant], VariantResult]:
    """Measure a candidate variant on the first backend against FP32 (for fallback / calibrator search)."""
    backend_name, reference = search
    backend = get_backend(backend_name)

    def evaluate(candidate: BuiltVariant) -> VariantResult:
        return _measure(backend, candidate, prepared, reference, clock)[0]

    return evaluate


def _build(
    spec: VariantSpec,
    prepared: Prepared,
    folder: Path,
    clock: Clock,
    evaluate: Callable[[BuiltVariant], VariantResult],
) -> tuple[BuiltVariant | None, str | None]:
    """Build one variant; a variant with `fallback` or `calibrator: auto` is searched with `evaluate`."""
    t = time.perf_counter()
    ctx = BuildContext(
        reference_path=prepared.source.onnx_path,
        workdir=folder,
        calibration=prepared.calibration_batches,
        torch_model=prepared.source.torch,
        training=prepared.training.get(spec.name),
    )
    try:
        logger.info("  building: %s", _technique(spec))
        return _build_one(spec, ctx, evaluate, prepared), None
    except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the sweep goes on
        logger.error("  build failed: %s", exc)
        return None, describe_error(exc)
    finally:
        clock.add("build", t)


def _technique(spec: VariantSpec) -> str:
    """What building this variant involves, for the progress line."""
    if spec.qat is not None:
        return f"QAT, {spec.qat.epochs} epochs"
    if spec.calibrator is None:
        return spec.precision
    return f"{spec.precision}, {spec.technique_name}, {spec.calibrator} calibration"


def _build_one(
    spec: VariantSpec,
    ctx: BuildContext,
    evaluate: Callable[[BuiltVariant], VariantResult],
    prepared: Prepared,
) -> BuiltVariant:
    """The variant, searched when it asks for a fallback or calibrator auto, with its torch form attached."""
    if spec.fallback is not None or spec.calibrator == "auto":
        from qbench.fallback import build_with_search

        built = build_with_search(spec, ctx, evaluate=evaluate, gate=prepared.recipe.gate)
    else:
        built = build_variant(spec, ctx)
    if prepared.source.torch is not None and built.torch_module is None:
        from qbench.variants.torch_forms import attach_torch_form

        built = attach_torch_form(built, spec, prepared.source.torch)
    return built


# -- measure -------------------------------------------------------------------------------------


def run_measure(
    backend_name: str,
    built: BuiltVariant,
    prepared: Prepared,
    reference: Reference,
    *,
    keep_outputs: bool = False,
) -> MeasureOutput:
    """Measure `built` on one backend against the FP32 reference (see `_measure`)."""
    clock = Clock()
    result, outputs = _measure(get_backend(backend_name), built, prepared, reference, clock)
    kept = outputs if keep_outputs else None
    return MeasureOutput(result, kept, seconds=clock.seconds, where=worker_name())


def _measure(
    backend: Backend,
    built: BuiltVariant,
    prepared: Prepared,
    reference: Reference,
    clock: Clock,
) -> tuple[VariantResult, Outputs | None]:
    """Cold start, accuracy on every evaluation row, then steady-state latency: one session alive at a time.

    The timed and the scored model differ when the backend cannot compute the variant's precision
    (qbench.validate.fidelity): the scored emulation then runs first, in its own session.
    """
    recipe = prepared.recipe
    unsupported = backend.supports(built)
    if unsupported:
        logger.info("  %s: skipped (%s)", backend.name, unsupported)
        return failed_built(built, backend.name, unsupported, status="skipped"), None
    feeds = prepared.evaluation_feeds
    label = f"{built.name}@{backend.name}"
    t = time.perf_counter()
    try:
        batch_sizes = tuple(sorted({*recipe.latency.batch_sizes, recipe.data.evaluation.batch_size, 1}))
        options = RunOptions(threads=recipe.latency.threads, batch_sizes=batch_sizes)
        plan = plan_measurement(backend, built)
        outputs = None
        if plan.separate:
            outputs = _score(
                backend.load(plan.scored, options),
                prepared,
                f"{label} evaluate (emulated)",
            )
        runner, create_ms, first_ms = measure_cold_start(
            lambda: backend.load(plan.timed, options), take_batch(feeds, 1)
        )
        try:
            if outputs is None:
                outputs = _score(runner, prepared, f"{label} evaluate", close=False)
            samples = measure_samples(
                runner, feeds, recipe.latency.batch_sizes, recipe.latency.warmup, recipe.latency.iterations,
                description=f"{label} latency", stability=recipe.latency.stability,
            )  # fmt: skip
            rule = stability_rule(recipe.latency.stability, recipe.latency.iterations)
            points = latency_points(samples, recipe.latency.warmup, rule)
            runtime = runner.describe()
        finally:
            runner.close()
    except Exception as exc:  # noqa: BLE001
        logger.error("  %s failed: %s", backend.name, exc)
        return failed_built(built, backend.name, describe_error(exc)), None
    finally:
        clock.add("inference", t)
    compared = reference.outputs if reference.outputs is not None else outputs
    accuracy = evaluate_accuracy(
        recipe.task,
        outputs,
        compared,
        prepared.labels,
        prepared.slices,
        prepared.custom_metrics,
    )
    accuracy = with_drops(accuracy, reference.accuracy or accuracy)
    latency = LatencyResult(
        threads=recipe.latency.threads,
        session_create_ms=create_ms,
        first_run_ms=first_ms,
        points=tuple(points),
    )
    model_bytes = built.onnx_path.stat().st_size
    serving = serving_figures(recipe, backend.name, samples, points, model_bytes=model_bytes, runtime=runtime,
                              preprocess_ms_per_row=prepared.preprocess_ms_per_row)  # fmt: skip
    result = VariantResult(
        variant=built.name,
        backend=backend.name,
        precision=built.precision,
        status="ok",
        params={**built.params, **{f"runtime.{k}": v for k, v in runtime.items()}},
        model_path=str(built.onnx_path),
        model_bytes=model_bytes,
        model_sha256=model_sha256(built.onnx_path),
        build_seconds=built.build_seconds,
        notes=built.notes,
        accuracy=accuracy,
        latency=latency,
        fidelity=plan.fidelity,
        evaluated_model_path=str(plan.scored.onnx_path) if plan.separate else None,
        serving=serving,
    )
    return result, outputs


def _score(runner: Runner, prepared: Prepared, description: str, *, close: bool = True) -> Outputs:
    """The evaluation outputs of `runner` (closed afterwards unless the caller goes on timing it)."""
    try:
        batch_size = prepared.recipe.data.evaluation.batch_size
        return run_outputs(runner, prepared.evaluation_feeds, batch_size, prepared.output_indices,
                           description=description)  # fmt: skip
    finally:
        if close:
            runner.close()


# -- results of jobs that did not measure --------------------------------------------------------


def failed(spec_name: str, precision: str, backend: str, error: str) -> VariantResult:
    return VariantResult(
        variant=spec_name,
        backend=backend,
        precision=precision,
        status="failed",
        error=error,
    )


def failed_built(built: BuiltVariant, backend: str, error: str, status: str = "failed") -> VariantResult:
    """A built variant that did not run on `backend`: failed, or skipped (the backend cannot run it)."""
    return VariantResult(
        variant=built.name, backend=backend, precision=built.precision, status=status, error=error,
        params=dict(built.params), model_path=str(built.onnx_path), build_seconds=built.build_seconds,
        notes=built.notes,
    )  # fmt: skip


def identical(built: BuiltVariant, twin: VariantResult) -> VariantResult:
    """`built` computes exactly what `twin` measured: report `twin`'s figures under its name, saying so."""
    note = f"identical to {twin.variant} (same graph and weights): not run again, the figures are {twin.variant}'s"
    logger.info("  %s: %s", twin.backend, note)
    return replace(
        twin, variant=built.name, precision=built.precision, params={**built.params, "identical_to": twin.variant},
        model_path=str(built.onnx_path), build_seconds=built.build_seconds, notes=(*built.notes, note),
    )  # fmt: skip


def identity(built: BuiltVariant) -> str:
    """What decides a variant's figures: its graph (digest), how backends must run it, and its torch form."""
    from qbench.variants.onnx_utils import graph_digest
    from qbench.variants.torch_forms import TORCH_FORM

    try:
        graph = graph_digest(built.onnx_path)
    except Exception:  # noqa: BLE001 - an unreadable model is measured (and fails) on its own
        graph = f"unread:{built.name}"
    return f"{graph}|{sorted(built.session_hints.items())}|{built.params.get(TORCH_FORM)}"


def describe_error(exc: BaseException) -> str:
    """User errors keep their message; anything else gets its type and the innermost frame, for a bug report."""
    if isinstance(exc, QbenchError):
        return str(exc)
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"
