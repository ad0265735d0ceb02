"""Image inputs: a column of image file paths decoded with Pillow into a model input (qbench.data.images)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from image_project import MEAN, SIDE, STD, cnn, png

from qbench.data.evaluation import evaluation_rows
from qbench.data.feeds import build_feeds
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec, ImageInputSpec, ImageSpec

Image = pytest.importorskip("PIL.Image")



def _meta(shape: tuple[int | None, ...] = (None, 3, SIDE, SIDE), dtype: type = np.float32) -> dict[str, TensorMeta]:
    return {"pixels": TensorMeta("pixels", np.dtype(dtype), shape)}


def _feed(tmp_path: Path, cells: list[str], shape=(None, 3, SIDE, SIDE), **options) -> np.ndarray:
    spec = ImageInputSpec(image=ImageSpec(root=Path("images"), **options))
    table = pd.DataFrame({"file": cells})
    feeds = build_feeds(table, np.arange(len(cells)), {"file": spec}, _meta(shape), recipe_file=tmp_path / "r.yaml")
    return feeds["pixels"]


def _refusal(tmp_path: Path, cells: list[str], shape=(None, 3, SIDE, SIDE), **options) -> str:
    with pytest.raises(RecipeError) as caught:
        _feed(tmp_path, cells, shape, **options)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_center_crop_scales_the_shorter_side_then_crops_the_centre(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 32, 3))  # height 20, width 32
    png(tmp_path / "images" / "wide.png", pixels)
    fed = _feed(tmp_path, ["wide.png"], shape=(None, 3, None, None), size=[16, 16], mean=MEAN, std=STD)
    # by hand: the shorter side (20) to 16, the longer to int(16 * 32 / 20) = 25, then columns 4..20 (round(9 / 2))
    scaled = np.asarray(Image.fromarray(pixels.astype(np.uint8)).resize((25, 16), Image.Resampling.BILINEAR))
    expected = ((scaled[:, 4:20].astype(np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1)
    assert fed.shape == (1, 3, 16, 16) and fed.dtype == np.float32
    np.testing.assert_allclose(fed[0], expected, rtol=1e-6, atol=1e-6)


def test_stretch_layout_and_mode_follow_the_model_input(tmp_path):
    pixels = np.arange(4 * 6 * 3).reshape(4, 6, 3) * 3
    png(tmp_path / "images" / "a.png", pixels)
    # an NHWC input of one channel: grayscale, channels last, read from the shape
    fed = _feed(tmp_path, ["a.png"], shape=(None, 4, 6, 1), scale=1.0)
    gray = np.asarray(Image.fromarray(pixels.astype(np.uint8)).convert("L"), dtype=np.float32)
    np.testing.assert_array_equal(fed[0, :, :, 0], gray)
    stretched = _feed(tmp_path, ["a.png"], shape=(None, 3, 2, 3), resize="stretch", interpolation="nearest", scale=1.0)
    by_hand = np.asarray(Image.fromarray(pixels.astype(np.uint8)).resize((3, 2), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(stretched[0], by_hand.transpose(2, 0, 1))


def test_crop_pct_layout_and_input_as_the_recipe_writes_them(tmp_path):
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (12, 12, 3))
    png(tmp_path / "images" / "a.png", pixels)
    entry = yaml.safe_load("{image: {root: images, size: [3, 3], crop_pct: 0.5, layout: NHWC, interpolation: nearest, "
                           "scale: 1}, input: second}")  # fmt: skip
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"file": entry, "other": "first"}})
    table = pd.DataFrame({"file": ["a.png"], "other": [[1.0]]})
    model = {"first": TensorMeta("first", np.dtype(np.float32), (None, 1)),
             "second": TensorMeta("second", np.dtype(np.float32), (None, None, None, 3))}  # fmt: skip
    fed = build_feeds(table, np.arange(1), data.inputs, model, recipe_file=tmp_path / "r.yaml")["second"]
    # by hand: crop_pct 0.5 scales the 12 x 12 image to int(3 / 0.5) = 6, then keeps rows and columns 2..4
    scaled = np.asarray(Image.fromarray(pixels.astype(np.uint8)).resize((6, 6), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(fed[0], scaled[2:5, 2:5])
    del data.inputs["other"]
    with pytest.raises(RecipeError, match=r"data\.inputs\.file\.input: 'second' is not an input of the model"):
        build_feeds(table, np.arange(1), data.inputs, {"first": model["first"]}, recipe_file=tmp_path / "r.yaml")
    entry.pop("input")
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"file": entry}})
    with pytest.raises(RecipeError, match=r"data\.inputs\.file\.input: the model inputs first, second are fed by no "):
        build_feeds(table, np.arange(1), data.inputs, model, recipe_file=tmp_path / "r.yaml")


def test_a_csv_column_of_paths_that_look_like_numbers_is_read_as_paths(tmp_path):
    from qbench.data.evaluation import load_data_table

    for name in ("0001", "0002"):
        png(tmp_path / "images" / f"{name}.png", np.full((SIDE, SIDE, 3), int(name)))
        (tmp_path / "images" / name).write_bytes((tmp_path / "images" / f"{name}.png").read_bytes())
    (tmp_path / "rows.csv").write_text("file,y\n0001,0\n0002,1\n")
    data = DataSpec(path=Path("rows.csv"), inputs={"file": {"image": {"root": "images", "scale": 1.0}}}, label="y")
    table = load_data_table(tmp_path / "rows.csv", data, label_names=False, recipe_file=tmp_path / "r.yaml")
    assert table["file"].tolist() == ["0001", "0002"]  # read as numbers, they were 1 and 2: no such files
    fed = build_feeds(table, np.arange(2), data.inputs, _meta(), recipe_file=tmp_path / "r.yaml")["pixels"]
    assert fed[:, 0, 0, 0].tolist() == [1.0, 2.0]


def test_a_missing_file_is_one_line_naming_the_row_and_the_path(tmp_path):
    png(tmp_path / "images" / "a.png", np.zeros((SIDE, SIDE, 3)))
    line = _refusal(tmp_path, ["a.png", "gone.png"])
    assert line.startswith(f"{tmp_path / 'r.yaml'}: data.inputs.file: row 1: image file ")
    assert str(tmp_path / "images" / "gone.png") in line and "not found" in line


def test_images_that_would_not_fit_in_memory_are_refused_before_any_is_decoded(tmp_path, monkeypatch):
    """Three rows of 8x8 RGB images as float32 take 768 bytes each: with 2,000 bytes available the feed is refused,
    before any is decoded, in one line naming the column and how many rows fit; with 2,304 it is built."""
    png(tmp_path / "images" / "a.png", np.zeros((SIDE, SIDE, 3)))
    png(tmp_path / "images" / "b.png", np.zeros((SIDE, SIDE, 3)))
    monkeypatch.setattr("qbench.data.images.available_memory", lambda: 2000)
    line = _refusal(tmp_path, ["a.png", "b.png", "a.png"])
    assert "data.inputs.file: 3 images decode to 0.0 GiB (0.00 MiB each as [3, 8, 8] float32)" in line
    assert "expected at most 2 rows (data.evaluation.limit, data.calibration.samples)" in line
    monkeypatch.setattr("qbench.data.images.available_memory", lambda: 3 * 768)
    assert _feed(tmp_path, ["a.png", "b.png", "a.png"]).shape == (3, 3, SIDE, SIDE)


def test_a_corrupt_image_is_one_line_naming_the_row_and_the_file(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    line = _refusal(tmp_path, ["bad.png"])
    assert f"data.inputs.file: row 0: {tmp_path / 'images' / 'bad.png'} cannot be read as an image" in line


def test_a_mode_giving_other_channels_than_the_model_takes_is_refused(tmp_path):
    png(tmp_path / "images" / "a.png", np.zeros((SIDE, SIDE, 3)))
    line = _refusal(tmp_path, ["a.png"], shape=(None, 1, SIDE, SIDE), mode="RGB")
    assert "data.inputs.file.image.mode: model input 'pixels' has shape [?, 1, 8, 8], 1 channel in layout NCHW, " \
           "but mode RGB gives 3 channels; expected mode: L" in line
    assert "image.size: got [4, 4]" in _refusal(tmp_path, ["a.png"], size=[4, 4])
    assert "image.mean: got 2 values, but mode RGB has 3 channels" in _refusal(tmp_path, ["a.png"], mean=[0.1, 0.2])
    assert "image.std: got 3 values, but mode L has 1 channel; expected one value per channel, or one for all" in \
        _refusal(tmp_path, ["a.png"], shape=(None, 1, SIDE, SIDE), std=[0.2, 0.2, 0.2])


def test_a_relative_path_may_not_leave_the_root_but_an_absolute_one_may(tmp_path):
    outside = png(tmp_path / "elsewhere" / "a.png", np.full((SIDE, SIDE, 3), 255))
    (tmp_path / "images").mkdir()
    line = _refusal(tmp_path, ["../elsewhere/a.png"])
    assert "data.inputs.file.image.root: row 0: '../elsewhere/a.png' leads to" in line and "outside" in line
    fed = _feed(tmp_path, [str(outside)])
    np.testing.assert_allclose(fed, 1.0)


def test_two_rows_naming_one_image_or_its_copy_are_one_input(tmp_path):
    rng = np.random.default_rng(1)
    first = png(tmp_path / "images" / "a.png", rng.integers(0, 256, (SIDE, SIDE, 3)))
    (tmp_path / "images" / "copy.png").write_bytes(first.read_bytes())
    png(tmp_path / "images" / "b.png", rng.integers(0, 256, (SIDE, SIDE, 3)))
    table = pd.DataFrame({"file": ["a.png", "./a.png", "copy.png", "b.png"], "y": [0, 0, 0, 1]})
    data = DataSpec(path=Path("t.parquet"), inputs={"file": {"image": {"root": "images"}}}, label="y")
    rows = evaluation_rows(table, data, recipe_file=tmp_path / "r.yaml", calibrated=False)
    assert rows.distinct_inputs == {"overall": 2}


# --- images as cameras and pipelines write them ------------------------------------------------------------------


def test_exif_orientation_alpha_and_frames_are_read_as_torchvisions_loader_reads_them(tmp_path):
    """docs/images.md's rule: the stored pixels of `Image.open(f).convert(mode)`: a JPEG tagged "rotate 90°" fed
    sideways, an RGBA PNG's colours without its alpha, an animated GIF's first frame."""
    rng = np.random.default_rng(4)
    (tmp_path / "images").mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    Image.fromarray(rng.integers(0, 256, (SIDE, 2 * SIDE, 3)).astype(np.uint8)).save(tmp_path / "images" / "tag.jpg",
                                                                                      exif=exif)  # fmt: skip
    rgba = rng.integers(0, 256, (SIDE, SIDE, 4)).astype(np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "images" / "alpha.png")
    frames = [Image.fromarray(np.full((SIDE, SIDE, 3), value, np.uint8)) for value in (10, 200)]
    frames[0].save(tmp_path / "images" / "anim.gif", save_all=True, append_images=frames[1:], duration=50)
    fed = _feed(tmp_path, ["tag.jpg", "alpha.png", "anim.gif"], shape=(None, 3, SIDE, 2 * SIDE), resize="stretch",
                interpolation="nearest", scale=1.0)  # fmt: skip
    stored = np.asarray(Image.open(tmp_path / "images" / "tag.jpg").convert("RGB"))  # 8 high, 16 wide: as stored
    np.testing.assert_array_equal(fed[0], stored.transpose(2, 0, 1))
    np.testing.assert_array_equal(fed[1, :, :, ::2], rgba[:, :, :3].transpose(2, 0, 1))  # each column twice
    np.testing.assert_array_equal(fed[2], 10)


def test_a_16_bit_png_is_read_by_its_high_byte_not_clipped(tmp_path):
    """Pillow's convert clips 16-bit values over 255 to 255 (a 16-bit photo fed all white): each is read as value >> 8,
    the same in both modes; float pixels (mode F), whose range the file does not state, are refused in one line."""
    values = np.array([0, 255, 256, 1000, 32768, 40000, 65280, 65535] * SIDE, dtype=np.uint16).reshape(SIDE, SIDE)
    (tmp_path / "images").mkdir()
    Image.fromarray(values).save(tmp_path / "images" / "deep.png")
    assert Image.open(tmp_path / "images" / "deep.png").mode == "I;16"
    by_hand = np.array([0, 0, 1, 3, 128, 156, 255, 255] * SIDE, dtype=np.float32).reshape(SIDE, SIDE)
    gray = _feed(tmp_path, ["deep.png"], shape=(None, 1, SIDE, SIDE), scale=1.0)
    np.testing.assert_array_equal(gray[0, 0], by_hand)
    rgb = _feed(tmp_path, ["deep.png"], scale=1.0)
    np.testing.assert_array_equal(rgb[0], np.stack([by_hand] * 3))
    Image.fromarray(values.astype(np.float32) / 65535).save(tmp_path / "images" / "float.tif")
    line = _refusal(tmp_path, ["deep.png", "float.tif"])
    assert f"data.inputs.file: row 1: {tmp_path / 'images' / 'float.tif'} holds pixels of mode F" in line
    assert "expected an image of 8-bit or unsigned 16-bit pixels" in line


def test_a_url_or_a_path_with_spaces_at_its_ends_is_refused_saying_so(tmp_path):
    png(tmp_path / "images" / "a.png", np.zeros((SIDE, SIDE, 3)))
    for url in ("s3://bucket/a.png", f"file://{tmp_path / 'images' / 'a.png'}"):
        line = _refusal(tmp_path, ["a.png", url])
        assert f"data.inputs.file: row 1: {url!r} is a URL; expected the path of a local image file" in line
    line = _refusal(tmp_path, ["a.png", " a.png"])  # a CSV written `file, label` / `a.png, 0`
    assert "row 1: image file '" + str(tmp_path / "images" / " a.png") + "' not found (cell ' a.png', which has " \
        "spaces at its start or end; 'a.png' is there)" in line
    assert "'b.png' is not there" in _refusal(tmp_path, ["b.png "])


def test_an_image_over_pillows_bomb_limit_is_one_logged_line_and_over_twice_it_refused(tmp_path, monkeypatch, caplog):
    import warnings

    png(tmp_path / "images" / "big.png", np.zeros((10, 10, 3)))  # 100 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's own two-line warning would raise here
        assert _feed(tmp_path, ["big.png"]).shape == (1, 3, SIDE, SIDE)
    logged = [record.getMessage() for record in caplog.records if record.name == "qbench.data.images"]
    assert logged == [f"data.inputs.file: row 0: {tmp_path / 'images' / 'big.png'} is 10 x 10 pixels (100), over "
                      "Pillow's decompression-bomb limit of 60 (PIL.Image.MAX_IMAGE_PIXELS); decoded, but an image "
                      "over twice the limit is refused"]  # fmt: skip
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)
    assert "cannot be read as an image (Image size (100 pixels) exceeds limit of 80 pixels" in \
        _refusal(tmp_path, ["big.png"])


# --- a sweep over a tiny CNN fed PNG files -----------------------------------------------------------------------


def test_a_sweep_of_fp16_and_int8_reads_the_images_as_decoded_by_hand(tmp_path):
    import onnxruntime as ort

    from qbench.sweep.runner import run_sweep

    cnn(tmp_path / "cnn.onnx")
    rng = np.random.default_rng(2)
    count = 48
    images = rng.integers(0, 256, (count, SIDE, SIDE, 3))
    for index, pixels in enumerate(images):
        png(tmp_path / "images" / f"{index}.png", pixels)
    hand = ((np.stack([np.asarray(Image.open(tmp_path / "images" / f"{i}.png")) for i in range(count)]).astype(np.float32)
             / 255 - MEAN) / STD).transpose(0, 3, 1, 2).astype(np.float32)  # fmt: skip
    session = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    predicted = session.run(None, {"pixels": hand})[0].argmax(axis=1)
    labels = predicted.copy()
    labels[::5] = (labels[::5] + 1) % 3  # a fifth of the labels disagree with the model
    split = np.array(["calib"] * 16 + ["eval"] * 32)
    tint = np.where(np.arange(count) % 2 == 0, "warm", "cool")
    pd.DataFrame({"file": [f"{i}.png" for i in range(count)], "label": labels, "split": split, "tint": tint}).to_parquet(tmp_path / "rows.parquet")
    recipe = {
        "name": "cnn", "task": "classification", "model": {"path": "cnn.onnx"},
        "data": {"path": "rows.parquet", "label": "label",
                 "inputs": {"file": {"image": {"root": "images", "mean": MEAN, "std": STD}}},
                 "calibration": {"filter": {"split": "calib"}, "samples": 16},
                 "evaluation": {"filter": {"split": "eval"}}, "slices": [{"by": "tint"}]},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3},
        "gate": {"metric": "agreement", "max_drop": 1.0}, "output_dir": str(tmp_path / "reports"),
    }  # fmt: skip
    (tmp_path / "cnn.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    outcome = run_sweep(tmp_path / "cnn.yaml", track=False)
    evaluated = split == "eval"
    fp32 = outcome.results.find("fp32", "onnxruntime-cpu").accuracy
    assert fp32.overall.metrics["accuracy"] == pytest.approx(np.mean(predicted[evaluated] == labels[evaluated]))
    warm = {s.name: s for s in fp32.slices}["tint=warm"]
    in_warm = evaluated & (tint == "warm")
    assert warm.metrics["accuracy"] == pytest.approx(np.mean(predicted[in_warm] == labels[in_warm]))
    for name in ("fp16", "int8"):
        variant = outcome.results.find(name, "onnxruntime-cpu")
        assert variant.status == "ok" and variant.accuracy.rows == 32
    recorded = outcome.results.inputs["data.inputs.file.image files"]
    assert recorded["path"] == str(tmp_path / "images")
    from qbench.gate.fresh import stale_inputs
    from qbench.recipe.spec import load_recipe

    assert stale_inputs(outcome.results, load_recipe(tmp_path / "cnn.yaml")) == ([], [])
    png(tmp_path / "images" / "3.png", 255 - images[3])  # one image rewritten after the sweep: its results are stale
    problems, _ = stale_inputs(outcome.results, load_recipe(tmp_path / "cnn.yaml"))
    assert len(problems) == 1 and "data.inputs.file.image files" in problems[0]


def test_the_input_digest_changes_with_an_image_files_bytes_not_its_path(tmp_path):
    from qbench.provenance import input_digests
    from qbench.recipe.spec import load_recipe

    png(tmp_path / "images" / "a.png", np.zeros((SIDE, SIDE, 3)))
    pd.DataFrame({"file": ["a.png"], "y": [0]}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "r", "task": "classification", "model": {"path": "m.onnx"},
              "data": {"path": "rows.parquet", "label": "y", "inputs": {"file": {"image": {"root": "images"}}}},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "m.onnx").write_bytes(b"not read here")
    name = "data.inputs.file.image files"
    before = input_digests(load_recipe(tmp_path / "r.yaml"))[name].sha256
    png(tmp_path / "images" / "a.png", np.ones((SIDE, SIDE, 3)))  # same name, one pixel value more
    after = input_digests(load_recipe(tmp_path / "r.yaml"))
    assert after[name].sha256 != before and after[name].path == str(tmp_path / "images")
    assert load_recipe(tmp_path / "r.yaml").data.image_columns["file"].mean is None


def test_a_model_input_whose_shape_is_not_stated_takes_the_recipes_size(tmp_path):
    """An ONNX input with no shape at all (unknown rank): size from the recipe, RGB and NCHW by default, or the
    one-line refusal asking for size. Reading channels, height and width off the empty shape raised IndexError
    ('tuple index out of range', exit 2 as a crash) unless the recipe said layout: NHWC."""
    pixels = np.arange(SIDE * SIDE * 3).reshape(SIDE, SIDE, 3)
    png(tmp_path / "images" / "a.png", pixels)
    fed = _feed(tmp_path, ["a.png"], shape=(), size=[SIDE, SIDE], scale=1.0)
    assert fed.shape == (1, 3, SIDE, SIDE)
    np.testing.assert_array_equal(fed[0], pixels.transpose(2, 0, 1))
    assert _refusal(tmp_path, ["a.png"], shape=()).endswith(
        "data.inputs.file.image.size: model input 'pixels' has shape (not stated), which states no height and width; "
        "expected size: [height, width]")
