"""What a sweep's results were made from: a content digest of every input, so the gate can say what changed.

The inputs of a recipe are the ONNX model and each of its external-data files, or the PyTorch
factory's source file and its weights; the data file, a separate calibration file, each text
column's tokenizer folder, and each image column's files (those its rows name, under its root or by
absolute path: qbench.data.image_files). `input_digests` hashes each of them (the recipe's fingerprint
is made from these digests); results.json records them as {input: {path, sha256}}; `changed_inputs`
recomputes them at gate time.

Code the recipe names (the factory, custom metrics) imports more of the user's project: a model class in
`mypkg/layers.py` beside a factory in `mypkg/models.py`. Which modules is known only once the code ran, so the sweep
records them after its preparation imported it (`project_module_digests`), and again once its jobs ran it (a metric
importing a helper inside its function, when first called), and the gate re-hashes each module the
results record (`recorded_module_files`): an edit to the model's class no longer leaves the old figures judged.
The files of the project a PyTorch factory opened to read as it built the module (a checkpoint it loads itself, not
through model.weights) are recorded alike (`factory_file_digests`, `recorded_factory_files`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.errors import QbenchError, RecipeError
from qbench.recipe.data import ImageInputSpec
from qbench.user_code import installed, module_source, not_found

if TYPE_CHECKING:  # pragma: no cover
    from qbench.digests import FileKey
    from qbench.recipe.spec import Recipe


EXTERNAL_DATA_INPUT = "model external data "  # + the file's location relative to the model's folder
TOKENIZER_INPUT_SUFFIX = ".tokenizer.path folder"  # data.inputs.<column> + this: a text column's tokenizer folder
PROJECT_MODULE_INPUT = "python module "  # + its name: a module of the user's project the recipe's code imported
FACTORY_FILE_INPUT = "model.torch read "  # + its path from the recipe's folder: a project file the factory read


def image_files_input(column: str) -> str:
    """The input name of the files image column `column` names (recorded with its root folder as its path)."""
    return f"data.inputs.{column}.image files"


def tokenizer_input(column: str) -> str:
    """The input name of text column `column`'s tokenizer folder."""
    return f"data.inputs.{column}{TOKENIZER_INPUT_SUFFIX}"


def metric_source_input(index: int) -> str:
    """The input name of the source file of the recipe's metrics[index] function."""
    return f"metrics[{index}] source"


@dataclass(frozen=True)
class InputDigest:
    path: str
    sha256: str
    # an image column's files: name -> sha256 of its bytes (qbench.data.image_files), what a snapshot copies; the
    # results record only path and sha256
    files: Mapping[str, str] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class InputCheck:
    """Recorded inputs recomputed: which changed, and which can no longer be read."""

    changed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def input_files(recipe: Recipe) -> dict[str, Path]:
    """Input name -> the file or folder it is read from, for every input that decides the results."""
    files: dict[str, Path] = {}
    if recipe.model_path is not None:
        files["model"] = recipe.model_path
        # a model that is gone has no external data to list: the gate names the model itself as gone
        for location in external_data_locations(recipe.model_path) if recipe.model_path.is_file() else ():
            files[f"{EXTERNAL_DATA_INPUT}{location}"] = recipe.model_path.parent / location
    if recipe.model.torch is not None:
        from qbench.sources.torch_model import factory_source_path

        files["model.torch source"] = factory_source_path(recipe.model.torch, recipe.base_dir)
    if recipe.weights_path is not None:
        files["model.weights"] = recipe.weights_path
    files["data"] = recipe.data_path
    if recipe.calibration_data_path is not None:
        files["data.calibration"] = recipe.calibration_data_path
    for index, metric in enumerate(recipe.metrics):
        module_name = metric.function.partition(":")[0]
        source = module_source(module_name, recipe.base_dir)
        if source is None:
            raise QbenchError(f"metrics[{index}].function: {not_found(module_name, recipe.base_dir)}")
        files[metric_source_input(index)] = source
    for column, spec in recipe.data.inputs.items():
        if isinstance(spec, str):
            continue
        if isinstance(spec, ImageInputSpec):
            from qbench.data.images import image_root

            files[image_files_input(column)] = image_root(spec.image, recipe_file=recipe.source, column=column)
            continue
        from qbench.data.text import resolve_tokenizer_folder, tokenizer_field

        folder = resolve_tokenizer_folder(spec.tokenizer.path, recipe_file=recipe.source, field=tokenizer_field(column))
        files[tokenizer_input(column)] = folder
    return files


def code_modules(recipe: Recipe) -> list[str]:
    """The modules the recipe names as code (model.torch's factory, each metric's function), in recipe order."""
    return [spec.partition(":")[0] for spec in (recipe.model.torch, *(m.function for m in recipe.metrics)) if spec]


def project_module_digests(recipe: Recipe) -> dict[str, InputDigest]:
    """Each module of the user's project this process has imported, by input name, where the recipe names code
    (qbench.user_code.project_sources_sha256 under the recipe's folder and that of each module it names), those
    modules aside: called once the sweep imported that code, whatever it imports in turn. None for a recipe that
    names no code."""
    from qbench.user_code import EditedAfterImport, project_sources_sha256

    named = code_modules(recipe)
    if not named:
        return {}
    try:
        sources = project_sources_sha256(_project_roots(recipe))
    except EditedAfterImport as exc:  # its digest would name code the sweep does not run
        raise QbenchError(f"{recipe.source}: {exc}") from None
    return {f"{PROJECT_MODULE_INPUT}{name}": InputDigest(str(path), sha) for name, (path, sha) in sources.items()
            if name not in named}  # those are inputs of their own (`input_files`)


def _project_roots(recipe: Recipe) -> list[Path]:
    """The folders the user's project is under: the recipe's, and that of each module the recipe names as code."""
    named = code_modules(recipe)
    roots = [recipe.base_dir, *(source.parent for name in named if (source := module_source(name, recipe.base_dir)))]
    return list(dict.fromkeys(roots))


def factory_file_digests(recipe: Recipe, files: Iterable[str]) -> dict[str, InputDigest]:
    """Of `files` (the paths a PyTorch factory opened to read: TorchModel.read_files), each of the user's project (under
    `_project_roots`, no module source, no installed package's, not model.weights: inputs of their own) by input name:
    a checkpoint or config the factory loads itself decides the module as model.weights does, and a gate comparing
    its code alone judged figures of weights replaced since."""
    from qbench.digests import file_sha256

    roots = [Path(os.path.realpath(root)) for root in _project_roots(recipe)]
    weights = Path(os.path.realpath(recipe.weights_path)) if recipe.weights_path is not None else None
    digests = {}
    for file in sorted(files):
        path = Path(os.path.realpath(file))
        if (path.suffix in (".py", ".pyc") or path == weights or not path.is_file() or installed(path)
                or not any(path.is_relative_to(root) for root in roots)):  # fmt: skip
            continue
        relative = Path(os.path.relpath(path, os.path.realpath(recipe.base_dir))).as_posix()
        digests[f"{FACTORY_FILE_INPUT}{relative}"] = InputDigest(str(path), file_sha256(path))
    return digests


def recorded_factory_files(recorded: Iterable[str], recipe: Recipe) -> dict[str, Path]:
    """The file now of each file the factory read that `recorded` (a results file's input names) names, at its place
    from the recipe's folder (a project checked out elsewhere included)."""
    return {name: recipe.base_dir / name.removeprefix(FACTORY_FILE_INPUT) for name in recorded
            if name.startswith(FACTORY_FILE_INPUT)}  # fmt: skip


def recorded_module_files(recorded: Iterable[str], recipe: Recipe) -> dict[str, Path]:
    """The file now of each project module `recorded` (a results file's input names) names, found by its name as an
    import from the recipe's folder finds it (a project checked out elsewhere, as CI does, included). One no import
    finds now is left out: the recipe's code no longer imports what the sweep ran (changed_inputs: changed)."""
    found = {name: module_source(name.removeprefix(PROJECT_MODULE_INPUT), recipe.base_dir)
             for name in recorded if name.startswith(PROJECT_MODULE_INPUT)}  # fmt: skip
    return {name: path for name, path in found.items() if path is not None}


def input_digests(recipe: Recipe) -> dict[str, InputDigest]:
    """Input name -> its path and the sha256 of its content (a folder: every file's name and bytes)."""
    from qbench.digests import file_sha256

    files = input_files(recipe)
    for name, path in files.items():
        if name.startswith(EXTERNAL_DATA_INPUT) and recipe.model_path is not None:  # as `qbench validate` says it
            if not path.exists():
                raise RecipeError(recipe.source, "model.path", f"ONNX model {recipe.model_path} keeps its weights in "
                                  f"{name.removeprefix(EXTERNAL_DATA_INPUT)!r}, not found in "
                                  f"{recipe.model_path.parent}")  # fmt: skip
        elif not path.exists():
            raise QbenchError(f"{recipe.source}: {name}: {path} not found")
    images = image_inputs(recipe)
    return {name: images.get(name) or InputDigest(str(path), file_sha256(path)) for name, path in files.items()}


def image_inputs(recipe: Recipe) -> dict[str, InputDigest]:
    """Image files input name -> its root, the digest of the files its rows name, and those files' digests."""
    from qbench.data.image_files import referenced_images

    return {image_files_input(column): InputDigest(str(found.root), found.sha256, found.files)
            for column, found in referenced_images(recipe).items()}  # fmt: skip


def changed_inputs(
    recorded: Mapping[str, Any], current: Mapping[str, Path] | None = None, digests: Mapping[str, str] | None = None
) -> InputCheck:  # fmt: skip
    """Compare recorded digests with the `current` input files (a recipe's `input_files`), or with the
    recorded paths hashed again now; `digests` holds the current digest of an input that is not one file or
    folder's (an image column's files: `image_inputs`).

    An input whose file is gone is missing (not an error: the gate reports it by name); one recorded
    but absent from `current`, or in `current` but not recorded (the recipe gained an input since the
    sweep), is changed.
    """
    from qbench.digests import file_sha256

    digests = digests or {}
    paths = current if current is not None else {name: Path(entry["path"]) for name, entry in recorded.items()}
    changed: list[str] = []
    missing: list[str] = []
    for name, entry in recorded.items():
        path = paths.get(name)
        if path is None:
            changed.append(name)
        elif not path.exists():
            missing.append(f"{name} ({path})")
        elif (digests[name] if name in digests else file_sha256(path)) != entry["sha256"]:
            changed.append(name)
    changed.extend(name for name in paths if name not in recorded)
    return InputCheck(tuple(changed), tuple(missing))


def external_data_locations(model_path: Path) -> list[str]:
    """The model's external-data files; a file ONNX cannot parse has none (its own digest still counts,
    and preflight rejects it by name). Remembered while the file's identity, size and times stay the same:
    finding them parses the whole graph (90 MB for a small transformer), and measuring asks at every run."""
    from qbench.digests import file_key
    from qbench.modelinfo.signature import external_data_files

    key, settled = file_key(model_path)
    if key in _EXTERNAL_DATA:
        return list(_EXTERNAL_DATA[key])
    try:
        found = external_data_files(model_path)
    except QbenchError:
        raise
    except Exception:  # noqa: BLE001 - onnx raises DecodeError, OSError...
        found = []
    if settled:
        if len(_EXTERNAL_DATA) >= 256:
            _EXTERNAL_DATA.clear()
        _EXTERNAL_DATA[key] = tuple(found)
    return found


_EXTERNAL_DATA: dict[FileKey, tuple[str, ...]] = {}


def model_sha256(path: Path) -> str:
    """sha256 identifying an ONNX model's content: the model file, then each external-data file (name and bytes).

    Two variants with equal digests are the same graph with the same weights (the frontier treats them as one).
    """
    import hashlib

    from qbench.digests import file_sha256

    digest = hashlib.sha256(file_sha256(path).encode())
    for location in external_data_locations(path):
        digest.update(f"{location}:{file_sha256(path.parent / location)}".encode())
    return digest.hexdigest()


def model_bytes(path: Path) -> int:
    """An ONNX model's size on disk: the model file and each of its external-data files (big models keep their
    weights there: the .onnx alone can be a few KB)."""
    return path.stat().st_size + sum((path.parent / location).stat().st_size
                                     for location in external_data_locations(path))


def recipe_record(recipe: Recipe) -> dict[str, Any]:
    """The recipe as results.json embeds it, with its digest: every field the recipe file set (parsing it
    again gives this recipe, defaults filled in; a dump with the defaults would trip the checks that
    reject options set for the wrong kind of model or variant)."""
    from qbench.results.schema import canonical_sha256

    resolved = recipe.model_dump(mode="json", exclude_unset=True)
    return {"resolved": resolved, "resolved_sha256": canonical_sha256(resolved)}


def recorded_recipe(record: Mapping[str, Any], results_file: Path) -> Recipe:
    """The recipe embedded in results (see `recipe_record`), checked against its digest; relative paths
    resolve against the recipe file's folder recorded at sweep time."""
    from pydantic import ValidationError

    from qbench.recipe.spec import Recipe
    from qbench.results.schema import canonical_sha256

    resolved = record.get("resolved")
    if not isinstance(resolved, dict):
        raise QbenchError(f"{results_file}: recipe.resolved: missing: the results do not say what the recipe asked for")
    if record.get("resolved_sha256") != canonical_sha256(resolved):
        raise QbenchError(f"{results_file}: recipe.resolved: does not match "
                          "recipe.resolved_sha256 (edited after the sweep)")
    try:
        recipe = Recipe.model_validate(resolved)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise QbenchError(f"{results_file}: recipe.resolved.{where}: {first['msg']}") from None
    recipe._source = Path(str(record.get("path", results_file)))
    return recipe
