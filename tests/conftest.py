"""Shared fixtures.

digits_project: the digits demo (model, parquet, recipe) built once per test session.

mlflow_server: a real `mlflow server` on 127.0.0.1, started once per test session
with its own sqlite store and artifact folder; yields its http URI. It runs as a
tree of processes whose workers outlive a SIGTERM to the parent, so it is
started in its own process group and the whole group is stopped; teardown fails
if any process of that group is still alive.

mlflow_store_template (autouse): new sqlite MLflow stores, in this process and those the tests start, are filled from
one made once per session (mlflow_template/sitecustomize.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_processes import start_mlflow_server, stop_process_group

MLFLOW_TEMPLATE_SITE = Path(__file__).parent / "mlflow_template"


@pytest.fixture(autouse=True)
def _not_under_github_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run on GitHub Actions, the suite would see GITHUB_ACTIONS=true, and every failing command in it would add an
    `::error` annotation line to the output its test reads: the tests that want one set it themselves."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not sys.platform.startswith("linux"):
        pytest.skip("the mlflow_server fixture checks its processes through /proc (Linux only)")
    url, process = start_mlflow_server(tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield url
    finally:
        leftover = stop_process_group(process)
        if leftover:
            pytest.fail(f"mlflow server processes survived the stop: {leftover}")


@pytest.fixture(scope="session")
def digits_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with models/digits.onnx, data/digits.parquet and recipes/digits.yaml (the repository's recipe)."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from qbench.demo.digits import RECIPE_FILE, make_digits_demo

    root = tmp_path_factory.mktemp("digits_project")
    paths = make_digits_demo(root, seed=0)
    if paths.get("recipe") != root / RECIPE_FILE:
        pytest.fail(f"make_digits_demo did not copy {RECIPE_FILE} into {root}: {paths}")
    return root


def _nvidia_gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `@pytest.mark.gpu` tests, with the reason, where torch sees no NVIDIA GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _nvidia_gpu_visible():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_pass_memos() -> None:
    """Every test calibrates anew (qbench.variants.pass_memo): a pass remembered from an earlier test would skip the
    code a test patches to fail or to count. Only modules already imported are touched (imports stay light)."""
    for name, memo in (("qbench.variants.smoothquant", "CHANNEL_RANGES"), ("qbench.variants.calibrate", "RANGES")):
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, memo).clear()


@pytest.fixture(scope="session", autouse=True)
def isolated_qbench_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Exports and engines go to a temporary cache, never the user's ~/.cache/qbench."""
    cache = tmp_path_factory.mktemp("qbench_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QBENCH_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session", autouse=True)
def mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file of the session's template store (made when a test first makes a sqlite store); its folder heads
    PYTHONPATH, so that the processes the tests start fill their new stores from it too."""
    template = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    spec = importlib.util.spec_from_file_location("mlflow_template_site", MLFLOW_TEMPLATE_SITE / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(site.TEMPLATE_VARIABLE, str(template))
        patch.setenv("PYTHONPATH",
                     os.pathsep.join([str(MLFLOW_TEMPLATE_SITE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        site.install()
        yield template
