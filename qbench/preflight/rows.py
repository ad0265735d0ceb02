"""Each data row's outputs must follow that row: the check that the model's axis 0 really is the batch.

qbench feeds data rows along axis 0 of every model input and reads one output row per input row. A model whose
batch is another axis (a sequence-first RNN or Transformer, `x: [seq, batch, feat]`) still runs when fed that
way, but then each "row" it returns mixes several data rows, and every figure describes a computation the model
never does in service. Shapes cannot tell the two apart (a static axis 0 may be a fixed batch or a sequence
length), so the FP32 reference is run on a few evaluation rows, then on the same rows in another order and on each
row alone (a fixed batch: copies of the row): each row's outputs must move with the row and keep their values (within
kernel differences between batch sizes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.backends.onnxruntime import quiet_run_options
from qbench.data.feeds import take_batch
from qbench.errors import QbenchError, RecipeError
from qbench.files import cache_dir
from qbench.modelinfo.signature import ModelInfo, TensorMeta
from qbench.onnx_read import constant_leading_sizes, read_onnx
from qbench.per_call import fed_per_call, per_call_inputs, session_per_call_inputs
from qbench.preflight.lengths import unfixed_length, variable_length
from qbench.preflight.randomness import EVAL_EXPORT, random_refusal, random_sources
from qbench.provenance import model_sha256
from qbench.recipe.spec import Recipe
from qbench.tasks.selection import ACROSS_ROWS
from qbench.validate.outputs import as_array
from qbench.variants.base import BuiltVariant
from qbench.verdicts import Agreement, checked, feeds_digest

logger = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
CHECKED_ROWS = 8  # evaluation rows the check runs (a fixed batch: exactly that batch)
RELATIVE_TOLERANCE = 1e-3  # of the output's largest magnitude: batch sizes may take other kernels
ABSOLUTE_TOLERANCE = 1e-5
_EXPECTED = "expected each row's outputs to depend on that row only: qbench feeds data rows along axis 0 of every input"
_REMEDY = {  # by model source
    "model.path": "so export the model batch-first (e.g. batch_first=True, or transpose the inputs in the graph)",
    "model.torch": ("and forward() combines rows: a batch size written as a number (x.view(2, -1), not "
                    "x.view(x.size(0), -1)), a reduction over dim 0, or a sequence-first layer (use batch_first=True)"),
}  # fmt: skip
# An exported model whose rows follow a reordering but not a batch of their own computes something over the batch.
_ACROSS_ROWS = "so let no value be computed over the batch (a batch's sum choosing an If branch or a Loop count)"


def check_row_independence(
    recipe: Recipe, path: Path, model: ModelInfo, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, int],
    batch: int | None,
) -> None:  # fmt: skip
    """RecipeError (at model.path / model.torch) when the evaluated `outputs` (name -> index) of the model at
    `path` do not follow the rows of `feeds`: fed in reverse order they must come back reversed, and each row fed
    alone (a fixed batch: a batch of copies of that row) must give that row's outputs. `batch`: the model's fixed
    batch, if any. A fixed batch of 1 cannot be reordered, but its outputs must still hold one row: a detector's
    [N, 6] detections of one image are not N rows.

    A pass is kept in qbench's cache (qbench.verdicts) under a digest of the model's bytes (its
    external-data files too: provenance.model_sha256), the rows checked (dtype, shape and bytes of each input), the
    outputs, the batch and the tolerances, and reused while the code that ran it is unchanged: a warm sweep of the same
    model on the same rows does not run it again (MiniLM: 1.5-2.5 s of each sweep's preparation). Rows that hold no
    numbers (strings) key no verdict: they are checked every time."""
    count = min((len(array) for array in feeds.values()), default=0)
    size = batch if batch is not None else min(CHECKED_ROWS, count)
    if count == 0:
        return
    rows = take_batch({name: array[:size] for name, array in feeds.items()}, size)

    def check(agreement: Agreement) -> str | None:
        return _check_rows(recipe, path, model, rows, outputs, batch, agreement)

    names = sorted(rows)
    digest = feeds_digest([rows[name] for name in names])
    if digest is None:
        check(Agreement())
        return
    settings = {"model": model_sha256(path), "rows": digest, "inputs": names, "outputs": dict(outputs), "batch": batch,
                "field": _field(recipe), "checked_rows": CHECKED_ROWS,
                "tolerance": [RELATIVE_TOLERANCE, ABSOLUTE_TOLERANCE]}  # fmt: skip
    checked(cache_dir(), path, "row-independence", settings, f"the row-independence check on {size} evaluation rows",
            check, level=logging.DEBUG)  # fmt: skip


def _check_rows(
    recipe: Recipe, path: Path, model: ModelInfo, rows: Mapping[str, np.ndarray], outputs: Mapping[str, int],
    batch: int | None, agreement: Agreement,
) -> str | None:  # fmt: skip
    """check_row_independence on `rows` (the rows it feeds): None when it passed (the largest difference it saw in
    `agreement`), why it was not run where it was skipped (not kept), a RecipeError where it failed."""
    size = len(next(iter(rows.values())))
    for name, nodes in random_sources(path, outputs).items():
        raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: {random_refusal(name, nodes)}")
    session = _session(path)
    if session is None:
        return "ONNX Runtime's CPU provider cannot load the model"
    try:
        reference = _run(session, rows, outputs)
    except Exception as exc:  # noqa: BLE001 - the dry run and the sweep report a model that does not run
        logger.info("row-independence check skipped: the FP32 reference did not run on the CPU: %s", exc)
        return "the FP32 reference did not run on the CPU"
    agreement.rows = size
    for name, values in reference.items():
        if values.ndim == 0 or len(values) != size:  # a batch on another axis: square batches would be read transposed
            remedy = variable_length(_graph(path), name) or _per_call(name, values, size)
            raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: output {name!r} had shape "
                              f"{list(values.shape)} for {size} rows fed; expected {size} on its axis 0, one output "
                              "row per input row: qbench reads axis 0 "
                              f"of every output as the batch, {remedy}")  # fmt: skip
    unfixed = unfixed_length(path, list(reference))
    if unfixed is not None:
        raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: {unfixed}")
    if size < 2:
        return None  # one row cannot be reordered
    _check_repeatable(recipe, path, model, batch, session, rows, outputs, reference, agreement)
    trials = [(np.arange(size)[::-1], f"the same {size} rows were fed in another order", _expected(recipe))]
    # Each row without the others, as a served row comes: a value computed over the batch (a scripted
    # `if x.sum() > 0:`) may agree between 8 rows and 4 of them, and still differ for one row.
    alone = range(min(size, CHECKED_ROWS))
    # model.torch: its remedy names those
    across = f"{_EXPECTED}, {_ACROSS_ROWS}" if _field(recipe) == "model.path" else _expected(recipe)
    if batch is None:
        trials += [(np.array([row]), f"each of the same {size} rows was fed alone", across) for row in alone]
    else:
        trials += [(np.full(size, row), f"each of the first {len(alone)} rows was fed as a batch of copies of itself",
                    across) for row in alone]  # fmt: skip
    for picks, how, expected in trials:
        try:
            got = _run(session, {name: array[picks] for name, array in rows.items()}, outputs)
        except Exception as exc:  # noqa: BLE001 - it ran on `size` rows: failing on fewer is the model's axis 0
            raise RecipeError(recipe.source, _field(recipe),
                              f"{_inputs(model, batch)}: the model ran on {size} rows but failed when {how}: "
                              f"{' '.join(str(exc).split())}; {_expected(recipe)}") from None  # fmt: skip
        for name, values in reference.items():
            seen = rows_moved(name, values, got.get(name), picks, agreement)
            if seen is not None and (later := _rows_on_later_axis(values, got.get(name), picks)) is not None:
                axis, across_rows = later
                why = f"reordered on its axis {axis} too: {ACROSS_ROWS}" if across_rows else (
                    f"reordered on its axis {axis} alone: {name!r} gives its rows on axis {axis}, its axis 0 (of "
                    f"{values.shape[0]}, as many as the rows fed) another dimension (a sequence-first or transposed "
                    f"output, [seq, batch, ...]); make the model return it batch-first (a Transpose moving axis {axis} "
                    "first): qbench reads axis 0 of every output as the batch")  # fmt: skip
                raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: {seen} when {how}, and "
                                  f"came back as those rows' outputs {why}")
            if seen is not None and _batch_axis_dropped(values, got.get(name), picks):
                raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: {seen} when {how}: "
                                  f"{_dropped_batch_axis(path, name)}")
            if seen is not None:
                variable = variable_length(_graph(path), name)
                hint = f"; {variable}" if variable else batch_axis_hint(model) + _batch_statistics(path)
                raise RecipeError(recipe.source, _field(recipe),
                                  f"{_inputs(model, batch)}: {seen} when {how}; {expected}{hint}")  # fmt: skip
    return None


def _check_repeatable(
    recipe: Recipe, path: Path, model: ModelInfo, batch: int | None,
    session, rows: Mapping[str, np.ndarray],  # noqa: ANN001
    outputs: Mapping[str, int], reference: Mapping[str, np.ndarray], agreement: Agreement,
) -> None:  # fmt: skip
    """RecipeError when the same rows fed again to the same session give other outputs, beyond the kernels' own
    run-to-run differences: a draw the graph scan did not see (a custom op's), whose noise every figure would
    measure, and which the reordering trials below would blame on the batch. ONNX Runtime promises no bit-exact
    repeats (a threaded ScatterND with a reduction, some fusions, differ in the last bits between runs), so the
    tolerance is the one left for other batch sizes' kernels; class ids must repeat exactly."""
    again = _run(session, rows, outputs)
    for name, values in reference.items():
        seen = rows_moved(name, values, again.get(name), np.arange(len(values)), agreement)
        if seen is not None:
            raise RecipeError(recipe.source, _field(recipe), f"{_inputs(model, batch)}: {seen} when the same rows were "
                              f"fed again; expected a deterministic model{_batch_statistics(path)}")  # fmt: skip


def _batch_statistics(path: Path) -> str:
    """'; its 1 BatchNormalization node(s) ...' when the graph normalises with each batch's own statistics (an
    export in training mode: training_mode=1), the usual cause of outputs that change with the rows fed beside."""
    count = sum(1 for node in _nodes(path) if node.op_type == "BatchNormalization"
                and any(a.name == "training_mode" and a.i == 1 for a in node.attribute))  # fmt: skip
    if not count:
        return ""
    return (f"; its {count} BatchNormalization node(s) normalise with each batch's own statistics "
            f"(training_mode=1): {EVAL_EXPORT}, where they use the running statistics")


def _nodes(path: Path) -> list:
    """The main graph's nodes of the model at `path`, or none where it cannot be read (the error stands alone)."""
    graph = _graph(path)
    return [] if graph is None else list(graph.node)


def _graph(path: Path):  # noqa: ANN202 - onnx is imported lazily
    """The main graph of the model at `path` (its weights left out, local functions inlined: an op in a layer's
    function is one of its nodes), or None where it cannot be read (for hints)."""
    from qbench.onnx_read import read_onnx

    try:
        return read_onnx(path).graph
    except Exception:  # noqa: BLE001 - a hint only
        return None


def _field(recipe: Recipe) -> str:
    return "model.path" if recipe.model.path is not None else "model.torch"


def _expected(recipe: Recipe) -> str:
    return f"{_EXPECTED}, {_REMEDY[_field(recipe)]}"


def _session(path: Path):  # noqa: ANN202 - onnxruntime is imported lazily
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - a graph only another backend runs: its own checks apply
        logger.info("row-independence check skipped: ONNX Runtime's CPU provider cannot load %s: %s", path, exc)
        return None


def _run(session, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, int]) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The evaluated outputs that are arrays (a sequence of maps as its score matrix; others are judged elsewhere)."""
    import onnxruntime as ort

    fed = fed_per_call(feeds, session_per_call_inputs(session))
    results = session.run(None, dict(fed), quiet_run_options(ort))  # a failure is logged once, by the caller
    arrays = {}
    for name, index in outputs.items():
        try:
            value = as_array(results[index], name)
        except (QbenchError, IndexError):
            continue
        arrays[name] = value
    return arrays


def rows_moved(name: str, reference: np.ndarray, got: np.ndarray | None, picks: np.ndarray,
               agreement: Agreement, numbers: np.ndarray | None = None, *,
               per_row: bool = False) -> str | None:  # fmt: skip
    """What was seen when `got` (the outputs of rows `picks`) is not `reference[picks]`; None when it is (the largest
    difference within tolerance goes to `agreement`). `numbers`: the row numbers to name (default: `picks`). The
    tolerance is relative to the largest magnitude of `reference`, or with `per_row` of each row's own outputs: a
    quiet row whose values moved by a loud row's share of a batch scale moves by far more than its own magnitude
    allows, and by less than the loud row's."""
    numbers = picks if numbers is None else numbers
    expected = reference[picks]
    if got is None or got.shape != expected.shape:
        shape = "no array" if got is None else f"shape {list(got.shape)}"
        return f"output {name!r} had {shape} where those rows' outputs have shape {list(expected.shape)}"
    if expected.dtype.kind not in "fc":
        unequal = np.flatnonzero([not np.array_equal(a, b) for a, b in zip(got, expected)])
        if unequal.size == 0:
            return None
        row = int(unequal[0])
        return f"row {int(numbers[row])}'s output {name!r} changed from {_short(expected[row])} to {_short(got[row])}"
    expected, got = expected.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(reference)
    magnitudes = np.where(np.isfinite(expected), np.abs(expected), 0.0).reshape(len(picks), -1)
    scales = magnitudes.max(axis=1, initial=0.0) if per_row else \
        np.full(len(picks), float(np.max(np.abs(reference[finite]))) if finite.any() else 0.0)  # fmt: skip
    tolerances = RELATIVE_TOLERANCE * scales + ABSOLUTE_TOLERANCE
    both_finite = np.isfinite(got) & np.isfinite(expected)
    same_special = (got == expected) | (np.isnan(got) & np.isnan(expected))  # inf where inf was, NaN where NaN was
    with np.errstate(invalid="ignore"):
        difference = np.where(both_finite, np.abs(got - expected), np.where(same_special, 0.0, np.inf))
    moved = difference.reshape(len(picks), -1).max(axis=1, initial=0.0)
    row = int(np.argmax(moved / tolerances))
    if moved[row] <= tolerances[row]:
        agreement.add(float(moved.max(initial=0.0)), 0)
        return None
    whose = "the row's" if per_row else "its"
    return (f"row {int(numbers[row])}'s output {name!r} changed by {moved[row]:.3g} ({whose} values reach "
            f"{scales[row]:.3g}, tolerance {tolerances[row]:.2g})")  # fmt: skip


def _rows_on_later_axis(reference: np.ndarray, got: np.ndarray | None, picks: np.ndarray) -> tuple[int, bool] | None:
    """The later axis of an output that follows the rows (`got`, the output of rows `picks`, is `reference` taken at
    `picks` on that axis) and whether axis 0 follows them too (True: a [batch, batch] similarity matrix) or keeps
    its order (False: a sequence-first or transposed output whose axis 0 happens to be as long as the rows fed), or
    None."""
    if got is None or len(np.unique(picks)) != len(picks):
        return None  # rows fed alone or as copies: nothing to take on a later axis
    for axis in range(1, reference.ndim):
        if reference.shape[axis] != len(picks):
            continue
        for across_rows, rows in ((True, reference[picks]), (False, reference)):
            expected = np.take(rows, picks, axis=axis)
            if expected.shape == got.shape and _same(got, expected):
                return axis, across_rows
    return None


def _batch_axis_dropped(reference: np.ndarray, got: np.ndarray | None, picks: np.ndarray) -> bool:
    """Whether a row fed alone came back without its batch axis: `got` has the shape of one row of `reference`."""
    return got is not None and len(picks) == 1 and reference.ndim > 1 and got.shape == reference.shape[1:]


def _dropped_batch_axis(path: Path, name: str) -> str:
    """Why an output loses its batch axis for one row, and the fix: a Squeeze of every axis of size 1 (no axes
    given, as PyTorch's `.squeeze()` exports) takes the batch's too when one row is fed."""
    squeezes = [node for node in _nodes(path) if node.op_type == "Squeeze"
                and (len(node.input) < 2 or not node.input[1])
                and not any(a.name == "axes" for a in node.attribute)]  # fmt: skip
    cause = (f"its graph holds {len(squeezes)} Squeeze node(s) given no axes "
             f"({squeezes[0].name or squeezes[0].output[0]!r}), which drop every axis of size 1, the batch's too at "
             "one row" if squeezes else "an axis of size 1 is dropped where the batch holds one row")  # fmt: skip
    return (f"output {name!r} drops its batch axis for a batch of one row ({cause}), so a batch of one row (a last "
            "batch, a served request) gives no row; expected one output row per input row at every batch size: "
            "squeeze named axes (PyTorch: .squeeze(-1), not .squeeze())")


def _same(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal values (class ids, flags), or floats within the tolerance left for other batch sizes' kernels."""
    if expected.dtype.kind not in "fc":
        return bool(np.array_equal(got, expected))
    return bool(np.allclose(got, expected, rtol=RELATIVE_TOLERANCE, atol=ABSOLUTE_TOLERANCE, equal_nan=True))


def _short(value: object) -> str:
    array = np.asarray(value)
    text = np.array2string(array, threshold=6, precision=4) if np.ndim(value) else repr(array.item())
    return text if len(text) <= 60 else text[:57] + "..."


def _inputs(model: ModelInfo, batch: int | None) -> str:
    """'model input x [8, 'batch', 6] (axis 0 taken as a fixed batch of 8)'."""
    shown = ", ".join(f"{meta.name} {meta.shape_text()}" for meta in model.inputs.values())
    plural = "s" if len(model.inputs) > 1 else ""
    taken = f" (axis 0 taken as a fixed batch of {batch})" if batch is not None else ""
    return f"model input{plural} {shown}{taken}"


def _per_call(name: str, values: np.ndarray, size: int) -> str:
    """How to return an output with another length than the rows on axis 0: batch-first where a later axis holds the
    rows (sequence-first, transposed); else, with fewer values than rows there, it is per call, as a statistic of the
    whole batch (its mean score, shape [] or [1]), for which 'batch-first' was no advice."""
    hint = _output_axis_hint(name, values, size)
    if hint or (values.ndim > 0 and values.shape[0] > size):
        return f"so make the model return it batch-first{hint}"
    return ("and it gives fewer values there than the rows fed: a value per call whatever the rows (a statistic of "
            "the whole batch, such as its mean score), not one per row; evaluate the per-row outputs (model.output or "
            "model.outputs) and compute such a statistic in a metric of your own "
            "(docs/recipe-reference.md: Custom metrics)")


def _output_axis_hint(name: str, values: np.ndarray, size: int) -> str:
    """'; axis 1 of 'y' has 8 entries, as many as the rows fed' when one later axis does, else ''."""
    axes = [axis for axis in range(1, values.ndim) if values.shape[axis] == size]
    return f"; axis {axes[0]} of {name!r} has {size} entries, as many as the rows fed" if len(axes) == 1 else ""


def batch_axis_hint(model: ModelInfo) -> str:
    """'; axis 1 ('batch') of 'x' is dynamic and looks like the batch' when an input's axes say so, else ''."""
    for meta in model.inputs.values():
        axis = _likely_batch_axis(meta)
        if axis is not None:
            name = meta.dim_names[axis] if axis < len(meta.dim_names) else None
            named = f" ({name!r})" if name else ""
            return f"; axis {axis}{named} of {meta.name!r} is dynamic and looks like the batch"
    return ""


def one_row_only(model: ModelInfo) -> tuple[str, str]:
    """Why a model with a dynamic batch runs one row but not two, and what to export instead: an input of one value
    per call (qbench.per_call: an optimum merged decoder's `use_cache_branch`, a flag choosing the If's branch),
    fed its rows' one value, which rows holding different values in its column cannot share; else a graph fixing a
    batch of 1 its inputs do not declare (a Reshape to a constant [1, -1], as older zoo exports write)."""
    per_call = per_call_inputs({name: meta.shape for name, meta in model.inputs.items() if meta.kind == "tensor"})
    flags = [meta for name, meta in model.inputs.items() if name in per_call]
    if flags:
        named = ", ".join(f"{meta.name!r} {meta.shape_text()}" for meta in flags)
        return (f"so model input {named} holds one value per call beside inputs with a dynamic batch (a flag, as an "
                "optimum merged decoder's use_cache_branch is), whose rows hold different values in its column",
                "or export a model without it (optimum's unmerged decoder_model.onnx and decoder_with_past_model.onnx)")
    return ("so its graph fixes a batch of 1 its inputs do not declare (a Reshape to a constant [1, -1])",
            "or export it with a dynamic batch")


def _likely_batch_axis(meta: TensorMeta) -> int | None:
    """A later axis that looks more like the batch than axis 0: a dynamic one when axis 0 is static, or one
    named like a batch when axis 0 is named otherwise."""
    shape: Sequence[int | None] = meta.shape
    names = meta.dim_names or (None,) * len(shape)
    if len(shape) < 2:
        return None
    if shape[0] is not None:
        return next((axis for axis in range(1, len(shape)) if shape[axis] is None), None)
    if names[0] and "batch" not in names[0].lower():
        return next((axis for axis in range(1, len(shape)) if names[axis] and "batch" in names[axis].lower()), None)
    return None


def runs_batch(backend: Backend, built: BuiltVariant, feeds: Mapping[str, np.ndarray], count: int, batch: int) -> bool:
    """Whether `backend` runs `built` on `batch` of the `count` rows of `feeds` (repeated where fewer), that run alone:
    a measurement first runs one row (its cold start), which a graph fixing a larger batch fails."""
    fed = {name: np.asarray(values)[np.arange(batch) % count] for name, values in feeds.items()}
    try:
        runner = backend.load(built, RunOptions(batch_sizes=(batch,)))
        try:
            runner.run(fed)
        finally:
            runner.close()
    except Exception:  # noqa: BLE001 - any refusal answers "no": a hint is not worth another error
        return False
    return True


def batches_a_graph_may_fix(recipe: Recipe, path: Path, size: int) -> list[int]:
    """The batches above 1 that a graph failing on one row may fix, smallest first: the first values of its constant
    shapes (onnx_read.constant_leading_sizes) and the recipe's batch sizes, up to max(`size`, 256) rows."""
    sizes = constant_leading_sizes(read_onnx(path)) | set(recipe.latency.batch_sizes)
    sizes |= {recipe.data.evaluation.batch_size, recipe.data.calibration.batch_size}
    return sorted(batch for batch in sizes if 1 < batch <= max(size, 256))
