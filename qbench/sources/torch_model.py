"""A PyTorch module as the FP32 source: import the factory, load a weights-only state_dict, export once.

Trust model: the factory (`model.torch: package.module:factory`) is code the user chose to run, imported like any Python
import with the recipe's folder first on `sys.path`. The weights are data, and data must not run code: they are read
with `torch.load(weights_only=True)`, which refuses files holding pickled Python objects (a whole `torch.save(model)`);
only a plain state_dict loads.

The FP32 reference is exported with the TorchScript exporter and cached in `$QBENCH_CACHE_DIR` (default
`~/.cache/qbench`) as `exports/<key>/model.onnx` (`qbench.sources.torch_export`). The key hashes what the export depends
on: the module's tensors after loading, the source files of every class in the module (its submodules' classes and their
bases, wherever they are defined), every file of the user's project the process has imported once the module is built
and has run (modules under the recipe's folder or the factory module's, so a helper forward() calls from another file;
installed packages and the standard library are left out), the example shapes and dtypes, the output names, the opset
and the torch version. Code outside the project (an installed package) is not in the key: a cached export is checked
against forward() before it is reused, and exported again when it differs.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.digests import file_sha256
from qbench.errors import MissingExtraError, QbenchError, RecipeError
from qbench.recipe.spec import Recipe
from qbench.sources.torch_factory import call_factory, describe
from qbench.sources.torch_lengths import dynamic_lengths
from qbench.sources.torch_outputs import flatten_outputs, own_names
from qbench.sources.torch_settings import settings_sha256
from qbench.sources.torch_weights import load_weights, refuse_meta_tensors
from qbench.sources.torch_wrappers import eval_mode, generated_code_sha256, guard_remedy, is_script_module, unwrapped
from qbench.user_code import EditedAfterImport, files_read, module_source, not_found, project_sources_sha256

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    import torch

EXAMPLE_BATCH = 2  # a batch of 1 can be special-cased by exporters
_EXPORT_FORMAT = 2  # bump when the export settings change, so older cached exports are not reused
_EXAMPLE_SEED = 0


@dataclass(frozen=True, eq=False)
class TorchModel:
    """The recipe's PyTorch model with its weights, and how to export it.

    `build()` deep-copies a template that is never handed out, so every caller (QAT,
    ModelOpt, the torch backends) gets a fresh FP32 module with the same weights,
    whatever the factory does on its own (random init, returning a cached module).
    """

    factory: str
    input_shapes: dict[str, tuple[int, ...]]  # forward()'s arguments in order -> example shape
    input_dtypes: dict[str, str]  # every input; default float32
    output_names: tuple[str, ...]
    opset: int
    cache_key: str
    _template: Any = field(repr=False)  # torch.nn.Module, FP32, eval mode
    factory_source_sha256: str = ""  # of the factory's module source as imported
    lengths: Mapping[str, Mapping[int, str]] = field(default_factory=dict)  # input -> {axis: name}, dynamic beside 0
    length_field: str = ""  # the recipe field that makes `lengths` vary (qbench.sources.torch_lengths)
    read_files: frozenset[str] = frozenset()  # what the factory opened to read (provenance.factory_file_digests)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.input_shapes)

    def build(self) -> torch.nn.Module:
        """A fresh FP32 copy of the model with its weights, in eval mode."""
        return eval_mode(copy.deepcopy(self._template))

    def example_inputs(self, batch: int = EXAMPLE_BATCH, length: int | None = None, *,
                       ids_as_masks: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
        """One tensor per input: the declared shape with `batch` as first dim (and `length` on the dynamic `lengths`
        axes, when given), the declared dtype; `ids_as_masks`: integer inputs hold what masks hold (_example_inputs)."""
        shapes = self.input_shapes
        if length is not None:
            shapes = {name: tuple(length if axis in self.lengths.get(name, {}) else size
                                  for axis, size in enumerate(shape))
                      for name, shape in shapes.items()}  # fmt: skip
        return _example_inputs(shapes, self.input_dtypes, batch, ids_as_masks=ids_as_masks)

    @property
    def takes_ids(self) -> bool:
        """Whether an input is integer and no mask: one the example fills with zeros (_example_inputs)."""
        return any(_holds_ids(name, dtype) for name, dtype in self.input_dtypes.items())

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """Every input's and output's dynamic axes for the exporter: the batch, and the inputs' `lengths`."""
        return {name: {0: "batch", **self.lengths.get(name, {})} for name in (*self.input_names, *self.output_names)}

    def export(self, module: torch.nn.Module, path: Path, *, opset: int | None = None) -> Path:
        """Export `module` (this model, or a quantized / QAT form of it) to one ONNX file.

        The TorchScript exporter (`dynamo=False`) on purpose: it exported ModelOpt-quantized
        modules where the dynamo exporter failed, and ran 10x faster. Every input and
        output gets a dynamic batch axis, and the inputs their `lengths` axes (the other axes keep the example's
        sizes).
        """
        torch = _import_torch()
        path.parent.mkdir(parents=True, exist_ok=True)
        with single_torch_thread(), warnings.catch_warnings(), _inputs_by_position(module):
            warnings.filterwarnings("ignore", message=".*TorchScript-based ONNX export", category=DeprecationWarning)
            torch.onnx.export(
                module,
                self.example_inputs(),
                str(path),
                dynamo=False,
                input_names=list(self.input_names),
                output_names=list(self.output_names),
                dynamic_axes=self.dynamic_axes(),
                opset_version=opset or self.opset,
                do_constant_folding=True,
            )
        _declare_unused_inputs(path, dict(zip(self.input_names, self.example_inputs(), strict=True)),
                               self.dynamic_axes())  # fmt: skip
        return path


@contextlib.contextmanager
def _inputs_by_position(module: torch.nn.Module) -> Iterator[None]:
    """Show the exporter a forward() that takes the inputs alone, as qbench calls it everywhere else.

    The TorchScript exporter appends the default of every forward() parameter past the inputs it is given as one
    more positional argument, keyword-only ones included: `forward(x, *, mask=None)` was called `forward(x, None)`
    and the export failed (TypeError: takes 2 positional arguments but 3 were given). An instance attribute, so the
    module's own names (and so the ONNX graph's node and initializer names) stay as they are."""
    if is_script_module(module):  # compiled: takes its inputs by position already, and its forward cannot be replaced
        yield
        return
    own = module.__dict__.get("forward")
    forward = module.forward

    def by_position(*inputs: Any) -> Any:
        return forward(*inputs)

    module.forward = by_position
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


# -- the factory's source file (nothing imported) -------------------------------------------------


def factory_source_path(spec: str, search_dir: Path) -> Path:
    """The source file of `spec`'s module ('package.module:factory'), found as an import would
    find it with `search_dir` (the recipe's folder) first on sys.path; neither it nor torch is imported."""
    module_name = spec.partition(":")[0]
    source = module_source(module_name, search_dir)
    if source is None:
        raise QbenchError(f"model.torch: {not_found(module_name, search_dir)}")
    return source


# -- loading ------------------------------------------------------------------------------------


def load_torch_model(recipe: Recipe, *, weights: Path | None = None) -> TorchModel:
    """Import the recipe's factory, build the module, load its weights, check it runs on the example inputs.

    The factory is imported like any Python code, with the recipe's folder put first on
    sys.path (so `mypkg/models.py` next to the recipe imports as `mypkg.models`); it is
    called with no arguments and must return an nn.Module. The weights, when given, are
    a state_dict read with `torch.load(weights_only=True)` and loaded strictly, from
    `weights` (a sweep's copy of them) or else the recipe's `model.weights`.
    """
    torch = _import_torch()
    spec = recipe.model
    if spec.torch is None or not spec.example_inputs:
        raise RecipeError(recipe.source, "model.torch", "this recipe's model is an ONNX file, not a PyTorch factory")
    module_name = spec.torch.partition(":")[0]
    source = module_source(module_name, recipe.base_dir)
    if source is None:
        raise RecipeError(recipe.source, "model.torch", not_found(module_name, recipe.base_dir))
    with single_torch_thread():
        module, read = _build_template(recipe, source, weights or recipe.weights_path)
        order = _bind_forward_arguments(recipe, module, list(spec.example_inputs))
        shapes = {name: tuple(spec.example_inputs[name]) for name in order}
        dtypes = {name: spec.input_dtype(name) for name in shapes}
        output_names = _output_names(recipe, module, _example_inputs(shapes, dtypes, EXAMPLE_BATCH))
    lengths, length_field = dynamic_lengths(recipe, shapes)
    source_sha256 = file_sha256(source)
    key = {
        "format": _EXPORT_FORMAT, "factory": spec.torch, "factory_source": source_sha256,
        "state": _state_sha256(module), "settings": settings_sha256(module), "classes": _class_sources_sha256(module),
        "project": _project_sources_sha256(recipe, source), "example_inputs": shapes, "input_dtypes": dtypes,
        "output_names": output_names, "opset": spec.opset, "torch": torch.__version__,
        "factory_arguments": spec.factory_arguments,
        "lengths": {name: {str(axis): dim for axis, dim in axes.items()} for name, axes in lengths.items()},
    }  # fmt: skip
    if generated := generated_code_sha256(module):  # only where there is some: other modules' keys stay as they were
        key["generated_code"] = generated
    return TorchModel(
        factory=spec.torch,
        input_shapes=shapes,
        input_dtypes=dtypes,
        output_names=output_names,
        opset=spec.opset,
        cache_key=hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest(),
        _template=module,
        factory_source_sha256=source_sha256,
        read_files=read,
        lengths=lengths,
        length_field=length_field,
    )


EXAMPLE_VALUES = ("floats uniform in [0, 1), integers 0, uint8 pixels uniform in 0..255, masks and bools 1 but at the "
                  "last position")  # _example_inputs


def _holds_ids(name: str, dtype: str) -> bool:
    return dtype in ("int64", "int32") and "mask" not in name.lower()


def _example_inputs(shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str], batch: int, *,
                    ids_as_masks: bool = False) -> tuple[Any, ...]:  # fmt: skip
    """The same tensors on every call. Floating inputs are uniform in [0, 1) from a fixed seed; integer
    inputs are zeros (a valid index for any embedding) except uint8 ones, pixels of an image a model normalises
    itself (uniform in 0..255, as a trace check on an all-black image shows no scale or offset wrong), and masks
    (by name) and bools, which are ones but
    for the last position of each row: a mask of one value is degenerate under one of the two conventions
    (an all-zero attention mask keeps nothing; an all-True key_padding_mask, True = padding, masks every key
    and nn.MultiheadAttention returns NaN), while one holding both keeps some positions under either.
    `ids_as_masks`: the integer inputs hold the masks' values too (token ids 1 but a padding 0 at the last
    position), for a model that masks its own padding from ids == 0 (qbench.sources.torch_export)."""
    torch = _import_torch()
    generator = torch.Generator().manual_seed(_EXAMPLE_SEED)
    tensors = []
    for name, shape in shapes.items():
        size, dtype = (batch, *shape[1:]), getattr(torch, dtypes[name])
        if dtype.is_floating_point:
            tensors.append(torch.rand(size, generator=generator).to(dtype))
        elif dtype == torch.uint8 and "mask" not in name.lower():
            tensors.append(torch.randint(0, 256, size, generator=generator, dtype=dtype))
        elif dtype == torch.bool or "mask" in name.lower() or ids_as_masks:
            mask = torch.ones(size, dtype=dtype)
            if len(size) > 1 and size[-1] > 1:
                mask[..., -1] = 0
            tensors.append(mask)
        else:
            tensors.append(torch.zeros(size, dtype=dtype))
    return tuple(tensors)


def _build_template(recipe: Recipe, source: Path, weights: Path | None) -> tuple[torch.nn.Module, frozenset[str]]:
    """Call the factory, make the module FP32, load the weights, switch to eval; with the files the factory itself
    opened to read (`weights` is not one: a sweep's copy of model.weights, an input of its own)."""
    torch = _import_torch()
    factory_name = recipe.model.torch or ""
    with files_read() as read:
        module = call_factory(recipe, source)
    if not isinstance(module, torch.nn.Module):
        returned = f"{factory_name}() returned {type(module).__name__}, expected a torch.nn.Module"
        raise RecipeError(recipe.source, "model.torch", returned)
    module = unwrapped(module).float()
    if weights is not None:
        load_weights(recipe, module, weights)
        module = module.float()  # a meta module takes the file's tensors as they are stored (float16 ones too)
    refuse_meta_tensors(recipe, module, weights)
    return eval_mode(module), frozenset(read)


def _bind_forward_arguments(recipe: Recipe, module: torch.nn.Module, names: list[str]) -> list[str]:
    """example_inputs in the order forward() takes them: by name when every name is a parameter, else by position.

    The names become the ONNX input names either way, so they need not be forward()'s
    (an nn.Sequential takes `input`; its users call it `features`). Only a count that
    cannot fit is refused: more inputs than positional parameters, or a parameter
    without a default left uncovered.
    """
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a compiled or scripted forward: nothing to compare with
        return names
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return names  # forward(*args) accepts any number
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    _refuse_names_at_other_positions(recipe, names, positional)
    if set(names) <= set(positional):
        names = [name for name in positional if name in names]  # by name
        covered = set(names)
    elif len(names) > len(positional):
        _refuse_a_mapping_forward(recipe, module, {name: tuple(recipe.model.example_inputs[name]) for name in names})
        keyword_only = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
        keyword_only += [f"**{p.name}" for p in parameters if p.kind is p.VAR_KEYWORD]
        message = f"got {len(names)} inputs {names}, but forward() takes {len(positional)}: {positional}"
        if keyword_only:
            calls = ", ".join(name if i < len(positional) else f"{name}={name}" for i, name in enumerate(names))
            message += (f" ({', '.join(keyword_only)} keyword-only: the exporter passes inputs by position); expected "
                        f"a forward() taking them by position: make the factory return a wrapper module whose "
                        f"forward({', '.join(names)}) calls the model as model({calls})")  # fmt: skip
        raise RecipeError(recipe.source, "model.example_inputs", message)
    else:
        covered = set(positional[: len(names)])  # by position
    uncovered = [p.name for p in parameters if p.name not in covered and p.default is p.empty
                 and p.kind is not p.VAR_KEYWORD]
    if uncovered:
        message = f"forward() argument {uncovered[0]!r} has no default and no example input: got {names}"
        raise RecipeError(recipe.source, "model.example_inputs", message)
    return names


def _refuse_names_at_other_positions(recipe: Recipe, names: list[str], positional: list[str]) -> None:
    """Refuse an input named after a forward() parameter it would not reach: inputs are passed by position, so
    `{input_ids, token_type_ids}` for a BERT's `forward(input_ids, attention_mask, token_type_ids, ...)` would give
    an ONNX input named token_type_ids that silently computes as the mask."""
    order = [name for name in positional if name in names] if set(names) <= set(positional) else names
    for index, (name, reached) in enumerate(zip(order, positional, strict=False)):
        if name in positional and reached != name:
            at = positional.index(name)
            missing = ", ".join(p for p in positional[:at] if p not in names)
            message = (f"{name!r} is forward()'s argument #{at + 1}, but inputs are passed to forward() by position, "
                       f"so it would be passed as {reached!r} (#{index + 1}); expected an example input for every "
                       f"argument before it ({missing}), or a factory returning a wrapper module whose forward() "
                       f"takes exactly {', '.join(order)}")
            raise RecipeError(recipe.source, "model.example_inputs", message)


def _refuse_a_mapping_forward(recipe: Recipe, module: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse, in one line, a forward() that takes one dict (`batch["features"]`) or tuple of tensors, which fails on
    the positional tensors the exporter passes with an error from inside the user's code (an IndexError).

    Found by calling forward() once with the example inputs as one dict, then as one tuple: only called once forward()
    has failed."""
    torch = _import_torch()
    dtypes = {name: recipe.model.input_dtype(name) for name in shapes}
    tensors = _example_inputs(shapes, dtypes, EXAMPLE_BATCH)
    arguments = ", ".join(shapes)
    forms = (  # (what forward() takes, what it runs on, the wrapper's call)
        ("dict", dict(zip(shapes, tensors, strict=True)), f"{{{', '.join(f'{n!r}: <tensor>' for n in shapes)}}}",
         f"{{{', '.join(f'{n!r}: {n}' for n in shapes)}}}"),
        ("tuple", tuple(tensors), f"({', '.join('<tensor>' for _ in shapes)},)", f"({arguments},)"),
    )  # fmt: skip
    for kind, batch, runs_on, call in forms:
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module(batch)
        except Exception:  # noqa: BLE001 - not this form: the caller reports the original failure
            continue
        message = (f"forward() takes one {kind} of tensors (it runs on {runs_on}), but qbench passes the inputs by "
                   f"position as tensors, forward({arguments}); make the factory return a wrapper module whose "
                   f"forward({arguments}) calls the model with {call}")  # fmt: skip
        raise RecipeError(recipe.source, "model.torch", message)


def _values_hint(exc: Exception) -> str:
    """What to do when forward() refuses the example's values rather than its shapes or dtypes: a model that checks
    what its inputs hold (BART's heads want an end-of-sequence token in every row) cannot be traced on them."""
    if not isinstance(exc, ValueError) or _half_hint(exc):
        return ""
    return ("; a forward() that needs its inputs to hold particular values (a token it looks for) cannot be exported "
            "from qbench's example: export it to ONNX yourself on real rows and give model.path")


def _half_hint(exc: Exception) -> str:
    """Why a forward() that meets a float16/bfloat16 tensor fails: qbench made the module FP32 (`_build_template`),
    so one that casts its inputs or activations to a 16-bit type itself (an FP16 island) mixes the two types."""
    if not any(kind in str(exc) for kind in ("Half", "BFloat16")):
        return ""
    return ("; qbench runs the module in FP32 (module.float(): the reference every variant is built from and judged "
            "against), so a forward() that casts to float16/bfloat16 itself, or a float16 input in "
            "model.input_dtypes, mixes types: give the FP32 module and let the fp16/bf16 variants lower it")


def _output_names(recipe: Recipe, module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[str, ...]:
    """The recipe's output names (checked against what forward returns), else dict keys, 'output' or 'output_<i>'."""
    torch = _import_torch()
    try:
        with torch.no_grad():
            outputs = module(*inputs)
    except Exception as exc:  # noqa: BLE001 - the shapes or dtypes do not fit the user's model
        examples = recipe.model.example_inputs or {}
        _refuse_a_mapping_forward(recipe, module, {name: tuple(shape) for name, shape in examples.items()})
        shapes = {name: [EXAMPLE_BATCH, *shape[1:]] for name, shape in examples.items()}
        guarded = guard_remedy(exc)
        message = (f"forward() failed on example inputs {shapes} ({EXAMPLE_VALUES}): {describe(exc)}"
                   f"{_half_hint(exc)}{_values_hint(exc)}{f'; {guarded}' if guarded else ''}")  # fmt: skip
        raise RecipeError(recipe.source, "model.example_inputs", message) from exc
    try:
        count = len(flatten_outputs(outputs))
    except QbenchError as exc:
        raise RecipeError(recipe.source, "model.torch", str(exc).removeprefix("model.torch: ")) from None
    given = recipe.model.output_names
    own = own_names(outputs, count)
    if given is not None:
        if len(given) != count:
            message = f"got {len(given)} names, but forward() returns {count} tensors"
            raise RecipeError(recipe.source, "model.output_names", message)
        moved = [name for index, name in enumerate(given) if name in (own or ()) and own.index(name) != index]
        if moved:  # names go by position: a key named at another position names another tensor
            message = (f"{moved[0]!r} is forward()'s output #{own.index(moved[0]) + 1} ({', '.join(own)}, in that "
                       f"order), named at position {list(given).index(moved[0]) + 1} here: names are given by "
                       "position; expected them in forward()'s order, or output_names left out (its names are used)")
            raise RecipeError(recipe.source, "model.output_names", message)
        return tuple(given)
    if own is not None:
        return own
    return ("output",) if count == 1 else tuple(f"output_{index}" for index in range(count))


def _state_sha256(module: torch.nn.Module) -> str:
    """sha256 over the module's tensors (names, dtypes, shapes, bytes): the weights as they will be exported."""
    torch = _import_torch()
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def _class_sources_sha256(module: torch.nn.Module) -> dict[str, str]:
    """Python module name -> sha256 of its source file, for every class in `module` (each submodule's class and
    its bases): a model whose classes live beside the factory's module (`mypkg/layers.py`) is exported anew when
    they are edited. Names, not paths: the same project in another folder reuses its exports."""
    files: dict[str, str] = {}
    for cls in {cls for submodule in module.modules() for cls in type(submodule).__mro__}:
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):  # a built-in class (object), or one defined without a file
            continue
        if path is not None and cls.__module__ not in files and Path(path).is_file():
            files[cls.__module__] = file_sha256(Path(path))
    return dict(sorted(files.items()))


def _project_sources_sha256(recipe: Recipe, source: Path) -> dict[str, str]:
    """Python module name -> sha256 of its file, for every module of the user's project this process has imported
    (under the recipe's folder or the factory module's), read after the factory built the module and forward()
    ran: a helper forward() calls from another file is exported anew when edited. The checks of a cached export
    run on a few inputs only, and can miss such an edit (all-0 token ids pool alike by mean or first token)."""
    try:
        sources = project_sources_sha256((recipe.base_dir, source.parent))
    except EditedAfterImport as exc:  # the key would name code this process does not run
        raise RecipeError(recipe.source, "model.torch", str(exc)) from None
    return {name: sha for name, (_, sha) in sources.items()}


# -- the cached FP32 export (qbench.sources.torch_export) ----------------------------------------


def _declare_unused_inputs(path: Path, examples: Mapping[str, torch.Tensor],
                           dynamic: Mapping[str, Mapping[int, str]]) -> None:
    """Declare forward() arguments the exporter dropped (the model ignores them) as graph inputs nothing reads, with
    the `dynamic` axes the others have, so the exported graph takes the feeds the module takes."""
    import onnx

    model = onnx.load(str(path))
    present = {i.name for i in model.graph.input}
    missing = [name for name in examples if name not in present]
    if not missing:
        return
    for name in missing:
        example = examples[name].numpy()
        elem = onnx.helper.np_dtype_to_tensor_dtype(example.dtype)
        dims = [dynamic[name].get(axis, size) for axis, size in enumerate(example.shape)]
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, dims))
    onnx.save(model, str(path))


# -- helpers ------------------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingExtraError("torch", "torch", "install it first: pip install torch==2.13.0") from None
    return torch


@contextlib.contextmanager
def single_torch_thread() -> Iterator[None]:
    """torch on 2-core machines runs 5-15x slower with 2 OpenMP threads than with 1; the count is restored after."""
    torch = _import_torch()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
