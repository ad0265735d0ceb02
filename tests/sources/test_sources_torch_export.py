"""The cached FP32 export of a PyTorch source: checked at a batch other than the example's, re-checked when reused,
keyed by the source files of the module's classes and of the user's project."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from qbench.errors import RecipeError  # noqa: E402
from qbench.recipe.spec import load_recipe  # noqa: E402
from qbench.sources import resolve_model  # noqa: E402
from qbench.sources.torch_export import export_reference  # noqa: E402
from qbench.sources.torch_model import load_torch_model  # noqa: E402

FEATURES = 4
# forward() calls `ops.act`, a function in another file than the factory's and the classes'
OPS_SOURCE = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
LAYERS_SOURCE = '''
import torch
from torch import nn

from mypkg import ops


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, features):
        return self.head(ops.act(self.hidden(features)))


class PerRowLoop(Net):
    """A Python loop over the rows: the trace unrolls it for the example's 2 rows."""

    def forward(self, features):
        return torch.stack([super(PerRowLoop, self).forward(features[i]) for i in range(features.shape[0])])


class KeyPadded(nn.Module):
    """Token ids and a bool key_padding_mask (True = padding, PyTorch's convention) through nn.MultiheadAttention."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, pad_mask):
        x = self.embed(ids)
        y, _ = self.attention(x, x, x, key_padding_mask=pad_mask, need_weights=False)
        return self.head(y.mean(1))


class IdsPadded(nn.Module):
    """Token ids whose padding (id 0) the module masks itself, as nn.TransformerEncoder's src_key_padding_mask."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8, padding_idx=0)
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        real = (ids != 0).to(torch.int64)
        hidden = self.encoder(self.embed(ids), src_key_padding_mask=real == 0)
        weights = real.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0))


class Overflows(Net):
    def forward(self, features):
        return super().forward(features) * 1e39


class Masked(Net):
    """A head masking what no decision reads with -inf, as a QA head masks the question and the padding."""

    def forward(self, features):
        return super().forward(features).masked_fill(torch.arange(3) == 2, float("-inf"))


class Sampled(Net):
    """A VAE-style sampler: the mean plus noise drawn in forward(), eval mode or not."""

    def forward(self, features):
        mean = super().forward(features)
        return mean + 0.05 * torch.randn_like(mean)


class Dropped(Net):
    """Dropout forced on whatever the module's mode."""

    def forward(self, features):
        return torch.nn.functional.dropout(super().forward(features), 0.5, training=True)


class RunningMean(Net):
    """A running mean of the inputs updated on every call, training or not, and subtracted from them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, features):
        self.seen.mul_(0.9).add_(0.1 * features.mean())
        self.calls += 1
        return super().forward(features - self.seen)


class Normed(Net):
    """BatchNorm (running statistics away from any batch's) and Dropout, returned by its factory in train mode."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(16)
        self.norm.running_mean.fill_(0.5)
        self.norm.running_var.fill_(4.0)
        self.drop = nn.Dropout(0.5)

    def forward(self, features):
        return self.head(self.drop(self.norm(ops.act(self.hidden(features)))))


class Counting(Net):
    """Counts its calls in a buffer its outputs never read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, features):
        self.calls += 1
        return super().forward(features)


class NumberedBatch(Net):
    """int() turns the traced batch size into a number: the export keeps the example's 2."""

    def forward(self, features):
        hidden = ops.act(self.hidden(features))
        return self.head(hidden.reshape(int(hidden.shape[0]), -1))
'''
MODELS_SOURCE = '''
import torch

from mypkg.layers import (Counting, Dropped, IdsPadded, KeyPadded, Masked, Net, Normed, NumberedBatch, Overflows,
                          PerRowLoop, RunningMean, Sampled)


def build():
    torch.manual_seed(0)  # the same weights on every load, without a weights file
    return Net()


def build_loop():
    return PerRowLoop()


def build_numbered():
    return NumberedBatch()


def build_key_padded():
    torch.manual_seed(0)
    return KeyPadded()


def build_ids_padded():
    torch.manual_seed(0)
    return IdsPadded()


def build_overflows():
    return Overflows()


def build_masked():
    torch.manual_seed(0)
    return Masked()


def build_sampled():
    return Sampled()


def build_dropped():
    return Dropped()


def build_running_mean():
    torch.manual_seed(0)
    return RunningMean()


def build_in_train_mode():
    torch.manual_seed(0)
    return Normed().train()


def build_counting():
    torch.manual_seed(0)
    return Counting()
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    yield
    _forget_mypkg()


def _forget_mypkg() -> None:
    """As a new process would: the next load imports mypkg (and extops) from its files again."""
    for name in [m for m in sys.modules if m in ("mypkg", "extops") or m.startswith("mypkg.")]:
        del sys.modules[name]


def _project(root: Path, factory: str = "build", *, installed_ops: Path | None = None, **model: object) -> Path:
    """mypkg in `root` beside the recipe; with `installed_ops`, forward()'s helper is `extops` from that folder
    (on sys.path, outside the project: a package installed elsewhere) rather than `mypkg.ops`."""
    package = root / "mypkg"
    package.mkdir(exist_ok=True)
    layers = LAYERS_SOURCE
    if installed_ops is not None:
        (installed_ops / "extops.py").write_text(OPS_SOURCE)
        layers = LAYERS_SOURCE.replace("from mypkg import ops", "import extops as ops")
    for name, source in (("__init__", ""), ("ops", OPS_SOURCE), ("layers", layers), ("models", MODELS_SOURCE)):
        (package / f"{name}.py").write_text(source)
    recipe = {
        "name": "export-cache",
        "model": {"torch": f"mypkg.models:{factory}", "example_inputs": {"features": [1, FEATURES]}, **model},
        "data": {"path": "data.csv", "inputs": {"x": "features"}},
        "variants": [{"name": "fp16", "precision": "fp16"}],
    }
    (root / "data.csv").write_text("x\n1\n")  # the recipe loads; these tests never read the data
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _onnx_vs_torch(path: Path, recipe: Path) -> float:
    """Largest |ONNX Runtime - torch| on 5 rows (a batch size the export never saw)."""
    x = np.random.default_rng(3).normal(size=(5, FEATURES)).astype(np.float32)
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"features": x})
    with torch.no_grad():
        want = load_torch_model(load_recipe(recipe)).build()(torch.from_numpy(x)).numpy()
    return float(np.max(np.abs(got - want)))


@pytest.mark.parametrize("factory", ["build_loop", "build_numbered"])
def test_an_export_that_recorded_the_example_batch_is_refused_naming_the_cause(tmp_path: Path, factory: str) -> None:
    """Both exports agree with forward() on the example's batch of 2 and not on any other: the loop's returns 2 rows
    for 5 (figures on 2 of every 64 rows), the reshape's fails. The old check ran on the example batch only, so the
    export was cached and the recipe failed later, blamed on data-dependent control flow or a runtime error."""
    recipe = _project(tmp_path, factory)
    with pytest.raises(RecipeError) as caught:
        resolve_model(load_recipe(recipe))
    error = caught.value
    assert error.field == "model.torch"
    assert f"the ONNX export of mypkg.models:{factory} follows only the example's batch of 2 rows: at a batch of 3 " \
           in error.detail
    assert "the TorchScript exporter recorded a size of the example batch as a constant: write x.flatten(1)" \
           in error.detail
    assert not list((tmp_path / "cache" / "exports").glob("*/model.onnx"))  # nothing cached


def test_a_module_whose_own_forward_fails_at_another_batch_is_refused(tmp_path: Path) -> None:
    recipe = _project(tmp_path)
    (tmp_path / "mypkg" / "layers.py").write_text(LAYERS_SOURCE.replace(
        "return self.head(ops.act(self.hidden(features)))",
        "return self.head(ops.act(self.hidden(features)).view(2, -1, 16).mean(1))"))  # fmt: skip
    with pytest.raises(RecipeError, match=r"at a batch of 3: forward\(\) itself fails on it \(RuntimeError: "):
        resolve_model(load_recipe(recipe))


def test_editing_a_class_in_another_file_than_the_factory_makes_a_new_export(tmp_path: Path) -> None:
    recipe = _project(tmp_path)
    first = load_torch_model(load_recipe(recipe)).cache_key
    _forget_mypkg()
    layers = tmp_path / "mypkg" / "layers.py"
    layers.write_text(LAYERS_SOURCE.replace("self.head(ops.act(", "self.head(torch.tanh("))
    assert load_torch_model(load_recipe(recipe)).cache_key != first


def test_a_cached_export_that_forward_no_longer_computes_is_exported_again(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """forward() calls a function from a file the key does not cover (outside the project): edited from relu to
    tanh, the cached export (relu) would have been reused, 0.5 off torch, and the recipe blamed on data-dependent
    control flow."""
    installed = tmp_path_factory.mktemp("installed")
    monkeypatch.syspath_prepend(str(installed))
    recipe = _project(tmp_path, installed_ops=installed)
    relu = export_reference(load_torch_model(load_recipe(recipe)))
    assert _onnx_vs_torch(relu, recipe) < 1e-5
    _forget_mypkg()
    (installed / "extops.py").write_text(OPS_SOURCE.replace("torch.relu", "torch.tanh"))
    torch_model = load_torch_model(load_recipe(recipe))
    tanh = export_reference(torch_model)
    assert tanh == relu  # the same key, the file replaced
    _forget_mypkg()
    assert _onnx_vs_torch(tanh, recipe) < 1e-5
    assert sorted(p.name for p in tanh.parent.iterdir()) == ["checks", "model.onnx"]  # no temp files left



def test_what_an_export_killed_midway_left_in_the_cache_goes_once_abandoned(tmp_path: Path) -> None:
    """A sweep killed while exporting (OOM, SIGKILL: no `finally` runs) left its temporary folder, a whole model's
    size, in the export cache for good; the next use of that export removes it once abandoned (6 hours), and leaves
    one an export under way is writing."""
    import os
    import time

    from qbench.execute.store import ABANDONED_AFTER_S

    recipe = _project(tmp_path)
    torch_model = load_torch_model(load_recipe(recipe))
    export = export_reference(torch_model)
    killed, running = export.parent / ".export.0a1b2c3d.publishing", export.parent / ".export.4e5f6a7b.publishing"
    for folder in (killed, running):
        folder.mkdir()
        (folder / "model.onnx").write_bytes(export.read_bytes())
    old = time.time() - ABANDONED_AFTER_S - 60
    os.utime(killed, (old, old))
    assert export_reference(torch_model) == export
    assert not killed.exists() and (running / "model.onnx").is_file()

def test_editing_a_helper_forward_calls_from_another_file_makes_a_new_export(tmp_path: Path) -> None:
    """ops.act is neither the factory's file nor a class's: the key left it out, so the edited code was served the
    relu export's folder (replaced there only when the checks of a cached export saw the edit)."""
    recipe = _project(tmp_path)
    relu = export_reference(load_torch_model(load_recipe(recipe)))
    _forget_mypkg()
    (tmp_path / "mypkg" / "ops.py").write_text(OPS_SOURCE.replace("torch.relu", "torch.tanh"))
    tanh = export_reference(load_torch_model(load_recipe(recipe)))
    assert tanh.parent != relu.parent and relu.is_file()  # a new key: the relu export is left to the relu code
    _forget_mypkg()
    assert _onnx_vs_torch(tanh, recipe) < 1e-5


def test_the_export_key_is_the_same_in_fresh_processes_when_nothing_changed(tmp_path: Path) -> None:
    recipe = _project(tmp_path)
    script = ("import sys\nfrom qbench.recipe.spec import load_recipe\nfrom "
              "qbench.sources.torch_model import "
              "load_torch_model\nprint(load_torch_model(load_recipe(sys.argv[1])).cache_key)\n")  # fmt: skip
    runs = [subprocess.Popen([sys.executable, "-c", script, str(recipe)], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    keys = [run.communicate(timeout=120)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert keys[0] == keys[1] == load_torch_model(load_recipe(recipe)).cache_key  # this process imported far more


def test_a_helper_edited_after_this_process_imported_it_is_refused(tmp_path: Path) -> None:
    """The key would hash the edited file while forward() runs the code imported before: an export of the old code
    cached under the new code's key, reused by every later run."""
    recipe = _project(tmp_path)
    load_torch_model(load_recipe(recipe))
    ops = tmp_path / "mypkg" / "ops.py"
    ops.write_text(OPS_SOURCE.replace("torch.relu", "torch.tanh"))
    with pytest.raises(RecipeError) as caught:
        load_torch_model(load_recipe(recipe))
    assert caught.value.field == "model.torch"
    assert caught.value.detail == f"{ops.resolve()} changed after this process imported it; run qbench in a new process " \
                                  "to use the new code"


def test_a_bool_key_padding_mask_exports_and_runs_like_forward_on_padded_rows(tmp_path: Path) -> None:
    """The example mask was all ones: for a key_padding_mask (True = padding) that masks every key, forward() itself
    returns NaN, and the export was refused as 'differs from forward()'s by nan' for a module that exports fine."""
    recipe = _project(tmp_path, "build_key_padded", example_inputs={"ids": [1, 6], "pad_mask": [1, 6]},
                      input_dtypes={"ids": "int64", "pad_mask": "bool"})  # fmt: skip
    path = export_reference(load_torch_model(load_recipe(recipe)))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 10, (5, 6)).astype(np.int64)
    pad_mask = np.arange(6)[None, :] >= rng.integers(1, 7, (5, 1))  # 1 to 6 real tokens, then padding
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids, "pad_mask": pad_mask})
    with torch.no_grad():
        want = load_torch_model(load_recipe(recipe)).build()(torch.from_numpy(ids), torch.from_numpy(pad_mask)).numpy()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_module_masking_its_own_padding_ids_exports_and_runs_like_forward_on_padded_rows(tmp_path: Path) -> None:
    """The example's token ids are all 0, the padding id: a module masking padding from its own ids (ids == 0) masks
    every key, and nn.TransformerEncoder returns NaN, so the export was refused ('cannot be compared: forward() itself
    returns NaN or inf') for a module that exports fine. The checks now feed such ids as masks (1 but a 0 last)."""
    recipe = _project(tmp_path, "build_ids_padded", example_inputs={"ids": [1, 6]}, input_dtypes={"ids": "int64"})
    path = export_reference(load_torch_model(load_recipe(recipe)))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 10, (5, 6)).astype(np.int64) * (np.arange(6)[None, :] < rng.integers(1, 7, (5, 1)))
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})
    with torch.no_grad():
        want = load_torch_model(load_recipe(recipe)).build()(torch.from_numpy(ids)).numpy()
    assert (ids == 0).any() and np.isfinite(want).all()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_forward_that_returns_inf_on_the_example_is_named_so_not_as_an_export_difference(tmp_path: Path) -> None:
    recipe = _project(tmp_path, "build_overflows")
    with pytest.raises(RecipeError) as caught:
        resolve_model(load_recipe(recipe))
    assert "on its example inputs: cannot be compared: forward() itself returns NaN or inf in output 'output' on " \
           "these inputs (features [2, 4] float32)" in caught.value.detail


def test_a_forward_masking_with_minus_inf_exports_and_the_export_is_compared_where_it_is_finite(tmp_path: Path) -> None:
    """A span head masking the question and padding with -inf passes the gate (qbench.tasks.span), but its torch
    source was refused at export: 'cannot be compared: forward() itself returns NaN or inf'. The export is compared
    where forward() is finite, and must give the same NaN/inf where it is not."""
    recipe = _project(tmp_path, "build_masked")
    path = export_reference(load_torch_model(load_recipe(recipe)))
    x = np.random.default_rng(3).normal(size=(5, FEATURES)).astype(np.float32)
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"features": x})
    assert np.isneginf(got[:, 2]).all() and np.isfinite(got[:, :2]).all()
    with torch.no_grad():
        want = load_torch_model(load_recipe(recipe)).build()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(("exported", "said"), [
    ([[0.5, -np.inf], [1.0, 2.0]], None),  # forward()'s own values, its -inf included
    ([[0.5, 0.0], [1.0, 2.0]], "differs from forward()'s by inf"),  # a finite value where forward() gives -inf
    ([[0.5, -np.inf], [1.0, 2.5]], "differs from forward()'s by 5.00e-01"),  # a finite value off by 0.5
    ([[0.5, np.nan], [1.0, 2.0]], "differs from forward()'s by nan"),  # NaN is not -inf
])  # fmt: skip
def test_an_export_must_give_the_same_nonfinite_values_as_forward(exported: list, said: str | None) -> None:
    from types import SimpleNamespace

    from qbench.sources.torch_export import export_difference

    forward = torch.tensor([[0.5, -np.inf], [1.0, 2.0]])
    model = SimpleNamespace(build=lambda: (lambda x: forward), input_names=["x"], output_names=["scores"])
    session = SimpleNamespace(run=lambda names, feeds: [np.array(exported, np.float32)])
    difference = export_difference(model, Path("unused.onnx"), [np.zeros((2, 1), np.float32)], session=session)
    assert difference is None if said is None else said in difference


@pytest.mark.parametrize(("factory", "drawn", "remedy"), [
    ("build_sampled", "RandomNormalLike", "a sampler draws in inference mode too: have the model return its "
                                          "deterministic part"),
    ("build_dropped", "Dropout", "forward() keeps dropout on in eval mode (F.dropout(..., training=True)): pass "
                                 "training=self.training"),
])  # fmt: skip
def test_a_forward_that_draws_random_numbers_is_named_so_not_as_an_export_difference(
    tmp_path: Path, factory: str, drawn: str, remedy: str
) -> None:
    """The export's outputs differ from forward()'s because both draw: it was refused as an export that does not
    compute forward() (`output 'output' differs from forward()'s by 1.03e-01`), pointing at the exporter."""
    recipe = _project(tmp_path, factory)
    with pytest.raises(RecipeError) as caught:
        resolve_model(load_recipe(recipe))
    detail = caught.value.detail
    assert detail.startswith(f"the ONNX export of mypkg.models:{factory} samples: output 'output' is computed through "
                             f"nodes that draw random numbers on every run: {drawn} ")  # fmt: skip
    assert remedy in detail and "differs from forward()" not in detail


def test_a_forward_that_updates_its_buffers_in_eval_mode_is_refused_naming_them(tmp_path: Path) -> None:
    """A running mean updated on every call, eval mode or not: the export holds one state and the module another
    after each batch. It was refused as `output 'output' differs from forward()'s by ...`, naming no cause."""
    with pytest.raises(RecipeError) as caught:
        resolve_model(load_recipe(_project(tmp_path, "build_running_mean")))
    assert caught.value.field == "model.torch"
    detail = caught.value.detail
    assert detail.startswith("the ONNX export of mypkg.models:build_running_mean changes its own state: forward() "
                             "updates 'seen', 'calls' on every call in eval mode, so the same rows give other outputs "
                             "on a second call (by ")  # fmt: skip
    assert "only in training (under `if self.training:`" in detail and "differs from forward()" not in detail


def test_a_buffer_forward_updates_but_never_reads_does_not_refuse_the_export(tmp_path: Path) -> None:
    """A call counter changes the module's state but not its outputs: the export computes what forward() does."""
    model = resolve_model(load_recipe(_project(tmp_path, "build_counting")))
    assert _onnx_vs_torch(model.onnx_path, tmp_path / "recipe.yaml") < 1e-5


@pytest.mark.parametrize(("factory", "copies"), [("build", 2), ("build_counting", 3)])
def test_the_export_checks_share_one_copy_of_a_module_whose_calls_change_none_of_its_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, copies: int
) -> None:
    """One copy is traced, one serves every check (each check built its own: 7 copies of MiniLM's 90 MB BERT); a
    module whose calls change a tensor (a call counter) is still built afresh for every check after the state check."""
    from qbench.sources.torch_model import TorchModel

    built = []
    build = TorchModel.build
    monkeypatch.setattr(TorchModel, "build", lambda self: built.append(1) or build(self))
    model = resolve_model(load_recipe(_project(tmp_path, factory)))
    assert len(built) == copies
    assert _onnx_vs_torch(model.onnx_path, tmp_path / "recipe.yaml") < 1e-5


def test_a_module_returned_in_train_mode_is_exported_in_eval_mode(tmp_path: Path) -> None:
    """docs/pytorch.md's word: Dropout passes its input through and BatchNorm reads its running statistics."""
    recipe = _project(tmp_path, "build_in_train_mode")
    path = resolve_model(load_recipe(recipe)).onnx_path
    assert "Dropout" not in {node.op_type for node in onnx.load(str(path)).graph.node}
    x = torch.from_numpy(np.random.default_rng(3).normal(size=(5, FEATURES)).astype(np.float32))
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"features": x.numpy()})
    _forget_mypkg()
    sys.path.insert(0, str(tmp_path))
    try:
        from mypkg.models import build_in_train_mode

        module = build_in_train_mode()
    finally:
        sys.path.remove(str(tmp_path))
    with torch.no_grad():
        served = copy.deepcopy(module).eval()(x).numpy()
        trained = module(x).numpy()  # train mode: batch statistics and dropout
    assert np.abs(got - served).max() < 1e-5 and np.abs(got - trained).max() > 0.1


def test_the_warnings_of_a_failed_export_are_still_shown() -> None:
    """The tracer's warnings were collected to find forward()'s reads of Python values and shown again after the
    export; when the export raised, they were dropped, the ones that may say why with them."""
    import warnings

    from qbench.sources.torch_export import _python_values_read

    with pytest.warns(UserWarning, match="a hint at the failure"), pytest.raises(ValueError, match="tracing failed"):
        with _python_values_read():
            warnings.warn("a hint at the failure", UserWarning, stacklevel=1)
            raise ValueError("tracing failed")
