"""`qbench gate` on a recipe's results: which results file, whether it is what the recipe asked for, intact and
fresh, then the verdict (qbench.gate.evaluate.evaluate_gate, which judges figures alone).

Fails closed: the newest run incomplete, results another recipe's, stale inputs or slices the data no longer gives
are problems (exit 2), never a fall back to older results or a pass on what the file claims.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import QbenchError, RecipeError
from qbench.gate.checks import (
    evaluation_from_data,
    expected_pairs,
    result_problems,
    timed_batch_sizes,
)
from qbench.gate.evaluate import GateReport, evaluate_gate, withheld
from qbench.gate.fresh import (
    MeasuredModel,
    another_recipe_file,
    changed_fields,
    changed_models,
    edited_recipe_file,
    measured_export,
    read_measured_model,
    stale_inputs,
    stale_sections,
)
from qbench.pricing import repriced
from qbench.provenance import recorded_recipe
from qbench.recipe.spec import Recipe
from qbench.results.schema import SweepResults, read_results
from qbench.runs import RESULTS_FILE, newest_run, of_another_checkout, run_folders, where_now

if TYPE_CHECKING:
    from qbench.data.evaluation import EvaluationRows


def latest_results(recipe: Recipe) -> Path:
    """The results.json of the recipe's newest run under <output_dir>/<name>/, by the times recorded in the runs.

    Fails closed: when the newest run is incomplete (interrupted, crashed or still running), that is an
    error naming it, never a silent fall back to an older complete run. Runs written there by another checkout of
    the recipe still on this machine (sharing the folder: two CI jobs at once) are that checkout's: judged, they were
    stale against this checkout's inputs, or passed on them.
    """
    root = recipe.output_path / recipe.name
    runs = run_folders(root)
    own = [run for run in runs if not of_another_checkout(run, recipe.source)]
    run = newest_run(own)
    if run is None and runs:
        others = sorted({str(r.written_by) for r in runs})
        raise QbenchError(
            f"no results of {recipe.source} under {root}: the runs there were swept by other checkouts of the recipe "
            f"on this machine writing to the same folder ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
            f"): run `qbench sweep {recipe.source}` first, or judge one of those runs with --results FILE"
        )
    if run is None:
        blocking = next((path for path in (root, *root.parents) if path.exists()), root)
        if not blocking.is_dir():  # no sweep could write there: running one first would not help
            raise RecipeError(recipe.source, "output_dir", f"{blocking} (in the path of {root}) is a file; "
                                                           "expected the folder the sweep writes its run folders "
                                                           "in")  # fmt: skip
        raise QbenchError(f"no results for recipe {recipe.name!r} under {root}: run `qbench sweep {recipe.source}` "
                          "first")  # fmt: skip
    if not run.complete:
        what = ("wait for it to finish" if run.state == "running" else
                f"finish it with `qbench sweep {recipe.source} --resume` (or re-run without --resume)")  # fmt: skip
        raise QbenchError(
            f"the newest run of recipe {recipe.name!r}, {run.path}, is incomplete ({run.state}): "
            f"{what}, or judge an older run with --results FILE"
        )
    return run.path / RESULTS_FILE


def run_gate(
    recipe: Recipe | None = None,
    results_path: Path | None = None,
    *,
    check_staleness: bool = True,
    unchecked_because: str = "--no-staleness-check",
) -> tuple[GateReport, SweepResults]:
    """Library entry point of `qbench gate`: read results (latest of the recipe, or a file) and judge them.

    What was asked for (variants, backends, reference, slices) and the gate settings come from
    `recipe`, or without one from the recipe embedded in the results (checked against its digest).
    The results must be intact (their digest), complete, consistent with qbench's own rules and
    fresh: every input (model, weights, factory source, data, tokenizer) hashed as at sweep time.
    check_staleness=False judges results whose inputs can no longer be read; the report notes it, giving
    `unchecked_because` as the reason (the flag that asked for it, or the command that never checks). Either way the
    evaluation rows and slices are re-derived from the recipe's data whenever it can be read (a note says when
    it cannot), so results can never drop a slice the data makes.
    """
    if recipe is None and results_path is None:
        raise QbenchError("qbench gate needs a recipe or --results FILE")
    path = results_path if results_path is not None else latest_results(recipe)
    results = located(read_results(path), path)
    try:
        recorded = recorded_recipe(results.recipe, path)
    except QbenchError as exc:  # intact but unjudgeable results: `qbench report` still shows them
        return GateReport(metric=results.gate_metric, problems=(str(exc),)), results
    asked = recipe if recipe is not None else recorded
    results = repriced(results, asked.cost)  # costs from the prices now asked, never from figures read back
    problems = stale_sections(recipe, recorded) if recipe is not None else []
    if recipe is not None and (recipe.name != recorded.name or another_recipe_file(recipe, recorded)):
        # another recipe's results: comparing its inputs with this recipe's says nothing
        return GateReport(metric=results.gate_metric, problems=tuple(problems)), results
    notes: list[str] = edited_recipe_file(recorded, path) if recipe is None else []
    if check_staleness:
        stale, missing = stale_inputs(results, asked)
        problems += stale
        problems += [f"cannot check the results for staleness: {m} is gone; pass --no-staleness-check "
                     "to judge them anyway" for m in missing]  # fmt: skip
    else:
        notes.append(f"inputs not checked for staleness ({unchecked_because})")
    fresh = check_staleness and not problems  # the recipe's inputs are the sweep's: what it did can be re-derived
    evaluated, measured = None, None
    if not problems:  # stale results are unusable already: what changed data gives says nothing more
        export = measured_export(results, asked)
        measured = read_measured_model(asked, export)  # once, for the slices' input types and the batch sizes timed
        evaluated, cannot = _evaluation_from_data(asked, measured)
        problems += cannot
        if (asked.model.torch and export is None and evaluated is not None
                and evaluated.distinct_inputs != results.distinct_inputs):  # fmt: skip
            notes.append("distinct inputs re-derived without the ONNX export the sweep measured (gone: another "
                         "machine, or $QBENCH_CACHE_DIR cleared): each input counted by its values as "
                         "model.input_dtypes types it, where the sweep left out those forward() never reads; "
                         "gate where it swept")  # fmt: skip
        if evaluated is None and not cannot:
            notes.append(f"slices not re-derived: the data file {asked.data_path} is gone (only the recipe's named "
                         "slices are required, at the sizes the results record)")  # fmt: skip
    timed = timed_batch_sizes(asked, measured) if fresh else None  # a model with a fixed batch is timed at it alone
    problems += result_problems(results, asked, evaluated, timed)
    problems += changed_models(results)
    report = evaluate_gate(results, asked.gate, expected=expected_pairs(asked), slo=asked.slo)
    report = withheld(replace(report, problems=(*problems, *report.problems)))
    if recipe is not None and not report.problems:
        notes += gate_changed_since_the_sweep(report, results, asked, recorded)
    return replace(report, notes=(*notes, *report.notes)), results


def located(results: SweepResults, results_file: Path) -> SweepResults:
    """`results` with each model file the sweep wrote into its run folder named where it is now, beside
    `results_file` (qbench.runs.where_now): the gate's check that it is still the model measured, the export and
    `qbench track` then read the run folder as it was handed over (moved, downloaded elsewhere), not a path of the
    machine that swept it, where the file is gone and an edited copy went unchecked."""
    def moved(path: str | None) -> str | None:
        return None if path is None else where_now(path, results_file.resolve().parent)

    variants = tuple(replace(v, model_path=moved(v.model_path), evaluated_model_path=moved(v.evaluated_model_path))
                     for v in results.variants)  # fmt: skip
    return replace(results, variants=variants)


def gate_changed_since_the_sweep(
    report: GateReport, results: SweepResults, asked: Recipe, recorded: Recipe
) -> list[str]:
    """A note where the recipe's gate or slo is not the one the results were swept with: the gate judges by the
    recipe's (a tolerance tightened since is applied), and the note names each field changed and every variant the
    sweep's own gate and slo (on the same prices) block that this one passes or no longer judges. Before, a tolerance
    loosened after a breach (or a variant taken out of gate.applies_to) turned the stored exit 1 into exit 0 with
    nothing said. The prices are left out: `--price` changes the recipe a sweep records, not the file."""
    changes = changed_fields(asked, recorded, ("gate", "slo"))
    if not changes:
        return []
    before = evaluate_gate(results, recorded.gate, expected=expected_pairs(asked), slo=recorded.slo)
    pairs = dict.fromkeys((v.variant, v.backend) for v in results.variants)
    let_through = [f"{variant}@{backend}" for variant, backend in pairs
                   if before.status_of(variant, backend) == "fail" and report.status_of(variant, backend) != "fail"]
    said = (f": the gate the results were swept with blocks {', '.join(let_through)}, which this one "
            "passes or does not judge") if let_through else ""
    return [f"judged by the recipe's {', '.join(changes)}, changed since the sweep{said}"]


def _evaluation_from_data(recipe: Recipe, measured: MeasuredModel) -> tuple[EvaluationRows | None, list[str]]:
    """The evaluation rows and slices the sweep derived, re-derived from the recipe's data (the same derivation, with
    the model it `measured`: a PyTorch source's export where it is still there, gate_fresh.measured_export; so the gate
    requires exactly the slices a sweep writes), with the problem that stops it if any. None without a problem: the
    data file is gone (only with --no-staleness-check does the gate get this far without it)."""
    if not recipe.data_path.exists():
        return None, []
    try:
        return evaluation_from_data(recipe, measured), []
    except QbenchError as exc:
        return None, [f"the slices cannot be re-derived from the data: {exc}"]
