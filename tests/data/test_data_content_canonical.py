"""Rows feeding the model one input are one input however their cells are written (qbench.data.content,
qbench.data.leakage): a zero's sign, an image's file format details, the calibration sample's cells as fed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data import evaluation_rows
from qbench.data.evaluation import calibration_sample
from qbench.recipe.data import DataSpec

RECIPE = Path("recipe.yaml")


def test_zeros_of_either_sign_are_one_input_in_columns_of_numbers_and_of_arrays() -> None:
    data = DataSpec(path=Path("d.parquet"), inputs={"x": "x"}, label="y")
    scalars = pd.DataFrame({"x": [0.0, -0.0, 1.0], "y": [0, 0, 1]})
    arrays = pd.DataFrame({"x": [np.array([0.0, 2.0]), np.array([-0.0, 2.0]), np.array([1.0, 2.0])], "y": [0, 0, 1]})
    for table in (scalars, arrays):
        assert evaluation_rows(table, data, recipe_file=RECIPE, calibrated=False).distinct_inputs == {"overall": 2}


def test_one_image_saved_with_other_metadata_and_compression_is_one_input(tmp_path: Path) -> None:
    """The same pixels written as a PNG twice, once with a text chunk and the strongest compression: other bytes,
    one input to the model; an image one pixel apart is another."""
    image = pytest.importorskip("PIL.Image")
    png_info = pytest.importorskip("PIL.PngImagePlugin")
    pixels = np.random.default_rng(3).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    folder = tmp_path / "images"
    folder.mkdir()
    image.fromarray(pixels).save(folder / "a.png", compress_level=1)
    tagged = png_info.PngInfo()
    tagged.add_text("Software", "another exporter")
    image.fromarray(pixels).save(folder / "b.png", compress_level=9, pnginfo=tagged)
    other = pixels.copy()
    other[0, 0, 0] ^= 1
    image.fromarray(other).save(folder / "c.png")
    assert (folder / "a.png").read_bytes() != (folder / "b.png").read_bytes()
    table = pd.DataFrame({"file": ["a.png", "b.png", "c.png"], "y": [0, 0, 1]})
    data = DataSpec(path=Path("t.parquet"), inputs={"file": {"image": {"root": "images"}}}, label="y")
    rows = evaluation_rows(table, data, recipe_file=tmp_path / "r.yaml", calibrated=False)
    assert rows.distinct_inputs == {"overall": 2}


def test_the_thin_sample_warning_counts_calibration_rows_as_the_model_input_takes_them(
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Eight float64 values that one float32 holds: one input to a float32 model input, however they are written."""
    table = pd.DataFrame({"x": 0.3 * (1 + np.arange(8) * 1e-12)})
    data = DataSpec(path=Path("d.parquet"), inputs={"x": "x"}, calibration={"samples": 8})
    with caplog.at_level(logging.WARNING):
        calibration_sample(table, data, {}, recipe_file=RECIPE, warn=True, dtypes={"x": np.dtype(np.float32)})
    assert [r.getMessage() for r in caplog.records] == [
        "data.calibration: the 8 calibration rows drawn hold 1 distinct input (the others repeat them): the "
        "calibrated ranges are those of 1 row"]  # fmt: skip


def test_only_the_images_of_the_rows_digested_are_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of many images of which a few are evaluated: the others' paths are kept, none of them decoded."""
    image = pytest.importorskip("PIL.Image")
    from qbench.data import images
    from qbench.data.content import content_table

    (tmp_path / "images").mkdir()
    for index in range(4):
        image.fromarray(np.full((4, 4, 3), index * 60, np.uint8)).save(tmp_path / "images" / f"{index}.png")
    decoded: list[Path] = []
    digest = images.pixels_sha256
    monkeypatch.setattr(images, "pixels_sha256", lambda path, *a, **k: decoded.append(path) or digest(path, *a, **k))
    table = pd.DataFrame({"file": [f"{index}.png" for index in range(4)], "y": [0, 1, 0, 1]})
    data = DataSpec(path=Path("t.parquet"), inputs={"file": {"image": {"root": "images"}}}, label="y")
    content = content_table(table, data, recipe_file=tmp_path / "r.yaml", rows=np.array([2, 0]))
    assert sorted(path.name for path in decoded) == ["0.png", "2.png"]
    assert content["file"].tolist()[1::2] == ["1.png", "3.png"] and content["file"][0].startswith("image pixels")
