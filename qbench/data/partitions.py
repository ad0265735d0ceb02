"""Read a folder of Parquet part files, as Spark, Hive, Dask or pyarrow write a table: one table, every part's
rows in the order of the parts' paths, with Hive-style partition columns (`region=eu/part-0000.parquet`) taken
from the folder names.

A partition value lives in a folder name, as text: it is read as a CSV cell is (a column every value of which is
a number becomes numbers, except the caller's `text_columns`, whose values keep the text the path holds, so
`code=007` stays the slice `code=007`), `__HIVE_DEFAULT_PARTITION__` (Spark's and Hive's null) is missing, and
`%XX` escapes are decoded. Files and folders whose names start with `_` or `.` (`_SUCCESS`, `.part-0.crc`,
`_delta_log`) are not data, as Spark and pyarrow skip them.

Every part must hold the same columns with the same types, and every part the same partition keys: a table
read from parts that disagree would silently lose or fill columns (pyarrow's own dataset takes the first file's
schema), so a disagreement is an error naming the part.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from urllib.parse import unquote

import pandas as pd

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def is_parquet_folder(folder: Path) -> bool:
    """Whether `folder` holds Parquet part files (anywhere below it, hidden files and folders left aside)."""
    return any(path.suffix.lower() == ".parquet" for path in data_files(folder))


def data_files(folder: Path) -> list[Path]:
    """The files under `folder` that may hold data, in path order (the order their rows are read in)."""
    return sorted(
        path for path in folder.rglob("*")
        if path.is_file() and not any(part.startswith(("_", ".")) for part in path.relative_to(folder).parts)
    )  # fmt: skip


def read_parquet_folder(
    folder: Path, *, read_part: Callable[[Path], pd.DataFrame],
    text_as_numbers: Callable[[pd.Series], pd.Series | None],
    text_columns: Collection[str] = (),
) -> pd.DataFrame:  # fmt: skip
    """One table from every Parquet part under `folder` (each read with `read_part`), partition columns last."""
    import pyarrow.parquet as pq

    files = data_files(folder)
    other = next((path for path in files if path.suffix.lower() != ".parquet"), None)
    if other is not None:
        raise ValueError(f"{other.relative_to(folder)} is not a .parquet file; expected a folder of Parquet part "
                         "files only (files named _* or .* are skipped)")  # fmt: skip
    first_keys = _partition_keys(files[0], folder)
    first_schema = pq.read_schema(files[0]).remove_metadata()
    frames = []
    for path in files:
        keys = _partition_keys(path, folder)
        if [key for key, _ in keys] != [key for key, _ in first_keys]:
            raise ValueError(f"{path.relative_to(folder)} is under partition keys {_shown(keys)}, "
                             f"{files[0].relative_to(folder)} under {_shown(first_keys)}; expected every part under "
                             "the same key=value folders")  # fmt: skip
        schema = pq.read_schema(path).remove_metadata()
        if set(zip(schema.names, schema.types)) != set(zip(first_schema.names, first_schema.types)):
            raise ValueError(f"part {path.relative_to(folder)} holds columns {_columns(schema)}, part "
                             f"{files[0].relative_to(folder)} {_columns(first_schema)}; expected every part to hold "
                             "the same columns with the same types")  # fmt: skip
        clash = next((key for key, _ in keys if key in schema.names), None)
        if clash is not None:
            raise ValueError(f"column {clash!r} is both in part {path.relative_to(folder)} and in its folder name "
                             f"{clash}=...; expected a partition column in the folder names only")  # fmt: skip
        frame = read_part(path)
        for key, value in keys:
            frame[key] = pd.Series([value] * len(frame), index=frame.index, dtype=object)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    for key, _ in first_keys:
        values = table[key].astype(object)
        numbers = None if key in text_columns else text_as_numbers(values)
        table[key] = values if numbers is None else numbers
    return table


def _partition_keys(path: Path, folder: Path) -> list[tuple[str, str | None]]:
    """The `key=value` folders between `folder` and `path`, decoded (other folders name no column)."""
    keys = []
    for part in path.relative_to(folder).parts[:-1]:
        key, equals, value = part.partition("=")
        if equals:
            value = unquote(value)
            keys.append((unquote(key), None if value == HIVE_NULL else value))
    return keys


def _shown(keys: list[tuple[str, str | None]]) -> str:
    return "(" + ", ".join(key for key, _ in keys) + ")" if keys else "(none)"


def _columns(schema: object) -> str:
    shown = ", ".join(f"{name}: {kind}" for name, kind in zip(schema.names, schema.types))  # type: ignore[attr-defined]
    return shown if len(shown) <= 200 else shown[:197] + "..."
