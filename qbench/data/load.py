"""Read the recipe's data table into a pandas DataFrame.

Formats: `.parquet` (pyarrow) or a folder of Parquet part files (Spark/Hive layouts,
partition columns from `key=value` folder names: qbench.data.partitions), `.csv`,
`.jsonl` / `.ndjson` (one JSON object per line), each of these three also compressed
(`.csv.gz`, `.jsonl.bz2`, `.ndjson.xz`), `.npz` (one column per array, rows along axis 0)
or a structured `.npy`, Feather / Arrow IPC files (`.feather`, `.arrow`), or a folder
written by `datasets`' `save_to_disk` (needs the `datasets` extra). Rows are addressed by position 0..N-1 everywhere in qbench, so the frame
always comes back with a clean RangeIndex.

CSV states no types: a column whose every cell is a number is read as numbers, except
the columns the caller names as text (`text_columns`: cells that name things, such as
slice codes "007" and "7" or class labels "01" and "1"), which keep the text the file
holds. Parquet, Feather, JSON lines, NumPy files and `datasets` folders keep the types they store, except Arrow's
decimals: pandas would give Python Decimal objects, which are neither class ids nor numbers to NumPy, so a
decimal column is read as integers where every value is whole (a decimal(5, 0) label), as floats otherwise.

CSV cannot hold arrays: a CSV column whose every non-empty cell is a JSON list
(`"[0.1, 0.2]"`) is parsed into Python lists, so the same table works as CSV,
JSON lines or parquet; so is a label column read as text (class names) when every cell is
one (token labels). A cell that looks like a list but is not valid JSON is an error rather
than a silent string (text in a text column).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import sys
import zipfile
import zlib
from collections.abc import Callable, Collection, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

import pandas as pd

from qbench.data.partitions import is_parquet_folder, read_parquet_folder
from qbench.errors import MissingExtraError, RecipeError, one_line, short_repr

SOURCE_ATTR = "source"
"""`DataFrame.attrs` key holding the data file's name, for messages like '120 rows in digits.parquet'."""

SUPPORTED_FORMATS = (".parquet, a folder of Parquet part files, .feather, .arrow (an Arrow IPC file), .csv, .jsonl, .ndjson (these three also as .gz, .bz2 "
                     "or .xz), .npz, .npy (a structured array), or a folder written by `datasets` save_to_disk")

_OPENERS: dict[str, Callable[..., IO[Any]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
"""Compressed text tables by their last suffix (`rows.csv.gz`); pandas infers the same compression from it."""


def load_table(
    path: Path, *, recipe_file: Path, field: str = "data.path", text_columns: Collection[str] = (),
    list_columns: Collection[str] = (),
) -> pd.DataFrame:  # fmt: skip
    """Read a data table; every problem is a RecipeError at `field` naming the file and the cause. A CSV file's
    `text_columns` keep their cells' text (only an empty cell is missing there), unless they are also among
    `list_columns` and every cell is a JSON list (token labels in the label column that otherwise names classes)."""
    path = Path(path)
    if not path.exists():
        raise RecipeError(recipe_file, field, f"file or folder not found: {path}")
    read = _reader_for(path, recipe_file=recipe_file, field=field)
    if read is _read_csv:
        read = partial(_read_csv, text_columns=text_columns, list_columns=list_columns)
    elif read is _read_parquet_folder:
        read = partial(_read_parquet_folder, text_columns=text_columns)
    try:
        df = read(path)
    except UnicodeDecodeError as exc:
        raise RecipeError(recipe_file, field, f"cannot read {path.name}: it is not {exc.encoding} text; "
                          "expected UTF-8 (or UTF-16 with a byte order mark)") from None  # fmt: skip
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
    compressed = suffix in _OPENERS
    if compressed:
        suffix = Path(path.stem).suffix.lower()  # rows.csv.gz: .csv
    reader = _FILE_READERS.get(suffix)
    if reader is None or (compressed and reader not in (_read_csv, _read_json_lines)):
        shown = suffix + path.suffix if compressed else path.suffix or "no suffix"
        raise RecipeError(
            recipe_file, field, f"unsupported data format {shown!r} ({path.name}): expected {SUPPORTED_FORMATS}"
        )
    return reader


def _open_data(path: Path, mode: str = "rb", **text: Any) -> IO[Any]:
    """Open a data file, decompressing it as its last suffix says (`rows.csv.gz`); `text` as for open()."""
    return _OPENERS.get(path.suffix.lower(), open)(path, mode, **text)


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    _check_unique_columns(pq.read_schema(path).names, "the schema")  # else pyarrow's "Multiple matches for FieldRef"
    return _decimals_as_numbers(pd.read_parquet(path, engine="pyarrow"))


def _read_arrow(path: Path) -> pd.DataFrame:
    """Feather (v1, or v2: the Arrow IPC file format, as `.arrow` files often hold)."""
    import pyarrow as pa

    try:
        return _decimals_as_numbers(pd.read_feather(path))
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{_one_line(exc)}; expected a Feather file or an Arrow IPC file (an Arrow IPC stream, as a "
                         "`datasets` folder's .arrow files hold, is read through its save_to_disk folder)") from None  # fmt: skip


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
    return read_parquet_folder(path, read_part=_read_parquet, text_as_numbers=text_as_numbers, text_columns=text_columns)


def _check_unique_columns(names: Sequence[str], where: str) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where} names column {repeated[0]!r} {names.count(repeated[0])} times; expected each "
                         "column once")  # fmt: skip


OTHER_SEPARATORS = (";", "\t", "|")  # what a CSV export from a spreadsheet in another locale may use


# what spreadsheets, R and databases write for a missing number
MISSING_NUMBER_TEXT = frozenset({"NA", "N/A", "n/a", "NaN", "nan", "-nan", "NULL", "null", "None", "<NA>", "#N/A", "#NA"})


def _read_csv(path: Path, text_columns: Collection[str] = (), list_columns: Collection[str] = ()) -> pd.DataFrame:
    """Only an empty cell is missing in a text column ("NA" is Namibia, "None" a category); in a column of numbers,
    an empty cell or a missing-number text (MISSING_NUMBER_TEXT) is NaN. `text_columns` are read as text whatever
    their cells look like: read as numbers, "007" and "7" would be one value, named 7."""
    encoding = text_encoding(path)
    header = _check_csv_rows(path, encoding)
    kept = [column for column in header if column in set(text_columns)]
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=dict.fromkeys(kept, str), encoding=encoding)
    for column in df.columns:
        if column in kept:
            if column in list_columns and _is_json_list_column(df[column]):
                df[column] = _parse_json_lists(df[column], names=True)
            continue
        if _is_json_list_column(df[column]):
            df[column] = _parse_json_lists(df[column])
        elif not pd.api.types.is_numeric_dtype(df[column]) and not pd.api.types.is_bool_dtype(df[column]):
            numbers = text_as_numbers(df[column])
            if numbers is not None:
                df[column] = numbers
    return df


def text_as_numbers(column: pd.Series) -> pd.Series | None:
    """A text column as numbers when every cell is a number, empty, or a missing-number text; else None."""
    cells = column.where(~column.isin(MISSING_NUMBER_TEXT))
    present = cells.dropna()
    if len(present) and pd.isna(pd.to_numeric(present.iloc[:1], errors="coerce").iloc[0]):
        return None  # most text columns show it on their first cell: no pass over them all
    numbers = pd.to_numeric(cells, errors="coerce")
    return numbers if numbers.notna().sum() == cells.notna().sum() else None


def _check_csv_rows(path: Path, encoding: str) -> list[str]:
    """Every record has as many fields as the header: pandas would pad a short row with NaN silently. Returns the
    header."""
    limit = csv.field_size_limit(sys.maxsize)  # a cell may hold a whole image as a JSON list
    try:
        header, counts = _csv_header(path, encoding, _field_counts)
        if counts is None or (counts != len(header)).any():  # a ragged record, or a blank line (allowed), or a
            # record csv cannot read: read again record by record, to tell which and report the first problem
            _csv_header(path, encoding, partial(_check_field_counts, header=header))
    finally:
        csv.field_size_limit(limit)
    return header


def _field_counts(reader: Any) -> Any:
    """Every record's field count, counted in C (no Python code per record); None where csv fails on a record."""
    import numpy as np

    try:
        return np.fromiter(map(len, reader), dtype=np.int64)
    except csv.Error:
        return None


def _check_field_counts(reader: Any, header: list[str]) -> None:
    """ValueError naming the first non-blank record whose field count is not the header's."""
    for record in reader:
        if any(cell.strip() for cell in record) and len(record) != len(header):
            shown = ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")
            raise ValueError(
                f"line {reader.line_num} has {len(record)} field{'s' if len(record) != 1 else ''}, "
                f"expected {len(header)} like the header ({shown})"
            )


def _csv_header(path: Path, encoding: str, rest: Callable[[Any], Any]) -> tuple[list[str], Any]:
    """The header of a CSV file (checked), and `rest` applied to a csv.reader over the records after it."""
    with _open_data(path, "rt", newline="", encoding=encoding, errors="replace") as handle:
        reader = csv.reader(handle)
        header = next((record for record in reader if len(record) > 1 or (record and record[0].strip())), [])
        if not header:  # pandas: "No columns to parse from file"
            raise ValueError("the file holds no header line; expected a line naming the columns, then a line per row")
        other = next((sep for sep in OTHER_SEPARATORS if len(header) == 1 and sep in header[0]), None)
        if other is not None:  # read as one column, every recipe column would be "missing"
            raise ValueError(f"the header is one column {short_repr(header[0])}: the file looks separated by "
                             f"{other!r}; expected comma-separated values")  # fmt: skip
        _check_unique_columns(header, "the header")  # pandas would read 'y' and rename the second to 'y.1'
        return header, rest(reader)


def _read_json_lines(path: Path) -> pd.DataFrame:
    encoding = text_encoding(path)
    _check_unique_keys(path, encoding)
    # dtype=False: keep strings such as "007" as strings instead of guessing numbers.
    return pd.read_json(path, lines=True, dtype=False, encoding=encoding)


_BYTE_ORDER_MARKS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def text_encoding(path: Path) -> str:
    """How a text table is encoded: UTF-8, or what its byte order mark says (a spreadsheet's "Unicode text" export
    is UTF-16 with one). Text in another encoding fails to decode, and the error names the file and UTF-8."""
    with _open_data(path) as handle:
        start = handle.read(3)
    return next((encoding for mark, encoding in _BYTE_ORDER_MARKS if start.startswith(mark)), "utf-8")


def _check_unique_keys(path: Path, encoding: str) -> None:
    """No object names a key twice: a JSON parser keeps the last value silently (a row's second "label" won)."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in pairs]
        _check_unique_columns(keys, f"line {number}")
        return dict(pairs)

    with _open_data(path, "rt", encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip() and not isinstance(json.loads(line, object_pairs_hook=unique), dict):
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
        raise ValueError(f"it holds one {array.dtype} array of shape {list(array.shape)} that names no column; expected "
                         "a structured array with named fields, or an .npz of named arrays: np.savez(path, x=..., y=...)")  # fmt: skip
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
    ".csv": _read_csv,
    ".jsonl": _read_json_lines,
    ".ndjson": _read_json_lines,
    ".npz": _read_npz,
    ".npy": _read_npy,
}


def _is_json_list_column(column: pd.Series) -> bool:
    """Whether every non-missing cell is text starting with '[' and ending with ']' (vectorised string ops)."""
    if not (pd.api.types.is_string_dtype(column) or pd.api.types.is_object_dtype(column)):
        return False
    cells = column.dropna()
    if cells.empty or pd.api.types.infer_dtype(cells, skipna=False) != "string":
        return False
    first = cells.iloc[0]  # most text columns fail on their first cell
    if not (first.startswith("[") and first.endswith("]")):
        return False
    text = cells.astype(str)
    return bool((text.str.startswith("[") & text.str.endswith("]")).all())


def _parse_json_lists(column: pd.Series, *, names: bool = False) -> pd.Series:
    """The column with its JSON list cells parsed. A column none of whose cells is JSON stays text (labels such as
    '[en]'); one where some are and some are not holds a malformed list, which is an error. A column of `names`
    (a label column whose text may name classes) is parsed only when every cell is a JSON list, as token labels
    are (one class id per token, as a parquet list column holds them); otherwise it keeps its text."""
    parsed = _parse_lists_at_once(column)
    if parsed is not None:
        return parsed
    failures: list[tuple[str, json.JSONDecodeError]] = []

    def parse(cell: object) -> object:
        if not isinstance(cell, str):
            return cell  # a missing cell stays missing
        try:
            return json.loads(cell)
        except json.JSONDecodeError as exc:
            failures.append((cell, exc))
            return cell

    parsed = column.astype(object).map(parse)
    if not failures:
        return parsed
    if names or len(failures) == int(column.notna().sum()):
        return column
    cell, exc = failures[0]
    raise ValueError(f"column {column.name!r}: cell {cell[:40]!r} looks like a JSON list but is not valid JSON ({exc})")


def _parse_lists_at_once(column: pd.Series) -> pd.Series | None:
    """The column's list cells parsed by one json.loads per block of cells joined into one JSON array, when that is
    sure to give what parsing each cell alone gives; else None (the caller parses cell by cell, and explains a bad
    one). Blocks (LIST_BLOCK cells) bound the joined text's memory on a large table.

    It is sure when the joined text holds no '"' (so every bracket is structure, none inside a string), every cell
    opens as many brackets as it closes, and the array holds one element per cell: each cell is then exactly one
    JSON value. A cell such as '[1],[2]' or a pair '[[1]', '[2]]' fails these checks and takes the slow path."""
    import numpy as np

    present = column.notna().to_numpy()
    cells = column[present]
    if cells.empty or pd.api.types.infer_dtype(cells, skipna=False) != "string":
        return None
    texts = cells.tolist()
    parsed = np.empty(len(column), dtype=object)
    parsed[~present] = column[~present].astype(object).to_numpy()  # missing cells as the per-cell path keeps them
    where = np.flatnonzero(present)
    for first in range(0, len(texts), LIST_BLOCK):
        block = _parse_list_block(texts[first : first + LIST_BLOCK])
        if block is None:
            return None
        parsed[where[first : first + LIST_BLOCK]] = np.fromiter(block, dtype=object, count=len(block))  # each a list
    return pd.Series(parsed, index=column.index, name=column.name, dtype=object)


LIST_BLOCK = 20_000


def _parse_list_block(texts: list[str]) -> list[Any] | None:
    """`texts` (each starting with '[' and ending with ']') parsed, when one json.loads of them joined is sure to
    give what each alone gives (see _parse_lists_at_once); else None."""
    import numpy as np

    joined = "[" + ",".join(texts) + "]"
    if '"' in joined or not joined.isascii():  # ASCII: a character is a byte, so offsets into the bytes are cells'
        return None
    codes = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)[1:-1]  # the cells and the commas between them
    opens = np.flatnonzero((codes == ord("[")) | (codes == ord("{")))
    closes = np.flatnonzero((codes == ord("]")) | (codes == ord("}")))
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) + 1)  # past each cell's comma
    cell_of = partial(np.searchsorted, ends, side="right")
    if (np.bincount(cell_of(opens), minlength=len(texts)) != np.bincount(cell_of(closes), minlength=len(texts))).any():
        return None
    try:
        values = json.loads(joined)
    except (ValueError, RecursionError):
        return None
    return values if len(values) == len(texts) else None


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
