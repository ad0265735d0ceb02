"""Image columns: each cell a path to an image file, decoded with Pillow into one model input.

    data:
      inputs:
        path: {image: {root: images, size: [224, 224], mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}

A relative path is read under `image.root` (relative to the recipe file) and may not leave it (`../x.png`); an
absolute path is read where it points. Each image is converted to `mode` (RGB or L), resized (`center_crop`: scaled
to cover size / crop_pct keeping its aspect ratio, then its centre cropped, as torchvision's Resize + CenterCrop;
`stretch`: scaled to size), multiplied by `scale`, less `mean`, over `std`, and laid out NCHW or NHWC. `size`, `mode`
and `layout` default to what the model input's shape states. Files are decoded one at a time straight into the
feed (no file's bytes outlive its decoding), each distinct file once per set of rows.

Which rows feed the model the same input is told by the pixels the files decode to (`image_content`), not by their
paths or bytes: two paths to one file, two copies of one image, or one image saved twice with other metadata or
compression, are one input. Every problem is a RecipeError naming
`data.inputs.<column>.image...` and, for a file, its row and path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.digests import bytes_sha256
from qbench.environment import available_memory
from qbench.errors import MissingExtraError, RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec, ImageInputSpec, ImageSpec, InputTarget

logger = logging.getLogger(__name__)

_CHANNELS = {"RGB": 3, "L": 1}
_MODES = {channels: mode for mode, channels in _CHANNELS.items()}
# unsigned 16-bit pixels (PNG, TIFF): read by their high byte, where Pillow's convert clips every value over 255 to 255
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def image_field(column: str, option: str | None = None) -> str:
    """The recipe field of an image input's option (or of the image input itself), for error messages."""
    return f"data.inputs.{column}.image" + (f".{option}" if option else "")


def image_root(spec: ImageSpec, *, recipe_file: Path, column: str) -> Path:
    """The folder `image.root` names (relative to the recipe file); a RecipeError when it is no folder."""
    root = root_path(spec, recipe_file=recipe_file)
    if not root.is_dir():
        raise RecipeError(recipe_file, image_field(column, "root"), f"{root} is not a folder; expected the folder "
                          "the column's relative image paths are read from")  # fmt: skip
    return root


def root_path(spec: ImageSpec, *, recipe_file: Path) -> Path:
    """The folder `image.root` names, resolved against the recipe file's folder."""
    root = spec.root.expanduser()
    return (root if root.is_absolute() else recipe_file.parent / root).resolve()


def image_input_name(
    column: str, spec: ImageInputSpec, inputs: Mapping[str, InputTarget], model_inputs: Mapping[str, TensorMeta], *,
    recipe_file: Path,
) -> str:  # fmt: skip
    """The model input an image column feeds: `input`, else the one model input no plain column names."""
    if spec.input is not None:
        if spec.input not in model_inputs:
            raise RecipeError(recipe_file, f"data.inputs.{column}.input", f"{spec.input!r} is not an input of the "
                              f"model; expected one of {', '.join(sorted(model_inputs))}")  # fmt: skip
        return spec.input
    named = {target for target in inputs.values() if isinstance(target, str)}
    free = [name for name in model_inputs if name not in named]
    if len(free) != 1:
        raise RecipeError(recipe_file, f"data.inputs.{column}.input", f"the model inputs {', '.join(free) or 'none'} "
                          "are fed by no named column; expected "
                          "`input: <the model input the images feed>`")  # fmt: skip
    return free[0]


@dataclass(frozen=True)
class Geometry:
    """What one decoded image is: its height and width, Pillow mode, and the layout of the feed."""

    size: tuple[int, int]
    mode: str
    layout: str

    @property
    def shape(self) -> tuple[int, ...]:
        """One row's shape in the feed."""
        channels, (height, width) = _CHANNELS[self.mode], self.size
        return (channels, height, width) if self.layout == "NCHW" else (height, width, channels)


def image_geometry(spec: ImageSpec, meta: TensorMeta, *, recipe_file: Path, column: str) -> Geometry:
    """`spec`'s size, mode and layout, each taken from the model input's shape where the recipe leaves it out; a
    RecipeError where they disagree with the shape (a mode giving 3 channels for an input taking 1)."""
    shape = tuple(meta.shape)
    if shape and len(shape) != 4:
        raise RecipeError(recipe_file, image_field(column), f"model input {meta.name!r} has shape {_shown(shape)}; "
                          "expected an image input of rank 4 (batch, channels, height, width or NHWC)")  # fmt: skip
    layout = spec.layout or _layout_of(shape)
    # an input whose shape is not stated (unknown rank) states none of them: size is the recipe's, mode and layout
    # default
    channels, height, width = (None, None, None) if not shape else (shape[1], shape[2], shape[3]) \
        if layout == "NCHW" else (shape[3], shape[1], shape[2])  # fmt: skip
    mode = spec.mode or _MODES.get(channels or 3)
    if mode is None or (channels is not None and _CHANNELS[mode] != channels):
        expected = f"mode: {_MODES[channels]}" if channels in _MODES else "a model input of 1 or 3 channels"
        got = f"mode {mode} gives {_CHANNELS[mode]} channels" if mode else "no mode gives that"
        raise RecipeError(recipe_file, image_field(column, "mode"), f"model input {meta.name!r} has shape "
                          f"{_shown(shape)}, {channels} channel{'s' if channels != 1 else ''} in layout {layout}, but "
                          f"{got}; expected {expected}")  # fmt: skip
    size = tuple(spec.size) if spec.size is not None else (height, width)
    if None in size:
        raise RecipeError(recipe_file, image_field(column, "size"), f"model input {meta.name!r} has shape "
                          f"{_shown(shape)}, which states no height "
                          "and width; expected size: [height, width]")  # fmt: skip
    if (height, width) != (None, None) and any(d is not None and d != s for d, s in zip((height, width), size)):
        raise RecipeError(recipe_file, image_field(column, "size"), f"got {list(size)}, but model input {meta.name!r} "
                          f"has shape {_shown(shape)} (layout {layout}); expected [{height}, {width}]")  # fmt: skip
    for option in ("mean", "std"):
        values = getattr(spec, option)
        if values is not None and len(values) not in (1, _CHANNELS[mode]):
            raise RecipeError(recipe_file, image_field(column, option), f"got {len(values)} values, but mode {mode} "
                              f"has {_CHANNELS[mode]} channel{'s' if _CHANNELS[mode] != 1 else ''}; expected one value "
                              "per channel, or one for all")  # fmt: skip
    return Geometry((int(size[0]), int(size[1])), mode, layout)


def _layout_of(shape: tuple[int | None, ...]) -> str:
    """NHWC where only the last axis can be channels (1 or 3), else NCHW (torchvision's and ONNX's convention)."""
    if shape and shape[3] in (1, 3) and shape[1] not in (1, 3):
        return "NHWC"
    return "NCHW"


def _shown(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" if shape else "(not stated)"


def image_file(cell: str, root: Path) -> tuple[Path, str | None]:
    """The file a cell names (a relative path under `root`, an absolute one as it is) and the name a sweep knows it
    by: its path relative to the root (`a.png` and `./a.png` are one name) or its absolute path; no name for a
    relative path leaving the root."""
    given = os.path.expanduser(cell)  # string operations: a sweep names each of tens of thousands of files
    if os.path.isabs(given):
        return Path(given), str(Path(given))
    # `..` is resolved by name: a link under the root to files elsewhere is the user's layout, not an escape
    name = os.path.normpath(given)
    inside = name != ".." and not name.startswith(".." + os.sep)
    return Path(os.path.normpath(os.path.join(root, given))), Path(name).as_posix() if inside else None


def image_paths(
    cells: pd.Series, column: str, root: Path, *, recipe_file: Path,
    copies: Mapping[str, tuple[Path, str]] | None = None
) -> list[tuple[Path, Path]]:  # fmt: skip
    """Each cell's file and where it is read from (its copy among `copies`, a sweep's snapshot, else the file); a
    RecipeError naming the row for a cell that is no path, one leaving the root, or a file that is not there (not
    among the copies: it was not there when the sweep hashed its inputs)."""
    paths = []
    for row, cell in cells.items():
        if not isinstance(cell, str) or not cell.strip():
            raise RecipeError(recipe_file, f"data.inputs.{column}", f"row {row} holds {cell!r}; expected the path of "
                              "an image file")  # fmt: skip
        if _URL.match(cell):
            raise RecipeError(recipe_file, f"data.inputs.{column}", f"row {row}: {cell!r} is a URL; expected the path "
                              f"of a local image file (relative to {root}, or absolute): copy or mount the files "
                              "first")  # fmt: skip
        path, name = image_file(cell, root)
        if name is None:
            raise RecipeError(recipe_file, image_field(column, "root"), f"row {row}: {cell!r} leads to {path}, "
                              f"outside {root}; expected a path inside the root, or an absolute path")  # fmt: skip
        read = path if copies is None else copies[name][0] if name in copies else None
        if read is None or not read.is_file():
            raise RecipeError(recipe_file, f"data.inputs.{column}", f"row {row}: image file {str(path)!r} not found "
                              f"(cell {cell!r}{_spaces_hint(cell, root)}); expected an existing file")  # fmt: skip
        paths.append((path, read))
    return paths


def _spaces_hint(cell: str, root: Path) -> str:
    """For a cell with spaces at either end (a CSV written `a.png, 0`): that it has them, and whether the file its
    path without them names is there."""
    stripped = cell.strip()
    if stripped == cell:
        return ""
    there = "is" if image_file(stripped, root)[0].is_file() else "is not"
    return f", which has spaces at its start or end; {stripped!r} {there} there"


def image_feed(cells: pd.Series, column: str, spec: ImageSpec, meta: TensorMeta, *, recipe_file: Path) -> np.ndarray:
    """The model input `meta` fed by the images `cells` name: (rows, *Geometry.shape) in the input's dtype. Each
    distinct file is decoded once, one at a time, straight into its row."""
    geometry = image_geometry(spec, meta, recipe_file=recipe_file, column=column)
    dtype = np.dtype(meta.dtype)
    if dtype.kind not in "f" and (spec.scale != 1 or spec.mean is not None or spec.std is not None):
        raise RecipeError(recipe_file, image_field(column, "scale"), f"model input {meta.name!r} takes {dtype}, whole "
                          "pixel values; expected scale: 1 and no mean or std")  # fmt: skip
    # read from a snapshot, the user's root only names the files (it may be gone: the copies are what is read)
    root = root_path(spec, recipe_file=recipe_file) if spec.copies is not None else \
        image_root(spec, recipe_file=recipe_file, column=column)  # fmt: skip
    paths = image_paths(cells, column, root, recipe_file=recipe_file, copies=spec.copies)
    _check_feed_memory(len(paths), geometry.shape, dtype, column, recipe_file=recipe_file)
    feed = np.empty((len(paths), *geometry.shape), dtype=dtype)
    mean = np.asarray(spec.mean if spec.mean is not None else [0.0], dtype=np.float32)
    std = np.asarray(spec.std if spec.std is not None else [1.0], dtype=np.float32)
    first: dict[Path, int] = {}
    for index, (row, (path, read)) in enumerate(zip(cells.index, paths, strict=True)):
        if path in first:
            feed[index] = feed[first[path]]
            continue
        first[path] = index
        pixels = decode(path, spec, geometry, recipe_file=recipe_file, column=column, row=row, read=read)
        if dtype.kind == "f":
            pixels = (pixels.astype(np.float32) * np.float32(spec.scale) - mean) / std
        feed[index] = pixels.transpose(2, 0, 1) if geometry.layout == "NCHW" else pixels
    return feed


def _check_feed_memory(rows: int, shape: tuple[int, ...], dtype: np.dtype, column: str, *, recipe_file: Path) -> None:
    """RecipeError before anything is decoded when the decoded images alone would not fit in the memory available
    (the sweep holds every row's input at once, and more beside it: a lower bound)."""
    per_image = int(np.prod(shape)) * dtype.itemsize
    available = available_memory()
    if available is None or rows * per_image <= available:
        return
    raise RecipeError(recipe_file, f"data.inputs.{column}", f"{rows} images decode to {rows * per_image / 2**30:.1f} "
                      f"GiB ({per_image / 2**20:.2f} MiB each as {list(shape)} {dtype}), but {available / 2**30:.1f} "
                      f"GiB of memory is available; expected at most {available // per_image} rows "
                      "(data.evaluation.limit, data.calibration.samples) or a smaller image.size")  # fmt: skip


def decode(
    path: Path, spec: ImageSpec, geometry: Geometry, *, recipe_file: Path, column: str, row: Any,
    read: Path | None = None
) -> np.ndarray:  # fmt: skip
    """One image file as a (height, width, channels) uint8 array, converted and resized as `spec` says; read from
    `read` (its copy in a sweep's snapshot) where given, named `path` in messages."""
    try:
        from PIL import Image
    except ImportError:
        raise MissingExtraError("the `pillow` package (image inputs)", "images") from None
    where = f"row {row}: {path}"
    try:
        # Pillow's warning for an image over MAX_IMAGE_PIXELS is two lines on stderr: one logged line instead
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(read or path)
        with opened:
            _warn_large(opened, where, column)
            image = _eight_bit(opened, where, column, recipe_file=recipe_file).convert(geometry.mode)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RecipeError(recipe_file, f"data.inputs.{column}", f"{where} cannot be read as an image ({reason}); "
                          "expected an image file Pillow reads (PNG, JPEG, ...)") from None  # fmt: skip
    height, width = geometry.size
    resample = getattr(Image.Resampling, spec.interpolation.upper())
    if spec.resize == "stretch":
        image = image.resize((width, height), resample)
    else:
        # as torchvision's Resize(int): the binding side to size / crop_pct, the other in proportion, truncated
        if height / image.height >= width / image.width:
            new_height = int(height / spec.crop_pct)
            scaled = (max(width, int(new_height * image.width / image.height)), new_height)
        else:
            new_width = int(width / spec.crop_pct)
            scaled = (new_width, max(height, int(new_width * image.height / image.width)))
        if scaled != image.size:
            image = image.resize(scaled, resample)
        left, top = int(round((scaled[0] - width) / 2.0)), int(round((scaled[1] - height) / 2.0))
        image = image.crop((left, top, left + width, top + height))
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def _eight_bit(image: Any, where: str, column: str, *, recipe_file: Path) -> Any:
    """`image` with 8-bit pixels for Pillow's convert: unsigned 16-bit ones by their high byte (value >> 8, 65535 to
    255; convert alone clips every value over 255 to 255); a RecipeError for 32-bit integer or float pixels (modes I,
    F) and signed 16-bit ones, whose range the file does not state."""
    from PIL import Image

    if image.mode in _SIXTEEN_BIT:
        return Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8))
    if image.mode in ("I", "F") or image.mode.startswith("I;"):
        raise RecipeError(recipe_file, f"data.inputs.{column}", f"{where} holds pixels of mode {image.mode} (32-bit "
                          "integer, float or signed), whose range the file does not state; expected an image of 8-bit "
                          "or unsigned 16-bit pixels")  # fmt: skip
    return image


def _warn_large(image: Any, where: str, column: str) -> None:
    """One logged line for an image over Pillow's decompression-bomb warning limit (decoded; over twice the limit
    Pillow refuses it, and so the image)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit and image.width * image.height > limit:
        logger.warning("data.inputs.%s: %s is %d x %d pixels (%s), over Pillow's decompression-bomb limit of %s "
                       "(PIL.Image.MAX_IMAGE_PIXELS); decoded, but an image over twice the limit is refused", column,
                       where, image.width, image.height, f"{image.width * image.height:,}", f"{limit:,}")  # fmt: skip


def image_content(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, rows: np.ndarray | None = None
) -> dict[str, pd.Series]:  # fmt: skip
    """Each image column of `table` with its paths (of `rows`, all where None: decoding is the costly part) replaced
    by a digest of the pixels each file decodes to (pixels_sha256), so that digests of input cells
    (qbench.data.leakage) count one image named twice, stored twice, or saved twice with other metadata or
    compression (the same pixels, other bytes), as one input. In a sweep the files read are its snapshot's copies. A
    cell naming no readable image keeps its path: building the feeds reports it."""
    replaced = {}
    for column, spec in data.image_columns.items():
        if column not in table.columns:
            continue
        root = root_path(spec, recipe_file=recipe_file)
        cells = table[column]
        digested = cells if rows is None else cells.iloc[np.unique(np.asarray(rows, dtype=np.int64))]
        digests = {cell: _content_digest(root, cell, spec) for cell in pd.unique(digested.dropna())}
        replaced[column] = cells.map(lambda cell: digests.get(cell, cell) if isinstance(cell, str) else cell)
    return replaced


def _content_digest(root: Path, cell: object, spec: ImageSpec) -> object:
    if not isinstance(cell, str) or not cell.strip():
        return cell
    path, name = image_file(cell, root)
    if spec.copies is not None:  # name -> the copy's path and the sha256 of its bytes
        return pixels_sha256(*spec.copies[name], mode=spec.mode) if name in spec.copies else cell
    try:
        return pixels_sha256(path, bytes_sha256(path), mode=spec.mode)
    except OSError:
        return cell


_PIXELS: dict[tuple[str, str], str] = {}
_PIXELS_ENTRIES = 1 << 20


def pixels_sha256(path: Path, file_sha256: str, *, mode: str | None) -> str:
    """"image pixels sha256 <digest>" of the pixels the image file at `path` (whose bytes' sha256 is `file_sha256`)
    decodes to, converted as the feed converts them (8-bit, then to `mode`; to RGB where the recipe leaves the mode to
    the model's shape, so two images an L feed takes alike may count as two), with their size: two files of one image,
    one written with other metadata, chunking or lossless compression, feed the model one input. Remembered by the
    bytes' digest: an image is decoded once per process. A file Pillow cannot decode is digested by its bytes (building
    the feeds refuses it)."""
    key = (file_sha256, mode or "RGB")
    digest = _PIXELS.get(key)
    if digest is not None:
        return digest
    try:
        from PIL import Image
    except ImportError:
        raise MissingExtraError("the `pillow` package (image inputs)", "images") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(path)
        with opened:
            image = _eight_bit(opened, str(path), "", recipe_file=path).convert(key[1])
            pixels = f"{image.mode} {image.size} ".encode() + image.tobytes()
        digest = "image pixels sha256 " + hashlib.sha256(pixels).hexdigest()
    except (OSError, ValueError, SyntaxError, RecipeError, Image.DecompressionBombError):
        digest = "image sha256 " + file_sha256
    if len(_PIXELS) >= _PIXELS_ENTRIES:
        _PIXELS.clear()
    _PIXELS[key] = digest
    return digest
