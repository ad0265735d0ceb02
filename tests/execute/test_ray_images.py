"""A sweep over image inputs on a real Ray cluster of this machine (bound to 127.0.0.1, as test_ray_executor's): its
workers decode the images from the sweep's snapshot and give the local executor's figures."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from image_project import SIDE, png, write_image_project
from probe_project import figures
from ray_processes import child_pids, stopped_without_survivors

from qbench.execute.plan import TIMING_RESOURCE
from qbench.sweep.runner import run_sweep

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[list[int]]:
    """A local Ray cluster bound to 127.0.0.1, stopped after the module; teardown fails if any process survives."""
    before = child_pids()
    ray.init(address="local", num_cpus=2, resources={TIMING_RESOURCE: 1}, _node_ip_address="127.0.0.1",
             include_dashboard=False,
             log_to_driver=False, object_store_memory=100 * 1024 * 1024, configure_logging=False)  # fmt: skip
    with stopped_without_survivors(ray.shutdown, before) as started:
        yield started


def test_a_ray_sweep_over_images_decodes_its_snapshot_and_gives_the_local_figures(
    ray_cluster: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qbench.sweep.runner as sweep

    rng = np.random.default_rng(5)
    for index in range(24):
        png(tmp_path / "images" / f"{index}.png", rng.integers(0, 256, (SIDE, SIDE, 3)))
    outside = png(tmp_path / "elsewhere" / "far.png", rng.integers(0, 256, (SIDE, SIDE, 3)))
    cells = [f"{index}.png" for index in range(24)] + [str(outside)]
    recipe = write_image_project(tmp_path, cells, [index % 3 for index in range(25)],
                                 executor={"store": str(tmp_path / "store")})  # fmt: skip
    local = run_sweep(recipe, track=False)

    spec = yaml.safe_load(recipe.read_text())
    spec["executor"]["kind"] = "ray"
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    snapshot_of = sweep.take_snapshot

    def snapshot_then_move_the_images_away(inputs, root):  # from here on only the snapshot holds the images
        taken = snapshot_of(inputs, root)
        shutil.move(tmp_path / "images", tmp_path / "moved")
        shutil.move(tmp_path / "elsewhere", tmp_path / "moved-elsewhere")
        return taken

    monkeypatch.setattr(sweep, "take_snapshot", snapshot_then_move_the_images_away)
    on_ray = run_sweep(recipe, track=False)
    assert not (tmp_path / "images").exists()
    assert figures(on_ray.results) == figures(local.results)
    assert {v.status for v in on_ray.results.variants} == {"ok"} and len(on_ray.results.variants) == 3
