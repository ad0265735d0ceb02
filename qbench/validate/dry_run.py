"""The dry run: the FP32 reference scored on a few evaluation rows at the largest batch the sweep feeds it, through
`measure` as the sweep scores it, so `qbench validate` and `qbench sweep` refuse a model that cannot be run or scored
before any variant is built."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qbench.backends import Backend
from qbench.errors import QbenchError, RecipeError
from qbench.preflight.checks import check_masked_outputs, check_output_memory
from qbench.preflight.prepare import Prepared
from qbench.preflight.rows import batches_a_graph_may_fix, one_row_only, runs_batch
from qbench.tasks import get_task
from qbench.validate.measure import Rows, measure
from qbench.variants import BuiltVariant

DRY_RUN_ROWS = 8


def dry_run(prepared: Prepared, backend: Backend, rows: int = DRY_RUN_ROWS) -> None:
    """Load the FP32 reference, run one row, and score the first `rows` evaluation rows as the sweep will, in batches of
    the largest size the sweep runs it at (`largest_batch`; the rows repeated to fill one such batch where it is
    larger); raises a QbenchError naming the model, the backend and the batch that failed when it cannot (a graph
    ONNX Runtime refuses, a shape written for batch 1 that fails at 16, outputs the task cannot score), so
    `qbench validate`, and `qbench sweep` before it builds anything, catch what would otherwise fail only once the
    variants are built. Its cost is one load and at most max(rows, that batch) rows, whatever the data's size. Every
    evaluation label is checked against the classes these outputs show where the graph does not size them (a
    RecipeError)."""
    everything = Rows.evaluation(prepared)
    count = min(rows, everything.count)
    size, field = largest_batch(prepared)
    picks = np.arange(max(size, count)) % count if count else np.arange(0)
    built = BuiltVariant("fp32", "fp32", prepared.source.onnx_path)
    try:
        measured = measure(backend, built, prepared, rows=replace(everything.subset(picks), batch_size=size),
                           quiet=True)  # fmt: skip
    except RecipeError:
        raise
    except QbenchError as exc:
        raise QbenchError(f"{prepared.source.onnx_path}: the FP32 reference cannot be scored: {exc}") from None
    result = measured.result
    if measured.metric_error is not None:  # the recipe's code failed, not the model: name the metric, not the model
        specs = prepared.recipe.metrics
        index = next((i for i, spec in enumerate(specs) if spec.name == measured.metric_error.metric), None)
        raise RecipeError(prepared.recipe.source, "metrics" if index is None else f"metrics[{index}].function",
                          f"{measured.metric_error} on FP32's outputs ({count} evaluation rows"
                          f"{f' repeated to one batch of {size}' if size > count else ''}); expected a function that "
                          "returns a number for the outputs and labels it is given "
                          "(docs/recipe-reference.md: Custom metrics)")
    if result.status == "failed":
        raise QbenchError(f"{prepared.source.onnx_path}: the FP32 reference does not run on {backend.name}: "
                          f"{' '.join(str(result.error).split())} (the check fed it one row, then {count} evaluation "
                          f"rows {'repeated to one batch' if size > count else 'in batches'} of {size}, the largest "
                          f"the sweep runs: {field}); "
                          f"{_expected(prepared, backend, built, everything, size)}")  # fmt: skip
    if measured.outputs:
        judge = get_task(prepared.recipe.task)
        check_masked_outputs(prepared.recipe, measured.outputs,
                             result.accuracy.nonfinite_outputs if result.accuracy is not None else 0,
                             [name for name, values in measured.outputs.items() if judge.masks_with_neginf(values)])
        check_output_memory(prepared.recipe, measured.outputs, everything.count)


def _expected(prepared: Prepared, backend: Backend, built: BuiltVariant, rows: Rows, size: int) -> str:
    """What the dry run's refusal of a reference with a dynamic batch expects, by which batches it runs: none, a single
    row failing too (an op the runtime refuses whatever the batch, such as ONNX Runtime 1.32's opset-23 `Attention`
    with a mask broadcast over the query axis: no batch-size setting helps, so none is suggested); one row but not two
    (preflight_rows.one_row_only says why: the fields to set to 1); else every batch size."""
    general = "expected a model that runs every batch size the recipe asks for"
    if prepared.batch is not None or not rows.count:
        return general

    def runs(rows_fed: int) -> bool:
        fed = replace(rows.subset(np.arange(rows_fed) % rows.count), batch_size=rows_fed)
        try:
            return measure(backend, built, prepared, rows=fed, quiet=True).result.status != "failed"
        except QbenchError:  # a RecipeError included: the hint is not worth another error
            return False

    if not runs(1):
        tried = batches_a_graph_may_fix(prepared.recipe, prepared.source.onnx_path, size)
        fixed = next((batch for batch in tried if runs_batch(backend, built, rows.feeds, rows.count, batch)), None)
        if fixed is not None:
            return (f"{general}; it fails on a single row but runs a batch of {fixed}, so its graph fixes a batch of "
                    f"{fixed} its inputs do not declare (a Reshape to a constant [{fixed}, ...]): export it with a "
                    f"dynamic batch, or with its inputs' batch dimension fixed to {fixed}, which qbench runs as a "
                    "fixed batch (docs/recipe-reference.md: A model with a fixed batch)")
        return (f"expected a model {backend.name} runs: it fails on a single row too, so no batch-size setting would "
                "help; the runtime's reason names the node it stops at")
    if size > 1 and not runs(2):
        why, instead = one_row_only(prepared.model)
        return (f"{general}; it runs one row but not two, {why}: set latency.batch_sizes: [1], "
                f"data.evaluation.batch_size: 1 and data.calibration.batch_size: 1, {instead}")
    return general


def largest_batch(prepared: Prepared) -> tuple[int, str]:
    """The largest batch the sweep feeds the FP32 reference, and the field that sets it: the model's fixed batch, else
    the larger of the timed batch sizes and the evaluation batches (data.evaluation.batch_size, or every row where
    there are fewer; the range analysis runs those too)."""
    if prepared.batch is not None:
        return prepared.batch, f"the model's fixed batch of {prepared.batch}"
    recipe = prepared.recipe
    sizes = [(max(recipe.latency.batch_sizes), f"latency.batch_sizes {list(recipe.latency.batch_sizes)}"),
             (min(recipe.data.evaluation.batch_size, len(prepared.evaluation_rows)),
              f"data.evaluation.batch_size {recipe.data.evaluation.batch_size} "
              f"over {len(prepared.evaluation_rows)} rows")]
    return max(sizes, key=lambda pair: pair[0])
