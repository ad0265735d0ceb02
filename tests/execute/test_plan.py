"""Build keys: a build is reused only by the same qbench code, spec and inputs, built with the same packages on the
same kind of machine."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import pytest
from probe_project import write_probe_recipe

import qbench
from qbench import environment
from qbench.execute import plan
from qbench.execute.overview import plan_overview
from qbench.execute.store import BuildStore
from qbench.provenance import input_digests
from qbench.recipe.spec import Recipe, load_recipe
from qbench.sweep.runner import run_sweep


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


def _versions(monkeypatch: pytest.MonkeyPatch, **changed: str) -> None:
    """Package metadata as if the distributions named in `changed` (underscores for dashes) were at those versions."""
    real = environment.package_version
    overrides = {name.replace("_", "-"): version for name, version in changed.items()}
    monkeypatch.setattr(environment, "package_version",
                        lambda name: overrides.get(name.replace("_", "-")) or real(name))  # fmt: skip


def _keys(recipe: Recipe) -> dict[str, str]:
    inputs = input_digests(recipe)
    return {spec.name: plan.build_key(recipe, spec, inputs, "") for spec in recipe.all_variants()}


def test_the_build_key_holds_the_versions_of_the_packages_its_technique_builds_with(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgraded quantizer (or numpy, or ml_dtypes under the float casts) must not be hidden behind builds the old
    one put in the store; a package the technique does not use leaves its key as it is."""
    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=["fp16", "int8-minmax"]))
    before = _keys(recipe)
    assert _keys(recipe) == before  # nothing changed: the same keys
    for package, changes in [("onnxruntime", {"fp32", "fp16", "int8-minmax"}),
                             ("numpy", {"fp32", "fp16", "int8-minmax"}),
                             ("ml_dtypes", {"fp32", "fp16"}), ("nvidia_modelopt", set()),
                             ("torchao", set())]:  # fmt: skip
        with monkeypatch.context() as patch:
            _versions(patch, **{package: "0.0.1"})
            after = _keys(recipe)
        assert {name for name in before if after[name] != before[name]} == changes, package


def test_the_build_key_of_an_int8_technique_holds_whether_the_cpu_lacks_vnni(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reduce_range auto chooses 7-bit weights on an x86 CPU without VNNI: a shared store must not hand a build made
    on a VNNI CPU to a CPU without it. The float casts do not read it."""
    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=["fp16", "int8-minmax"]))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    vnni = _keys(recipe)
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx2"}))
    without = _keys(recipe)
    assert {name for name in vnni if without[name] != vnni[name]} == {"int8-minmax"}


def test_a_shared_store_keeps_a_build_per_quantizer_version_and_cpu_kind(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sweeps sharing one store: with nothing changed every build is reused (`qbench sweep --plan`: `in store`);
    after `pip install -U onnxruntime` none is, and the sweep builds beside the old builds, not over them (a sweep
    elsewhere still on the old version would read the new files under the key it computed); a CPU without VNNI
    builds its own INT8 and reuses the float builds."""
    path = write_probe_recipe(user_project, tmp_path, variants=["fp16", "int8-minmax"])
    recipe, store = load_recipe(path), BuildStore(str(tmp_path / "store"))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))

    def reused() -> set[str]:
        rows = plan_overview(recipe, store).rows
        return {row.job.removeprefix("build:") for row in rows if row.job.startswith("build:") and row.resume.reused}

    def manifests() -> list[dict]:
        return [json.loads(m.read_text()) for m in (tmp_path / "store").glob("*/manifest.json")]

    run_sweep(path, track=False)
    assert reused() == {"fp32", "fp16", "int8-minmax"} and len(manifests()) == 3  # nothing changed: all reused
    with monkeypatch.context() as upgraded:
        _versions(upgraded, onnxruntime="99.0")
        assert reused() == set()
        run_sweep(path, track=False)
        assert reused() == {"fp32", "fp16", "int8-minmax"} and len(manifests()) == 6
    assert reused() == {"fp32", "fp16", "int8-minmax"}  # the old version's builds are still there
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx2"}))
    assert reused() == {"fp32", "fp16"}
    run_sweep(path, track=False)
    int8 = {m["environment"]["x86_without_vnni"]: m["params"]["reduce_range"]
            for m in manifests() if m["name"] == "int8-minmax"
            and m["environment"]["onnxruntime"] != "99.0"}  # fmt: skip
    assert int8 == {"False": False, "True": True}  # reduce_range auto: 7 bits only for the CPU without VNNI


def test_the_plan_fingerprint_leaves_out_only_the_run_fields_and_keeps_any_field_added_to_their_sections(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where results go and how jobs run leave a run resumable; everything else a figure may depend on (task options,
    the data, latency settings, metric options) makes another plan, and so would a field added later to a run
    section (the sections were left out whole, a new `executor` field with them)."""
    from qbench.recipe.executor import ExecutorSpec
    from qbench.recipe.spec import RUN_FIELDS, AnalysisSpec, TrackingSpec

    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=["fp16"]))
    before = plan.plan_fingerprint(recipe, {})
    old_formula = recipe.model_dump(mode="json", exclude={"tracking", "output_dir", "executor"})
    assert before == hashlib.sha256(json.dumps({"qbench": qbench.__version__, "recipe": old_formula},
                                               sort_keys=True).encode()).hexdigest()  # fmt: skip  # runs stay resumable
    moved = recipe.model_copy(update={
        "tracking": TrackingSpec(uri="sqlite:///elsewhere.db", experiment="other"), "output_dir": tmp_path / "else",
        "executor": ExecutorSpec(kind="ray", address="auto", store=str(tmp_path / "s2"), retries=0,
                                 timeout_s=60)})  # fmt: skip
    assert plan.plan_fingerprint(moved, {}) == before
    for edit in ({"task_options": {"max_answer_tokens": 8}}, {"analysis": AnalysisSpec(ranges=True)},
                 {"latency": recipe.latency.model_copy(update={"iterations": 6})},
                 {"data": recipe.data.model_copy(update={"evaluation": recipe.data.evaluation.model_copy(
                     update={"filter": "age > 40"})})}):  # fmt: skip
        assert plan.plan_fingerprint(recipe.model_copy(update=edit), {}) != before, edit
    monkeypatch.setitem(RUN_FIELDS, "executor", tuple(f for f in RUN_FIELDS["executor"] if f != "retries"))
    assert plan.plan_fingerprint(moved, {}) != plan.plan_fingerprint(recipe, {})  # a field not named: in the plan
