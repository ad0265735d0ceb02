"""Whether results are fresh: the recipe's sections that decide them, its input files and the measured model files as
they were when the sweep ran. Each function returns problems (one line each); any makes the results unusable (the
gate's exit 2) or, for `qbench explain`, says which results it cannot rebuild from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import QbenchError, short_repr
from qbench.provenance import (
    changed_inputs,
    image_files_input,
    image_inputs,
    input_files,
    model_sha256,
    recorded_factory_files,
    recorded_module_files,
)
from qbench.recipe.spec import JUDGED_SECTIONS, RESULT_SECTIONS, Recipe, load_recipe
from qbench.results.schema import SweepResults

if TYPE_CHECKING:
    from qbench.modelinfo.signature import ModelInfo

logger = logging.getLogger(__name__)


def stale_sections(current: Recipe, recorded: Recipe) -> list[str]:
    """Sections of the recipe that decide the results and differ from the recipe the sweep ran."""
    if current.name != recorded.name:
        return [f"the results are from recipe {recorded.name!r}, not {current.name!r}"]
    changed = _changed_sections(current, recorded)
    if another_recipe_file(current, recorded):
        return [f"stale results: the newest run of recipe {current.name!r} was swept from {recorded.source}, not "
                f"{current.source}, and its section(s) {', '.join(map(repr, changed))} differ: recipe files sharing a "
                f"name and output_dir write their runs to one folder; give each its own name, or re-run `qbench sweep "
                f"{current.source}`"]  # fmt: skip
    return [f"stale results: recipe section {section!r} changed since the sweep: re-run `qbench sweep`"
            for section in changed]


def another_recipe_file(current: Recipe, recorded: Recipe) -> bool:
    """Whether results of `current`'s name were swept from another recipe file whose sections deciding them differ:
    two files of one name and output_dir write their runs to one folder, and the newest is judged, so its inputs
    (another data file) say nothing of `current`'s. Files are told apart by their names: a project moved or checked
    out elsewhere (CI) keeps its recipe's file name, not its path."""
    if Path(current.source).name == Path(recorded.source).name:
        return False
    return bool(_changed_sections(current, recorded))


def edited_recipe_file(recorded: Recipe, results_file: Path) -> list[str]:
    """A note, for `qbench gate --results FILE` alone (judged by the recipe the results embed), where the recipe file
    they were swept from is still there and now asks for something else: a gate.max_drop tightened since, or a section
    the figures depend on. The verdict printed is then not the one `qbench gate <that file>` gives (the tightened
    gate's breach, or stale results), and nothing said so."""
    path = Path(recorded.source)
    if not path.is_file():
        return []  # a project checked out elsewhere (CI): no file to compare with
    try:
        current = load_recipe(path)
    except QbenchError as exc:
        return [f"judged by the recipe these results embed; the recipe file they were swept from no longer loads: "
                f"{exc}"]
    changed = _changed_sections(current, recorded, (*RESULT_SECTIONS, *JUDGED_SECTIONS))
    if not changed:
        return []
    return [f"judged by the recipe these results embed, but the recipe file {path} they were swept from now differs in "
            f"section(s) {', '.join(map(repr, changed))}: `qbench gate {path} --results {results_file}` judges by the "
            "file's"]


def _changed_sections(current: Recipe, recorded: Recipe, sections: tuple[str, ...] = RESULT_SECTIONS) -> list[str]:
    now = current.model_dump(mode="json", include=set(sections))
    then = recorded.model_dump(mode="json", include=set(sections))
    return [section for section in sections if now.get(section) != then.get(section)]


def changed_fields(current: Recipe, recorded: Recipe, sections: tuple[str, ...]) -> list[str]:
    """'gate.max_drop 0.0 -> 0.05' for each field of `sections` whose value differs between the two recipes (a section
    present in one alone: 'slo absent -> {...}')."""
    now = current.model_dump(mode="json", include=set(sections))
    then = recorded.model_dump(mode="json", include=set(sections))
    changes = []
    for section in _changed_sections(current, recorded, sections):
        old, new = then.get(section), now.get(section)
        if not (isinstance(old, dict) and isinstance(new, dict)):
            changes.append(f"{section} {_shown(old)} -> {_shown(new)}")
            continue
        changes += [f"{section}.{key} {_shown(old.get(key))} -> {_shown(new.get(key))}"
                    for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]  # fmt: skip
    return changes


def _shown(value: object) -> str:
    return "absent" if value is None else short_repr(value)


def stale_inputs(results: SweepResults, recipe: Recipe) -> tuple[list[str], list[str]]:
    """(problems, inputs that can no longer be read): inputs whose content changed since the sweep.

    `recipe` (the one given, else the one the results embed) says which inputs decide the results: each must
    have a recorded digest matching its file now. The results' own record never decides which of those inputs
    are checked: one whose entry was dropped would leave its file unchecked. It adds the modules of the project
    the recipe's code imported, and the files its PyTorch factory read, which only the sweep that ran it can name
    (their records are `project_modules` and `factory_files` evidence: results without them cannot be judged)."""
    if not results.inputs:
        return ["inputs: the results record no input digests, so they cannot be checked for staleness"], []
    files = {**input_files(recipe), **recorded_module_files(results.inputs, recipe),
             **recorded_factory_files(results.inputs, recipe)}  # fmt: skip
    try:
        images = {name: entry.sha256 for name, entry in image_inputs(recipe).items()}
    except QbenchError as exc:  # the table naming the images is unreadable now: they cannot be what was measured
        images = {image_files_input(column): f"unreadable: {exc}" for column in recipe.data.image_columns}
    check = changed_inputs(results.inputs, files, images)
    problems = [
        f"stale results: {name} ({files.get(name, results.inputs[name]['path'])}) changed since the sweep: re-run "
        "`qbench sweep`" if name in results.inputs else
        f"stale results: the recipe reads {name}, but the results record no digest of it: re-run `qbench sweep`"
        for name in check.changed
    ]  # fmt: skip
    return problems, list(check.missing)


def changed_models(results: SweepResults) -> list[str]:
    """Measured model files that no longer hold the model measured (their recorded `model_sha256`).

    The figures describe the model the sweep measured; a file replaced or edited since (the run folder's copy that
    `qbench export`, `qbench track` and a deployment take) is not what they describe. A file that is gone is no
    problem: the results stay intact without it (they are often judged away from their run folder).
    """
    problems: list[str] = []
    checked: set[str] = set()
    for result in results.variants:
        path = result.model_path
        if result.status != "ok" or not path or not result.model_sha256 or path in checked:
            continue
        checked.add(path)
        if Path(path).is_file() and model_sha256(Path(path)) != result.model_sha256:
            problems.append(f"{result.key}: the model file {path} is not the model measured (its sha256 differs "
                            "from the recorded model_sha256: replaced or edited after the sweep); re-run "
                            "`qbench sweep`")
    return problems


def measured_export(results: SweepResults, recipe: Recipe) -> Path | None:
    """For a PyTorch source, the ONNX export its FP32 reference was measured as (a result's `model_path`), where the
    file is still there and holds that model (its recorded `model_sha256`): which inputs the sweep digested by their
    values, and as which types, is a fact of that graph (an input forward() never reads is left out of the digests),
    and the recipe does not state it. None for an ONNX source (the recipe names its model) or an export gone."""
    if recipe.model.torch is None:
        return None
    for result in results.variants:
        path = Path(result.model_path) if result.model_path else None
        if (result.variant == results.reference and result.status == "ok" and path is not None and path.is_file()
                and result.model_sha256 and model_sha256(path) == result.model_sha256):  # fmt: skip
            return path
    return None


@dataclass(frozen=True)
class MeasuredModel:
    """The ONNX file the sweep measured and its signature, read once per gate run for every check that needs it (the
    batch sizes timed, the slices' input types): each read of a dynamic-batch model runs onnx's shape inference. `path`
    is None where there is no file, `signature` None where there is no readable ONNX model."""

    path: Path | None
    signature: ModelInfo | None


def read_measured_model(recipe: Recipe, export: Path | None = None) -> MeasuredModel:
    """The ONNX model the sweep measured: a PyTorch source's `export` (`measured_export`) or an ONNX source's file, read
    now (never from an earlier read of the same path: a file rewritten in place is read as it is)."""
    from qbench.modelinfo.signature import read_model_info

    path = export or recipe.model_path
    if path is None or not path.is_file():
        return MeasuredModel(None, None)
    try:
        return MeasuredModel(path, read_model_info(path))
    except Exception:  # noqa: BLE001 - only with --no-staleness-check can it be other than the sweep's model
        logger.info("the model's signature is not read: %s is not a readable ONNX model", path)
        return MeasuredModel(path, None)
