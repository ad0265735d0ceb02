"""Build keys: a build is reused only by the same qbench code, spec and inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_project import write_probe_recipe

from qbench.execute import plan
from qbench.provenance import input_digests
from qbench.recipe import load_recipe


def test_the_build_key_changes_with_qbench_code_of_the_same_version(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited checkout (or a patched install) keeps the version number: a fix to a builder must not be hidden
    behind builds the old code put in the store."""
    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=["fp16"]))
    spec, inputs = recipe.all_variants()[1], input_digests(recipe)
    key = plan.build_key(recipe, spec, inputs, "")
    assert plan.build_key(recipe, spec, inputs, "") == key  # the same code: the same key
    assert len(plan.qbench_code_digest()) == 64
    monkeypatch.setattr(plan, "qbench_code_digest", lambda: "0" * 64)
    assert plan.build_key(recipe, spec, inputs, "") != key
