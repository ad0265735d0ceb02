"""Checks that would otherwise fail only after a whole sweep: run by `qbench validate` and at the start of a sweep.

- the plan: at least one variant besides the FP32 reference, and every glob of `gate.applies_to` (and
  `slo.applies_to`) matches at least one of them (a glob that matches none is a typo that would leave the
  variant it meant unjudged);
- the destinations: `output_dir` and a build store on this machine's file systems are (or can be
  made) writable folders, and the tracking store can be written (a sqlite file or a file: folder;
  servers are asked by `track`; an fsspec build store by the build that publishes to it);
- memory: the input of the largest batch fits in the memory available now;
- masks: FP32's outputs are not -inf at the same positions on every row the dry run scores (a mask written with
  -inf, which would leave every row FP32's failure and nothing to judge);
- unread inputs: a model input no evaluated output is computed from (read by no node, or only on the way to an output
  not evaluated) is warned about with the column feeding it: its cells change no figure (a slice column fed by mistake);
- a fixed batch: a model whose inputs only take batches of one size (an export without a dynamic
  batch axis): the recipe's batch sizes are that one (those it leaves out are set to it); rows that do
  not fill a last batch are padded where they are fed (`qbench.data.iter_batches`); inputs fixing axis 0 beside
  inputs leaving it dynamic share no batch (a GNN's x ['num_nodes', F] and edge_index [2, 'num_edges']): refused.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
from pydantic import BaseModel

from qbench.backends import get_backend
from qbench.environment import available_memory
from qbench.errors import QbenchError, RecipeError, short_repr
from qbench.gate.checks import unmatched_globs
from qbench.modelinfo.signature import ModelInfo, shared_by_batch
from qbench.preflight.rows import batch_axis_hint
from qbench.recipe.registry import check_registry
from qbench.recipe.search import check_search_batches
from qbench.recipe.slo import check_serving
from qbench.recipe.spec import Recipe
from qbench.track.uri import resolve_tracking_uri

logger = logging.getLogger(__name__)

_GIB = 1 << 30
ModelT = TypeVar("ModelT", bound=BaseModel)


def check_plan(recipe: Recipe) -> None:
    """There is something to compare with FP32, and every gate (and SLO) glob picks at least one such variant."""
    reference = recipe.all_variants()[0].name
    candidates = [v.name for v in recipe.planned_variants()[1:]]
    if not candidates:
        raise RecipeError(
            recipe.source,
            "variants",
            "no variant to compare with the FP32 reference; add one, e.g. {name: int8, precision: int8, "
            "calibrator: minmax}",
        )
    _check_globs(recipe, "gate.applies_to", recipe.gate.applies_to, reference, candidates)
    if recipe.slo is not None and recipe.slo.applies_to is not None:
        _check_globs(recipe, "slo.applies_to", recipe.slo.applies_to, reference, candidates)
    if recipe.search is not None and not recipe.gate.applies(recipe.search.name):
        logger.warning(f"gate.applies_to: {short_repr(recipe.gate.applies_to)} does not match the search's variant "
                       f"{recipe.search.name!r}: the search meets the gate's "
                       "tolerances but `qbench gate` will not judge its pick")  # fmt: skip


def _check_globs(recipe: Recipe, field: str, patterns: list[str], reference: str, candidates: list[str]) -> None:
    unmatched = unmatched_globs(field, patterns, reference, candidates)
    if unmatched:
        raise RecipeError(recipe.source, *unmatched[0])


def check_node_names(recipe: Recipe, path: Path) -> None:
    """Every node an ONNX build is told to keep float (`exclude_nodes`) is one of the model's main graph at `path`, as
    the build reads it (`main_graph_nodes`): a recipe error now, naming the entry, not a failed build later."""
    named = [(i, spec) for i, spec in enumerate(recipe.variants) if spec.exclude_nodes and spec.quantizer != "modelopt"]
    if not named:
        return
    from qbench.onnx_read import read_onnx
    from qbench.variants.node_names import main_graph_nodes
    from qbench.variants.onnx_utils import name_unnamed_nodes

    model = read_onnx(path)
    name_unnamed_nodes(model)
    for i, spec in named:
        for j, name in enumerate(spec.exclude_nodes):
            try:
                main_graph_nodes(model, name)
            except QbenchError as exc:
                raise RecipeError(recipe.source, f"variants[{i}].exclude_nodes[{j}]", str(exc)) from None


_SHAPE_READERS = frozenset({"Shape", "Size"})  # read a tensor's dimensions, never its values


def unread_inputs(path: Path, outputs: Collection[str] | None = None) -> dict[str, bool]:
    """The model's fed inputs (not initializers) whose values none of `outputs` (None: the graph's) is computed from, in
    the graph's order, each with whether its shape is read there: read by no node, only by nodes no evaluated output
    depends on, or only through a Shape/Size (an attention mask an export dropped but for its length: padding then
    changes every figure it should not). What an If/Loop/Scan body reads from outside counts as read by that node.
    Local functions are inlined first; a graph that cannot be read gives none."""
    from qbench.modelinfo.classes import each_once
    from qbench.onnx_read import read_onnx
    from qbench.variants.onnx_utils import outer_scope_reads

    try:
        graph = read_onnx(path).graph
    except Exception:  # noqa: BLE001 - an unreadable model is refused by the checks that load it
        return {}
    producers = {out: node for node in graph.node for out in node.output if out}
    reached: set[str] = set()
    shaped: set[str] = set()
    for output in [tensor.name for tensor in graph.output] if outputs is None else outputs:
        for tensor, waiting in each_once(output):
            reached.add(tensor)
            node = producers.get(tensor)
            if node is None:
                continue
            if node.op_type in _SHAPE_READERS and node.domain in ("", "ai.onnx"):
                shaped.update(name for name in node.input if name)
                continue
            waiting.extend(name for name in (*node.input, *outer_scope_reads(node)) if name)
    constants = {tensor.name for tensor in graph.initializer}
    return {tensor.name: tensor.name in shaped for tensor in graph.input
            if tensor.name not in constants and tensor.name not in reached}


def warn_unread_inputs(recipe: Recipe, path: Path, outputs: Collection[str]) -> None:
    """Log each model input whose values no evaluated output is computed from, with the data column feeding it: its
    cells are read and fed, yet change no figure (a slice or id column fed as an input by mistake, a mask the graph
    ignores or reads only the length of)."""
    columns = {spec: column for column, spec in recipe.data.inputs.items() if isinstance(spec, str)}
    for name, shape_read in unread_inputs(path, outputs).items():
        fed = f" (fed from data column {columns[name]!r})" if name in columns else ""
        listed = ", ".join(map(repr, outputs))
        how = (f"the evaluated output(s) {listed} are computed from its shape alone (Shape/Size), never its values"
               if shape_read else f"no node the evaluated output(s) {listed} are computed from reads it")
        logger.warning(f"model input {name!r}{fed}: {how}; its values change no figure; if the model was meant to read "
                       f"them (a mask, padding), check the export")  # fmt: skip


def check_backends(recipe: Recipe) -> None:
    """Every backend the recipe names must be usable here (SDK installed, device present)."""
    for name in recipe.backends:
        try:
            get_backend(name).check_available()
        except QbenchError as exc:
            raise RecipeError(recipe.source, f"backends[{recipe.backends.index(name)}]", str(exc)) from None


def check_quantizer_options(recipe: Recipe) -> None:
    """Options ModelOpt cannot honour are recipe errors now, not build failures later."""
    for index, spec in enumerate(recipe.variants):
        if spec.quantizer != "modelopt":
            continue
        from qbench.techniques.modelopt import Modelopt
        from qbench.variants.base import technique_of
        from qbench.variants.modelopt_quant import modelopt_settings

        try:
            modelopt_settings(technique_of(spec, Modelopt))  # the technique's config, not the variant's spec
        except QbenchError as exc:
            detail = str(exc).removeprefix(f"variant {spec.name!r}: ")
            raise RecipeError(recipe.source, f"variants[{index}]", detail) from None


def check_destinations(recipe: Recipe, *, track: bool) -> None:
    """output_dir, a local build store and, when tracking, a local tracking store must be writable folders
    (nothing is created)."""
    from qbench.execute.store import build_store  # qbench.execute imports this module

    _check_writable_folder(recipe, "output_dir", recipe.output_path / recipe.name)  # where run folders are made
    store = build_store(recipe).local
    if store is not None:
        default = "" if recipe.executor.store else (" (the default, in qbench's cache: set "
                                                    "executor.store or $QBENCH_CACHE_DIR)")
        _check_writable_folder(recipe, "executor.store", store,
                               expected=f"a writable folder for built variants{default}")  # fmt: skip
    if not track:
        return
    uri = resolve_tracking_uri(recipe)
    database = _local_store(uri)
    if database is None:
        return
    path, is_folder = database
    # the default store ($MLFLOW_TRACKING_URI, else mlflow.db in the working directory: read-only in some CI jobs)
    # is checked as one the recipe names; before, the sweep failed on it after its first build
    default = "" if recipe.tracking_uri else (f" (tracking.uri is not set, so runs go to {uri}: set tracking.uri or "
                                              "$MLFLOW_TRACKING_URI, or run with --no-track)")  # fmt: skip
    if is_folder:
        _check_writable_folder(recipe, "tracking.uri", path, expected=f"a writable folder{default}")
        return
    if path.exists() and (path.is_dir() or not os.access(path, os.W_OK)):
        problem = "is a folder" if path.is_dir() else "is not writable"
        raise RecipeError(recipe.source, "tracking.uri",
                          f"the sqlite database {path} {problem}; expected a writable file{default}")  # fmt: skip
    # its folder takes the database's lock file (qbench.track.store) even where the database exists
    _check_writable_folder(recipe, "tracking.uri", path.parent, create=False, expected=f"a writable folder{default}")


def check_batch_memory(recipe: Recipe, feeds: Mapping[str, np.ndarray], *, available: int | None = None) -> None:
    """The model inputs of every batch size the recipe asks for fit in the memory available (bytes per row ×
    batch, from the evaluation feeds, which carry the model's input shapes and dtypes)."""
    rows = min((len(array) for array in feeds.values()), default=0)
    if rows == 0:
        return
    per_row = sum(array.nbytes for array in feeds.values()) / rows
    available = available_memory() if available is None else available
    if available is None:
        return
    for field, batch in _batch_sizes(recipe):
        needed = per_row * batch
        if needed > available:
            raise RecipeError(
                recipe.source,
                field,
                f"a batch of {batch} rows needs {needed / _GIB:.1f} GiB of model input ({per_row:.0f} bytes per row), "
                f"but {available / _GIB:.1f} GiB of memory is available; expected a smaller batch size",
            )


def check_output_memory(recipe: Recipe, outputs: Mapping[str, np.ndarray], evaluation_rows: int, *,
                        available: int | None = None) -> None:
    """The evaluated outputs of every evaluation row fit in the memory available: a measurement holds FP32's and the
    variant's at once, each as the model gives it (docs/internals.md, "What qbench itself costs"), so it needs at
    least twice their bytes (per row from the dry run's `outputs`: a language model's logits are tokens x vocabulary
    floats)."""
    rows = min((len(array) for array in outputs.values()), default=0)
    available = available_memory() if available is None else available
    if rows == 0 or available is None:
        return
    per_row = sum(array.nbytes for array in outputs.values()) / rows
    needed = 2 * per_row * evaluation_rows
    if needed > available:
        shapes = ", ".join(f"'{name}' {list(array.shape[1:])} {array.dtype}" for name, array in outputs.items())
        raise RecipeError(
            recipe.source,
            "data.evaluation.limit",
            f"{evaluation_rows} evaluation rows need at least {needed / _GIB:.1f} GiB for their outputs "
            f"({per_row / 2**20:.2f} MiB per row: {shapes}; FP32's and a variant's are held at once), but "
            f"{available / _GIB:.1f} GiB of memory is available; expected at most {int(available // (2 * per_row))} "
            "rows (data.evaluation.limit), or a smaller output (model.output)",
        )


def check_masked_outputs(recipe: Recipe, outputs: Mapping[str, np.ndarray], failed_rows: int,
                         ruled_out: Collection[str] = ()) -> None:  # fmt: skip
    """RecipeError (model.path / model.torch) when FP32 failed on every row the dry run scored (`failed_rows`: those
    whose judged values hold NaN/inf, as the task reads them) because an evaluated output is -inf at the same
    positions on every row and NaN/+inf nowhere: a mask written with -inf (masked_fill(~allowed, -inf)). A row FP32
    fails on is compared with nothing, so the sweep would build every variant and judge none (exit 2); a finite fill
    computes the same decisions and is judged. For the outputs in `ruled_out`, whose -inf the task reads as a class the
    model rules out on that row (Task.masks_with_neginf), only a mask leaving no value is such a failure: one that
    leaves some classes is scored over them, whether or not the dry run's few rows happen to share it (evaluation rows
    sorted by the category that sets the mask)."""
    rows = min((len(array) for array in outputs.values()), default=0)
    if rows == 0 or failed_rows < rows:
        return
    for name, values in outputs.items():
        flat = np.asarray(values)
        if flat.dtype.kind != "f" or flat.ndim < 2:
            continue
        flat = flat.reshape(rows, -1)
        masked = np.isneginf(flat)
        if np.isnan(flat).any() or np.isposinf(flat).any() or not masked[0].any() or not (masked == masked[0]).all():
            continue
        if name in ruled_out and not masked[0].all():  # classes are left to decide among: no row fails for it
            continue
        positions = np.flatnonzero(masked[0])
        shown = ", ".join(map(str, positions[:8])) + (", ..." if len(positions) > 8 else "")
        field = "model.path" if recipe.model.path is not None else "model.torch"
        raise RecipeError(
            recipe.source, field,
            f"output {name!r} of the FP32 model is -inf at the same {len(positions)} of its {flat.shape[1]} values "
            f"per row (flat positions {shown}) on every evaluation row the dry run scored: a mask written with -inf; "
            "qbench reads a NaN/inf among the values it judges as that row's failure, and a row FP32 fails on has "
            "nothing to compare a variant with, so no variant could be judged; expected finite outputs: fill the "
            "mask with a finite value (float32's minimum, -3.4e38), or evaluate the output before the mask "
            "(model.output)",
        )  # fmt: skip


def fixed_batch(recipe: Recipe, model: ModelInfo) -> int | None:
    """The batch size the model's inputs are fixed to (a static first dimension), None when it is dynamic.
    A session refuses any other size, after the sweep has started: a batch-size field the recipe sets must be
    that one (one error names every one that is not); one it leaves out takes it (`with_fixed_batch`)."""
    dims = model.batch_dims
    if not dims:
        return None
    _check_shared_axis_0(recipe, model)
    name, size = next(iter(dims.items()))
    if len(set(dims.values())) > 1:
        shapes = ", ".join(f"{n} {list(model.inputs[n].shape)}" for n in dims)
        raise RecipeError(recipe.source, "model", f"the model's inputs fix different batch sizes ({shapes}); "
                          f"expected one batch dimension shared by every input: {_ONE_SAMPLE_PER_ROW}")  # fmt: skip
    wrong = [(field, now, expected) for field, now, expected in _batch_fields(recipe, size) if now != expected]
    if wrong:
        listed = ", ".join(f"{field}: {expected} (now {now})" for field, now, expected in wrong)
        where = f"model input {name!r} has a fixed batch dimension of {size} (shape {list(model.inputs[name].shape)})"
        raise RecipeError(recipe.source, wrong[0][0], f"{where}, so it runs batches of {size} only; expected "
                          f"{listed}, or leave {'it' if len(wrong) == 1 else 'them'} out to take the model's batch, "
                          f"or a model exported with a dynamic batch axis{_rows_first(model)}")  # fmt: skip
    return size


_ONE_SAMPLE_PER_ROW = (
    "qbench feeds one sample per data row along axis 0 of every input, so a model whose one call is one sample "
    "along other axes (a graph neural net's node features [num_nodes, F] and edge_index [2, num_edges], as PyG "
    "exports it) cannot be fed so; export it batch-first: one graph per call with a batch axis added ([1, "
    "num_nodes, F], [1, 2, num_edges]) or a padded dense batch ([batch, max_nodes, F] with a node mask the model "
    "applies), each row's graph padded to one size"
)


def _check_shared_axis_0(recipe: Recipe, model: ModelInfo) -> None:
    """RecipeError when some inputs fix axis 0 while others leave it dynamic (inputs of rank 1 and those with no row
    axis aside, as in `ModelInfo.batch_dims`: data.inputs refuses the latter): axis 0 is then no batch the inputs share
    (a GNN's x ['num_nodes', F] beside edge_index [2, 'num_edges']), and taking the static one for a fixed batch would
    feed two graphs' rows as one. Where every fixed axis 0 is 1, a batch of one row fits every input, whichever axis
    holds its batch: a fixed batch of 1 (a GRU's or LSTM's initial state h0 [1, 'batch', H], as torch lays it out even
    batch-first)."""
    ranked = [meta for meta in model.inputs.values() if len(meta.shape) > 1 and not shared_by_batch(meta, model.inputs)]
    fixed = [meta for meta in ranked if meta.shape[0] is not None]
    free = [meta for meta in ranked if meta.shape[0] is None]
    if not fixed or not free or all(meta.shape[0] == 1 for meta in fixed):
        return
    dynamic = ", ".join(f"{meta.name} {meta.shape_text()}" for meta in free)
    static = ", ".join(f"{meta.name} {meta.shape_text()}" for meta in fixed)
    named = [(meta.name, axis, dim) for meta in ranked for axis, dim in enumerate(meta.dim_names)
             if axis > 0 and dim and "batch" in dim.lower()]  # fmt: skip
    hint = (f"; axis {named[0][1]} ({named[0][2]!r}) of {named[0][0]!r} is named like the batch: if it is, export the "
            "model batch-first" if named else "")  # fmt: skip
    field = "model.path" if recipe.model.path is not None else "model"
    raise RecipeError(recipe.source, field, f"the model's inputs share no batch axis: {dynamic} "
                      f"{'leaves' if len(free) == 1 else 'leave'} axis 0 dynamic, {static} "
                      f"{'fixes' if len(fixed) == 1 else 'fix'} it; {_ONE_SAMPLE_PER_ROW}{hint}")  # fmt: skip


def _rows_first(model: ModelInfo) -> str:
    """A static axis 0 beside a dynamic later axis is as often a features- or sequence-first export as a fixed
    batch: following the advice to run batches of axis 0's size would feed rows along the wrong axis (the
    row check refuses it only after the user rewrote the recipe), so the error says which axis looks like it."""
    hint = batch_axis_hint(model)
    return f"{hint}: if it is, export the model batch-first (qbench feeds data rows along axis 0)" if hint else ""


def with_fixed_batch(recipe: Recipe, size: int) -> Recipe:
    """`recipe` with every batch-size field set to the model's fixed batch `size` (`fixed_batch` has checked
    those the recipe sets): timed at that batch only, evaluated and calibrated in batches of it. A budget the
    recipe sets at another latency batch size (slo.batch_size, registry.primary_batch_size, search.batch_sizes) is an
    error."""
    data = _unset(recipe.data, evaluation=_unset(recipe.data.evaluation, batch_size=size),
                  calibration=_unset(recipe.data.calibration, batch_size=size))  # fmt: skip
    latency = _unset(recipe.latency, batch_sizes=[size])
    try:
        check_serving(recipe.slo, recipe.cost, recipe.backends, latency.batch_sizes)
        check_registry(recipe.registry, recipe.backends, latency.batch_sizes)
        check_search_batches(recipe.search, latency.batch_sizes)
    except ValueError as exc:
        field, _, detail = str(exc).partition(": ")
        raise RecipeError(recipe.source, field, f"{detail}: the model's fixed batch, the only one timed") from None
    return recipe.model_copy(update={"data": data, "latency": latency})


def _batch_sizes(recipe: Recipe) -> list[tuple[str, int]]:
    sizes = [(f"latency.batch_sizes[{i}]", b) for i, b in enumerate(recipe.latency.batch_sizes)]
    sizes += [
        ("data.evaluation.batch_size", recipe.data.evaluation.batch_size),
        ("data.calibration.batch_size", recipe.data.calibration.batch_size),
    ]
    sizes += [(f"variants[{i}].qat.batch_size", v.qat.batch_size) for i, v in enumerate(recipe.variants) if v.qat]
    return sizes


def _batch_fields(recipe: Recipe, size: int) -> list[tuple[str, object, object]]:
    """(field, value, the value a fixed batch of `size` needs) for each batch-size field the recipe sets."""
    fields = [
        ("latency.batch_sizes", recipe.latency, "batch_sizes", [size]),
        ("data.evaluation.batch_size", recipe.data.evaluation, "batch_size", size),
        ("data.calibration.batch_size", recipe.data.calibration, "batch_size", size),
    ]
    return [(field, getattr(spec, name), expected) for field, spec, name, expected in fields
            if name in spec.model_fields_set]


def _unset(spec: ModelT, **values: object) -> ModelT:
    """`spec` with `values`, still counted as fields the recipe leaves out: results record the recipe as written,
    and the gate's staleness check parses that record again."""
    return type(spec).model_construct(_fields_set=set(spec.model_fields_set), **{**dict(spec), **values})


def _local_store(uri: str) -> tuple[Path, bool] | None:
    """(path, is_folder) of a sqlite database file or a file: store folder; None for servers and databases."""
    if uri.startswith("sqlite:///"):
        database = uri.removeprefix("sqlite:///").split("?", 1)[0]
        return None if database in ("", ":memory:") else (Path(database), False)
    if uri.startswith("file:"):
        return Path(uri.removeprefix("file://").removeprefix("file:")), True
    return None


def _check_writable_folder(recipe: Recipe, field: str, folder: Path, *, create: bool = True,
                           expected: str = "a writable folder") -> None:  # fmt: skip
    """`folder` is a writable folder, or (with `create`) can be made inside its nearest existing, writable parent."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        if not create:
            raise RecipeError(recipe.source, field, f"folder not found: {existing}; expected an existing folder")
        existing = existing.parent
    if not existing.is_dir():
        what = f"{folder} is a file" if existing == folder else f"{existing} (in the path of {folder}) is a file"
        raise RecipeError(recipe.source, field, f"{what}; expected {expected}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RecipeError(recipe.source, field, f"folder {existing} is not writable; expected {expected}")


def example_inputs_mismatch(
    recipe: Recipe, input_shapes: Mapping[str, tuple[int, ...]], table: pd.DataFrame, rows: np.ndarray,
) -> RecipeError | None:
    """For a PyTorch source, the refusal naming `model.example_inputs` when a column's cells do not hold as many
    values as the example shape of the input it feeds (after the batch axis), else None.

    The exported reference takes the example's sizes on every axis but the batch: a data.inputs shape error
    (cells of 8 tokens fed to an input exported at 16) is fixed in model.example_inputs, not in data.inputs. Cells
    of several sizes fit no example shape: data.inputs' own error (pad them to one size) stands for them."""
    for column, target in recipe.data.inputs.items():
        if not isinstance(target, str) or target not in input_shapes or column not in table or not len(rows):
            continue
        if table[column].iloc[rows].map(np.size).nunique() > 1:
            continue
        cell_shape = np.shape(table[column].iloc[rows[0]])
        example = input_shapes[target]
        if math.prod(cell_shape) != math.prod(example[1:]):
            message = (
                f"input {target!r} is exported with shape {list(example)} (batch first), but column {column!r} holds "
                f"cells of shape {list(cell_shape)}: a PyTorch source's inputs keep the example's sizes after the "
                f"batch axis; set {target}: {[1, *cell_shape]} (or give the column cells of shape {list(example[1:])})"
            )
            return RecipeError(recipe.source, "model.example_inputs", message)
    return None
