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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from qbench.backends import get_backend
from qbench.backends.base import form_run_by
from qbench.errors import QbenchError, environment_cause
from qbench.execute.plan import build_facts, searches
from qbench.execute.resume import measured_with
from qbench.execute.store import BuildStore, StoreUnwritable, manifest_of
from qbench.interrupt import held
from qbench.preflight.prepare import Prepared
from qbench.provenance import model_bytes, model_sha256
from qbench.recipe.spec import VariantSpec
from qbench.results.schema import AccuracyResult, VariantResult
from qbench.validate.clock import PhaseClock
from qbench.validate.measure import Measured, Reference, Rows, describe_error, measure
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.base import ONNX, TORCH

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]  # evaluated output name -> values over the evaluation rows


def fp32_reference(outputs: Outputs | None, accuracy: AccuracyResult | None) -> Reference | None:
    """What a measurement is compared with: FP32's outputs (first backend) and its accuracy on the same
    backend; None for FP32's first measurement, which is the reference."""
    return None if outputs is None else Reference(outputs, accuracy)


@dataclass(frozen=True)
class BuildOutput:
    """A finished build: the manifest of its files in the store (None when it failed) and its torch form."""

    variant: str
    manifest: dict[str, Any] | None
    error: str | None = None
    torch_module: Any = None  # an in-memory torch form (QAT, ModelOpt), which the store cannot hold
    seconds: dict[str, float] = field(default_factory=dict)
    where: str = ""
    search: dict[str, Any] | None = None  # the INT8 search's report (JSON form), when this build was the search
    span: tuple[float, float] | None = None  # when the job started and ended where it ran (epoch seconds)
    environment: str | None = None  # failed for a reason outside the variant (qbench.errors.environment_cause)


@dataclass(frozen=True)
class MeasureOutput:
    """A finished measurement; `outputs` are kept only when the job was asked to (FP32's, the reference)."""

    result: VariantResult
    outputs: Outputs | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    where: str = ""
    span: tuple[float, float] | None = None  # when the job started and ended where it ran (epoch seconds)
    environment: str | None = None  # failed for a reason outside the variant (qbench.errors.environment_cause)
    measured_with: dict[str, str] | None = None  # where it ran (qbench.execute.resume.measured_with)


def worker_name() -> str:
    """Which machine and process ran a job, for the progress lines."""
    return f"{socket.gethostname()}:{os.getpid()}"


# -- build ---------------------------------------------------------------------------------------


def run_build(
    spec: VariantSpec,
    prepared: Prepared,
    store: BuildStore,
    key: str,
    search: tuple[str, Reference | None] | None = None,
) -> BuildOutput:
    """Build `spec` in a private folder, publish its files to `store` under `key`, return their manifest.

    `search` (first backend, FP32 reference) serves variants whose candidates are measured while building:
    `fallback`, `calibrator: auto`, and the recipe's INT8 search (whose report rides in the manifest)."""
    started = time.time()
    output = _build_and_publish(spec, prepared, store, key, search)
    return replace(output, span=(started, time.time()))


def _build_and_publish(
    spec: VariantSpec,
    prepared: Prepared,
    store: BuildStore,
    key: str,
    search: tuple[str, Reference | None] | None,
) -> BuildOutput:
    stored = _stored_search(spec, prepared, store, key)
    if stored is not None:
        return BuildOutput(spec.name, stored, where="the build store")
    clock = PhaseClock()
    folder = Path(tempfile.mkdtemp(prefix=f"qbench-build-{spec.name}-"))
    try:
        report = None
        try:
            if is_int8_search(spec, prepared):
                built, report = _int8_search(search, prepared, folder, clock)
            else:
                evaluate = _search_evaluator(search, prepared, clock) if search is not None else _no_search(spec)
                built = _build(spec, prepared, folder, clock, evaluate)
        except _BuildFailed as failure:
            return BuildOutput(spec.name, None, failure.error, seconds=clock.seconds, where=worker_name(),
                               search=failure.report, environment=failure.environment)  # fmt: skip
        own_torch = built.torch_module is not None and not _torch_form_from_source(built, prepared)
        t = time.perf_counter()
        try:
            manifest = manifest_of(built, folder, build_facts(prepared.recipe, spec), reusable=not own_torch,
                                   reference=model_sha256(prepared.source.onnx_path))
            if report is not None:
                manifest["search"] = report
            manifest = store.publish(key, folder, manifest)  # another publisher's, when it got there first
        except StoreUnwritable:  # full or read-only: every build would fail the same way, so the sweep stops
            raise
        except Exception as exc:  # noqa: BLE001 - a store that failed otherwise fails this build, not the sweep
            error = f"publishing the build to {store.root} failed: {describe_error(exc)}"
            logger.error("  build failed: %s", error)
            return BuildOutput(spec.name, None, error, seconds=clock.seconds, where=worker_name(), search=report,
                               environment=environment_cause(exc))  # fmt: skip
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


def _stored_search(spec: VariantSpec, prepared: Prepared, store: BuildStore, key: str) -> dict[str, Any] | None:
    """The stored build of a variant that searches while building (the INT8 search, `fallback`, `calibrator: auto`)
    when the store already holds one this sweep may reuse (same key: recipe, input files, qbench and machine facts).

    Publishing a new search's build keeps the entry already there (BuildStore.publish), so searching again only cost
    the search's time and printed a search whose pick the results then did not report: a sweep repeated on a 2-core
    machine spent 30-70 s on an INT8 search that screened ORT static first, and reported the stored search, which
    had kept SmoothQuant. Its choice depends on timing, so the reuse is said."""
    if not searches(prepared.recipe, spec):
        return None
    stored = store.reusable(key, build_facts(prepared.recipe, spec), model_sha256(prepared.source.onnx_path))
    if stored is not None:
        logger.warning("  %s: the build store already holds this build and its search (%s): reused, not searched "
                       "again; remove that entry to search again", spec.name, store.entry(key))  # fmt: skip
    return stored


class _BuildFailed(Exception):
    """A variant that could not be built: why (`error`), whether for a reason outside it (`environment`), and the
    INT8 search's report when the search found no pick."""

    def __init__(self, error: str, environment: str | None = None, report: dict[str, Any] | None = None) -> None:
        super().__init__(error)
        self.error, self.environment, self.report = error, environment, report


def is_int8_search(spec: VariantSpec, prepared: Prepared) -> bool:
    """Whether `spec` names the variant of the recipe's INT8 search (`search:`)."""
    return prepared.recipe.search is not None and spec.name == prepared.recipe.search.name


def _int8_search(
    search: tuple[str, Reference | None] | None, prepared: Prepared, folder: Path, clock: PhaseClock
) -> tuple[BuiltVariant, dict[str, Any]]:
    """Run the recipe's INT8 search into `folder`: its pick and its report (JSON form); raises _BuildFailed when
    there is none. Its failure is the searched variant's failure; the sweep goes on."""
    from qbench.results.schema import to_jsonable
    from qbench.search.run import run_search

    reference = search[1] if search is not None else None
    if search is None or reference is None or reference.accuracy is None:
        raise _BuildFailed("the INT8 search needs FP32 measured first on the first backend")
    backend = search[0]
    fp32 = Measured(VariantResult("fp32", backend, "fp32", "ok", accuracy=reference.accuracy), reference.outputs)
    try:
        outcome = run_search(prepared, get_backend(backend), fp32, prepared.recipe.search, folder, clock=clock)
    except Exception as exc:  # noqa: BLE001 - recorded as the searched variant's failure
        logger.error("  search failed: %s", describe_error(exc))
        raise _BuildFailed(f"search failed: {describe_error(exc)}", environment_cause(exc)) from None
    report = to_jsonable(outcome.report)
    if outcome.built is None:
        from qbench.search.select import why_none
        from qbench.variants.integer_kernels import float_weighted_layers
        from qbench.variants.onnx_utils import load_model

        float_layers = float_weighted_layers(load_model(prepared.source.onnx_path))
        raise _BuildFailed(why_none(outcome.report.candidates, float_layers), report=report)
    return outcome.built, report


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
    search: tuple[str, Reference | None], prepared: Prepared, clock: PhaseClock
) -> Callable[[BuiltVariant], VariantResult]:
    """Measure a candidate variant on the first backend against FP32 (for fallback / calibrator search): on the
    selection rows (qbench.selection_rows: the gate then judges the pick on the evaluation rows, which did not choose
    it), or on the evaluation rows when there are none."""
    backend_name, reference = search
    backend = get_backend(backend_name)
    rows = Rows.selection(prepared)
    chosen_on: dict[str, Reference | None] = {}  # FP32 on the selection rows, measured for the first candidate

    def evaluate(candidate: BuiltVariant) -> VariantResult:
        if rows is not None and "fp32" not in chosen_on:
            fp32 = BuiltVariant("fp32", "fp32", prepared.source.onnx_path, borrowed=True)
            chosen_on["fp32"] = measure(backend, fp32, prepared, rows=rows, quiet=True, clock=clock).reference
        against = reference if rows is None else chosen_on["fp32"]
        return measure(backend, candidate, prepared, rows=rows, reference=against, timing=prepared.recipe.latency,
                       clock=clock).result

    return evaluate


def _build(
    spec: VariantSpec,
    prepared: Prepared,
    folder: Path,
    clock: PhaseClock,
    evaluate: Callable[[BuiltVariant], VariantResult],
) -> BuiltVariant:
    """Build one variant; a variant with `fallback` or `calibrator: auto` is searched with `evaluate`; raises
    _BuildFailed when it cannot be built."""
    t = time.perf_counter()
    ctx = BuildContext(
        reference_path=prepared.source.onnx_path,
        workdir=folder,
        calibration=prepared.calibration_batches,
        torch_model=prepared.source.torch,
        training=prepared.training.get(spec.name),
        fixed_batch=prepared.batch,
    )
    try:
        logger.info("  building: %s", _technique(spec))
        return _build_one(spec, ctx, evaluate, prepared)
    except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the sweep goes on
        logger.error("  build failed: %s", exc)
        raise _BuildFailed(describe_error(exc), environment_cause(exc)) from None
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

        built = build_with_search(spec, ctx, evaluate=evaluate, prepared=prepared)
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
    reference: Reference | None,
    *,
    keep_outputs: bool = False,
    record: Callable[[MeasureOutput], None] | None = None,
) -> MeasureOutput:
    """Measure `built` on one backend against the FP32 reference (qbench.validate.measure.measure). `record` (the
    sweep's own process) writes the output where a resume finds it before this returns, shielded from SIGINT/SIGTERM
    (qbench.interrupt.held): a signal once the measurement is done then never loses it."""
    started = time.time()
    clock = PhaseClock()
    measured = measure(get_backend(backend_name), built, prepared, reference=reference,
                       timing=prepared.recipe.latency, clock=clock, serving=True)  # fmt: skip
    with held():
        kept = measured.outputs if keep_outputs else None
        output = MeasureOutput(measured.result, kept, seconds=clock.seconds, where=worker_name(),
                               span=(started, time.time()), environment=measured.environment,
                               measured_with=measured_with(backend_name, prepared.recipe.latency.threads))  # fmt: skip
        if record is not None:
            record(output)
    return output


# -- results of jobs that did not measure --------------------------------------------------------


def failed(spec_name: str, precision: str, backend: str, error: str) -> VariantResult:
    return VariantResult(
        variant=spec_name,
        backend=backend,
        precision=precision,
        status="failed",
        error=error,
    )


def identical(built: BuiltVariant, twin: VariantResult) -> VariantResult:
    """`built` computes exactly what `twin` measured: report `twin`'s figures under its name, saying so. Where the
    result names the variant's own ONNX file, its size and digest are that file's: a graph and weights equal to the
    twin's are seldom the same bytes (a quantizer that found nothing to quantize still re-saves the model), and a
    digest that is not the named file's reads as a file edited after the sweep (the gate finds it unusable)."""
    note = f"identical to {twin.variant} (same graph and weights): not run again, the figures are {twin.variant}'s"
    logger.info("  %s: %s", twin.backend, note)
    form = form_run_by(get_backend(twin.backend))
    built = built.as_run_in(form)  # what is true of the form twin's backend ran
    own = {"model_path": str(built.onnx_path), "model_bytes": model_bytes(built.onnx_path),
           "model_sha256": model_sha256(built.onnx_path)} if form == ONNX else {}  # fmt: skip
    return replace(
        twin, variant=built.name, precision=built.precision, params={**built.params, "identical_to": twin.variant},
        build_seconds=built.build_seconds, notes=(*built.notes, note), **own,
    )  # fmt: skip


def identities(built: BuiltVariant) -> dict[str, str]:
    """What decides a variant's figures, by the form a backend runs (ONNX, TORCH): its graph (digest) and how
    backends must run it; on a backend running the torch form also that form and whether it is torch.compile'd (two
    variants of one graph, one compiled, run different code there, and the same code on ONNX Runtime)."""
    from qbench.variants.onnx_utils import graph_digest
    from qbench.variants.torch_forms import TORCH_COMPILE, TORCH_FORM

    try:
        graph = graph_digest(built.onnx_path)
    except Exception:  # noqa: BLE001 - an unreadable model is measured (and fails) on its own
        graph = f"unread:{built.name}"
    on_onnx = f"{graph}|{sorted(built.session_hints.items())}"
    compiled = bool(built.params.get(TORCH_COMPILE))
    return {ONNX: on_onnx, TORCH: f"{on_onnx}|{built.params.get(TORCH_FORM)}|compiled={compiled}"}
