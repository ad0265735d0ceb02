"""A passed check of a cached export against forward() is kept in the export cache and reused by a repeated sweep on
the same export, rows, settings and code; any change of those, or a damaged verdict, runs the check again."""

from __future__ import annotations

import json
import logging
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

from qbench.errors import RecipeError  # noqa: E402
from qbench.preflight.prepare import Prepared, prepare  # noqa: E402
from qbench.recipe.spec import load_recipe  # noqa: E402
from qbench.sources import torch_export  # noqa: E402
from qbench.verdicts import feeds_digest  # noqa: E402

MODELS = '''
import torch
from torch import nn

import verdict_ops as ops


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, features):
        return self.head(ops.act(self.hidden(features)))


class Branches(Net):
    """A branch on the data: the trace keeps the example's (all inputs >= 0), the rows take the other."""

    def forward(self, features):
        if (features < 0).any():
            return -super().forward(features)
        return super().forward(features)


def build():
    torch.manual_seed(0)
    return Net()


def build_branches():
    torch.manual_seed(0)
    return Branches()
'''
OPS = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    yield
    for name in [m for m in sys.modules if m.partition(".")[0] in ("mypkg", "verdict_ops", "verdict_pkg")]:
        del sys.modules[name]


@pytest.fixture
def installed(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """forward()'s helper in a folder on sys.path outside the project: code the export's key does not cover."""
    folder = tmp_path_factory.mktemp("installed")
    monkeypatch.syspath_prepend(str(folder))
    (folder / "verdict_ops.py").write_text(OPS)
    return folder


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each comparison of the export with forward() ran on, in order."""
    compared: list[int] = []
    real = torch_export.export_difference

    def counted(torch_model: Any, path: Path, inputs: Any, **kwargs: Any) -> str | None:
        compared.append(len(inputs[0]))
        return real(torch_model, path, inputs, **kwargs)

    monkeypatch.setattr(torch_export, "export_difference", counted)
    return compared


def _project(root: Path, *, rows: int = 40, seed: int = 0, factory: str = "build") -> Path:
    (root / "mypkg").mkdir(exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "models.py").write_text(MODELS)
    features = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
    pd.DataFrame({"features": list(features)}).to_parquet(root / "data.parquet")
    recipe = {
        "name": "verdicts",
        "task": "embedding",
        "model": {"torch": f"mypkg.models:{factory}", "example_inputs": {"features": [1, 4]},
                  "output_names": ["scores"]},
        "data": {"path": "data.parquet", "inputs": {"features": "features"}},
        "variants": [{"name": "fp16", "precision": "fp16"}],
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _prepare(recipe: Path) -> Prepared:
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]  # a new process's view: the project imported afresh
    return prepare(load_recipe(recipe), track=False, destinations=False, backends=False)


def _verdicts(prepared: Prepared) -> dict[str, Path]:
    """Kind ('example', 'rows') -> the kept verdict of the export `prepared` uses."""
    kept = sorted((prepared.source.onnx_path.parent / "checks").glob("*.json"))
    return {path.name.partition("-")[0]: path for path in kept}


def test_a_repeated_prepare_reuses_both_passed_checks_and_says_so(
    tmp_path: Path, installed: Path, checks: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Before, every sweep compared the cached export with forward() again: on the example inputs, a batch of 3,
    and 32 of the recipe's rows (MiniLM: 2.3 s of a warm sweep's 10.5 s of preparation)."""
    recipe = _project(tmp_path)
    first = _prepare(recipe)
    assert checks == [2, 3, 32]  # the new export's example and other batch, then 32 of the 40 rows
    assert set(_verdicts(first)) == {"example", "rows"}
    checks.clear()
    with caplog.at_level(logging.DEBUG, logger="qbench.verdicts"):
        again = _prepare(recipe)
    assert checks == []
    assert again.source.onnx_path == first.source.onnx_path
    exports = [r for r in caplog.records if "check against forward()" in r.getMessage()]
    assert sum("is reused" in r.getMessage() for r in exports) == 2  # the example's check too
    reused = [r.getMessage() for r in exports if "is reused" in r.getMessage() and r.levelno == logging.INFO]
    assert len(reused) == 1  # one line, the rows': the example's is at DEBUG
    assert "check against forward() on the recipe's 40 evaluation rows is reused" in reused[0]
    assert "on 32 rows" in reused[0]


def test_the_kept_largest_difference_is_onnx_runtime_against_torch_on_the_rows_checked(
    tmp_path: Path, installed: Path
) -> None:
    prepared = _prepare(_project(tmp_path))
    record = json.loads(_verdicts(prepared)["rows"].read_text())
    feeds = prepared.evaluation_feeds["features"]
    rows = feeds[np.unique(np.linspace(0, len(feeds) - 1, 32).astype(int))]
    (got,) = ort.InferenceSession(str(prepared.source.onnx_path), providers=["CPUExecutionProvider"]).run(
        None, {"features": rows})  # fmt: skip
    with torch.no_grad():
        want = prepared.source.torch.build()(torch.from_numpy(rows)).numpy()
    assert record["passed"] is True and record["rows"] == 32
    assert record["largest_difference"] == pytest.approx(float(np.max(np.abs(got - want))), rel=1e-6, abs=1e-12)
    assert record["code"][str((installed / "verdict_ops.py").resolve())]["module"] == "verdict_ops"  # forward() ran it


def test_other_rows_run_the_row_check_again(tmp_path: Path, installed: Path, checks: list[int]) -> None:
    recipe = _project(tmp_path)
    _prepare(recipe)
    _project(tmp_path, seed=1)  # the same model, other rows
    checks.clear()
    _prepare(recipe)
    assert checks == [32]  # the rows' check alone: the export and its example check are the same


def test_other_weights_run_both_checks_again(tmp_path: Path, installed: Path, checks: list[int]) -> None:
    recipe = _project(tmp_path)
    first = _prepare(recipe)
    source = (tmp_path / "mypkg" / "models.py").read_text()
    (tmp_path / "mypkg" / "models.py").write_text(source.replace("torch.manual_seed(0)\n    return Net()",
                                                                 "torch.manual_seed(1)\n    return Net()"))
    checks.clear()
    second = _prepare(recipe)
    assert second.source.onnx_path != first.source.onnx_path
    assert checks == [2, 3, 32]


def test_another_tolerance_runs_both_checks_again(
    tmp_path: Path, installed: Path, checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _project(tmp_path)
    _prepare(recipe)
    monkeypatch.setattr(torch_export, "EXPORT_TOLERANCE", 2e-4)
    checks.clear()
    _prepare(recipe)
    assert checks == [2, 3, 32]


def test_an_edit_to_installed_code_forward_runs_runs_the_checks_again(
    tmp_path: Path, installed: Path, checks: list[int]
) -> None:
    """verdict_ops.py is outside the project: not in the export's key, only in the verdicts' list of code."""
    recipe = _project(tmp_path)
    _prepare(recipe)
    (installed / "verdict_ops.py").write_text(OPS.replace("torch.relu(x)", "torch.relu(x) + 0.0"))
    del sys.modules["verdict_ops"]
    checks.clear()
    _prepare(recipe)
    assert checks == [2, 3, 32]


def test_the_helper_imported_from_another_environment_runs_the_checks_again_saying_why_at_debug(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, installed: Path, checks: list[int],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Another virtual environment (or PYTHONPATH) holding its own verdict_ops.py: the first one's file is unchanged,
    but it is not the code forward() runs now. Why the check runs again is a --debug line: at INFO it printed in the
    log of every run from another checkout sharing the cache, with nothing to act on."""
    recipe = _project(tmp_path)
    _prepare(recipe)
    other = tmp_path_factory.mktemp("other_environment")
    (other / "verdict_ops.py").write_text(OPS.replace("torch.relu(x)", "torch.relu(x) + 0.0"))
    monkeypatch.syspath_prepend(str(other))
    del sys.modules["verdict_ops"]
    checks.clear()
    with caplog.at_level(logging.DEBUG, logger="qbench.verdicts"):
        _prepare(recipe)
    assert checks == [2, 3, 32]
    assert sys.modules["verdict_ops"].__file__ == str(other / "verdict_ops.py")
    why = [r for r in caplog.records if "is not the code" in r.getMessage()]
    assert why and all(r.levelno == logging.DEBUG for r in why)


def test_a_helper_that_puts_an_object_in_its_place_in_sys_modules_is_reused(
    tmp_path: Path, installed: Path, checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As torch._VF does (every torch model's forward() may run it): its sys.modules entry names no file, so the
    module is placed by its package's folder. Checking for its own file re-ran the checks on every sweep."""
    (installed / "verdict_pkg").mkdir()
    (installed / "verdict_pkg" / "__init__.py").write_text("")
    shadowed = OPS + "\n\nimport sys, types\n\nsys.modules[__name__] = types.SimpleNamespace(act=act)\n"
    (installed / "verdict_pkg" / "shadowed.py").write_text(shadowed)
    monkeypatch.setattr(sys.modules[__name__], "MODELS",
                        MODELS.replace("import verdict_ops as ops", "from verdict_pkg import shadowed as ops"))
    recipe = _project(tmp_path)
    first = _prepare(recipe)
    record = json.loads(_verdicts(first)["rows"].read_text())
    assert record["code"][str((installed / "verdict_pkg" / "shadowed.py").resolve())]["module"] == "verdict_pkg.shadowed"
    checks.clear()
    _prepare(recipe)
    assert checks == []


@pytest.mark.parametrize("damage", ["truncated", "not json", "failed", "no code", "other version", "nan"])
def test_a_damaged_verdict_runs_its_check_again_and_is_replaced(
    tmp_path: Path, installed: Path, checks: list[int], damage: str
) -> None:
    recipe = _project(tmp_path)
    path = _verdicts(_prepare(recipe))["rows"]
    whole = json.loads(path.read_text())
    text = path.read_text()
    damaged = {
        "truncated": text[: len(text) // 2],
        "not json": "\x00\x01",
        "failed": json.dumps({**whole, "passed": False}),
        "no code": json.dumps({**whole, "code": {}}),
        "other version": json.dumps({**whole, "version": whole["version"] + 1}),
        "nan": json.dumps({**whole, "largest_difference": float("nan")}),
    }[damage]
    path.write_text(damaged)
    checks.clear()
    _prepare(recipe)
    assert checks == [32]
    assert json.loads(path.read_text()) == whole


def test_a_failed_row_check_is_not_kept(tmp_path: Path, installed: Path, checks: list[int]) -> None:
    """Branches takes another path on rows with a negative value than on the example's: refused, every time."""
    recipe = _project(tmp_path, factory="build_branches")
    for _ in range(2):
        with pytest.raises(RecipeError, match="reads a tensor as a Python value"):
            _prepare(recipe)
    (folder,) = (tmp_path / "cache" / "exports").glob("*/checks")
    assert [p.name.partition("-")[0] for p in folder.iterdir()] == ["example"]  # the example's check passed
    # every row (forward() read a value: all batches) on both runs, before and after exporting again
    assert checks == [2, 3, 40, 40, 40, 40]


def test_feeds_are_digested_by_value_and_object_arrays_not_at_all() -> None:
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    changed = ids.copy()
    changed[2, 3] = 0
    assert feeds_digest([ids]) == feeds_digest([ids.copy()])
    assert feeds_digest([ids]) != feeds_digest([changed])
    assert feeds_digest([ids]) != feeds_digest([ids.astype(np.int32)])
    assert feeds_digest([ids]) != feeds_digest([ids.reshape(4, 3)])
    assert feeds_digest([np.array(["a", "b"], dtype=object)]) is None
