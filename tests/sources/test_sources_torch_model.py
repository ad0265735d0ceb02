"""PyTorch model source: factory import, weights-only loading, cached and checked ONNX export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from qbench.cli.app import main  # noqa: E402
from qbench.digests import file_sha256  # noqa: E402
from qbench.errors import QbenchError, RecipeError  # noqa: E402
from qbench.recipe.spec import load_recipe  # noqa: E402
from qbench.sources import resolve_model  # noqa: E402
from qbench.sources.torch_export import export_reference  # noqa: E402
from qbench.sources.torch_model import (  # noqa: E402
    TorchModel,
    factory_source_path,
    load_torch_model,
)

FEATURES = 4
CLASSES = 3
MODELS_SOURCE = f'''
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear({FEATURES}, 16)
        self.head = nn.Linear(16, {CLASSES})

    def forward(self, features):
        return self.head(torch.relu(self.hidden(features)))


class Tagger(nn.Module):
    """Token ids and a mask in, one score per sequence out."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled), pooled


class OptionalMask(Tagger):
    """forward() as Hugging Face models write it: optional arguments, token_type_ids after attention_mask."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return super().forward(input_ids + (0 if token_type_ids is None else token_type_ids), mask)


def build_optional_mask():
    return OptionalMask()


class Untraceable(Classifier):
    """Runs eagerly, fails under the tracer (as a Hugging Face BertModel does: an argument passed twice)."""

    def forward(self, features):
        if torch.jit.is_tracing():
            raise TypeError("forward() got multiple values for argument 'use_cache'")
        return super().forward(features)


def build_untraceable():
    return Untraceable()


class HalfIsland(Classifier):
    """An FP16 island between float32 inputs and outputs, as a mixed-precision model ships."""

    def __init__(self):
        super().__init__()
        self.half()

    def forward(self, features):
        return super().forward(features.half()).float()


def build_half_island():
    return HalfIsland()


class NeedsEndToken(Classifier):
    """Checks what its inputs hold, as Hugging Face's BART heads do (an end-of-sequence token in every row)."""

    def forward(self, features):
        if not bool((features == 2).any(dim=1).all()):
            raise ValueError("Each example must contain at least one <eos> token.")
        return super().forward(features)


def build_needs_end_token():
    return NeedsEndToken()


class Branching(Classifier):
    """Data-dependent control flow: the trace keeps the branch the export's example took."""

    def forward(self, features):
        if (features < 0).any():
            return -self.head(torch.relu(self.hidden(features)))
        return self.head(torch.relu(self.hidden(features)))


class Scaled(Classifier):
    """A constructor that needs an argument, as training code's model classes do."""

    def __init__(self, scale, *, shift=0.0):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, features):
        return super().forward(features) * self.scale + self.shift


class ReadsAMaximum(Classifier):
    """Reads a batch's largest value as a Python number (.item()): the trace keeps the example's branch."""

    def forward(self, features):
        scores = super().forward(features)
        return -scores if features.max().item() > 5 else scores


def build_reads_a_maximum():
    return ReadsAMaximum()


class IgnoresMask(Classifier):
    def forward(self, features, mask):
        return self.head(torch.relu(self.hidden(features)))


class Pair(NamedTuple):
    scores: torch.Tensor
    hidden: torch.Tensor


@dataclass
class Result:
    scores: torch.Tensor


class PairClassifier(Classifier):
    def forward(self, features):
        hidden = torch.relu(self.hidden(features))
        return Pair(self.head(hidden), hidden)


class DataclassClassifier(Classifier):
    def forward(self, features):
        return Result(self.head(torch.relu(self.hidden(features))))


class KeywordOnly(Classifier):
    def forward(self, *, features):
        return self.head(torch.relu(self.hidden(features)))


def build_classifier():
    return Classifier()


class KeywordOnlyDefault(Classifier):
    """A keyword-only argument with a default, as training code adds options: called with `features` alone."""

    def forward(self, features, *, scale=None):
        scores = super().forward(features)
        return scores if scale is None else scores * scale


def build_keyword_only_default():
    return KeywordOnlyDefault()


def build_on_meta():
    """Built without values, as large models are (torch.device('meta')): the weights file supplies them."""
    with torch.device("meta"):
        return Classifier()


def build_keyword_only():
    return KeywordOnly()


def build_pair():
    return PairClassifier()


def build_dataclass():
    return DataclassClassifier()


class WithNumber(Classifier):
    def forward(self, features):
        scores = super().forward(features)
        return {{"scores": scores, "extra": (scores.sum(1), 0.5)}}


class PairsRows(Classifier):
    """Normalises the hidden units over groups of rows: the batch size is written as a number."""

    def forward(self, features):
        hidden = torch.relu(self.hidden(features)).view(2, -1)
        return self.head((hidden / hidden.norm(dim=1, keepdim=True)).view(-1, 16))


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Classifier()

    def forward(self, features):
        return self.model(features)


def build_wrapped():
    return Wrapped()


class NestedOutputs(Classifier):
    """Shaped like a Hugging Face ModelOutput (a dict): the task's output beside a tuple of hidden states."""

    def forward(self, features):
        hidden = torch.relu(self.hidden(features))
        return {{"logits": self.head(hidden), "hidden_states": (hidden, Pair(hidden * 2, hidden * 3))}}


def build_nested():
    return NestedOutputs()


def build_with_number():
    return WithNumber()


def build_pairs_rows():
    return PairsRows()


def build_branching():
    return Branching()


def build_ignores_mask():
    return IgnoresMask()


def build_sequential():
    """forward(input): users call the input `features`."""
    return nn.Sequential(nn.Linear({FEATURES}, 16), nn.ReLU(), nn.Linear(16, {CLASSES}))


class TakesADict(Classifier):
    """A training loop's model: forward() reads its tensors from one batch dict."""

    def forward(self, batch):
        return self.head(torch.relu(self.hidden(batch["features"])))


def build_takes_a_dict():
    return TakesADict()


class TakesATuple(Classifier):
    """forward() unpacks its tensors from one tuple, as a (features, mask) pair."""

    def forward(self, pair):
        features, mask = pair
        return self.head(torch.relu(self.hidden(features * mask)))


def build_takes_a_tuple():
    return TakesATuple()


class TakesKeywords(Classifier):
    def forward(self, **batch):
        return self.head(torch.relu(self.hidden(batch["features"])))


def build_takes_keywords():
    return TakesKeywords()


class Normalised(Classifier):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d({CLASSES})

    def forward(self, features):
        return self.norm(super().forward(features))


def build_normalised():
    return Normalised()


class AnyWidth(Classifier):
    """Runs on rows of any width of at least {FEATURES} (like a model over token sequences of any length)."""

    def forward(self, features):
        return self.head(torch.relu(self.hidden(features[:, :{FEATURES}])))


def build_any_width():
    return AnyWidth()


def build_tagger():
    return Tagger()


def not_a_module():
    return "a string"


def failing_factory():
    raise ValueError("no GPU here")


NOT_CALLABLE = 3
'''
PICKLED_REFUSAL = (
    "refused: it holds pickled Python objects, which could run code; "
    "save a plain state_dict with torch.save(model.state_dict(), path)"
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Exports go to a per-test cache; `mypkg` (written anew by every test) is forgotten afterwards."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous_threads)
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def _factory_namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(MODELS_SOURCE, "models.py", "exec"), namespace)  # the same classes the recipe's factory builds
    return namespace


def _trained_classifier(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return _factory_namespace()["build_classifier"]().eval()


def _write_project(root: Path, model: torch.nn.Module) -> None:
    """mypkg/models.py, weights.pt (a state_dict) and data.parquet (labels = the model's own predictions)."""
    package = root / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODELS_SOURCE)
    torch.save(model.state_dict(), root / "weights.pt")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, FEATURES)).astype(np.float32)
    with torch.no_grad():
        labels = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    pd.DataFrame(
        {
            "x": list(x),
            "label": labels.astype(np.int64),
            "split": ["calib"] * 60 + ["eval"] * 100,
            "band": np.where(x[:, 0] > 0, "high", "low"),
        }
    ).to_parquet(root / "data.parquet")


def _write_recipe(root: Path, model: dict[str, Any] | None = None, **overrides: Any) -> Path:
    recipe = {
        "name": "tiny-torch",
        "model": {
            "torch": "mypkg.models:build_classifier",
            "weights": "weights.pt",
            "example_inputs": {"features": [1, FEATURES]},
            "output_names": ["scores"],
            **(model or {}),
        },
        "data": {
            "path": "data.parquet",
            "inputs": {"x": "features"},
            "label": "label",
            "calibration": {"filter": {"split": "calib"}, "samples": 32, "batch_size": 16},
            "evaluation": {"filter": {"split": "eval"}},
            "slices": [{"by": "band"}],
        },
        "variants": [],
        "backends": ["onnxruntime-cpu"],
        "latency": {"batch_sizes": [1, 8], "warmup": 1, "iterations": 3},
        "gate": {"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5},
        "output_dir": str(root / "reports"),
        **overrides,
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in recipe.items() if v is not None}, sort_keys=False))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A recipe folder with a classifier factory, its weights and a data table; returns the recipe path."""
    _write_project(tmp_path, _trained_classifier())
    return _write_recipe(tmp_path)


def _load_error(recipe_path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        load_torch_model(load_recipe(recipe_path))
    return caught.value


# -- loading ------------------------------------------------------------------------------------


def test_build_returns_a_fresh_eval_module_with_the_weights_every_call(project: Path) -> None:
    saved = torch.load(project.parent / "weights.pt", weights_only=True)
    torch_model = load_torch_model(load_recipe(project))
    first, second = torch_model.build(), torch_model.build()
    assert first is not second and not first.training
    assert all(torch.equal(first.state_dict()[name], tensor) for name, tensor in saved.items())
    with torch.no_grad():
        first.hidden.weight.add_(1.0)  # what QAT or ModelOpt would do to their copy
    assert torch.equal(torch_model.build().hidden.weight, saved["hidden.weight"])
    assert (torch_model.input_names, torch_model.output_names, torch_model.opset) == (("features",), ("scores",), 17)


def test_the_weights_file_loaded_is_not_a_file_the_factory_read(project: Path) -> None:
    """A sweep loads a copy of model.weights (its snapshot, in a build store that may lie in the project): that copy
    is model.weights, an input of its own, not a checkpoint the factory read (recorded as one, the gate of a fresh
    checkout refused the results as stale for want of the copy)."""
    copy = project.parent / "store" / "weights.pt"
    copy.parent.mkdir()
    copy.write_bytes((project.parent / "weights.pt").read_bytes())
    torch_model = load_torch_model(load_recipe(project), weights=copy)
    assert not {Path(file).name for file in torch_model.read_files} & {"weights.pt"}


def test_example_inputs_have_the_declared_shape_with_the_batch_replaced(project: Path) -> None:
    torch_model = load_torch_model(load_recipe(project))
    (features,) = torch_model.example_inputs(batch=5)
    assert features.shape == (5, FEATURES) and features.dtype == torch.float32
    assert torch.equal(torch_model.example_inputs(batch=5)[0], features)  # the same on every call
    assert torch_model.example_inputs()[0].shape[0] == 2


def test_whole_pickled_module_is_refused_without_running_its_code(project: Path) -> None:
    marker = project.parent / "code-ran"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    torch.save({"hidden.weight": Payload()}, project.parent / "weights.pt")
    error = _load_error(project)
    assert error.field == "model.weights" and PICKLED_REFUSAL in error.detail
    assert not marker.exists()

    torch.save(torch.nn.Sequential(torch.nn.Linear(FEATURES, CLASSES)), project.parent / "weights.pt")  # a whole module
    error = _load_error(project)
    assert error.field == "model.weights" and PICKLED_REFUSAL in error.detail


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: {("renamed" if k == "hidden.weight" else k): v for k, v in s.items()},
         "missing 'hidden.weight'; unexpected 'renamed'"),
        (lambda s: {**s, "head.weight": torch.zeros(CLASSES, 7)}, "does not fit the module"),
        (lambda s: {"state_dict": s, "epoch": 3}, "entry 'state_dict' holds OrderedDict"),
        # keys that differ only by a prefix: a wrapper's state_dict, or a part's
        (lambda s: {f"module.{k}": v for k, v in s.items()}, "(every key in the file starts with 'module.' "
         "(a wrapper's state_dict: DataParallel's 'module.', torch.compile's '_orig_mod.'); save the wrapped "
         "module's own state_dict, or strip 'module.' from the keys)"),
        (lambda s: {f"_orig_mod.{k}": v for k, v in s.items()}, "every key in the file starts with '_orig_mod.'"),
    ],
    ids=["wrong-keys", "wrong-shape", "checkpoint", "dataparallel", "compiled"],
)  # fmt: skip
def test_a_state_dict_that_does_not_fit_is_a_recipe_error(project: Path, edit: Any, expected: str) -> None:
    state = torch.load(project.parent / "weights.pt", weights_only=True)
    torch.save(edit(state), project.parent / "weights.pt")
    error = _load_error(project)
    assert error.field == "model.weights"
    assert expected in error.detail


def test_the_state_dict_of_the_model_a_factory_wraps_is_refused_naming_the_prefix(project: Path) -> None:
    error = _load_error(_write_recipe(project.parent, {"torch": "mypkg.models:build_wrapped"}))
    assert error.field == "model.weights"
    assert error.detail.endswith("(the file's keys lack the module's prefix 'model.': it holds that submodule's "
                                 "state_dict; save the whole module's)")


def test_a_state_dict_torch_loads_is_accepted_as_torch_accepts_it(project: Path) -> None:
    """An older checkpoint (or a converted one: a plain dict without torch's version metadata) lacks BatchNorm's
    `num_batches_tracked`, which load_state_dict(strict=True) fills in; qbench must not be stricter than torch."""
    torch.manual_seed(1)
    module = _factory_namespace()["build_normalised"]()
    state = {name: tensor for name, tensor in module.state_dict().items() if not name.endswith("num_batches_tracked")}
    module.load_state_dict(state, strict=True)  # what torch accepts
    torch.save(state, project.parent / "weights.pt")
    loaded = load_torch_model(load_recipe(_write_recipe(project.parent, {"torch": "mypkg.models:build_normalised"})))
    assert torch.equal(loaded.build().norm.running_var, module.norm.running_var)
    torch.save({**state, "norm.extra": torch.zeros(1)}, project.parent / "weights.pt")  # what torch refuses
    assert "unexpected 'norm.extra'" in _load_error(project).detail


def test_unreadable_weights_file_is_a_recipe_error(project: Path) -> None:
    (project.parent / "weights.pt").write_bytes(b"not a checkpoint")
    error = _load_error(project)
    assert error.field == "model.weights" and "cannot read" in error.detail


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        ("nosuchpkg.models:build", "cannot find module 'nosuchpkg.models'"),
        ("mypkg.broken:build", "importing 'mypkg.broken' failed: ModuleNotFoundError: "
                               "No module named 'not_installed_dep'"),
        ("mypkg.models:build_clasifier", "has no attribute 'build_clasifier' (did you mean 'build_classifier'?)"),
        ("mypkg.models:NOT_CALLABLE", "mypkg.models:NOT_CALLABLE is int, not a callable"),
        ("mypkg.models:not_a_module", "returned str, expected a torch.nn.Module"),
        ("mypkg.models:failing_factory", "calling mypkg.models:failing_factory() failed: ValueError: no GPU here"),
    ],
)  # fmt: skip
def test_a_bad_factory_is_a_recipe_error_naming_the_cause(project: Path, factory: str, expected: str) -> None:
    (project.parent / "mypkg" / "broken.py").write_text("import not_installed_dep\n")
    error = _load_error(_write_recipe(project.parent, {"torch": factory}))
    assert error.field == "model.torch"
    assert expected in error.detail


@pytest.mark.parametrize(
    ("model", "field", "expected"),
    [
        ({"example_inputs": {"x": [1, FEATURES], "y": [1, FEATURES]}}, "model.example_inputs",
         "got 2 inputs ['x', 'y'], but forward() takes 1: ['features']"),
        ({"example_inputs": {"features": [1, 7]}}, "model.example_inputs",
         "forward() failed on example inputs {'features': [2, 7]}"),
        ({"output_names": ["a", "b"]}, "model.output_names", "got 2 names, but forward() returns 1 tensors"),
        # names go by position: a namedtuple's (or dict's) own names in another order named the wrong tensors
        ({"torch": "mypkg.models:build_pair", "output_names": ["hidden", "scores"]}, "model.output_names",
         "'hidden' is forward()'s output #2 (scores, hidden, in that order), named at position 1 here"),
        ({"torch": "mypkg.models:build_takes_keywords", "example_inputs": {"features": [1, FEATURES]}},
         "model.example_inputs", "forward() takes 0: [] (**batch keyword-only: the exporter passes inputs by "
         "position); expected a forward() taking them by position: make the factory return a wrapper module whose "
         "forward(features) calls the model as model(features=features)"),
        ({"torch": "mypkg.models:build_keyword_only", "example_inputs": {"features": [1, FEATURES]}},
         "model.example_inputs", "forward() takes 0: [] (features keyword-only: "
                                 "the exporter passes inputs by position); "
         "expected a forward() taking them by position: make the factory return a wrapper module whose "
         "forward(features) calls the model as model(features=features)"),
    ],
)  # fmt: skip
def test_example_inputs_and_output_names_must_fit_forward(
    project: Path, model: dict[str, Any], field: str, expected: str
) -> None:
    error = _load_error(_write_recipe(project.parent, model))
    assert error.field == field
    assert expected in error.detail


@pytest.mark.parametrize("example_inputs", [{"features": [1, FEATURES]}, {"features": [1, FEATURES], "mask": [1, 2]}])
def test_a_forward_that_takes_a_dict_is_refused_in_one_line_naming_the_remedy(
    project: Path, example_inputs: dict[str, list[int]]
) -> None:
    recipe = _write_recipe(project.parent,
                           {"torch": "mypkg.models:build_takes_a_dict", "example_inputs": example_inputs})
    error = _load_error(recipe)
    names = ", ".join(example_inputs)
    assert error.field == "model.torch"
    assert "forward() takes one dict of tensors" in error.detail
    assert f"passes the inputs by position as tensors, forward({names}); make the factory return a wrapper" in error.detail


def test_a_forward_that_takes_a_tuple_is_refused_in_one_line_naming_the_remedy(project: Path) -> None:
    """It was refused as `got 2 inputs ['features', 'mask'], but forward() takes 1: ['pair']`, with no remedy."""
    example_inputs = {"features": [1, FEATURES], "mask": [1, FEATURES]}
    error = _load_error(_write_recipe(project.parent, {"torch": "mypkg.models:build_takes_a_tuple",
                                                       "example_inputs": example_inputs}))  # fmt: skip
    assert error.field == "model.torch"
    assert error.detail == ("forward() takes one tuple of tensors (it runs on (<tensor>, <tensor>,)), but qbench "
                            "passes the inputs by position as tensors, forward(features, mask); make the factory "
                            "return a wrapper module whose forward(features, mask) calls the model with "
                            "(features, mask,)")  # fmt: skip


def test_inputs_named_like_forwards_arguments_bind_by_name_in_any_order(project: Path) -> None:
    recipe = _write_recipe(
        project.parent,
        {"torch": "mypkg.models:build_tagger", "weights": None, "output_names": None,
         "example_inputs": {"attention_mask": [1, 6], "input_ids": [1, 6]},
         "input_dtypes": {"attention_mask": "int64", "input_ids": "int64"}},
    )  # fmt: skip
    model = load_torch_model(load_recipe(recipe))
    assert model.input_names == ("input_ids", "attention_mask")


@pytest.mark.parametrize(("names", "expected"), [
    # bound by name, forward()'s order: the second tensor would be passed as attention_mask, and the ONNX input named
    # token_type_ids would compute as a mask (before, silently)
    (["input_ids", "token_type_ids"], "'token_type_ids' is forward()'s argument #3, but inputs are passed to forward() "
     "by position, so it would be passed as 'attention_mask' (#2); expected an example input for every argument "
     "before it (attention_mask)"),
    # bound by position (ids is no parameter's name): token_type_ids would reach attention_mask
    (["ids", "token_type_ids"], "'token_type_ids' is forward()'s argument #3, but inputs are passed to forward() by "
     "position, so it would be passed as 'attention_mask' (#2)"),
])  # fmt: skip
def test_an_input_named_after_a_forward_argument_it_would_not_reach_is_refused(
    project: Path, names: list[str], expected: str
) -> None:
    recipe = _write_recipe(
        project.parent,
        {"torch": "mypkg.models:build_optional_mask", "weights": None, "output_names": None,
         "example_inputs": {name: [1, 6] for name in names}, "input_dtypes": dict.fromkeys(names, "int64")},
    )  # fmt: skip
    error = _load_error(recipe)
    assert error.field == "model.example_inputs" and expected in error.detail


def test_a_keyword_only_argument_with_a_default_exports_what_forward_computes(project: Path) -> None:
    """The TorchScript exporter passed the keyword-only default as one more positional argument: forward(x, None)
    failed (takes 2 positional arguments but 3 were given) and the sweep exited 2 telling the user to write a
    wrapper, for a module that runs as qbench calls it."""
    recipe = load_recipe(_write_recipe(project.parent, {"torch": "mypkg.models:build_keyword_only_default"}))
    torch_model = load_torch_model(recipe)
    session = ort.InferenceSession(str(export_reference(torch_model)), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = _trained_classifier()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(["scores"], {"features": x})[0], expected, rtol=1e-5, atol=1e-6)
    assert [i.name for i in session.get_inputs()] == ["features"]


def test_a_module_built_on_the_meta_device_takes_the_weights_file_s_values(project: Path) -> None:
    """load_state_dict copied nothing into meta tensors: the module stayed on meta and forward() failed with a
    device mismatch blamed on model.example_inputs, though the weights file held every tensor."""
    torch_model = load_torch_model(load_recipe(_write_recipe(project.parent, {"torch": "mypkg.models:build_on_meta"})))
    x = torch.from_numpy(np.random.default_rng(4).normal(size=(5, FEATURES)).astype(np.float32))
    with torch.no_grad():
        np.testing.assert_array_equal(torch_model.build()(x).numpy(), _trained_classifier()(x).numpy())


def test_a_meta_module_without_weights_is_one_line_naming_model_weights(project: Path) -> None:
    error = _load_error(_write_recipe(project.parent, {"torch": "mypkg.models:build_on_meta", "weights": None}))
    assert error.field == "model.weights" and "\n" not in str(error)
    assert "build_on_meta() built the module on the meta device (shapes, no values): hidden.weight" in error.detail


def test_factory_arguments_reach_the_constructor_and_the_cache_key(project: Path) -> None:
    """The factory was called with no arguments: a model class whose constructor needs one (`torch:
    mypkg.models:Scaled`) could not be given at all; `model.factory_arguments` are its keyword arguments."""
    built = {}
    for scale in (2.0, 3.0):
        recipe = _write_recipe(project.parent, {"torch": "mypkg.models:Scaled",
                                                "factory_arguments": {"scale": scale, "shift": 0.5}})  # fmt: skip
        built[scale] = load_torch_model(load_recipe(recipe))
    x = torch.from_numpy(np.random.default_rng(5).normal(size=(5, FEATURES)).astype(np.float32))
    with torch.no_grad():
        expected = _trained_classifier()(x).numpy() * 3.0 + 0.5
        np.testing.assert_allclose(built[3.0].build()(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    assert built[2.0].cache_key != built[3.0].cache_key


@pytest.mark.parametrize(
    ("arguments", "field", "expected"),
    [
        ({}, "model.factory_arguments", "mypkg.models:Scaled() needs argument 'scale', which is not given; "
                                          "expected it in model.factory_arguments"),
        ({"scal": 2.0}, "model.factory_arguments.scal", "mypkg.models:Scaled() takes no argument 'scal' "
                                                         "(did you mean 'scale'?); it takes scale, shift"),
    ],
)  # fmt: skip
def test_a_factory_argument_missing_or_unknown_is_one_line_naming_the_field(
    project: Path, arguments: dict[str, Any], field: str, expected: str
) -> None:
    error = _load_error(_write_recipe(project.parent, {"torch": "mypkg.models:Scaled", "factory_arguments": arguments}))
    assert error.field == field and "\n" not in str(error)
    assert expected in error.detail


def test_a_missing_argument_without_default_is_refused(project: Path) -> None:
    recipe = _write_recipe(
        project.parent,
        {"torch": "mypkg.models:build_tagger", "weights": None, "output_names": None,
         "example_inputs": {"ids": [1, 6]}, "input_dtypes": {"ids": "int64"}},
    )  # fmt: skip
    error = _load_error(recipe)
    assert "forward() argument 'attention_mask' has no default and no example input: got ['ids']" in error.detail


def test_an_nn_sequential_binds_its_input_by_position_under_the_users_name(project: Path) -> None:
    """nn.Sequential.forward takes `input`; the recipe calls it `features`, which the ONNX input is named."""
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_sequential", "weights": None})
    model = load_torch_model(load_recipe(recipe))
    path = export_reference(model)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["features"]
    x = np.random.default_rng(0).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = model.build()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {"features": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_a_factory_edited_after_import_is_refused_in_the_same_process(project: Path) -> None:
    load_torch_model(load_recipe(project))
    models = project.parent / "mypkg" / "models.py"
    models.write_text(models.read_text() + "\n# edited\n")
    error = _load_error(project)
    assert error.field == "model.torch" and "changed after this process imported it" in error.detail


# -- the factory's source hash -----------------------------------------------------------------------


def test_fingerprint_follows_the_factory_source(project: Path) -> None:
    before = load_recipe(project).fingerprint()
    assert load_recipe(project).fingerprint() == before
    models = project.parent / "mypkg" / "models.py"
    models.write_text(models.read_text().replace("nn.Linear(16", "nn.Linear(16  "))
    assert load_recipe(project).fingerprint() != before


def test_factory_source_hash_imports_neither_the_package_nor_torch(project: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from qbench.digests import file_sha256\n"
        "from qbench.sources.torch_model import factory_source_path\n"
        f"print(file_sha256(factory_source_path('mypkg.models:build_classifier', Path({str(project.parent)!r}))))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mypkg')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    sha, imported = done.stdout.split()
    assert imported == "[]"
    assert sha == file_sha256(project.parent / "mypkg" / "models.py")
    with pytest.raises(QbenchError, match="cannot find module 'nosuchpkg.models'"):
        factory_source_path("nosuchpkg.models:build", project.parent)


# -- export ---------------------------------------------------------------------------------------


def test_export_runs_in_onnxruntime_like_torch_with_a_dynamic_batch(project: Path) -> None:
    torch_model = load_torch_model(load_recipe(project))
    path = export_reference(torch_model)
    assert path == Path(os.environ["QBENCH_CACHE_DIR"]) / "exports" / torch_model.cache_key / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["features"]
    assert [o.name for o in session.get_outputs()] == ["scores"]
    x = np.random.default_rng(1).normal(size=(7, FEATURES)).astype(np.float32)
    (scores,) = session.run(None, {"features": x})
    with torch.no_grad():
        expected = torch_model.build()(torch.from_numpy(x)).numpy()
    assert scores.shape == (7, CLASSES)
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=1e-4)


def test_second_export_is_served_from_the_cache(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_model(load_recipe(project)).onnx_path
    written = first.stat().st_mtime_ns

    def no_export(*args: Any, **kwargs: Any) -> Path:
        raise AssertionError("exported again despite a cached export")

    monkeypatch.setattr(TorchModel, "export", no_export)
    again = resolve_model(load_recipe(project))  # a fresh load: same factory, weights, shapes, opset
    assert again.onnx_path == first and first.stat().st_mtime_ns == written
    assert sorted(p.name for p in first.parent.iterdir()) == ["checks", "model.onnx"]  # no temp files left


def test_new_weights_or_opset_make_a_new_export(project: Path) -> None:
    first = load_torch_model(load_recipe(project))
    torch.save(_trained_classifier(seed=1).state_dict(), project.parent / "weights.pt")
    assert load_torch_model(load_recipe(project)).cache_key != first.cache_key
    torch.save(_trained_classifier(seed=0).state_dict(), project.parent / "weights.pt")
    assert load_torch_model(load_recipe(project)).cache_key == first.cache_key
    assert load_torch_model(load_recipe(_write_recipe(project.parent, {"opset": 18}))).cache_key != first.cache_key


def test_a_forward_the_tracer_cannot_run_is_refused_in_one_line_naming_model_torch(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the tracer's TypeError reached the CLI as `qbench: error: TypeError: ...`, naming neither the recipe
    nor its field, and the export folder kept nothing either way."""
    model = {"torch": "mypkg.models:build_untraceable", "weights": None}
    recipe = _write_recipe(project.parent, model, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert (f"{recipe}: model.torch: the ONNX export of mypkg.models:build_untraceable failed while tracing forward() "
            "on the example inputs: TypeError: forward() got multiple values for argument 'use_cache'; expected a "
            "forward() the TorchScript exporter can trace") in error


def test_an_export_that_differs_from_torch_is_refused_and_not_cached(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_export = TorchModel.export

    def export_other_weights(self: TorchModel, module: Any, path: Path, *, opset: int | None = None) -> Path:
        return real_export(self, _trained_classifier(seed=123), path, opset=opset)

    monkeypatch.setattr(TorchModel, "export", export_other_weights)
    torch_model = load_torch_model(load_recipe(project))
    with pytest.raises(QbenchError, match="output 'scores' differs from forward"):
        export_reference(torch_model)
    assert list((Path(os.environ["QBENCH_CACHE_DIR"]) / "exports" / torch_model.cache_key).iterdir()) == []


def test_integer_inputs_and_several_outputs_export_with_their_dtypes(project: Path) -> None:
    recipe = _write_recipe(
        project.parent,
        {"torch": "mypkg.models:build_tagger", "weights": None, "output_names": None,
         "example_inputs": {"input_ids": [1, 6], "attention_mask": [1, 6]},
         "input_dtypes": {"input_ids": "int64", "attention_mask": "int64"}},
    )  # fmt: skip
    torch_model = load_torch_model(load_recipe(recipe))
    ids, mask = torch_model.example_inputs(batch=3)
    assert ids.dtype == mask.dtype == torch.int64 and mask.tolist() == [[1, 1, 1, 1, 1, 0]] * 3  # both values per row
    assert torch_model.output_names == ("output_0", "output_1")
    session = ort.InferenceSession(str(export_reference(torch_model)), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)"), ("attention_mask", "tensor(int64)")
    ]  # fmt: skip
    feeds = {"input_ids": np.arange(30, dtype=np.int64).reshape(5, 6), "attention_mask": np.ones((5, 6), np.int64)}
    scores, pooled = session.run(None, feeds)  # a batch of 5: only the batch axis is dynamic
    with torch.no_grad():
        expected_scores, _ = torch_model.build()(*(torch.from_numpy(a) for a in feeds.values()))
    assert scores.shape == (5, 2) and pooled.shape == (5, 8)
    np.testing.assert_allclose(scores, expected_scores.numpy(), atol=1e-4, rtol=1e-4)


def test_an_export_that_took_another_branch_than_the_rows_take_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The export's random example is non-negative, the evaluation rows are not: forward() negates its scores on
    them and the exported graph does not. The reference would describe another model (FP32 accuracy 0.24 against
    0.89 seen on such a model), so the recipe is refused, naming model.torch."""
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_branching"},
                           variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert "model.torch: on 64 evaluation rows the ONNX export's output 'scores' differs from forward()'s" in error
    assert "forward() reads a tensor as a Python value at " in error and "models.py:" in error


def test_an_export_holding_a_python_value_is_checked_on_every_evaluation_batch(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """forward() negates its scores on a batch whose largest value passes 5 (read with .item()); the export holds
    the example's branch. One evaluation row passes 5, outside the 32 rows the export was checked on: the check
    passed, and every batch holding that row was scored against a reference that was not the module (torch-backend
    variants, which run forward(), breached against it)."""
    frame = pd.read_parquet(project.parent / "data.parquet")
    eval_rows = np.flatnonzero(frame["split"].to_numpy() == "eval")
    frame["x"] = [np.clip(x, -4, 4).astype(np.float32) for x in frame["x"]]
    frame.at[eval_rows[1], "x"] = np.full(FEATURES, 9.0, dtype=np.float32)  # not among the 32 spread rows checked
    frame.to_parquet(project.parent / "data.parquet")
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_reads_a_maximum"},
                           variants=[{"name": "fp16", "precision": "fp16"}])  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert "model.torch: on 64 evaluation rows the ONNX export's output 'scores' differs from forward()'s" in error
    assert "forward() reads a tensor as a Python value at " in error and "models.py:" in error


def test_a_number_among_forwards_outputs_is_named_by_its_place(project: Path) -> None:
    error = _load_error(_write_recipe(project.parent,
                                      {"torch": "mypkg.models:build_with_number", "output_names": None}))
    assert error.field == "model.torch"
    assert error.detail == ("forward()'s output['extra'][1] is a float; expected every item it returns to be a tensor "
                            "(or None): return a number as a tensor, or leave it out")


def test_a_forward_that_mixes_rows_is_refused_with_a_remedy_for_a_module(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """x.view(2, -1) in forward() itself: export and module agree at any batch, but rows are normalised in pairs
    of whatever size the batch makes them. The remedy said to export batch-first, which a module's author cannot."""
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_pairs_rows", "output_names": None},
                           variants=[{"name": "fp16", "precision": "fp16"}])  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert "recipe.yaml: model.torch: model input features ['batch', 4]: row " in error
    assert "forward() combines rows: a batch size written as a number (x.view(2, -1), not x.view(x.size(0), -1))" in error
    assert "batch-first (e.g." not in error


def test_namedtuple_outputs_are_named_by_their_fields_and_a_dataclass_is_refused_in_one_line(project: Path) -> None:
    named = load_torch_model(load_recipe(_write_recipe(project.parent, {"torch": "mypkg.models:build_pair",
                                                                       "output_names": None})))  # fmt: skip
    assert named.output_names == ("scores", "hidden")
    error = _load_error(_write_recipe(project.parent, {"torch": "mypkg.models:build_dataclass", "output_names": None}))
    assert str(error).endswith("recipe.yaml: model.torch: forward() returned a Result; expected a tensor, or a tuple, "
                               "list or dict of tensors (return dataclasses.astuple(...) or a dict)")


def test_a_forward_argument_the_model_ignores_stays_an_input_of_the_export(project: Path) -> None:
    """The TorchScript exporter drops an unused argument; feeding it then failed with ORT's 'Invalid input name'."""
    model = {"torch": "mypkg.models:build_ignores_mask",
             "example_inputs": {"features": [1, FEATURES], "mask": [1, FEATURES]}}
    recipe = _write_recipe(project.parent, model, variants=[{"name": "fp16", "precision": "fp16"}])
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["inputs"] = {"x": "features", "x_again": "mask"}
    frame = pd.read_parquet(project.parent / "data.parquet")
    frame.assign(x_again=frame["x"]).to_parquet(project.parent / "data.parquet")
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    session = ort.InferenceSession(str(export_reference(load_torch_model(load_recipe(recipe)))))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("features", "tensor(float)"),
                                                                ("mask", "tensor(float)")]
    assert main(["sweep", str(recipe), "--no-track"]) == 0


# -- through the CLI -----------------------------------------------------------------------------------


def test_validate_accepts_a_torch_source_recipe(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = _write_recipe(project.parent, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 0
    assert "OK" in capsys.readouterr().out


def test_cells_that_do_not_fit_the_example_shape_name_model_example_inputs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exported input keeps the example's width (6); the rows hold 4 values: the shape to change is the
    example's, which data.inputs does not set."""
    model = {"torch": "mypkg.models:build_any_width", "example_inputs": {"features": [1, 6]}}
    recipe = _write_recipe(project.parent, model, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 2
    assert ("model.example_inputs: input 'features' is exported with shape [1, 6] (batch first), but column 'x' holds "
            "cells of shape [4]: a PyTorch source's inputs keep the example's sizes after the batch axis; set "
            "features: [1, 4]") in capsys.readouterr().err  # fmt: skip


def test_cells_of_several_sizes_are_refused_as_data_not_as_one_example_shape(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unpadded token lists fit no example shape; before, the error told to set the example to the first row's size."""
    table = pd.read_parquet(project.parent / "data.parquet")
    table["x"] = [np.concatenate([cell, np.zeros(index % 3, cell.dtype)]) for index, cell in enumerate(table["x"])]
    table.to_parquet(project.parent / "data.parquet")
    model = {"torch": "mypkg.models:build_any_width", "example_inputs": {"features": [1, 6]}}
    recipe = _write_recipe(project.parent, model, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert "data.inputs: column 'x' holds cells of different lengths" in error and "pad them to one size" in error
    assert "model.example_inputs" not in error


def test_validate_accepts_a_modelopt_variant(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every `quantizer: modelopt` recipe failed at validate and sweep start: `qbench: error: AttributeError:
    'VariantSpec' object has no attribute 'calibration'` (the check was handed the variant, not its config)."""
    pytest.importorskip("modelopt.torch.quantization")
    variants = [{"name": "int8-mo", "precision": "int8", "calibrator": "minmax", "quantizer": "modelopt"}]
    assert main(["validate", str(_write_recipe(project.parent, variants=variants))]) == 0, capsys.readouterr().err


def test_sweep_builds_every_variant_from_the_exported_reference(project: Path) -> None:
    variants = [
        {"name": "fp16", "precision": "fp16"},
        {"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"},
    ]
    recipe = _write_recipe(project.parent, variants=variants)
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    (results_file,) = (project.parent / "reports" / "tiny-torch").glob("*/results.json")
    results = json.loads(results_file.read_text())
    statuses = {(v["variant"], v["backend"]): (v["status"], v.get("error")) for v in results["variants"]}
    assert set(statuses) == {("fp32", "onnxruntime-cpu"), ("fp16", "onnxruntime-cpu"),
                             ("int8-minmax", "onnxruntime-cpu")}
    assert all(status == "ok" for status, _ in statuses.values()), statuses
    assert results["recipe"]["model_source"] == "mypkg.models:build_classifier"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_weights_saved_in_16_bits_are_named_in_the_fp32_references_note(project: Path, dtype: str) -> None:
    """A state_dict saved in float16/bfloat16 is widened into the FP32 module, and its export holds float32 weights
    rounded to that type: no node showed it, so the reference was plain 'fp32' while every drop was measured from
    that rounding (an ONNX reference storing its weights in float16 behind a Cast is noted for)."""
    weights = project.parent / "weights.pt"
    state = torch.load(weights, weights_only=True)
    torch.save({name: tensor.to(getattr(torch, dtype)) for name, tensor in state.items()}, weights)
    recipe = _write_recipe(project.parent, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    (results_file,) = (project.parent / "reports" / "tiny-torch").glob("*/results.json")
    [reference] = [v for v in json.loads(results_file.read_text())["variants"] if v["variant"] == "fp32"]
    said = f"weights in {dtype} (rounded, stored as float32) and widens them to float when it runs"
    assert said in reference["params"]["stored_weights"]
    assert said in (results_file.parent / "report.md").read_text()


def test_a_module_with_an_fp16_island_is_refused_saying_qbench_made_it_fp32(project: Path) -> None:
    """qbench makes the module FP32 before anything runs: a forward() casting to float16 itself then failed with
    torch's dtype mismatch alone, which reads as a bug in the user's model."""
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_half_island", "weights": None})
    error = str(_load_error(recipe))
    assert "model.example_inputs: forward() failed on example inputs" in error
    assert "qbench runs the module in FP32 (module.float()" in error and "\n" not in error


def test_a_forward_refusing_the_examples_values_is_told_what_they_hold_and_the_way_out(project: Path) -> None:
    """BartForSequenceClassification raised on qbench's all-zero token ids, and the line blamed
    model.example_inputs, whose shapes were right: the user could change nothing there."""
    recipe = _write_recipe(project.parent, {"torch": "mypkg.models:build_needs_end_token"})
    error = _load_error(recipe)
    assert error.field == "model.example_inputs" and "\n" not in str(error)
    assert "{'features': [2, 4]} (floats uniform in [0, 1), integers 0, uint8 pixels uniform in 0..255, masks and bools 1" \
           " but at the last" in error.detail
    assert "ValueError: Each example must contain at least one <eos> token." in error.detail
    assert "export it to ONNX yourself on real rows and give model.path" in error.detail


def test_a_forward_refusing_uint8_examples_is_told_they_hold_pixels_not_zeros(project: Path) -> None:
    """uint8 inputs are fed pixels uniform in 0..255, not the zeros of other integers: the line said "integers 0"
    of an image model fed uint8, which is not what it ran on."""
    recipe = _write_recipe(project.parent, {"input_dtypes": {"features": "uint8"}})
    error = _load_error(recipe)
    assert error.field == "model.example_inputs" and "\n" not in str(error)
    assert "(floats uniform in [0, 1), integers 0, uint8 pixels uniform in 0..255, masks and bools 1 but" in error.detail


# -- the demo's PyTorch-source recipe ---------------------------------------------------------------


def test_demo_torch_recipe_rebuilds_the_demo_onnx_model(digits_project: Path) -> None:
    from qbench.demo.digits import MODEL_FILE, TORCH_RECIPE_FILE

    recipe = load_recipe(digits_project / TORCH_RECIPE_FILE)
    assert recipe.weights_path == (digits_project / "models" / "digits.pt").resolve()
    assert [v.name for v in recipe.variants] == ["fp16", "bf16", "int8-minmax", "int8-dynamic", "fp8"]
    torch_model = load_torch_model(recipe)
    images = np.random.default_rng(0).uniform(size=(16, 1, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(str(digits_project / MODEL_FILE), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"input": images})
    with torch.no_grad():
        expected = torch_model.build()(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)


def test_tensors_nested_in_named_outputs_are_named_by_their_path(project: Path) -> None:
    """They were output_0..output_3, so `model.output: logits` (a ModelOutput's own name) named no output."""
    recipe = _write_recipe(project.parent,
                           {"torch": "mypkg.models:build_nested", "output_names": None, "output": "logits"},
                           variants=[{"name": "fp16", "precision": "fp16"}])  # fmt: skip
    torch_model = load_torch_model(load_recipe(recipe))
    assert torch_model.output_names == ("logits", "hidden_states.0", "hidden_states.1.scores", "hidden_states.1.hidden")
    session = ort.InferenceSession(str(export_reference(torch_model)), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = torch_model.build()(torch.from_numpy(x))["logits"].numpy()
    np.testing.assert_allclose(session.run(["logits"], {"features": x})[0], expected, rtol=1e-5, atol=1e-6)
    assert main(["validate", str(recipe)]) == 0


def test_output_names_may_rename_forwards_own_names_in_their_order(project: Path) -> None:
    renamed = load_torch_model(load_recipe(_write_recipe(project.parent, {"torch": "mypkg.models:build_pair",
                                                                         "output_names": ["logits", "embedding"]})))  # fmt: skip
    assert renamed.output_names == ("logits", "embedding")


# -- a sweep's snapshot ---------------------------------------------------------------------------


def test_with_a_snapshot_the_weights_are_its_copy_and_the_factory_the_recorded_source(project: Path, tmp_path: Path) -> None:
    from qbench.execute.snapshot import take_snapshot
    from qbench.provenance import input_digests

    recipe = load_recipe(project)
    inputs = input_digests(recipe)
    snapshot = take_snapshot(inputs, tmp_path / "sources")
    expected = resolve_model(recipe).torch.cache_key  # type: ignore[union-attr]
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]
    torch.save(_trained_classifier(seed=1).state_dict(), project.parent / "weights.pt")  # after the sweep hashed it
    assert resolve_model(recipe, snapshot).torch.cache_key == expected  # type: ignore[union-attr]
    assert resolve_model(recipe).torch.cache_key != expected  # type: ignore[union-attr]

    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]
    (project.parent / "mypkg" / "models.py").write_text(MODELS_SOURCE + "\n# edited\n")
    with pytest.raises(QbenchError, match=r"mypkg/models\.py changed while the sweep read it; run again$"):
        resolve_model(recipe, snapshot)


def test_an_export_cache_on_a_full_disk_is_one_line_naming_it_not_advice_on_forward(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exporter writing into qbench's cache met a full disk: the error read as forward() failing to trace (`expected
    a forward() the TorchScript exporter can trace: make the factory return a wrapper module ...`). Now it names the
    cache folder and the disk's reason."""
    import errno

    from qbench.files import cache_dir

    def full_disk(self: TorchModel, module: Any, path: Path, *, opset: int | None = None) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(TorchModel, "export", full_disk)
    recipe = _write_recipe(project.parent, variants=[{"name": "fp16", "precision": "fp16"}])
    assert main(["validate", str(recipe)]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    folder = cache_dir() / "exports" / load_torch_model(load_recipe(recipe)).cache_key
    assert line == f"error: {folder}: cannot write the ONNX export: No space left on device"
