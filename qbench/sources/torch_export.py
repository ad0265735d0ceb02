"""The cached FP32 ONNX export of a PyTorch source, and the checks that it computes what forward() computes.

A new export is checked against torch on the example batch and on a batch of another size
(the exporter traces: a size it read as a Python number is recorded as a constant). A cached
export is checked the same way before it is reused: its key covers the weights and the files of
the user's project, not code installed elsewhere that forward() calls, and a stale reference
would mislead every figure. A passed check is kept beside the export with the digests of the code it ran
(qbench.verdicts), and a repeated sweep reuses it while that code, the inputs and the settings are
the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qbench.errors import QbenchError
from qbench.execute.store import remove_abandoned
from qbench.files import cache_dir as qbench_cache_dir
from qbench.files import new_folder, write_fault
from qbench.preflight.randomness import random_refusal, random_sources
from qbench.sources.torch_lengths import other_lengths
from qbench.sources.torch_model import EXAMPLE_BATCH, TorchModel, single_torch_thread
from qbench.sources.torch_outputs import flatten_outputs
from qbench.sources.torch_wrappers import guard_remedy
from qbench.user_code import installed
from qbench.verdicts import Agreement, checked, feeds_digest

logger = logging.getLogger(__name__)

EXPORT_TOLERANCE = 1e-4  # largest |torch - onnxruntime| difference accepted (absolute, plus as much relative)
OTHER_BATCH = 3  # not the example's batch (2), nor a multiple of it: a traced `view(2, -1)` cannot fit by chance
ROWS_CHECKED = 32  # evaluation rows, spread over them, an export is checked on when forward() read no Python value
_PYTHON_VALUE = "Converting a tensor to a Python"  # the tracer's warning: a tensor read as a number or a bool
_ANY_BATCH = (f"write x.flatten(1) or x.view(x.size(0), -1) rather than x.view({EXAMPLE_BATCH}, -1), and no Python "
              "loop over the rows (for i in range(x.shape[0]))")


def export_reference(torch_model: TorchModel, cache_dir: Path | None = None) -> Path:
    """The FP32 ONNX export of `torch_model` (in `cache_dir`, default qbench.files.cache_dir()), reused when
    cached and still computing what forward() computes (checked against torch in ONNX Runtime before it is cached).
    """
    folder = (cache_dir or qbench_cache_dir()) / "exports" / torch_model.cache_key
    target = folder / "model.onnx"
    if folder.is_dir():  # an export's temporary folder left by a sweep killed while exporting (OOM, SIGKILL)
        remove_abandoned(folder, "export cache")
    if target.is_file():
        try:
            stale = _checked_export(torch_model, target, folder)
        except Exception as exc:  # noqa: BLE001 - an unreadable cached file is replaced like a stale one
            stale = f"cannot be run: {exc}"
        if stale is None:
            return target
        logger.warning("the cached export %s is not what forward() computes now (%s): code forward() runs changed "
                       "outside the files the cache key covers; exporting again", target, stale)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("exporting %s to ONNX (cached in %s)", torch_model.factory, folder)
    problem = _export_into(torch_model, target)
    if problem is not None:
        raise ExportError(f"the ONNX export of {torch_model.factory} {problem}", problem.field)
    return target


class ExportError(QbenchError):
    """The export does not compute what forward() computes; `field` is the recipe field to change."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Problem:
    """Why an export is not the module, and the recipe field to change: model.torch, or the field that makes the
    inputs' lengths vary when the export follows only the example's length."""

    text: str
    field: str = "model.torch"

    def __str__(self) -> str:
        return self.text


def refresh_export(torch_model: TorchModel, path: Path, inputs: Sequence[Any]) -> bool:
    """Replace the export at `path`, which differs from forward() on `inputs` (the recipe's rows), by a new export
    when that one computes what forward() computes on them; True when replaced.

    A cached export is checked before reuse on the example inputs only, and those can miss an edit to code the
    cache key does not cover (a function of a package installed outside the project): token ids that are all 0 pool
    alike whether forward() takes their mean or the first one. Without this the stale export stayed in the cache and
    the recipe was refused as data-dependent control flow, on every run, for code that exports correctly."""
    problem = _export_into(torch_model, path, inputs)
    if problem is None:
        logger.warning("the cached export %s was not what forward() computes now on the recipe's rows: code "
                       "forward() runs changed outside the files the cache key covers; exported again",
                       path)  # fmt: skip
    return problem is None


def _export_into(torch_model: TorchModel, target: Path, inputs: Sequence[Any] | None = None) -> Problem | None:
    """Export forward() to a temporary file beside `target`; when it computes what forward() computes (on the
    example, another batch size and `inputs`), rename it into place, else return why not and leave `target` as is:
    the cache never holds a partial or wrong file, and a concurrent sweep never reads half of one. The temporary file
    has `target`'s name (in a folder of its own), so the digest its kept check is under is the renamed file's."""
    folder = new_folder(target.parent, "export", "publishing")  # removed by remove_abandoned when its writer died
    temporary = folder / target.name
    try:
        try:
            with _python_values_read() as read:
                torch_model.export(torch_model.build(), temporary)
        except Exception as exc:  # noqa: BLE001 - the tracer running the user's forward(): what failed is the finding
            if (fault := write_fault(exc)) is not None:  # the cache's disk, not forward(): no advice on tracing
                raise QbenchError(f"{target.parent}: cannot write the ONNX export: {fault.strerror}") from exc
            return Problem(f"failed while tracing forward() on the example inputs: {type(exc).__name__}: {exc}; "
                           "expected a forward() the TorchScript exporter can trace: make the factory return a wrapper "
                           "module whose forward() takes the example inputs and calls the model with keyword arguments")
        problem = _checked_export(torch_model, temporary, target.parent)
        if problem is None and inputs is not None:
            difference = export_difference(torch_model, temporary, inputs)
            problem = None if difference is None else Problem(difference)
        if problem is None:
            _record_values(target, read)
            os.replace(temporary, target)
        return problem
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _checked_export(torch_model: TorchModel, path: Path, folder: Path) -> Problem | None:
    """`_export_problem`, or None at once where the same check passed on the same file, settings and code before
    (its verdict kept in `folder`, the export's). Its reuse is logged at DEBUG: the sweep's one line on reused checks
    is the rows' (`rows_difference`), which come after."""
    settings = {"key": torch_model.cache_key, "tolerance": EXPORT_TOLERANCE, "other_batch": OTHER_BATCH}
    return checked(folder, path, "example", settings, "the ONNX export's check against forward() on its example inputs",
                   lambda agreement: _export_problem(torch_model, path, agreement), level=logging.DEBUG)  # fmt: skip


def _export_problem(torch_model: TorchModel, path: Path, agreement: Agreement | None = None) -> Problem | None:
    """Why the export at `path` is not the module (ONNX Runtime's outputs differ from torch's by more than
    EXPORT_TOLERANCE on the example batch, on a batch of another size, or at other lengths of its dynamic
    `lengths` axes), or None.

    On the example batch a difference means the module does something the exporter cannot capture
    (data-dependent control flow, say). On another batch it means the trace recorded the example's
    batch size as a constant: every batch of evaluation rows but the example's would then be computed
    wrong, or rows mixed together, or fail. A graph that draws random numbers is named as such first: its outputs
    differ from forward()'s, and from its own, on every run."""
    for name, nodes in random_sources(path, torch_model.output_names).items():
        return Problem(f"samples: {random_refusal(name, nodes, torch=True)}")
    forward = _Forward(torch_model)
    ids_as_masks = _ids_as_masks(torch_model, forward)
    inputs = torch_model.example_inputs(ids_as_masks=ids_as_masks)
    stateful, example_outputs = _state_problem(forward, inputs)
    if stateful is not None:
        return Problem(stateful)
    session = _session(path)
    difference = export_difference(torch_model, path, inputs, session=session, agreement=agreement,
                                   expected=example_outputs)  # fmt: skip
    if difference is not None:
        return Problem(f"on its example inputs: {difference}")
    problem = _batch_problem(torch_model, path, session, ids_as_masks, agreement, forward)
    if problem is not None:
        return Problem(problem)
    return _length_problem(torch_model, path, session, ids_as_masks, agreement, forward)


class _Forward:
    """forward() of the module for the export's checks, its outputs as float32 arrays. One copy of the module serves
    every check unless calling it changed one of its tensors (`_state_problem` says which); each check built a copy
    of its own, 7 copies of MiniLM's 90 MB BERT and 1.8 s of a cold sweep's preparation."""

    def __init__(self, torch_model: TorchModel) -> None:
        self.torch_model = torch_model
        self.module = torch_model.build()
        self.shared = True  # whether self.module serves every call (False: a fresh copy per call)

    def __call__(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        import torch  # a TorchModel exists: torch is installed and loaded

        module = self.module if self.shared else self.torch_model.build()
        with single_torch_thread(), torch.no_grad():
            return [t.float().numpy() for t in flatten_outputs(module(*inputs))]


def _state_problem(forward: _Forward, inputs: Sequence[Any]) -> tuple[str | None, list[np.ndarray]]:
    """forward() changing the module's own tensors in eval mode (a running mean it updates on every call) so that
    the same rows give other outputs on a second call, or None; and the outputs of the first call on `inputs`. The
    export holds one state (the exporter drops the update), the module another after every batch: such a model was
    refused as an export that differs from forward() (`output 'logits' differs from forward()'s by 9.28e-01`),
    naming neither the tensor nor the fix. A module whose tensors changed though its outputs did not (a call
    counter) is built afresh for every later check."""
    import torch  # a TorchModel exists: torch is installed and loaded

    module = forward.module
    before = {name: t.detach().clone() for name, t in module.state_dict().items() if isinstance(t, torch.Tensor)}
    first, second = forward(inputs), forward(inputs)
    after = module.state_dict()
    changed = [name for name, old in before.items() if name not in after or not _same_tensor(old, after[name])]
    forward.shared = not changed
    moved = [_largest_difference(b, a) for a, b in zip(first, second, strict=True) if a.shape == b.shape]
    if (len(moved) == len(first) and max(moved, default=0.0) == 0.0) or not changed:
        return None, first  # the same outputs; or other outputs from the same state: a draw, named by random_sources
    largest = max(moved, default=float("inf"))
    return (f"changes its own state: forward() updates {', '.join(map(repr, changed[:5]))}"
            f"{f' and {len(changed) - 5} more' if len(changed) > 5 else ''} on every call in eval mode, so the same "
            f"rows give other outputs on a second call (by {largest:.2e}) and every figure would depend on the rows "
            "run before; expected a forward() that updates running statistics only in training (under `if "
            "self.training:`, as nn.BatchNorm does)"), first  # fmt: skip


def _same_tensor(old: Any, new: Any) -> bool:
    """Whether a state tensor still holds what it held (NaN where it held NaN)."""
    import torch

    if old.shape != new.shape or old.dtype != new.dtype:
        return False
    if old.is_floating_point() or old.is_complex():
        return bool(torch.equal(torch.nan_to_num(old), torch.nan_to_num(new))
                    and torch.equal(torch.isnan(old), torch.isnan(new)))  # fmt: skip
    return bool(torch.equal(old, new))


def _ids_as_masks(torch_model: TorchModel, forward: _Forward) -> bool:
    """Whether the checks feed the integer inputs as the example feeds masks (ids 1 but a 0 at the last position)
    rather than as zeros: where forward() gives an output no finite value on the zeros and a finite value in every
    output on those. Token id 0 is the padding of most vocabularies, so a model that masks its padding from its own
    ids (an nn.TransformerEncoder's src_key_padding_mask from ids == 0) masks every token of the zeros and returns
    NaN: nothing to compare, and a model that exports fine was refused. The export traced on the zeros is compared
    on the other values: a branch forward() took on the zeros alone shows as a difference there."""

    def finite(ids_as_masks: bool) -> bool:
        outputs = forward(torch_model.example_inputs(ids_as_masks=ids_as_masks))
        return all(bool(np.isfinite(a).any()) for a in outputs if a.size)

    try:  # the masks' values are tried only where the zeros leave an output no finite value
        return torch_model.takes_ids and not finite(False) and finite(True)
    except Exception:  # noqa: BLE001 - forward() refusing ids of 1 (a table of one row): the zeros' finding stands
        return False


def _length_problem(torch_model: TorchModel, path: Path, session: Any, ids_as_masks: bool,
                    agreement: Agreement | None, forward: _Forward) -> Problem | None:  # fmt: skip
    """How the export differs from forward() at lengths other than the example's on its dynamic `lengths` axes
    (qbench.sources.torch_lengths), said with the field that makes the rows' lengths vary and the fixed length that
    would do instead."""
    if not torch_model.lengths:
        return None
    name, axes = next(iter(torch_model.lengths.items()))
    example = torch_model.input_shapes[name][next(iter(axes))]
    for length in other_lengths(example):
        inputs = torch_model.example_inputs(length=length, ids_as_masks=ids_as_masks)
        try:
            expected = forward(inputs)
        except Exception as exc:  # noqa: BLE001 - the user's forward(): what failed is the finding
            finding = f"forward() itself fails ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        else:
            try:
                difference = export_difference(torch_model, path, inputs, session=session, agreement=agreement,
                                               expected=expected)  # fmt: skip
                finding = None if difference is None else f"its {difference}"
            except Exception as exc:  # noqa: BLE001 - ONNX Runtime refusing the length is the finding
                finding = f"it fails in ONNX Runtime ({str(exc).splitlines()[0][:300]})"
        if finding is not None:
            return Problem(
                f"follows only the example's length of {example} along axis {next(iter(axes))} of {name!r}, which "
                f"{torch_model.length_field} makes vary between batches: at length {length} {finding}; expected a "
                f"forward() that takes any length (a length read as a Python number, x.view(b, {example}, -1) or "
                f"int(x.size(1)), is traced as a constant), or padding: max_length with max_length: {example}, which "
                "feeds every row at the example's length", torch_model.length_field)  # fmt: skip
    return None


def _batch_problem(torch_model: TorchModel, path: Path, session: Any, ids_as_masks: bool,
                   agreement: Agreement | None, forward: _Forward) -> str | None:  # fmt: skip
    """How the export at a batch of OTHER_BATCH rows differs from forward(), said with its likely cause."""
    inputs = torch_model.example_inputs(OTHER_BATCH, ids_as_masks=ids_as_masks)
    try:
        expected = forward(inputs)
    except Exception as exc:  # noqa: BLE001 - the user's forward(): what failed is the finding
        remedy = guard_remedy(exc) or _ANY_BATCH
        return (f"cannot be checked at a batch of {OTHER_BATCH}: forward() itself fails on it ({type(exc).__name__}: "
                f"{exc}); qbench feeds rows in batches of any size along axis 0: {remedy}")  # fmt: skip
    try:
        difference = export_difference(torch_model, path, inputs, session=session, agreement=agreement,
                                       expected=expected)  # fmt: skip
        finding = None if difference is None else f"its {difference}"
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime refusing the other batch is the finding
        finding = f"it fails in ONNX Runtime ({str(exc).splitlines()[0][:300]})"
    if finding is None:
        return None
    own = [list(a.shape) for a in expected if not a.shape or a.shape[0] != OTHER_BATCH]
    culprit = (f"forward() itself returns {own[0]} for {OTHER_BATCH} rows: a size written as a number in the module"
               if own else "the TorchScript exporter recorded a size of the example batch as a constant")
    return (f"follows only the example's batch of {EXAMPLE_BATCH} rows: at a batch of {OTHER_BATCH} {finding}; "
            f"{culprit}: {_ANY_BATCH}")  # fmt: skip


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def export_difference(torch_model: TorchModel, path: Path, inputs: Sequence[Any], *, session: Any = None,
                      agreement: Agreement | None = None,
                      expected: Sequence[np.ndarray] | None = None) -> str | None:  # fmt: skip
    """How the exported graph's outputs on `inputs` (one per input, in order) differ from forward()'s beyond
    EXPORT_TOLERANCE (relative to each output's largest finite magnitude), or None when they agree (their largest
    difference then added to `agreement`). Where forward() gives NaN/inf (a head masking what no answer reads with
    -inf) the export must give the same value there; an output with no finite value at all leaves nothing to compare,
    and is named so. `expected`: forward()'s outputs on `inputs` where the caller has them (else it is run)."""
    import torch  # a TorchModel exists: torch is installed and loaded

    inputs = [torch.as_tensor(value) for value in inputs]
    if expected is None:
        expected = _Forward(torch_model)(inputs)
    if not all(np.isfinite(want).any() for want in expected if want.size):
        name = next(n for n, want in zip(torch_model.output_names, expected, strict=True)
                    if want.size and not np.isfinite(want).any())  # fmt: skip
        return (f"cannot be compared: forward() itself returns NaN or inf in output {name!r} on these inputs "
                f"({_described(torch_model.input_names, inputs)})")  # fmt: skip
    session = session or _session(path)
    actual = session.run(None, {name: t.numpy() for name, t in zip(torch_model.input_names, inputs, strict=True)})
    if len(actual) != len(expected):
        return f"{len(actual)} outputs are not forward()'s {len(expected)}"
    largest = 0.0
    for name, got, want in zip(torch_model.output_names, actual, expected, strict=True):
        got = np.asarray(got, dtype=np.float32)
        finite = want[np.isfinite(want)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        if got.shape != want.shape or not np.allclose(got, want, rtol=EXPORT_TOLERANCE, atol=EXPORT_TOLERANCE * scale,
                                                      equal_nan=True):  # the same NaN/inf where forward() gives one
            difference = _largest_difference(got, want) if got.shape == want.shape else np.inf
            return (f"output {name!r} differs from forward()'s by {difference:.2e} (shapes {list(got.shape)} vs "
                    f"{list(want.shape)}, tolerance {EXPORT_TOLERANCE} x {scale:.3g})")  # fmt: skip
        largest = max(largest, _largest_difference(got, want))
    if agreement is not None:
        agreement.add(largest, len(inputs[0]) if inputs else 0)
    return None


def _largest_difference(got: np.ndarray, want: np.ndarray) -> float:
    """The largest |got - want| where they are not the same value (the same NaN or inf counts as the same)."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):  # inf - inf where they are the same: left out by `same`
        return float(np.max(np.where(same, 0.0, np.abs(got - want)), initial=0.0))


def _described(names: Sequence[str], inputs: Sequence[Any]) -> str:
    return ", ".join(f"{name} {list(t.shape)} "
                     f"{str(t.dtype).removeprefix('torch.')}" for name, t in zip(names, inputs, strict=True))


# -- values forward() read as Python numbers: the export holds the example's -------------------------------------


def _values_file(path: Path) -> Path:
    return path.with_name(f"{path.stem}.python_values.json")


def python_values(path: Path) -> list[str]:
    """Where (`file:line`) forward() turned a tensor into a Python value while the export at `path` was traced
    (`.item()`, `bool(t)`, `if t.sum() > 0`): the export holds the value the example gave, as a constant. The user's
    own code only: an installed package's (transformers compares lengths so, on every BERT) is left to the checks at
    other batch sizes and lengths, and checking every evaluation row for it doubled the MiniLM recipe's validate."""
    try:
        return [str(place) for place in json.loads(_values_file(path).read_text())]
    except (OSError, ValueError, TypeError):  # no record (an export of an older qbench): nothing known
        return []


def _record_values(target: Path, read: list[str]) -> None:
    """Keep `python_values` beside the export at `target`: a file only where forward() read any."""
    if read:
        _values_file(target).write_text(json.dumps(read))
    else:
        _values_file(target).unlink(missing_ok=True)


@contextlib.contextmanager
def _python_values_read() -> Iterator[list[str]]:
    """Collect the places the tracer warned of a tensor read as a Python value; other warnings are shown as usual."""
    import torch  # a TorchModel exists: torch is installed and loaded

    read: list[str] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torch.jit.TracerWarning)  # not once per place: every export is told
            yield read
    finally:  # a failed export's warnings too: the tracer's may say why it failed
        for warning in caught:
            if issubclass(warning.category, torch.jit.TracerWarning) and str(warning.message).startswith(_PYTHON_VALUE):
                place = f"{warning.filename}:{warning.lineno}"
                read.extend([] if place in read or installed(Path(os.path.realpath(warning.filename))) else [place])
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def rows_difference(torch_model: TorchModel, path: Path, feeds: Sequence[Any],
                    batch_size: int) -> tuple[str, list[Any]] | None:
    """How the export at `path` differs from forward() on the recipe's evaluation rows (`feeds`, one array per
    input), and the inputs it differs on; None when it agrees.

    Checked on ROWS_CHECKED rows spread over them in one batch; when forward() read a tensor as a Python value while
    traced (`python_values`), on every row in the evaluation's batches of `batch_size` instead: such a value (a batch
    sum's sign, a row's maximum) can differ from one batch to the next, and a check on one batch passed an export
    that computed another branch than forward() on half the batches scored (every torch-backend variant was then
    judged against a reference that was not the module, and breached)."""
    read = python_values(path)
    count = len(feeds[0])
    if read:
        batches: list[Any] = [slice(start, start + batch_size) for start in range(0, count, batch_size)]
    else:
        batches = [np.unique(np.linspace(0, count - 1, min(count, ROWS_CHECKED)).astype(int))]
    found: list[tuple[str, list[Any]]] = []

    def check(agreement: Agreement) -> str | None:
        session = _session(path)
        for rows in batches:
            inputs = [feed[rows] for feed in feeds]
            difference = export_difference(torch_model, path, inputs, session=session, agreement=agreement)
            if difference is not None:
                found.append((f"on {len(inputs[0])} evaluation rows the ONNX export's {difference}", inputs))
                return difference
        return None

    rows = feeds_digest(feeds)
    if rows is None:  # nothing to key a verdict by: checked every time
        check(Agreement())
    else:
        settings = {"key": torch_model.cache_key, "tolerance": EXPORT_TOLERANCE, "rows": rows, "python_values": read,
                    "batches": ROWS_CHECKED if not read else batch_size}  # fmt: skip
        checked(path.parent, path, "rows", settings,
                f"the ONNX export's check against forward() on the recipe's {count} evaluation rows", check)
    return found[0] if found else None


def rows_refusal(path: Path) -> str:
    """Why an export differs from forward() on the recipe's rows, and what to do."""
    read = python_values(path)
    if read:
        return (f": forward() reads a tensor as a Python value at {read[0]} (.item(), int(), bool(), an `if` on a "
                "tensor), and the export holds the value qbench's example gave; compute it with tensor operations "
                "(torch.where, no .item()) or export the model yourself and set model.path")
    return (": forward() takes a path the export did not record (data-dependent control flow, e.g. `if x.sum() > 0`); "
            "write it with tensor operations (torch.where) or export the model yourself and set model.path")
