"""The executor tests' project: the user-model project (tumour MLP, probe metric) and its figures from one
uninterrupted local sweep, built once per module."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe
from user_model import make_user_project

from qbench.sweep import run_sweep


@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_user_project(tmp_path_factory.mktemp("user_project")).parent


@pytest.fixture(scope="module")
def local_figures(user_project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, int]:
    """One uninterrupted local sweep of VARIANTS: its figures and how many probe calls one measure job makes."""
    target = tmp_path_factory.mktemp("local")
    outcome = run_sweep(write_probe_recipe(user_project, target, variants=VARIANTS), track=False)
    calls = len(probe_calls(target))
    assert calls % 3 == 0  # fp32, fp16, int8-minmax: the same number of calls each
    return figures(outcome.results), calls // 3
