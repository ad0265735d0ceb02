"""What the gate checks before judging: are these results what qbench itself makes for the recipe?

The gate never trusts what a results file claims about itself. What was asked for (variants,
backends, reference, slices, the batch sizes timed) comes from the recipe and its model; a status is
accepted only where qbench's own rules produce it; sizes, counts, metrics and latency points (one per
batch size timed) must be ones a sweep can write. Each function returns problems (one line each,
naming the variant@backend, the field or the file); any problem makes the results unusable (exit 2).
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from qbench.errors import did_you_mean, expected_one_of, short_repr
from qbench.gate.fresh import MeasuredModel, read_measured_model
from qbench.recipe.spec import Recipe, VariantSpec
from qbench.results.schema import AccuracyResult, LatencyResult, SliceMetrics, SweepResults, VariantResult
from qbench.validate.catalogue import METRICS, drop, impossible_value, within

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from qbench.data.evaluation import EvaluationRows

STATUSES = ("ok", "failed", "skipped")


def expected_pairs(recipe: Recipe) -> list[tuple[str, str]]:
    """(variant, backend) for every variant the recipe builds (its INT8 search's last) on every backend it names."""
    return [(name, b) for name in _built_specs(recipe) for b in recipe.backends]


def _built_specs(recipe: Recipe) -> dict[str, VariantSpec]:
    """Variant name -> its spec; the searched variant's stands for any INT8 candidate (only its kind is checked)."""
    return {v.name: v for v in recipe.planned_variants()}


def unmatched_globs(
    field: str, patterns: Sequence[str], reference: str, candidates: Sequence[str]
) -> list[tuple[str, str]]:
    """(`field[i]`, why) for every glob of a variant list (gate.applies_to, slo.applies_to) that picks no variant
    besides the reference: almost always a typo, and the variant it meant would go unjudged while the gate passes."""
    if not patterns:
        return [(field, f"got [], expected at least one glob over the variants {', '.join(candidates)}")]
    unmatched = []
    for index, pattern in enumerate(patterns):
        if any(fnmatch.fnmatchcase(name, pattern) for name in candidates):
            continue
        note = f" (the reference {reference!r} is never gated)" if fnmatch.fnmatchcase(reference, pattern) else ""
        unmatched.append((f"{field}[{index}]", f"{short_repr(pattern)} matches no variant{note}; expected a glob over "
                          f"the variants {', '.join(candidates)}{did_you_mean(pattern, candidates)}"))  # fmt: skip
    return unmatched


# -- staleness -------------------------------------------------------------------------------------


# -- what qbench's own rules allow -----------------------------------------------------------------


def skip_possible(backend: str, spec: VariantSpec) -> bool:
    """Whether `backend` can decline `spec` (Backend.supports), re-derived from the backend's rule.

    ONNX Runtime backends run every ONNX variant; torch backends decline a variant that has no torch
    form (qbench.variants.torch_forms: decided by the variant's kind, except the model-dependent
    dynamic INT8 and FP8 forms); other backends (TensorRT) decide from the model's ops and the GPU.
    """
    from qbench.backends import BACKENDS
    from qbench.backends.onnxruntime import OnnxRuntimeBackend
    from qbench.backends.torch_backend import TorchBackend
    from qbench.variants.torch_forms import torch_form_for

    runtime = BACKENDS.get(backend)
    if issubclass(runtime, OnnxRuntimeBackend):
        return False
    if issubclass(runtime, TorchBackend):
        model_dependent = spec.qat is None and (
            spec.precision == "fp8" or (spec.precision == "int8" and spec.calibrator == "dynamic")
        )
        return model_dependent or isinstance(torch_form_for(spec, None), str)
    return True


def result_problems(
    results: SweepResults,
    recipe: Recipe,
    evaluated: EvaluationRows | None,
    timed_sizes: Sequence[int] | None = None,
) -> list[str]:
    """Every way `results` differ from what a sweep of `recipe` writes.

    evaluated: the evaluation rows and slices re-derived from the recipe and its data (`evaluation_from_data`;
        None when they cannot be: the recipe's named slices are then still required). Their count, the rows
        left out for NaN/inf inputs, and every slice with its size must be the results'.
    timed_sizes: the batch sizes the sweep times every variant at, re-derived from the recipe and its
        model (`timed_batch_sizes`; None when they cannot be: the results' record of them is then
        taken where a sweep of the recipe could have written it).
    """
    specs = _built_specs(recipe)
    reference = recipe.all_variants()[0].name
    timed, problems = _expected_batch_sizes(results, recipe, timed_sizes)
    if results.reference != reference:
        problems.append(f"reference: got {results.reference!r}, the recipe's FP32 reference is {reference!r}")
    if results.evaluation_rows <= 0:
        problems.append(f"evaluation_rows: got {results.evaluation_rows}, expected a positive count")
    if evaluated is not None:
        problems.extend(_evaluated_problems(results, evaluated, keeps=recipe.data.nonfinite_inputs == "keep"))
    expected = set(expected_pairs(recipe))
    seen: set[tuple[str, str]] = set()
    for result in results.variants:
        pair = (result.variant, result.backend)
        if pair in seen:
            problems.append(f"{result.key}: recorded more than once")
        seen.add(pair)
        if pair not in expected:
            problems.append(f"{result.key}: in the results but not asked for by the recipe")
            continue
        problems.extend(f"{result.key}: {p}" for p in _variant_problems(result, specs[result.variant], timed))
    ref_scopes = _reference_scopes(results, reference)
    on_backend = _reference_by_backend(results, reference)
    undefined = _undefined_scopes(results, reference, recipe.gate.gated_metrics)
    named = [s.name for s in recipe.data.slices if s.name is not None]
    wanted = evaluated.slice_sizes if evaluated is not None else None
    first = recipe.backends[0]
    for result in results.variants:
        if (result.variant, result.backend) in expected and result.status == "ok" and result.accuracy is not None:
            # FP32 on a later backend records its drops against the first backend's FP32 (evidence 'fp32_drops')
            later_fp32 = result.variant == reference and result.backend != first and "fp32_drops" in results.evidence
            problems.extend(
                f"{result.key}: {p}"
                for p in _accuracy_problems(result.accuracy, results, recipe, wanted, named, ref_scopes,
                                            on_backend.get(result.backend, {}), undefined.get(result.backend, set()),
                                            on_backend.get(first, {}) if later_fp32 else None)  # fmt: skip
            )
    return problems


def _variant_problems(result: VariantResult, spec: VariantSpec, timed: Sequence[int]) -> list[str]:
    if result.status not in STATUSES:
        return [f"status {expected_one_of(result.status, STATUSES)}"]
    problems: list[str] = []
    if result.precision != spec.precision:
        problems.append(f"precision: got {result.precision!r}, the recipe builds {spec.precision!r}")
    if result.status == "skipped" and not skip_possible(result.backend, spec):
        problems.append(
            f"status 'skipped', but {result.backend} runs every {spec.precision} variant of this kind "
            "(qbench never skips it there)"
        )
    if result.status != "ok":
        if not result.error:
            problems.append(f"status {result.status!r} without the reason (error)")
        if result.accuracy is not None:
            problems.append(f"status {result.status!r} but accuracy recorded")
        return problems
    if result.accuracy is None or result.latency is None:
        problems.append(f"status 'ok' without {'accuracy' if result.accuracy is None else 'latency'}")
    if result.error is not None:
        problems.append("status 'ok' with an error recorded")
    if result.model_bytes is None or result.model_bytes <= 0:
        problems.append(f"model_bytes: got {result.model_bytes!r}, expected the model's positive size")
    if result.latency is not None:
        for point in result.latency.points:
            figures = (point.p50_ms, point.p95_ms, point.p99_ms, point.mean_ms)
            if not all(isinstance(f, (int, float)) and math.isfinite(f) and f >= 0 for f in figures):
                problems.append(f"latency at batch {point.batch_size}: expected finite, non-negative times")
        problems.extend(_latency_point_problems(result.latency, timed))
    return problems


# -- batch sizes timed ----------------------------------------------------------------------------


def timed_batch_sizes(recipe: Recipe, measured: MeasuredModel | None = None) -> list[int] | None:
    """The batch sizes a sweep of `recipe` times every variant at, re-derived from the recipe and its model
    (`measured`, read here when not given): the recipe's latency.batch_sizes, or the model's batch alone when its
    inputs fix one (the sweep substitutes it for those the recipe leaves out: qbench.preflight.checks.with_fixed_batch).
    A PyTorch source is exported with a dynamic batch axis. None where the model cannot be read."""
    from qbench.preflight.checks import fixed_batch

    if recipe.model_path is None:
        return list(recipe.latency.batch_sizes)
    model = measured if measured is not None else read_measured_model(recipe)
    if model.signature is None:
        return None
    batch = fixed_batch(recipe, model.signature)
    return [batch] if batch is not None else list(recipe.latency.batch_sizes)


def _expected_batch_sizes(
    results: SweepResults, recipe: Recipe, derived: Sequence[int] | None
) -> tuple[list[int], list[str]]:
    """(the batch sizes every usable variant has one latency point at, problems with the results' record of them).

    The results record the batch sizes the sweep timed (recipe.latency.batch_sizes; the SLO gate judges by it).
    `derived` (`timed_batch_sizes`) decides when given; without it, the record is taken where a sweep of the
    recipe could have written it: the recipe's own batch sizes or, when the recipe leaves them out, one batch
    (a model with a fixed batch)."""
    latency = results.recipe.get("latency")
    recorded = latency.get("batch_sizes") if isinstance(latency, Mapping) else None
    asked = list(recipe.latency.batch_sizes)
    if derived is not None:
        expected, what = list(derived), _batch_sizes(derived)
    elif "batch_sizes" in recipe.latency.model_fields_set:
        expected, what = asked, _batch_sizes(asked)
    elif _one_batch_size(recorded):
        return list(recorded), []
    else:
        expected, what = asked, f"{_batch_sizes(asked)} (or, for a model with a fixed batch, that batch alone)"
    if recorded == expected:
        return expected, []
    return expected, [f"recipe.latency.batch_sizes: the results record {recorded!r}, but a sweep of the recipe "
                      f"times {what}"]  # fmt: skip


def _one_batch_size(value: object) -> bool:
    return isinstance(value, list) and len(value) == 1 and type(value[0]) is int and value[0] > 0


def _latency_point_problems(latency: LatencyResult, timed: Sequence[int]) -> list[str]:
    """One latency point per batch size the sweep times, and none at another."""
    sizes = [point.batch_size for point in latency.points]
    distinct = [size for i, size in enumerate(sizes) if size not in sizes[:i]]
    problems = [f"latency: {sizes.count(size)} points at {_batch_sizes([size])}, expected one per batch size"
                for size in distinct if sizes.count(size) > 1]  # fmt: skip
    written = [size for size in sizes if type(size) is int]  # an edited "8" or 8.0 is no batch size qbench writes
    missing = [size for size in timed if size not in written]
    if missing:
        problems.append(f"latency: no point at {_batch_sizes(missing)}; the sweep times {_batch_sizes(timed)}")
    extra = [size for size in distinct if type(size) is not int or size not in timed]
    if extra:
        problems.append(f"latency: a point at {_batch_sizes(extra)}, which the sweep does not time "
                        f"(it times {_batch_sizes(timed)})")  # fmt: skip
    return problems


def _batch_sizes(sizes: Sequence[object]) -> str:
    """'batch size 8', 'batch sizes 1, 32' (a size qbench would not write shows as written: '8')."""
    listed = ", ".join(str(size) if type(size) is int else repr(size) for size in sizes)
    return f"batch size{'s' if len(sizes) > 1 else ''} {listed}"


def _reference_scopes(results: SweepResults, reference: str) -> dict[str, SliceMetrics] | None:
    """The scopes (overall, each slice) of the first usable FP32 result: every variant evaluates the same rows."""
    for result in results.variants:
        if result.variant == reference and result.status == "ok" and result.accuracy is not None:
            return {s.name: s for s in (result.accuracy.overall, *result.accuracy.slices)}
    return None


def _reference_by_backend(results: SweepResults, reference: str) -> dict[str, dict[str, SliceMetrics]]:
    """Backend -> scope name ("overall" and each slice) -> FP32's scope on that backend: the reference each of its
    variants is compared with (its NaN/inf rows, the figures its drops are taken from)."""
    return {result.backend: {scope.name: scope for scope in (result.accuracy.overall, *result.accuracy.slices)}
            for result in results.variants
            if result.variant == reference and result.status == "ok" and result.accuracy is not None}  # fmt: skip


def _undefined_scopes(results: SweepResults, reference: str, metrics: Sequence[str]) -> dict[str, set[tuple[str, str]]]:
    """Backend -> (metric, scope) of each gated metric and scope where it is NaN/inf for every usable result on it,
    FP32 included, and FP32 gives no NaN/inf output: the data leaves it undefined there (R² of a constant target, a
    one-row slice), which is no sign of an edited file (the gate skips such a slice). A NaN only some results have
    stays unexplained."""
    undefined: dict[str, set[tuple[str, str]]] = {}
    for fp32 in results.variants:
        if fp32.variant != reference or fp32.status != "ok" or fp32.accuracy is None:
            continue
        usable = [r.accuracy for r in results.variants
                  if r.backend == fp32.backend and r.status == "ok" and r.accuracy is not None]  # fmt: skip
        undefined[fp32.backend] = {
            (metric, scope.name) for metric in metrics for scope in (fp32.accuracy.overall, *fp32.accuracy.slices)
            if scope.nonfinite_outputs == 0
            and all(not math.isfinite(_metric_of(a, scope.name, metric)) for a in usable)
        }  # fmt: skip
    return undefined


def _metric_of(accuracy: AccuracyResult, scope: str, metric: str) -> float:
    found = accuracy.overall if scope == "overall" else accuracy.slice(scope)
    value = found.metrics.get(metric) if found is not None else None
    return value if isinstance(value, (int, float)) else math.nan


def _accuracy_problems(
    accuracy: AccuracyResult,
    results: SweepResults,
    recipe: Recipe,
    wanted: dict[str, int] | None,
    named: Sequence[str],
    ref_scopes: dict[str, SliceMetrics] | None,
    on_backend: Mapping[str, SliceMetrics],
    undefined: set[tuple[str, str]],
    drops_from: Mapping[str, SliceMetrics] | None = None,
) -> list[str]:
    """What is wrong with one result's accuracy; `on_backend`: FP32's scopes on its backend, `drops_from` those its
    drops are taken against where they are another FP32's (default: `on_backend`)."""
    problems: list[str] = []
    rows = accuracy.rows
    if rows != results.evaluation_rows or accuracy.overall.size != rows:
        problems.append(
            f"accuracy.rows {rows} / overall size {accuracy.overall.size} differ from evaluation_rows "
            f"{results.evaluation_rows}"
        )
    if not 0 <= accuracy.nonfinite_outputs <= rows or accuracy.overall.nonfinite_outputs != accuracy.nonfinite_outputs:
        problems.append(f"nonfinite_outputs: got {accuracy.nonfinite_outputs}, expected 0..{rows} (= overall's)")
    have = {s.name: s for s in accuracy.slices}
    if len(have) != len(accuracy.slices):
        problems.append("a slice is recorded more than once")
    required = list(wanted) if wanted is not None else list(named)
    problems.extend(f"slice {name!r} missing (the recipe defines it)" for name in required if name not in have)
    if wanted is not None:
        problems.extend(f"slice {name!r} is not one the recipe defines" for name in have if name not in wanted)
    elif ref_scopes is not None:  # the data gone: every result is measured on the same rows, so has the same slices
        same_rows = "every result is measured on the same rows"
        problems.extend(f"slice {name!r} missing (FP32's first result has it: {same_rows})"
                        for name in ref_scopes if name not in (*have, "overall", *required))  # fmt: skip
        problems.extend(f"slice {name!r} is not one FP32's first result has ({same_rows})"
                        for name in have if name not in ref_scopes)  # fmt: skip
    for scope in (accuracy.overall, *accuracy.slices):
        fp32 = on_backend.get(scope.name)
        problems.extend(_scope_problems(scope, rows, recipe.gate.gated_metrics, recipe.gate.min_slice_size,
                                        0 if fp32 is None else fp32.nonfinite_outputs,
                                        {metric for metric, name in undefined if name == scope.name}))  # fmt: skip
        problems.extend(_denominator_problems(scope, None if ref_scopes is None else ref_scopes.get(scope.name)))
        problems.extend(_drop_problems(scope, fp32 if drops_from is None else drops_from.get(scope.name)))
        if scope is accuracy.overall:
            continue
        if wanted is not None and scope.name in wanted and scope.size != wanted[scope.name]:
            problems.append(f"slice {scope.name!r}: size {scope.size}, the data gives it {wanted[scope.name]} rows")
        if ref_scopes is not None and scope.name in ref_scopes and ref_scopes[scope.name].size != scope.size:
            problems.append(f"slice {scope.name!r}: size {scope.size}, FP32's is {ref_scopes[scope.name].size} "
                            "(same rows)")  # fmt: skip
    return problems


def _scope_problems(scope: SliceMetrics, rows: int, metrics: Sequence[str], min_slice_size: int,
                    reference_nonfinite: int, undefined: set[str]) -> list[str]:  # fmt: skip
    """A NaN gated metric (of `metrics`) is explained by non-finite outputs (the variant's, or FP32's it is compared
    with), by a slice too small to judge, or by the data (`undefined`: the metrics NaN for every result on this
    scope, see _undefined_scopes)."""
    where = "overall" if scope.name == "overall" else f"slice {scope.name!r}"
    problems: list[str] = []
    if not 0 < scope.size <= rows:
        problems.append(f"{where}: size {scope.size}, expected 1..{rows}")
    if not 0 <= scope.nonfinite_outputs <= max(scope.size, 0):
        problems.append(f"{where}: nonfinite_outputs {scope.nonfinite_outputs}, expected 0..{scope.size}")
    if not 0 <= scope.new_nonfinite_outputs <= max(scope.nonfinite_outputs, 0):
        problems.append(f"{where}: new_nonfinite_outputs {scope.new_nonfinite_outputs}, "
                        f"expected 0..{scope.nonfinite_outputs}")  # fmt: skip
    for name, each in scope.metrics.items():
        info = METRICS.get(name)
        numeric = isinstance(each, (int, float)) and not isinstance(each, bool)
        count, unit = (scope.denominators[name], "scored items") if name in scope.denominators else (scope.size, "rows")
        why = impossible_value(info, each, count, unit) if numeric and info is not None and not info.custom else None
        if why is not None:
            problems.append(f"{where}: metric {name!r} is {each!r}, {why}")
    problems.extend(f"{where}: metric {name!r} is recorded as raised ({why}) yet has the figure "
                    f"{scope.metrics.get(name)!r}"
                    for name, why in scope.raised.items() if not _nan(scope.metrics.get(name)))  # fmt: skip
    for metric in metrics:
        value = scope.metrics.get(metric)
        explained = (scope.nonfinite_outputs > 0 or reference_nonfinite > 0 or metric in undefined
                     or metric in scope.raised)  # fmt: skip
        if value is None:
            problems.append(f"{where}: metric {metric!r} missing")
        elif not math.isfinite(value) and not explained and scope.judged_count(metric) >= min_slice_size:
            problems.append(f"{where}: metric {metric!r} is NaN/inf with no non-finite outputs to explain it")
    return problems


def _nan(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isnan(value)


def _denominator_problems(scope: SliceMetrics, reference: SliceMetrics | None) -> list[str]:
    """A metric resting on other units than the scope's rows (a token-classification output's scored tokens) names a
    metric of the scope and a whole count; FP32's same scope counts over the same units (same rows, same labels), so
    a count edited to let an impossible rate pass shows against it."""
    where = "overall" if scope.name == "overall" else f"slice {scope.name!r}"
    problems = []
    for name, count in scope.denominators.items():
        info = METRICS.get(name)
        if name not in scope.metrics or info is None:
            problems.append(f"{where}: denominators name {name!r}, not a metric of this scope")
        elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
            problems.append(f"{where}: denominator of {name!r} is {count!r}, expected a count >= 0")
    if reference is not None and scope.denominators != reference.denominators:
        problems.append(f"{where}: rates counted over {scope.denominators or 'its rows'}, FP32's over "
                        f"{reference.denominators or 'its rows'} (same rows and labels)")  # fmt: skip
    return problems


def _drop_problems(scope: SliceMetrics, fp32: SliceMetrics | None) -> list[str]:
    """Each drop a scope records is the one the sweep took between its figure and FP32's on the same backend
    (qbench.validate.accuracy.with_drops), for every metric of the catalogue both hold. The verdict is taken from
    the two figures, so a drop that disagrees with them shows that one side was edited (FP32's accuracy lowered to
    the variant's: every drop then reads 0 and the variant would pass); a recipe's own metrics are left to the
    figures alone (their directions are scoped to the run judging them)."""
    if fp32 is None:
        return []
    where = "overall" if scope.name == "overall" else f"slice {scope.name!r}"
    problems = []
    for name in sorted(set(scope.metrics) & set(fp32.metrics) | set(scope.drops)):
        info = METRICS.get(name)
        if info is None or info.custom:
            continue
        if name not in scope.metrics or name not in fp32.metrics:
            problems.append(f"{where}: a drop of {name!r} is recorded, but not both figures it is a drop between")
            continue
        own, reference = scope.metrics[name], fp32.metrics[name]
        expected, recorded = drop(name, reference, own), scope.drops.get(name)
        if recorded is None:
            problems.append(f"{where}: no drop of {name!r} is recorded beside both figures")
        elif not _same_drop(recorded, expected, own, reference):
            problems.append(f"{where}: drop of {name!r} recorded as {recorded!r}, but FP32's figure {reference!r} and "
                            f"this one {own!r} make it {expected!r} (one of them was changed after the "
                            "sweep)")  # fmt: skip
    return problems


def _same_drop(recorded: float, expected: float, *figures: float) -> bool:
    """Equal up to float rounding; results write NaN and inf alike as null, so any two non-finite drops agree."""
    if not (math.isfinite(recorded) and math.isfinite(expected)):
        return not math.isfinite(recorded) and not math.isfinite(expected)
    return within(abs(recorded - expected), 0.0, *figures)


def evaluation_from_data(recipe: Recipe, measured: MeasuredModel | None = None) -> EvaluationRows:
    """The evaluation rows and slices a sweep of `recipe` derives from its data (qbench.data.evaluation_rows,
    the sweep's own derivation: evaluation filter, NaN/inf input policy, limit, slices over those rows). `measured`: the
    model the sweep measured (an ONNX source's file, a PyTorch source's export: gate.fresh.read_measured_model), read
    here when not given."""
    from qbench.data import evaluation_rows, load_data_table
    from qbench.data.content import numeric_dtypes
    from qbench.preflight.checks import unread_inputs
    from qbench.tasks import get_task

    model = measured if measured is not None else read_measured_model(recipe)
    # the model's string inputs keep a CSV's text as the sweep read it ("007" is no NaN/inf check's number); a
    # PyTorch source's inputs are tensors of numbers, and a model gone (--no-staleness-check) states none
    model_inputs = model.signature.inputs if model.signature is not None else None
    # a PyTorch source's export takes each input as model.input_dtypes states it (float32 by default); where the export
    # is gone, every input counts as read
    fed_as = numeric_dtypes({name: recipe.model.input_dtype(name) for name in recipe.model.example_inputs or {}})
    unread = {}
    if model.path is not None:
        unread = unread_inputs(model.path)  # the inputs the sweep's digests leave out, as it found them
        fed_as = numeric_dtypes(model_inputs or {})  # and the types they were fed as
    table = load_data_table(recipe.data_path, recipe.data, label_names=get_task(recipe.task).labels_name_classes,
                            recipe_file=recipe.source, model_inputs=model_inputs)  # fmt: skip
    return evaluation_rows(table, recipe.data, recipe_file=recipe.source, calibrated=recipe.fits_on_calibration_rows,
                           unread=unread, dtypes=fed_as)  # fmt: skip


def _evaluated_problems(results: SweepResults, evaluated: EvaluationRows, *, keeps: bool) -> list[str]:
    """The results' count of evaluation rows, and of those left out (or, as the recipe `keeps` them, fed) for NaN/inf
    inputs, against the data's."""
    problems = []
    if results.evaluation_rows != len(evaluated.rows):
        problems.append(f"evaluation_rows: got {results.evaluation_rows}, the data gives {len(evaluated.rows)} rows")
    dropped = results.dropped_nonfinite
    recorded = dropped.get("evaluation", {}) if isinstance(dropped, Mapping) else None
    if recorded != evaluated.dropped:
        problems.append(f"dropped_nonfinite.evaluation: got {recorded!r}, the data gives {evaluated.dropped!r} "
                        "(rows left out for NaN/inf inputs)")  # fmt: skip
    if not results.distinct_inputs and evaluated.distinct_inputs:  # a file from before the count, or edited
        problems.append(f"distinct_inputs: the results record none, the data gives {evaluated.distinct_inputs!r} "
                        "(scopes whose rows repeat inputs): results from a qbench that counted copies of an input as "
                        "evidence, or edited; re-run `qbench sweep`")  # fmt: skip
    elif results.distinct_inputs != evaluated.distinct_inputs:
        problems.append(f"distinct_inputs: got {results.distinct_inputs!r}, the data gives "
                        f"{evaluated.distinct_inputs!r} (distinct inputs of the scopes whose rows repeat "
                        "some)")  # fmt: skip
    from qbench.data.nonfinite import drop_nonfinite  # the data was read: pandas is loaded already

    fed = drop_nonfinite(evaluated.rows, evaluated.nonfinite)[1] if keeps else {}
    recorded = results.kept_nonfinite.get("evaluation", {}) if isinstance(results.kept_nonfinite, Mapping) else None
    if recorded != fed:
        problems.append(f"kept_nonfinite.evaluation: got {recorded!r}, the data gives {fed!r} "
                        "(rows fed with NaN/inf inputs)")  # fmt: skip
    return problems
