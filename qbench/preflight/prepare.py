"""Everything a sweep needs, checked before anything runs.

`prepare` opens the data and the model, checks every name the recipe uses
against them (columns, input and output names, filters that select rows,
backends that can run here), that the model is an FP32 reference
(`qbench.preflight.precision`) whose rows are on axis 0 (`qbench.preflight.rows`),
and returns the arrays the sweep feeds to the variants. `qbench validate` is
exactly this, with nothing built or timed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qbench.backends.onnxruntime import quiet_runtime_log
from qbench.data import (
    NonfiniteMasks,
    build_feeds,
    check_finite,
    evaluation_rows,
    finite_rows,
    limit_notes,
    load_data_table,
    nonfinite_masks,
    per_slice_counts,
    row_ids_sha256,
    training_rows,
)
from qbench.data.content import content_table, numeric_dtypes
from qbench.data.feeds import sequence_ids, text_feed_notes
from qbench.data.labels import label_cells
from qbench.data.leakage import shared_rows, warn_shared
from qbench.data.nonfinite import kept_nonfinite, qat_refuses_nonfinite
from qbench.errors import QbenchError, RecipeError
from qbench.modelinfo.signature import ModelInfo, external_data_files, read_model_info
from qbench.preflight.checks import (
    check_backends,
    check_batch_memory,
    check_destinations,
    check_node_names,
    check_plan,
    check_quantizer_options,
    example_inputs_mismatch,
    fixed_batch,
    unread_inputs,
    warn_unread_inputs,
    with_fixed_batch,
)
from qbench.preflight.labels import read_labels
from qbench.preflight.load import check_reference_loads
from qbench.preflight.lookups import Lookup, check_lookup_indices, constant_lookups
from qbench.preflight.precision import reduced_precision
from qbench.preflight.rows import check_row_independence
from qbench.preflight.samples import Feeds, calibration_feeds, record_dropped
from qbench.provenance import metric_source_input
from qbench.recipe.data import DataSpec
from qbench.recipe.spec import Recipe
from qbench.results.schema import CalibrationRecord
from qbench.selection_rows import (
    SelectionRows,
    chooses_among_candidates,
    selection_rows,
)
from qbench.sources import ModelSource, resolve_model
from qbench.tasks import CustomMetric, Task, get_task
from qbench.tasks.class_scores import named_labels
from qbench.tasks.custom import load_custom_metrics
from qbench.tasks.selection import OutputChoice, choose_outputs
from qbench.variants.base import TrainingData

if TYPE_CHECKING:  # pragma: no cover
    from qbench.execute.snapshot import Snapshot

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Prepared:
    """The recipe's data, resolved into model feeds.

    slices: slice name -> boolean mask over the evaluation rows (in evaluation order).
    """

    recipe: Recipe
    source: ModelSource
    model: ModelInfo
    outputs: tuple[OutputChoice, ...]  # the evaluated outputs (one unless model.outputs names several)
    evaluation_rows: np.ndarray
    evaluation_feeds: Feeds
    labels: np.ndarray | None
    slices: dict[str, np.ndarray]
    calibration_batches: list[Feeds]
    calibration: CalibrationRecord
    calibration_overlap: int  # calibration rows feeding what an evaluation row feeds (overlap flatters INT8)
    training: dict[str, TrainingData]  # variant name -> rows it fine-tunes on (QAT variants only)
    # data.nonfinite_inputs: drop -> {"evaluation" | "calibration": {input column: rows left out}}
    dropped_nonfinite: dict[str, dict[str, int]]
    # data.nonfinite_inputs: keep -> {"evaluation" | "calibration" | "slice:<name>": {input column: rows kept}}
    kept_nonfinite: dict[str, dict[str, int]]
    custom_metrics: tuple[CustomMetric, ...] = ()
    preprocess_ms_per_row: float = float("nan")  # building the evaluation feeds (tokenisation included), per row
    # the model's fixed batch (None: dynamic): every run feeds exactly this many rows (the recipe's batch
    # sizes are set to it; a last batch is filled with repeats of its rows, and what they give is dropped)
    batch: int | None = None
    snapshot: Snapshot | None = None  # the sweep's copies of its input files, which everything here was read from
    selection: SelectionRows | None = None  # where searches choose among candidates (qbench.selection_rows)
    distinct_inputs: dict[str, int] = field(default_factory=dict)  # EvaluationRows.distinct_inputs
    evaluation_digests: np.ndarray | None = None  # EvaluationRows.digests: what each evaluation row feeds the model
    evaluation_sequence_ids: np.ndarray | None = None  # of the evaluation rows (qbench.data.feeds.sequence_ids)

    @property
    def output_name(self) -> str:
        """The first evaluated output (the only one for most recipes)."""
        return self.outputs[0].name

    @property
    def output_index(self) -> int:
        return self.outputs[0].index

    @property
    def output_indices(self) -> dict[str, int]:
        """Evaluated output name -> its index in the model's outputs."""
        return {choice.name: choice.index for choice in self.outputs}

    @property
    def label_tables(self) -> dict[str, tuple[int | str, ...]]:
        """Evaluated string label output -> the class table its values are read as positions of."""
        return {c.name: c.meta.class_keys for c in self.outputs if named_labels(c.meta) and c.meta.class_keys}


def prepare(
    recipe: Recipe, *, track: bool = True, destinations: bool = True, backends: bool = True,
    snapshot: Callable[[], Snapshot] | None = None,
) -> Prepared:  # fmt: skip
    """Check the recipe against its model, data, backends and destinations (the tracking store only when
    `track`); build evaluation, calibration and training feeds.

    A cluster's driver leaves the backends to the nodes that run them (`backends=False`); a worker
    leaves the destinations to the driver too (`destinations=False`). A sweep passes `snapshot`, which
    copies the inputs it hashed (qbench.execute.snapshot), called once the plan and the destinations are
    checked: the model, weights and data are then read from those copies, never from the recipe's paths,
    and a message about them names the user's files."""
    quiet_runtime_log()
    check_plan(recipe)
    if destinations:
        check_destinations(recipe, track=track)
    if backends:
        check_backends(recipe)
    check_quantizer_options(recipe)
    taken = snapshot() if snapshot is not None else None
    try:
        return _prepare(recipe, taken, loads=backends)
    except QbenchError as exc:
        if taken is not None:
            exc.args = (taken.shown(str(exc)),)
        raise


def _prepare(recipe: Recipe, snapshot: Snapshot | None, *, loads: bool, export_refreshed: bool = False) -> Prepared:
    """`loads`: check that every backend loads the reference (a cluster's driver leaves that to its nodes)."""
    source = resolve_model(recipe, snapshot)
    model = _read_model(recipe, source.onnx_path)
    if loads:
        check_reference_loads(recipe, source.onnx_path, _model_field(recipe))
    check_node_names(recipe, source.onnx_path)
    batch = fixed_batch(recipe, model)
    if batch is not None:
        recipe = with_fixed_batch(recipe, batch)
        logger.info("the model has a fixed batch of %d: timed at that batch only; every run feeds %d rows (a last, "
                    "shorter batch is filled with repeats of its rows, whose outputs are dropped)",
                    batch, batch)  # fmt: skip
    task = get_task(recipe.task)
    custom_metrics = load_custom_metrics(recipe)
    if snapshot is not None:  # imported from the user's files: they must still be what the sweep hashed
        for index in range(len(recipe.metrics)):
            snapshot.check_read(metric_source_input(index))
    data = snapshot.data(recipe.data) if snapshot is not None else recipe.data  # tokenizers read from their copies
    table = load_data_table(_read_from(snapshot, "data", recipe.data_path), data,
                            label_names=task.labels_name_classes, recipe_file=recipe.source,
                            model_inputs=model.inputs)  # fmt: skip
    unread = unread_inputs(source.onnx_path)  # of every output: the gate re-derives the digests from the model alone
    fed_as = numeric_dtypes(model.inputs)  # and the types it is fed as, from the model alone too
    evaluation = evaluation_rows(table, data, recipe_file=recipe.source, calibrated=recipe.fits_on_calibration_rows,
                                 unread=unread, dtypes=fed_as)  # fmt: skip
    eval_rows, masks, nonfinite = evaluation.rows, evaluation.masks, evaluation.nonfinite
    for note in limit_notes(table, evaluation, data, label_classes=task.labels_name_classes):
        logger.warning(note)
    dropped: dict[str, dict[str, int]] = {}
    record_dropped(dropped, "evaluation", evaluation.dropped, evaluation.left_out)
    if evaluation.held_out:
        logger.warning("%d evaluation rows are calibration rows and are held out (data.calibration.overlap: "
                       "hold_out; at most half of the calibration candidates are drawn where they are evaluation "
                       "rows too): %d rows evaluated", evaluation.held_out, len(evaluation.rows))  # fmt: skip
    eval_slices = evaluation.slices
    outputs = _pick_outputs(recipe, task, model, label_cells(table, recipe.data, eval_rows, recipe_file=recipe.source))
    for note in filter(None, (choice.meta.declaration_note() for choice in outputs)):
        logger.warning(note)
    _check_gate_metric(recipe, task, outputs)
    warn_unread_inputs(recipe, source.onnx_path, [c.name for c in outputs])
    labels = read_labels(recipe, task, table, eval_rows, outputs)
    started = time.perf_counter()
    try:
        eval_feeds = build_feeds(table, eval_rows, data.inputs, model.inputs, recipe_file=recipe.source,
                                 defaulted=model.defaulted)
    except RecipeError as exc:
        mismatch = (source.torch and exc.field == "data.inputs"
                    and example_inputs_mismatch(recipe, source.torch.input_shapes, table, eval_rows))  # fmt: skip
        if mismatch:
            raise mismatch from None
        raise
    preprocess_ms_per_row = (time.perf_counter() - started) * 1000 / max(len(eval_rows), 1)
    for level, note in text_feed_notes(table, eval_rows, data.inputs, model.inputs, recipe_file=recipe.source):
        logger.log(level, note)
    check_batch_memory(recipe, eval_feeds)
    lookups = constant_lookups(source.onnx_path)
    check_lookup_indices(recipe, lookups, eval_feeds, eval_rows, "evaluation")
    if source.torch is not None and _check_export_on_rows(recipe, source, eval_feeds, refresh=not export_refreshed):
        # a stale export was replaced: read the new one
        return _prepare(recipe, snapshot, loads=loads, export_refreshed=True)
    check_row_independence(recipe, source.onnx_path, model, eval_feeds, {c.name: c.index for c in outputs}, batch)
    calibration_table = (
        load_data_table(_read_from(snapshot, "data.calibration", recipe.calibration_data_path), data,
                        label_names=task.labels_name_classes, recipe_file=recipe.source, field="data.calibration.path",
                        model_inputs=model.inputs)  # fmt: skip
        if recipe.calibration_data_path is not None
        else table
    )
    calibration_nonfinite = nonfinite if calibration_table is table else nonfinite_masks(calibration_table, data.inputs)
    split, calibration_batches = calibration_feeds(
        recipe, calibration_table, model, calibration_nonfinite, dropped, masks if calibration_table is table else {},
        lookups, whole=batch is not None, data=data, evaluation=evaluation if calibration_table is table else None,
        unread=unread,
    )
    calibration_rows = split.fitted
    judged = [name for name, mask in eval_slices.items() if mask.any()]  # an empty slice is judged nowhere
    chooses = chooses_among_candidates(recipe)
    selection = selection_rows(data, calibration_table, split, calibration_nonfinite, judged=judged,
                               model_inputs=model.inputs,
                               labels=lambda t, rows: read_labels(recipe, task, t, rows, outputs),
                               recipe_file=recipe.source, unread=unread) if chooses else None  # fmt: skip
    if selection is not None:  # fed to FP32 and every candidate (an id past a table there failed the search alone)
        check_lookup_indices(recipe, lookups, selection.feeds, split.selection, "selection")
    kept = kept_nonfinite(data, (eval_rows, nonfinite, masks), (calibration_rows, calibration_nonfinite),
                          split.selection if selection is not None else split.selection[:0])  # fmt: skip
    evaluated = evaluation.digests  # never None here: building the evaluation feeds refused a missing fed column
    fitted = content_table(calibration_table, data, recipe_file=recipe.source, rows=calibration_rows, unread=unread,
                           dtypes=fed_as)  # fmt: skip
    overlap = shared_rows(fitted, calibration_rows, evaluated, data.fed_columns)
    selection_overlap = _selection_overlap(selection, evaluated) if chooses else None
    if recipe.fits_on_calibration_rows:
        allowed = calibration_table is table and data.calibration.overlap == "allow"
        warn_shared(overlap, len(calibration_rows), "calibration",
                    "data.calibration.overlap: allow" if allowed
                    else "the same rows twice, or in both files")  # fmt: skip
    return Prepared(
        recipe=recipe,
        source=source,
        model=model,
        outputs=tuple(outputs),
        evaluation_rows=eval_rows,
        evaluation_feeds=eval_feeds,
        labels=labels,
        slices=eval_slices,
        calibration_batches=calibration_batches,
        calibration=CalibrationRecord(
            size=len(calibration_rows),
            seed=recipe.data.calibration.seed,
            stratify_by=recipe.data.calibration.stratify_by,
            row_ids_sha256=row_ids_sha256(calibration_rows),
            # slices are defined on data.path; a separate calibration file gets no per-slice counts
            per_slice_counts=per_slice_counts(calibration_rows, masks) if calibration_table is table else {},
            overlap=data.calibration.overlap,
            held_out_rows=evaluation.held_out,
            evaluation_overlap_rows=overlap,
            selection_rows=(selection.count if selection else 0) if chooses else None,
            selection_from_sample=(selection.from_sample if selection else 0) if chooses else None,
            selection_overlap_rows=selection_overlap,
        ),
        calibration_overlap=overlap,
        training=_training(recipe, task, table, model, outputs, nonfinite, masks, eval_rows, evaluated, data=data,
                           calibration=(calibration_rows, calibration_nonfinite), lookups=lookups, unread=unread),
        custom_metrics=custom_metrics,
        dropped_nonfinite=dropped,
        kept_nonfinite=kept,
        preprocess_ms_per_row=preprocess_ms_per_row,
        batch=batch,
        snapshot=snapshot,
        selection=selection,
        distinct_inputs=evaluation.distinct_inputs,
        evaluation_digests=evaluation.digests,
        evaluation_sequence_ids=sequence_ids(table, eval_rows, data.inputs, recipe_file=recipe.source),
    )


def _read_from(snapshot: Snapshot | None, name: str, path: Path) -> Path:
    """Where input `name` (at `path` in the recipe) is read from: the sweep's copy of it, when there is one."""
    return path if snapshot is None else snapshot.path(name, path)


def _check_export_on_rows(recipe: Recipe, source: ModelSource, feeds: Feeds, *, refresh: bool = True) -> bool:
    """The exported reference must compute what forward() computes on the recipe's own rows, not only on the
    export's random example: a branch on the data (`if (x < 0).any()`) is recorded as the example took it, and
    every figure would then describe another model. True when the export differed and a new export replaced it
    (a cached export of code since edited): what was read from the old file must be read again."""
    from qbench.sources.torch_export import refresh_export, rows_difference, rows_refusal

    torch_model = source.torch
    if torch_model is None or any(name not in feeds for name in torch_model.input_names):
        return False
    inputs = [feeds[n] for n in torch_model.input_names]
    try:
        found = rows_difference(torch_model, source.onnx_path, inputs, recipe.data.evaluation.batch_size)
    except Exception as exc:  # noqa: BLE001 - the user's forward() on real rows: any error is theirs to see
        raise RecipeError(recipe.source, "model.torch", f"forward() failed on evaluation rows: {exc}") from exc
    if found is None:
        return False
    if refresh and refresh_export(torch_model, source.onnx_path, found[1]):
        return True
    raise RecipeError(recipe.source, "model.torch", found[0] + rows_refusal(source.onnx_path))


def _read_model(recipe: Recipe, path: Path) -> ModelInfo:
    """The model's inputs and outputs; its external-data files must exist (ONNX reads them only when run); it
    must compute in FP32 (`reduced_precision`)."""
    from qbench.onnx_read import read_onnx

    field = _model_field(recipe)
    try:
        info = read_model_info(path)
        locations = external_data_files(path)
        not_fp32 = reduced_precision(read_onnx(path))
    except QbenchError as exc:
        raise RecipeError(recipe.source, field, str(exc)) from None
    except Exception as exc:  # onnx raises several types for a file that is not a model
        raise RecipeError(recipe.source, field, f"cannot read ONNX model {path}: {exc}") from None
    gone = [location for location in locations if not (path.parent / location).is_file()]
    if gone:
        raise RecipeError(
            recipe.source, field, f"ONNX model {path} keeps its weights in {gone[0]!r}, not found in {path.parent}"
        )
    if not_fp32 is not None:
        raise RecipeError(recipe.source, field, f"{path}: {not_fp32}; expected the FP32 model that variants are built "
                          "from (qbench makes the reduced-precision variants itself)")  # fmt: skip
    return info


def _model_field(recipe: Recipe) -> str:
    return "model.path" if recipe.model.path is not None else "model.torch"


def _pick_outputs(recipe: Recipe, task: Task, model: ModelInfo, labels: list[Any] | None) -> list[OutputChoice]:
    """model.output / model.outputs, checked against what the task can read, or the task's own pick among the
    outputs the `labels` (the label column's values) can score."""
    wanted = recipe.model.outputs or ([recipe.model.output] if recipe.model.output is not None else None)
    field = "model.outputs" if recipe.model.outputs is not None else "model.output"
    try:
        return choose_outputs(task, model, wanted, labels)
    except QbenchError as exc:
        raise RecipeError(recipe.source, field, str(exc)) from None


def _check_gate_metric(recipe: Recipe, task: Task, outputs: list[OutputChoice]) -> None:
    """Each gated metric must be one the evaluated output gives (kl_mean needs scores, not class ids)."""
    for index, metric in enumerate(recipe.gate.gated_metrics):
        field = f"gate.metrics[{index}].metric" if recipe.gate.metrics else "gate.metric"
        for choice in outputs:
            prefix = f"{choice.name}/" if len(outputs) > 1 else ""
            if not metric.startswith(prefix):
                continue
            reason = task.metrics_not_computed(choice.meta).get(metric.removeprefix(prefix))
            if reason is not None:
                raise RecipeError(recipe.source, field,
                                  f"{metric!r} is not computed for output {choice.name!r}: {reason}")


def _finite_rows(
    recipe: Recipe, rows: np.ndarray, nonfinite: NonfiniteMasks, dropped: dict[str, dict[str, int]], what: str
) -> np.ndarray:
    """With `data.nonfinite_inputs: drop`, `rows` less those holding NaN/inf (counted in `dropped[what]`)."""
    kept, counts = finite_rows(rows, nonfinite, recipe.data, what=what, recipe_file=recipe.source)
    record_dropped(dropped, what, counts, len(rows) - len(kept))
    return kept


def _selection_overlap(selection: SelectionRows | None, evaluated: np.ndarray) -> int:
    """How many selection rows feed the model what an evaluation row feeds it (their row_digests among `evaluated`),
    warned about: kept apart by position, a calibration file copying evaluation rows still lets a search, fallback or
    calibrator: auto choose on inputs that then judge its pick."""
    if selection is None or selection.digests is None:
        return 0
    shared = int(np.isin(selection.digests, evaluated).sum())
    if shared:
        logger.warning("%d of the %d selection rows feed the model what evaluation rows feed it (the same inputs in "
                       "both files, or twice in the table): candidates are chosen partly on inputs that judge the "
                       "pick, whose pass may be optimistic", shared, selection.count)  # fmt: skip
    return shared


def _training(
    recipe: Recipe,
    task: Task,
    table: pd.DataFrame,
    model: ModelInfo,
    outputs: list[OutputChoice],
    nonfinite: NonfiniteMasks,
    slices: dict[str, np.ndarray],
    eval_rows: np.ndarray, evaluated: np.ndarray,  # the evaluation rows and their row_digests
    *,
    data: DataSpec,
    calibration: tuple[np.ndarray, NonfiniteMasks],
    lookups: Mapping[str, Lookup],
    unread: Mapping[str, bool] | None = None,
) -> dict[str, TrainingData]:
    """Feeds (fed as `data.inputs`, as calibration_feeds', their ids within `lookups`' tables) and labels for every QAT
    variant, from its `qat.train` filter (never an evaluation row: see training_rows). Fake quantization turns NaN into
    a number in training and in the observers that calibrate on the `calibration` rows alike, so QAT never takes
    NaN/inf rows, whatever data.nonfinite_inputs says (qat_refuses_nonfinite). `unread`: model inputs no output reads
    (content_table)."""
    training = {}
    by_content = (content_table(table, data, recipe_file=recipe.source, unread=unread,
                                dtypes=numeric_dtypes(model.inputs))
                  if any(v.qat for v in recipe.variants) else table)  # fmt: skip
    for index, spec in enumerate(recipe.variants):
        if spec.qat is None:
            continue
        field = f"variants[{index}].qat.train.filter"
        rows = training_rows(table, spec.qat.train.filter, eval_rows, field=field, recipe_file=recipe.source)
        rows = _finite_rows(recipe, rows, nonfinite, {}, f"{spec.name} training")
        rows = rows[: spec.qat.train.limit] if spec.qat.train.limit is not None else rows
        warn_shared(shared_rows(by_content, rows, evaluated, recipe.data.fed_columns), len(rows),
                    f"{spec.name} training",
                    "the same rows twice in the table")  # fmt: skip
        if recipe.data.nonfinite_inputs == "keep":
            qat_refuses_nonfinite(recipe.source, spec.name, index, (rows, nonfinite), calibration)
        check_finite(table, rows, nonfinite, slices, what=f"{spec.name} training", recipe_file=recipe.source)
        use_labels = spec.qat.loss == "label" and recipe.data.label is not None
        labels = read_labels(recipe, task, table, rows, outputs) if use_labels else None
        feeds = build_feeds(table, rows, data.inputs, model.inputs, recipe_file=recipe.source)
        check_lookup_indices(recipe, lookups, feeds, rows, f"{spec.name} training")
        training[spec.name] = TrainingData(feeds=feeds, labels=labels, task=recipe.task, output_index=outputs[0].index,
                                           probabilities=outputs[0].meta.probabilities)
    return training
