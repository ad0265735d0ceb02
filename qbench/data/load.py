"""Read the recipe's data table into a pandas DataFrame.

Formats: `.parquet` (pyarrow) or a folder of Parquet part files (Spark/Hive layouts,
partition columns from `key=value` folder names: qbench.data.partitions), `.csv` / `.tsv`
(qbench.data.text_tables: their dialect, text columns, numbers and JSON list cells),
`.jsonl` / `.ndjson` (one JSON object per line), each of these also compressed
(`.csv.gz`, `.jsonl.bz2`, `.ndjson.xz`), `.npz` (one column per array, rows along axis 0)
or a structured `.npy`, Feather / Arrow IPC files (`.feather`, `.arrow`), or a folder
written by `datasets`' `save_to_disk` (needs the `datasets` extra). Rows are addressed by position 0..N-1 everywhere in
qbench, so the frame always comes back with a clean RangeIndex.

Parquet, Feather, JSON lines, NumPy files and `datasets` folders keep the types they store, but the text cells of
the columns a recipe reads as values (inputs, label) mean what the same cells mean in a CSV file
(text_tables.parse_text_cells: JSON list text is lists, numbers written as text numbers, 'true'/'false' booleans,
except in the caller's `text_columns`). Arrow's decimals are read as numbers: pandas would give Python Decimal
objects, which are neither class ids nor numbers to NumPy, so a decimal column is read as integers where every
value is whole (a decimal(5, 0) label), as floats otherwise.
"""

from __future__ import annotations

import csv
import json
import lzma
import zipfile
import zlib
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.data.csv_records import (
    COMPRESSED_SUFFIXES,
    check_unique_columns,
    open_data,
    text_encoding,
    undecodable_at,
)
from qbench.data.partitions import is_parquet_folder, read_parquet_folder
from qbench.data.text_tables import CsvDialect, parse_text_cells, read_csv, text_as_numbers
from qbench.errors import MissingExtraError, RecipeError, one_line

SOURCE_ATTR = "source"
"""`DataFrame.attrs` key holding the data file's name, for messages like '120 rows in digits.parquet'."""

SUPPORTED_FORMATS = (".parquet, a folder of Parquet part files, .feather, .arrow (an Arrow IPC file), .csv, .tsv, "
                     ".jsonl, .ndjson (these four also as .gz, .bz2 or .xz), .npz, .npy (a structured array), or a "
                     "folder written by `datasets` save_to_disk")


def load_table(
    path: Path, *, recipe_file: Path, field: str = "data.path", text_columns: Collection[str] = (),
    list_columns: Collection[str] = (), verbatim_columns: Collection[str] = (), csv_dialect: CsvDialect = CsvDialect(),
    value_columns: Collection[str] = (), encoding: str | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Read a data table; every problem is a RecipeError at `field` naming the file and the cause. A CSV file (read
    as `csv_dialect` says) keeps its `text_columns`' text (only an empty cell is missing there), unless they are also
    among `list_columns` and every cell is a JSON list (token labels in the label column that otherwise names
    classes), or, in a file with decimal commas, a cell writes a number (not in `verbatim_columns`: see read_csv).
    CSV and JSON lines files are read as their byte order mark says, else as `encoding` (the recipe's
    `data.encoding`), else as UTF-8."""
    path = Path(path)
    if not path.exists():
        raise RecipeError(recipe_file, field, f"file or folder not found: {path}")
    read = _reader_for(path, recipe_file=recipe_file, field=field)
    if read is read_csv:
        read = partial(read_csv, dialect=csv_dialect, text_columns=text_columns, list_columns=list_columns,
                       verbatim_columns=verbatim_columns, encoding=encoding)  # fmt: skip
    else:  # types stored, but text cells read as a CSV file's are: one meaning for the same cells in every format
        if read is _read_parquet_folder:
            read = partial(_read_parquet_folder, text_columns=text_columns)
        elif read is _read_json_lines:
            read = partial(_read_json_lines, encoding=encoding)
        read = partial(_with_text_parsed, partial(_with_struct_fields, read), text_columns=text_columns,
                       list_columns=list_columns, columns=value_columns)  # fmt: skip
    try:
        df = read(path)
        if df.columns.has_duplicates:  # Feather, Arrow and any later reader: pandas keeps both, and a column lookup
            # then returns a frame where every step expects a column (an AttributeError deep in the sweep)
            check_unique_columns([str(name) for name in df.columns], "the table")
    except UnicodeDecodeError as exc:
        where = undecodable_at(path, exc.encoding) or "somewhere"
        raise RecipeError(recipe_file, field, f"cannot read {path.name}: {where} is not {exc.encoding} text; set "
                          "data.encoding to the encoding the file was written in (cp1252 for most Windows and Excel "
                          "exports, latin-1, utf-16, ...)") from None  # fmt: skip
    except (EOFError, zlib.error, lzma.LZMAError) as exc:  # a truncated or damaged compressed file
        raise RecipeError(recipe_file, field, f"cannot read {path.name}: it is not a complete {path.suffix} "
                          f"file ({_one_line(exc)})") from None  # fmt: skip
    except (OSError, ValueError, csv.Error) as exc:
        raise RecipeError(recipe_file, field, f"cannot read {path.name}: {_one_line(exc)}") from None
    if df.empty:
        raise RecipeError(recipe_file, field, f"{path.name} has no rows")
    df = df.reset_index(drop=True)
    df.attrs[SOURCE_ATTR] = path.name
    return df


def _with_text_parsed(
    read: Callable[[Path], pd.DataFrame], path: Path, *, text_columns: Collection[str], list_columns: Collection[str],
    columns: Collection[str],
) -> pd.DataFrame:  # fmt: skip
    return parse_text_cells(read(path), text_columns=text_columns, list_columns=list_columns, columns=columns)


def _with_struct_fields(read: Callable[[Path], pd.DataFrame], path: Path) -> pd.DataFrame:
    """The table, each field of a struct column (a JSON object per line, a Spark/pyarrow struct) also a column of its
    own named as pyarrow's Table.flatten() names it (`meta.region`; nested structs `a.b.c`), a row without the field
    or holding null in it missing there. Before, JSON lines written `{"features": {...}, "meta": {"region": ...}}`
    could feed no field and slice by none: `by: meta.region` was "not a column"."""
    return _struct_fields(read(path))


def _struct_fields(df: pd.DataFrame) -> pd.DataFrame:
    columns: dict[str, pd.Series] = {str(name): df[name] for name in df.columns}
    pending = list(columns)
    added = False
    while pending:
        column = pending.pop(0)
        cells = columns[column]
        present = cells[cells.notna()] if pd.api.types.is_object_dtype(cells) else cells.iloc[:0]
        if present.empty or not isinstance(present.iloc[0], dict) or not present.map(
                lambda cell: isinstance(cell, dict)).all():  # list cells (most object columns): one look
            continue
        for key in dict.fromkeys(str(key) for cell in present for key in cell):
            name = f"{column}.{key}"
            if name in columns:
                raise ValueError(f"column {column!r} holds structs whose field {key!r} is also a column named "
                                 f"{name!r}; expected one column of each name")  # fmt: skip
            values = [cell.get(key) if isinstance(cell, dict) else None for cell in cells]
            columns[name] = pd.Series(values, index=df.index,
                                      dtype=None if any(v is not None for v in values) else object)  # fmt: skip
            pending.append(name)
            added = True
    return pd.concat(columns, axis=1) if added else df


def table_name(df: pd.DataFrame) -> str:
    """The data file a table was loaded from (or 'the table' for a frame built in code)."""
    return str(df.attrs.get(SOURCE_ATTR, "the table"))


def _reader_for(path: Path, *, recipe_file: Path, field: str) -> Callable[[Path], pd.DataFrame]:
    if path.is_dir():
        if not (path / "state.json").is_file() and is_parquet_folder(path):
            return _read_parquet_folder
        _check_saved_dataset_folder(path, recipe_file=recipe_file, field=field)
        return _read_saved_dataset
    suffix = path.suffix.lower()
    compressed = suffix in COMPRESSED_SUFFIXES
    if compressed:
        suffix = Path(path.stem).suffix.lower()  # rows.csv.gz: .csv
    reader = _FILE_READERS.get(suffix)
    if reader is None or (compressed and reader not in (read_csv, _read_json_lines)):
        shown = suffix + path.suffix if compressed else path.suffix or "no suffix"
        raise RecipeError(
            recipe_file, field, f"unsupported data format {shown!r} ({path.name}): expected {SUPPORTED_FORMATS}"
        )
    return reader


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    check_unique_columns(pq.read_schema(path).names, "the schema")  # else pyarrow's "Multiple matches for FieldRef"
    return _decimals_as_numbers(pd.read_parquet(path, engine="pyarrow"))


def _read_arrow(path: Path) -> pd.DataFrame:
    """Feather (v1, or v2: the Arrow IPC file format, as `.arrow` files often hold)."""
    import pyarrow as pa

    try:
        return _decimals_as_numbers(pd.read_feather(path))
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{_one_line(exc)}; expected a Feather file or an Arrow IPC file (an Arrow IPC stream, as a "
                         "`datasets` folder's .arrow files hold, is read through its save_to_disk "
                         "folder)") from None  # fmt: skip


def _decimals_as_numbers(df: pd.DataFrame) -> pd.DataFrame:
    """Columns of Decimal cells (an Arrow decimal) as int64 where the type has no fractional digits (a decimal(5, 0)
    label; float64 if some are missing, as pyarrow reads an integer column with nulls), as float64 otherwise: the
    column's scale decides, not its values, so a price column is floats in every file however whole its prices."""
    from decimal import Decimal

    for name in df.columns:
        present = df[name].dropna()
        if not (pd.api.types.is_object_dtype(df[name]) and len(present) and isinstance(present.iloc[0], Decimal)):
            continue
        if pd.api.types.infer_dtype(present) != "decimal":
            continue  # not every cell is a Decimal: left for the checks downstream to name
        if all(cell.is_finite() and cell.as_tuple().exponent >= 0 and abs(cell) < 2**63 for cell in present):
            whole = "int64" if len(present) == len(df) else "float64"
            df[name] = df[name].map(int, na_action="ignore").astype(whole)
        else:
            df[name] = df[name].astype("float64")
    return df


def _read_parquet_folder(path: Path, text_columns: Collection[str] = ()) -> pd.DataFrame:
    return read_parquet_folder(path, read_part=_read_parquet, text_as_numbers=text_as_numbers,
                               text_columns=text_columns)  # fmt: skip


def _read_json_lines(path: Path, encoding: str | None = None) -> pd.DataFrame:
    encoding = text_encoding(path, encoding)
    _check_unique_keys(path, encoding)
    # dtype=False: keep strings such as "007" as strings instead of guessing numbers.
    return pd.read_json(path, lines=True, dtype=False, encoding=encoding)


def _check_unique_keys(path: Path, encoding: str) -> None:
    """No object names a key twice: a JSON parser keeps the last value silently (a row's second "label" won)."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in pairs]
        check_unique_columns(keys, f"line {number}")
        return dict(pairs)

    with open_data(path, "rt", encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"), object_pairs_hook=unique)
            except json.JSONDecodeError as exc:  # its own "line 1 column 26" counts within this line, not the file
                where = f"{exc.msg.removesuffix(' at')} at character {exc.pos + 1}"
                raise ValueError(f"line {number} is not valid JSON ({where}); expected one JSON object per line "
                                 "(JSON lines)") from None  # fmt: skip
            if not isinstance(row, dict):
                kind = "an array" if line.lstrip().startswith("[") else "not an object"
                raise ValueError(f"line {number} is {kind}; expected one JSON object per line (JSON lines), "
                                 "such as {\"x\": [0.1, 0.2], \"y\": 1}")  # fmt: skip


def _read_npz(path: Path) -> pd.DataFrame:
    """One column per array of `np.savez(path, x=..., y=...)`, rows along axis 0 of each."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as arrays:  # a pickled object array could run code: refused
            return _array_columns({name: arrays[name] for name in arrays.files})
    except (zipfile.BadZipFile, EOFError) as exc:  # a truncated or damaged archive
        raise ValueError(f"it is not a readable .npz archive ({exc or type(exc).__name__})") from None


def _read_npy(path: Path) -> pd.DataFrame:
    """One column per field of a structured array (`np.save` of a record array); a plain array names no column."""
    import numpy as np

    array = np.load(path, allow_pickle=False)
    if array.dtype.names is None:
        raise ValueError(f"it holds one {array.dtype} array of shape {list(array.shape)} that names no column; "
                         "expected a structured array with named fields, or "
                         "an .npz of named arrays: np.savez(path, x=..., y=...)")  # fmt: skip
    return _array_columns({name: array[name] for name in array.dtype.names})


def _array_columns(arrays: dict[str, Any]) -> pd.DataFrame:
    """Arrays sharing their first axis (the rows) as columns: a 1-D array is a column of single values, an array of
    more axes a column of one (axes after the first) array per row, as a Parquet list column gives them."""
    if not arrays:
        raise ValueError("it holds no arrays; expected one array per column, e.g. np.savez(path, x=..., y=...)")
    scalar = [name for name, array in arrays.items() if array.ndim == 0]
    if scalar:
        raise ValueError(f"array {scalar[0]!r} is a single value; expected one entry per row along axis 0")
    rows = {name: len(array) for name, array in arrays.items()}
    if len(set(rows.values())) > 1:
        shown = ", ".join(f"{name}: {count}" for name, count in rows.items())
        raise ValueError(f"its arrays hold different numbers of rows ({shown}); expected the same length along axis 0")
    return pd.DataFrame({name: array if array.ndim == 1 else list(array) for name, array in arrays.items()})


_FILE_READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    ".parquet": _read_parquet,
    ".feather": _read_arrow,
    ".arrow": _read_arrow,
    ".csv": read_csv,
    ".tsv": read_csv,
    ".jsonl": _read_json_lines,
    ".ndjson": _read_json_lines,
    ".npz": _read_npz,
    ".npy": _read_npy,
}


def _check_saved_dataset_folder(folder: Path, *, recipe_file: Path, field: str) -> None:
    """A DatasetDict folder holds several splits: qbench evaluates one table, so ask for one split folder."""
    dict_manifest = folder / "dataset_dict.json"
    if dict_manifest.is_file():
        splits = _dataset_dict_splits(dict_manifest)
        example = f"{folder.name}/{splits[0]}" if splits else f"{folder.name}/<split>"
        raise RecipeError(
            recipe_file,
            field,
            f"{folder.name} is a DatasetDict folder with splits {', '.join(splits) or '(none)'}: "
            f"point data.path at one split folder, e.g. {example}",
        )
    if not (folder / "state.json").is_file():
        raise RecipeError(
            recipe_file,
            field,
            f"{folder.name} is a folder without .parquet files or state.json (not Parquet parts nor a `datasets` "
            f"save_to_disk folder); expected {SUPPORTED_FORMATS}",
        )


def _dataset_dict_splits(manifest: Path) -> list[str]:
    try:
        splits = json.loads(manifest.read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(split) for split in splits]


def _read_saved_dataset(folder: Path) -> pd.DataFrame:
    try:
        import datasets
    except ImportError:
        raise MissingExtraError("the `datasets` package", "datasets") from None
    return datasets.load_from_disk(str(folder)).to_pandas()


def _one_line(exc: BaseException) -> str:
    return one_line(exc) or type(exc).__name__
