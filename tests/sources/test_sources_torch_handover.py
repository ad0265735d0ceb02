"""PyTorch artefacts as teams hand them over, loaded by the recipe's factory: a TorchScript file (`torch.jit.load`), a
`torch.export` program's module, a model wrapped by `torch.compile` or `nn.DataParallel`; and what the export's cache
key must see of them (code carried as data, settings held beside the weights)."""

from __future__ import annotations

import importlib
import json
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

from module_source import ModuleSource  # noqa: E402

from qbench.errors import QbenchError  # noqa: E402
from qbench.recipe.spec import VariantSpec, load_recipe  # noqa: E402
from qbench.sources.torch_export import export_reference  # noqa: E402
from qbench.sources.torch_model import load_torch_model  # noqa: E402
from qbench.sources.torch_settings import settings_sha256  # noqa: E402
from qbench.variants.torch_forms import torch_form_for  # noqa: E402

FEATURES = 6
LOADERS = '''
import json
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent.parent


class Net(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.hidden = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8, eps=eps)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.norm(self.hidden(x)))))


def _trained():
    net = Net()
    net.load_state_dict(torch.load(HERE / "state.pt"))
    return net


def scripted():
    return torch.jit.load(str(HERE / "artefact.pt"))


def exported():
    return torch.export.load(str(HERE / "artefact.pt2")).module()


def compiled():
    return torch.compile(_trained())


def compiled_untrained():
    return torch.compile(Net())


def data_parallel():
    return nn.DataParallel(_trained())


def configured():
    net = Net(**json.loads((HERE / "config.json").read_text()))
    net.load_state_dict(torch.load(HERE / "state.pt"))
    return net
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    _package(tmp_path, monkeypatch)
    yield
    for name in [m for m in sys.modules if m == "teampkg" or m.startswith("teampkg.")]:
        del sys.modules[name]


def _package(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """teampkg/loaders.py (the factories above) under `root`, imported (TorchScript compiles from source files)."""
    (root / "teampkg").mkdir()
    (root / "teampkg" / "__init__.py").write_text("")
    (root / "teampkg" / "loaders.py").write_text(LOADERS)
    monkeypatch.syspath_prepend(str(root))
    return importlib.import_module("teampkg.loaders")


def _net(root: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    return sys.modules["teampkg.loaders"].Net().eval()


def _project(root: Path, factory: str, weights: str | None = None) -> Path:
    """state.pt (the Net's state_dict), data.parquet and the recipe, beside the package."""
    torch.save(_net(root).state_dict(), root / "state.pt")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, FEATURES)).astype(np.float32)
    pd.DataFrame({"x": list(x), "label": rng.integers(0, 3, 40), "split": ["calib"] * 10 + ["eval"] * 30}).to_parquet(
        root / "data.parquet")  # fmt: skip
    model = {"torch": f"teampkg.loaders:{factory}", "example_inputs": {"x": [1, FEATURES]}}
    if weights:
        model["weights"] = weights
    recipe = {
        "name": "handover", "model": model,
        "data": {"path": "data.parquet", "inputs": {"x": "x"}, "label": "label",
                 "calibration": {"filter": {"split": "calib"}}, "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _exported_matches_net(recipe: Path) -> None:
    """The cached export computes the Net's forward (in eval mode) on rows of batch 5."""
    onnx_path = export_reference(load_torch_model(load_recipe(recipe)))
    x = np.random.default_rng(1).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = _net(recipe.parent)(torch.from_numpy(x)).numpy()
    got = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_torchscript_file_the_factory_loads_is_exported(tmp_path: Path, how: str) -> None:
    net = _net(tmp_path)
    saved = torch.jit.script(net) if how == "script" else torch.jit.trace(net, torch.rand(2, FEATURES))
    torch.jit.save(saved, str(tmp_path / "artefact.pt"))
    _exported_matches_net(_project(tmp_path, "scripted"))  # was: 'forward' method must be a script method


def test_a_torch_export_module_the_factory_loads_is_exported(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(_net(tmp_path), (torch.rand(2, FEATURES),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(tmp_path / "artefact.pt2"))
    _exported_matches_net(_project(tmp_path, "exported"))  # was: NotImplementedError: Calling eval() is not supported


@pytest.mark.parametrize(("factory", "weights"), [("compiled", None), ("data_parallel", None),
                                                  ("compiled_untrained", "state.pt")])  # fmt: skip
def test_a_wrapped_model_is_exported_as_the_model_inside(tmp_path: Path, factory: str, weights: str | None) -> None:
    """torch.compile's and DataParallel's wrappers compute the model's forward(); the model's own state_dict fits."""
    recipe = _project(tmp_path, factory, weights)
    assert type(load_torch_model(load_recipe(recipe)).build()).__name__ == "Net"
    _exported_matches_net(recipe)


def test_a_torchscript_file_scripted_from_edited_code_with_the_same_weights_is_exported_anew(tmp_path: Path) -> None:
    class Negated(torch.nn.Module):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return -self.net(x)

    class Plain(Negated):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    recipe = _project(tmp_path, "scripted")
    torch.jit.save(torch.jit.script(Negated(_net(tmp_path))), str(tmp_path / "artefact.pt"))
    first = load_torch_model(load_recipe(recipe)).cache_key
    torch.jit.save(torch.jit.script(Negated(_net(tmp_path))), str(tmp_path / "artefact.pt"))
    assert load_torch_model(load_recipe(recipe)).cache_key == first  # the same artefact saved again: the same key
    torch.jit.save(torch.jit.script(Plain(_net(tmp_path))), str(tmp_path / "artefact.pt"))  # the same state, no minus
    assert load_torch_model(load_recipe(recipe)).cache_key != first


def test_a_setting_changed_beside_the_same_weights_is_exported_anew(tmp_path: Path) -> None:
    """A config file the factory reads (as from_pretrained reads config.json): LayerNorm's eps from 1e-5 to 0.5."""
    recipe = _project(tmp_path, "configured")
    (tmp_path / "config.json").write_text(json.dumps({"eps": 1e-5}))
    before = export_reference(load_torch_model(load_recipe(recipe)))
    (tmp_path / "config.json").write_text(json.dumps({"eps": 0.5}))
    torch_model = load_torch_model(load_recipe(recipe))
    after = export_reference(torch_model)
    assert after != before
    x = np.random.default_rng(1).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.no_grad():
        expected = torch_model.build()(torch.from_numpy(x)).numpy()
    got = ort.InferenceSession(str(after), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_settings_digest_follows_public_settings_and_tensor_attributes_only(tmp_path: Path) -> None:
    net = _net(tmp_path)
    same = _net(tmp_path)
    same._cache = object()  # private: left out
    assert settings_sha256(same) == settings_sha256(net)
    other_eps = _net(tmp_path)
    other_eps.norm.eps = 0.5
    assert settings_sha256(other_eps) != settings_sha256(net)
    scaled = _net(tmp_path)
    scaled.scale, net.scale = torch.tensor([2.0]), torch.tensor([3.0])  # a plain tensor attribute, not a buffer
    assert settings_sha256(scaled) != settings_sha256(net)


@pytest.mark.parametrize("setting", [
    lambda: np.array([0.5, 1.0], dtype=np.float32),  # a normalisation held as a numpy array
    lambda: np.float32(0.5),  # a numpy scalar read from a config
    lambda: pd.DataFrame({"mean": [0.5, 1.0]}),  # a pandas table of per-feature statistics
])  # fmt: skip
def test_settings_digest_follows_numpy_and_pandas_values(tmp_path: Path, setting: Any) -> None:
    """An array-like setting was keyed by its class alone: a module whose numpy mean (or scalar, or pandas table)
    changed, its weights the same, reused the export made with the old values (forward() reads them as constants)."""
    net, changed = _net(tmp_path), _net(tmp_path)
    net.stats, changed.stats = setting(), setting()
    assert settings_sha256(changed) == settings_sha256(net)
    changed.stats = changed.stats * 2
    assert settings_sha256(changed) != settings_sha256(net)


def test_settings_digest_leaves_a_logger_s_process_state_out(tmp_path: Path) -> None:
    """A module holding its logger was keyed through the logger's parent, the root logger, and so on the handlers the
    process happened to configure (importing MLflow, qbench's CLI): each process gave its own key, each sweep a new
    export."""
    import logging

    net = _net(tmp_path)
    net.log = logging.getLogger("teampkg.loaders")
    before = settings_sha256(net)
    handler = logging.StreamHandler()
    logging.getLogger().addHandler(handler)
    try:
        assert settings_sha256(net) == before
    finally:
        logging.getLogger().removeHandler(handler)


def test_code_digest_of_a_scripted_module_leaves_its_file_s_folder_out(tmp_path: Path) -> None:
    """A TorchScript graph's text names the source file's path on every node: the same class scripted from another
    checkout's folder (a CI job's workspace) was keyed anew and exported again. An edit to forward() still counts."""
    import importlib.util

    from qbench.sources.torch_wrappers import generated_code_sha256

    code = ("import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.lin = torch.nn.Linear(3, 2)\n\n    def forward(self, x):\n        return "
            "torch.relu(self.lin(x)) * 2\n")

    def scripted(folder: str, text: str) -> torch.jit.ScriptModule:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "checkout_net.py").write_text(text)
        spec = importlib.util.spec_from_file_location("checkout_net", tmp_path / folder / "checkout_net.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        return torch.jit.script(module.Net())

    first, second = scripted("job-1", code), scripted("job-2", code)
    assert str(tmp_path / "job-1") in str(first.inlined_graph)  # the path the old key read
    assert generated_code_sha256(first) == generated_code_sha256(second)
    edited = scripted("job-3", code.replace("* 2", "* 3"))
    assert generated_code_sha256(edited) != generated_code_sha256(first)


@pytest.mark.parametrize(("dynamic", "mode", "batch", "expected"), [
    (False, "eval", 2, "export it with a dynamic batch, torch.export.export(model, args, dynamic_shapes="),
    (False, "eval", 8, "export it with a dynamic batch, torch.export.export(model, args, dynamic_shapes="),
    (True, "train", 2, "a torch.export program keeps the mode it was exported in: export it from model.eval()"),
])  # fmt: skip
def test_a_torch_export_program_that_cannot_be_swept_is_refused_saying_how_to_export_it(
        tmp_path: Path, dynamic: bool, mode: str, batch: int, expected: str) -> None:  # fmt: skip
    """Exported at a fixed batch (its module() asserts that batch: the example's, 2, or another, 8, which failed on the
    example's batch with `Guard failed: x.size()[0] == 8` and no word of how to export it), or from a module in
    training mode (its Dropout draws, and its module() cannot be put in eval mode): one line saying how to export it
    instead."""
    net = _net(tmp_path).train(mode == "train")
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=1024)}} if dynamic else None
    torch.export.save(torch.export.export(net, (torch.rand(batch, FEATURES),), dynamic_shapes=shapes),
                      str(tmp_path / "artefact.pt2"))  # fmt: skip
    with pytest.raises(QbenchError) as caught:
        export_reference(load_torch_model(load_recipe(_project(tmp_path, "exported"))))
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_torchscript_module_has_no_torchao_form_and_the_reason_says_why(tmp_path: Path) -> None:
    """torchao swaps nn.Linear instances; a TorchScript module's layers are compiled ones ("this model has none" read as
    if the model had no linear layer)."""
    pytest.importorskip("torchao")
    spec = VariantSpec(name="int8-dynamic", precision="int8", calibrator="dynamic")
    reason = torch_form_for(spec, ModuleSource(torch.jit.script(_net(tmp_path))))
    assert reason == ("torchao quantizes nn.Linear layers, and a TorchScript module holds none: give the model's class "
                      "and state_dict for a torch INT8 form")
    assert not isinstance(torch_form_for(spec, ModuleSource(_net(tmp_path))), str)  # the class itself has a form
