"""The executor tests' project: the user-model project (tumour MLP, probe metric) and its figures from one
uninterrupted local sweep, built once per module."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe
from user_model import make_user_project

from qbench.cli.app import main
from qbench.sweep.runner import run_sweep


@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_user_project(tmp_path_factory.mktemp("user_project")).parent


@pytest.fixture(scope="module")
def local_figures(user_project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, int]:
    """One uninterrupted local sweep of VARIANTS: its figures and how many probe calls one measure job makes.

    A local sweep first runs `qbench validate`'s dry run of FP32 (qbench.sweep), which scores its rows as a measure job
    does (overall and each slice): as many probe calls as one job, before FP32's measure job."""
    target = tmp_path_factory.mktemp("local")
    recipe = write_probe_recipe(user_project, target, variants=VARIANTS)
    assert main(["validate", str(recipe)]) == 0
    dry_run = len(probe_calls(target))
    outcome = run_sweep(recipe, track=False)
    calls = len(probe_calls(target)) - dry_run
    assert calls == 4 * dry_run  # the dry run, then fp32, fp16, int8-minmax: the same number of calls each
    return figures(outcome.results), dry_run
