"""The image files a recipe's rows name: what its input digest covers and what a sweep copies into its snapshot.

An image column's input is exactly the files the rows of the data table (and of a separate calibration table) name,
each by its name (qbench.data.images.image_file: its path relative to `image.root`, or its absolute path) and the
sha256 of its bytes; its digest is over those names and digests. A file in the root that no row names costs no read
and no copy, and adding one leaves results fresh; an image read by an absolute path outside the root is covered as
one under it. Each file's digest is remembered while its stat stays the same (qbench.digests.bytes_sha256), so
hashing an unchanged folder again (the gate, the next sweep) reads no file's bytes. A cell naming no file (missing,
leaving the root) is left out: building the feeds reports it, naming its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from qbench.data.images import image_file, image_root
from qbench.digests import bytes_sha256, files_sha256

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import Recipe


@dataclass(frozen=True)
class ImageFiles:
    """One image column's files: its root folder, and file name -> sha256 of its bytes."""

    root: Path
    files: dict[str, str]

    @property
    def sha256(self) -> str:
        """The digest of exactly these files: their names and their bytes' digests."""
        return files_sha256(self.files)


def source_path(root: Path, name: str) -> Path:
    """The user's file of a name (qbench.data.images.image_file): absolute as it is, else under `root`."""
    path = Path(name)
    return path if path.is_absolute() else root / path


def referenced_images(recipe: Recipe) -> dict[str, ImageFiles]:
    """Image column -> the files the recipe's data (and calibration) rows name, each hashed (see the module)."""
    from qbench.data.evaluation import load_data_table

    images = recipe.data.image_columns
    if not images:
        return {}
    paths = [recipe.data_path] + ([recipe.calibration_data_path] if recipe.calibration_data_path is not None else [])
    fields = ["data.path", "data.calibration.path"]
    tables = [load_data_table(path, recipe.data, label_names=False, recipe_file=recipe.source, field=field)
              for path, field in zip(paths, fields)]  # fmt: skip
    found = {}
    for column, spec in images.items():
        root = image_root(spec, recipe_file=recipe.source, column=column)
        cells = pd.unique(pd.concat([table[column] for table in tables if column in table.columns]).dropna()) \
            if any(column in table.columns for table in tables) else []  # fmt: skip
        files: dict[str, str] = {}
        for cell in cells:
            if not isinstance(cell, str) or not cell.strip():
                continue
            path, name = image_file(cell, root)
            if name is None or name in files:
                continue
            try:
                files[name] = bytes_sha256(path)
            except OSError:  # missing, or a folder: building the feeds names the row
                continue
        found[column] = ImageFiles(root, files)
    return found
