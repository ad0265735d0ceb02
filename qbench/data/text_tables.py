"""CSV and TSV files as qbench reads them: their cells (opening them and checking their records: csv_records).

CSV states no types: a column whose every cell is a number is read as numbers, except the columns the caller
names as text (`text_columns`: cells that name things, such as slice codes "007" and "7" or class labels "01"
and "1"), which keep the text the file holds. A file's dialect (CsvDialect, the recipe's `data.csv`) says how
it writes cells: its delimiter (a comma; a tab for `.tsv`; a spreadsheet in a locale with decimal commas
writes ';'), its decimal mark and the separator grouping its thousands ('1.234,5', '1 234,5'). Neither is ever
guessed: '1,234' is 1234 in one locale and 1.234 in another, so a cell such as '0,5' is a number only in a file
declared to write decimal commas, and '1.234,5' only in one declared to group thousands with '.'; they are text
otherwise (and where a number is expected, the error says so: number_format_hint). A column read as numbers whose
cells could be grouped thousands ('1.234' as 1.234) in a file whose other cells show that grouping ('5.678,9') is
refused rather than read either way (check_undeclared_grouping).

CSV cannot hold arrays: a CSV column whose every non-empty cell is a JSON list (`"[0.1, 0.2]"`) is parsed into
Python lists, so the same table works as CSV, JSON lines or parquet; so is a label column read as text (class
names) when every cell is one (token labels). A cell that looks like a list but is not valid JSON is an error
rather than a silent string (text in a text column). JSON writes numbers with decimal points whatever the
file's decimal mark; in a file with decimal commas a list cell writing ',' between two digits ('[0,5, 1,5]',
valid JSON for four integers) is refused. These readings of text cells (parse_text_cells) are also those of the
text columns of every other format (qbench.data.load): the same cells mean the same thing whatever file holds them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.data.csv_records import (
    COMPRESSED_SUFFIXES,
    check_csv_records,
    checked_records,
    column_names,
    text_encoding,
)

DECIMAL_ATTR = "decimal"
"""`DataFrame.attrs` key holding the decimal mark a CSV table's numbers were written with (',' or '.')."""

THOUSANDS_ATTR = "thousands"
"""`DataFrame.attrs` key holding the separator a CSV table's numbers group thousands with (None: no grouping)."""

_COMMA_TEXT_ATTR = "decimal_comma_text"
"""`DataFrame.attrs` key: the text columns of a file with decimal commas kept as written (text_decimal)."""

THOUSANDS = {",": "','", ".": "'.'", " ": "a space", "'": "an apostrophe", "\u00a0": "a no-break space (U+00A0)",
             "\u202f": "a narrow no-break space (U+202F)"}  # fmt: skip
"""The thousands separators a CSV file may group its numbers with (French locales write the no-break spaces, Swiss
ones the apostrophe), by name."""


@dataclass(frozen=True)
class CsvDialect:
    """How a CSV file writes its cells: `delimiter` between fields (None: a tab for a `.tsv` file, else a comma)
    and the `decimal` mark of its numbers."""

    delimiter: str | None = None
    decimal: str = "."
    thousands: str | None = None

    def delimiter_for(self, path: Path) -> str:
        if self.delimiter is not None:
            return self.delimiter
        suffix = Path(path.stem).suffix if path.suffix.lower() in COMPRESSED_SUFFIXES else path.suffix
        return "\t" if suffix.lower() == ".tsv" else ","


# what spreadsheets, R and databases write for a missing number
MISSING_NUMBER_TEXT = frozenset({"NA", "N/A", "n/a", "NaN", "nan", "-nan", "NULL", "null", "None", "<NA>", "#NA"})

SPREADSHEET_ERRORS = frozenset({"#N/A", "#DIV/0!", "#VALUE!", "#REF!", "#NAME?", "#NUM!", "#NULL!", "#SPILL!", "#CALC!",
                                "#FIELD!", "#BLOCKED!", "#CONNECT!", "#BUSY!", "#UNKNOWN!", "#GETTING_DATA", "#ERROR!"})
"""What Excel, Google Sheets and LibreOffice write where a formula failed (#N/A too: a lookup that found nothing):
no value, and not a missing one either, so never read as NaN, a class, a slice or text fed to a model."""


def spreadsheet_error(df: pd.DataFrame, columns: Collection[str]) -> tuple[int, str, str] | None:
    """The first cell (row position, column, cell) of `columns` that is a spreadsheet error (SPREADSHEET_ERRORS,
    spaces around it aside), in row order; None when there is none."""
    found: list[tuple[int, str, str]] = []
    for column in (name for name in dict.fromkeys(columns) if name in df.columns):
        cells = df[column]
        if not (pd.api.types.is_object_dtype(cells) or pd.api.types.is_string_dtype(cells)):
            continue
        flagged = _flag_cells(cells, lambda cell: isinstance(cell, str) and cell.strip() in SPREADSHEET_ERRORS)
        errors = flagged.nonzero()[0]
        if len(errors):
            found.append((int(errors[0]), column, str(cells.iloc[errors[0]])))
    return min(found, default=None)


def _flag_cells(cells: pd.Series, predicate: Callable[[Any], bool]) -> np.ndarray:
    """`predicate` of each cell of `cells`, asked once per distinct value (a column of splits, slices or classes holds a
    few values in a million rows: a call per cell took seconds); a missing cell is False. Cells that cannot be
    hashed (arrays, lists) are asked one at a time."""
    try:
        codes, distinct = pd.factorize(cells, use_na_sentinel=True)
    except TypeError:
        return cells.map(predicate, na_action="ignore").to_numpy(dtype=bool, na_value=False)
    flags = np.fromiter((bool(predicate(value)) for value in distinct), dtype=bool, count=len(distinct))
    return np.append(flags, False)[codes]  # a missing cell's code is -1: the False appended

DECIMAL_COMMA_NUMBER = re.compile(r"-?[0-9]+,[0-9]+")
"""A number written with a decimal comma, as a spreadsheet in such a locale exports it: '0,5', '-12,25'."""

_POINT_NUMBER = re.compile(r"-?[0-9]+\.[0-9]+")


def grouped_number(thousands: str, decimal: str | None, *, fraction: str = "?") -> str:
    """A regex for a number grouping its thousands, '1.234' or '-12.345.678,25' (thousands '.', decimal ','): a leading
    group of 1 to 3 digits, not 0, then groups of 3, then a decimal part: optional (`fraction` '?'), needed (''), or
    none (`decimal` None)."""
    number = f"-?[1-9][0-9]{{0,2}}(?:{re.escape(thousands)}[0-9]{{3}})+"
    return number if decimal is None else f"{number}(?:{re.escape(decimal)}[0-9]+){fraction}"


def read_csv(
    path: Path, dialect: CsvDialect = CsvDialect(), text_columns: Collection[str] = (),
    list_columns: Collection[str] = (), verbatim_columns: Collection[str] = (), encoding: str | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Only an empty cell is missing in a text column ("NA" is Namibia, "None" a category); in a column of numbers,
    an empty cell or a missing-number text (MISSING_NUMBER_TEXT) is NaN. `text_columns` are read as text whatever
    their cells look like: read as numbers, "007" and "7" would be one value, named 7. In a file with decimal
    commas, a text column's cells that write a number ('0,5') read as that number written with a point ('0.5', as
    the same table in Parquet names it: slice names and filters see one table whatever its format), except in
    `verbatim_columns` (the text fed to the model, kept as written). `encoding` is the file's where no byte order
    mark says (None: UTF-8)."""
    encoding = text_encoding(path, encoding)
    delimiter = dialect.delimiter_for(path)
    header = check_csv_records(path, encoding, delimiter)
    names = column_names(header)
    kept = [column for column in names if column in set(text_columns)]
    read = partial(pd.read_csv, path, sep=delimiter, keep_default_na=False, na_values=[""], encoding=encoding,
                   header=0, names=names)  # fmt: skip
    df = checked_records(read(decimal=dialect.decimal, dtype=dict.fromkeys(kept, str)), header)
    decimal, thousands = dialect.decimal, dialect.thousands
    df = parse_text_cells(df, text_columns=kept, list_columns=list_columns, verbatim_columns=verbatim_columns,
                          decimal=decimal, thousands=thousands)  # fmt: skip
    if thousands is None:
        check_undeclared_grouping(df, decimal, lambda columns: read(usecols=columns, dtype=str))
    df.attrs[DECIMAL_ATTR], df.attrs[THOUSANDS_ATTR] = decimal, thousands
    if dialect.decimal != ".":
        df.attrs[_COMMA_TEXT_ATTR] = tuple(column for column in kept if column in verbatim_columns)
    return df


def parse_text_cells(
    df: pd.DataFrame, *, text_columns: Collection[str] = (), list_columns: Collection[str] = (),
    verbatim_columns: Collection[str] = (), decimal: str = ".", thousands: str | None = None,
    columns: Collection[str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """The text columns of a table read as read_csv reads a CSV file's, whatever format held them: the one path
    that gives text cells their meaning, so a Parquet or JSON lines string column of JSON lists ('[0, 1]'), of
    numbers ('-1.55') or of booleans ('true', as pandas' CSV reader reads them: True/TRUE/true, False/FALSE/false)
    is what the same cells give in a CSV file. `text_columns` keep their text (a JSON list column among
    `list_columns` aside; with decimal commas or grouped thousands their numbers are written with points, except
    in `verbatim_columns`). Only `columns` are read so (None: every column); those holding anything but text
    (numbers, lists, arrays) are left as they are."""
    for column in df.columns if columns is None else [column for column in df.columns if column in columns]:
        cells = df[column]
        if not _is_text_column(cells):
            continue
        if pd.api.types.infer_dtype(cells, skipna=True) == "boolean":  # booleans with gaps, as pandas' CSV reader and
            df[column] = text_as_numbers(cells)  # Parquet give them: 1.0 / NaN / 0.0, as a CSV file's always were
            continue
        if column in text_columns:
            if column in list_columns and _is_json_list_column(cells):
                df[column] = _parse_json_lists(cells, names=True, decimal=decimal)
            elif (decimal != "." or thousands is not None) and column not in verbatim_columns:
                df[column] = _with_decimal_points(cells, decimal, thousands)
            continue
        if _is_json_list_column(cells):
            df[column] = _parse_json_lists(cells, decimal=decimal)
            continue
        parsed = text_as_numbers(cells, decimal=decimal, thousands=thousands)
        if parsed is None:
            parsed = _text_as_booleans(cells)
        if parsed is not None:
            df[column] = parsed
    return df


_BOOLEAN_TEXT = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False, "false": False}
"""The cells pandas' CSV reader reads as booleans."""


def _is_text_column(column: pd.Series) -> bool:
    """Whether every non-missing cell of a (non-empty) object or text column is text, or every one a boolean (a
    boolean column with gaps)."""
    if not (pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column)):
        return False
    return len(column) > 0 and pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty", "boolean")


def _text_as_booleans(column: pd.Series) -> pd.Series | None:
    """A text column as booleans when every present cell writes one (_BOOLEAN_TEXT), as a CSV file's reads: bool, or
    with some cells missing 1.0 / 0.0 with NaN in the gaps; else None."""
    present = column.dropna()
    if present.empty or not present.isin(_BOOLEAN_TEXT.keys()).all():
        return None
    booleans = column.astype(object).map(_BOOLEAN_TEXT, na_action="ignore")
    return booleans.astype(bool) if len(present) == len(column) else booleans.astype("float64")


def text_decimal(values: pd.Series) -> str:
    """The decimal mark of the numbers a text column of a loaded table writes: a comma in a column of a file with
    decimal commas kept as written (fed to the model), a point otherwise (read_csv wrote the others' with points)."""
    return "," if values.name in values.attrs.get(_COMMA_TEXT_ATTR, ()) else "."


def text_as_numbers(column: pd.Series, decimal: str = ".", thousands: str | None = None) -> pd.Series | None:
    """A text column as numbers when every cell is a number (written with `decimal` as its decimal mark, and with
    its thousands grouped by `thousands` or not at all), empty, or a missing-number text; else None. A cell holding
    the separator is a number only when it groups digits by three ('1.234,5'): pandas' own `thousands` drops the
    separator wherever it is, reading '1.5' as 15. With decimal commas a cell holding a point ('1.234': a thousands
    separator, or a point) is no number unless the file declares '.' its thousands separator."""
    cells = column.where(~column.isin(MISSING_NUMBER_TEXT))
    if thousands is not None:
        text = cells.dropna().astype(str)
        separated = text[text.str.contains(thousands, regex=False)]
        if not separated.str.fullmatch(grouped_number(thousands, decimal)).all():
            return None
        cells = cells.where(cells.isna(), cells.astype(str).str.replace(thousands, "", regex=False))
    if decimal != ".":
        text = cells.dropna().astype(str)
        if text.str.contains(".", regex=False).any():
            return None
        cells = cells.where(cells.isna(), cells.astype(str).str.replace(decimal, ".", regex=False))
    present = cells.dropna()
    if len(present) and pd.isna(pd.to_numeric(present.iloc[:1], errors="coerce").iloc[0]):
        return None  # most text columns show it on their first cell: no pass over them all
    numbers = pd.to_numeric(cells, errors="coerce")
    return numbers if numbers.notna().sum() == cells.notna().sum() else None


def _with_decimal_points(column: pd.Series, decimal: str, thousands: str | None) -> pd.Series:
    """A text column of a file with decimal commas or grouped thousands, its cells that write a number in the file's
    way ('0,5', '1.234,5') written as the same table in Parquet names them ('0.5', '1234.5'). With decimal commas, a
    column also holding numbers written with a point is an error: '1.5' would name the slice that '1,5' names."""
    text = column.astype(object)
    none = pd.Series(False, index=text.index)
    grouped = _matches(text, grouped_number(thousands, decimal)) if thousands else none
    commas = _matches(text, DECIMAL_COMMA_NUMBER.pattern) if decimal == "," else none
    if not (grouped.any() or commas.any()):
        return column
    points = _matches(text, _POINT_NUMBER.pattern) & ~grouped if decimal == "," else none
    if commas.any() and points.any():
        raise ValueError(f"column {column.name!r} holds both {text[commas].iloc[0]!r} and {text[points].iloc[0]!r}; "
                         "expected numbers written with one decimal mark, "
                         "the comma the file declares (data.csv.decimal)")
    numbers = text.where(~grouped, text.str.replace(thousands or "", "", regex=False))
    return column.where(~(grouped | commas), numbers.str.replace(decimal, ".", regex=False))


def _matches(text: pd.Series, pattern: str) -> pd.Series:
    """Which cells of a text column (missing ones: none) are all `pattern`."""
    return text.str.fullmatch(pattern).fillna(False).astype(bool)


_PRINTED_ARRAY = r"\[[\[\]\s0-9eE+\-.naif]*\]"  # numbers between brackets, as NumPy prints an array
_SPACED_NUMBERS = r"[0-9.]\s+[-+0-9.]"  # two of them side by side with no comma between


def shown_text(text: str, limit: int = 40) -> str:
    """`text` as an error quotes a cell: its first `limit` characters, '...' marking a cut (a whole image's cell
    would otherwise fill the line)."""
    text = str(text)  # a NumPy string as the plain text it holds
    return text if len(text) <= limit else f"{text[:limit]}..."


def printed_array_hint(values: pd.Series) -> str:
    """For an error about a text column where numbers are expected: '; cells such as '[42 32 26 ...' are arrays as
    NumPy prints them ...' when some cell is one (numbers between brackets, spaces and no comma between them: what
    pandas' to_csv writes for an array cell, which no JSON parser reads back), else ''."""
    text = _text_cells(values).str.strip()
    return _such_cells(text[text.str.fullmatch(_PRINTED_ARRAY) & text.str.contains(_SPACED_NUMBERS)],
                       "are arrays as NumPy prints them (pandas' to_csv writes array cells so): expected a JSON "
                       "list per cell ('[42, 32, 26]', as json.dumps(cell.tolist()) "
                       "writes it) or a Parquet list column")


def array_file_hint(values: pd.Series) -> str:
    """For an error about a text column where numbers are expected: '; cells such as 'sets/row0.npy' name NumPy files
    ...' when some cell does (a set, point cloud or sequence saved one .npy per row): qbench reads the arrays a table
    holds, never a file a cell names, so the cell was fed as one text value (`holds cells of 1 value`)."""
    text = _text_cells(values).str.strip()
    return _such_cells(text[text.str.lower().str.endswith((".npy", ".npz"))],
                       "name NumPy files, which qbench does not read (it feeds the arrays the table holds): expected "
                       "the arrays themselves, as a Parquet list column (np.load(path).tolist() per row) or one .npz "
                       "of the stacked rows (np.savez(path, x=np.stack(arrays), label=labels))")


def _such_cells(found: pd.Series, what: str) -> str:
    """'; cells such as <the first found, quoted> <what>', or '' when none was found."""
    return "" if found.empty else f"; cells such as {shown_text(found.iloc[0])!r} {what}"


def text_cells_hint(values: pd.Series) -> str:
    """For an error about a text column where numbers are expected, what its text cells are when that is known
    (number_format_hint, printed_array_hint, array_file_hint); else ''."""
    return number_format_hint(values) or printed_array_hint(values) or array_file_hint(values)


def number_format_hint(values: pd.Series) -> str:
    """For an error about a text column where numbers are expected: '; cells such as '1.234,5' group thousands with
    '.' ...' or '; cells such as '0,5' write numbers with a decimal comma ...' when some do in a CSV file not declared
    to write them so, or '; cell '1,5' holds the thousands separator ...' when one misplaces the declared separator;
    else ''."""
    if DECIMAL_ATTR not in values.attrs or not (
        pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)
    ):
        return ""
    text = _text_cells(values)
    declared, separator = values.attrs[DECIMAL_ATTR], values.attrs.get(THOUSANDS_ATTR)
    if separator is not None:
        separated = text[text.str.contains(separator, regex=False)]
        misplaced = separated[~separated.str.fullmatch(grouped_number(separator, declared))]
        if not misplaced.empty:
            return (f"; cell {misplaced.iloc[0]!r} holds the thousands separator {separator!r} (data.csv.thousands) "
                    "without groups of three digits after it")
    commas = DECIMAL_COMMA_NUMBER.pattern if declared == "." else "$^"  # a declared comma reads them already
    for thousands in (sep for sep in THOUSANDS if sep != separator):
        for decimal in (mark for mark in (declared, "," if declared == "." else ".") if mark != thousands):
            found = text[text.str.fullmatch(grouped_number(thousands, decimal))]
            if found.empty:
                continue
            declare = f"data.csv: {{decimal: {decimal!r}, thousands: {thousands!r}}}"
            if re.fullmatch(commas, found.iloc[0]):  # '1,234': a decimal comma, or a grouping comma
                return (f"; cells such as {found.iloc[0]!r} write numbers with a decimal comma or group thousands "
                        f"with ',', read as numbers only where declared: data.csv: {{decimal: ','}} or {declare}")
            return (f"; cells such as {found.iloc[0]!r} group thousands with {THOUSANDS[thousands]}, read as numbers "
                    f"only where declared: {declare}")
    found = text[text.str.fullmatch(commas)]
    if found.empty:
        return ""
    return (f"; cells such as {found.iloc[0]!r} write numbers with a decimal comma, read as numbers only where "
            "declared: data.csv: {decimal: ','}")


def check_undeclared_grouping(df: pd.DataFrame, decimal: str, read_text: Callable[[list[str]], pd.DataFrame]) -> None:
    """ValueError when a column read as numbers holds cells that group thousands with the decimal mark ('1.234',
    read as 1.234) while another column's cells show that the file groups thousands so ('5.678,9': '.' groups, ','
    is the decimal mark): read either way, the number would be a guess. `read_text(columns)` reads those columns'
    cells again as text: only when a float column holds values such cells could give, and another cell shows the
    grouping, is the file read again."""
    import numpy as np

    candidates = []
    for column in (column for column in df.columns if pd.api.types.is_float_dtype(df[column])):
        thousandths = np.abs(df[column].to_numpy(dtype=float)) * 1000  # '1.234' gives 1234 of them
        whole = np.isclose(thousandths, np.round(thousandths), rtol=0, atol=1e-6)
        if ((thousandths >= 1000) & (thousandths < 1e6) & whole).any():
            candidates.append(column)
    other = "," if decimal == "." else "."
    evidence = grouped_number(decimal, other, fraction="")  # decimal '.': '5.678,9', grouped by '.'
    shown = None
    for column in (column for column in df.columns if candidates and not pd.api.types.is_numeric_dtype(df[column])):
        cells = _text_cells(df[column])
        found = cells[cells.str.fullmatch(evidence)]
        if not found.empty:
            shown = (column, found.iloc[0])
            break
    if shown is None:
        return
    text = read_text(candidates)
    for column in candidates:
        cells = text[column].dropna()
        ambiguous = cells[cells.str.fullmatch(grouped_number(decimal, None))]
        if not ambiguous.empty:
            cell = ambiguous.iloc[0]
            raise ValueError(f"column {column!r}: cell {cell!r} reads as {float(cell.replace(',', '.'))!r} with the "
                             f"decimal mark {decimal!r}, but cell {shown[1]!r} of column {shown[0]!r} groups thousands "
                             f"with {decimal!r}; expected the file's marks declared: data.csv: "
                             f"{{decimal: {other!r}, thousands: {decimal!r}}}")  # fmt: skip


def _text_cells(column: pd.Series) -> pd.Series:
    """The text cells of a column (a list or number among them left out)."""
    cells = column.dropna()
    return cells[cells.map(lambda cell: isinstance(cell, str))].astype(str)


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


def _parse_json_lists(column: pd.Series, *, names: bool = False, decimal: str = ".") -> pd.Series:
    """The column with its JSON list cells parsed. A column none of whose cells is JSON stays text (labels such as
    '[en]'); one where some are and some are not holds a malformed list, which is an error. A column of `names`
    (a label column whose text may name classes) is parsed only when every cell is a JSON list, as token labels
    are (one class id per token, as a parquet list column holds them); otherwise it keeps its text."""
    if decimal != ".":
        _check_list_numbers(column)
    parsed = _parse_lists_at_once(column)
    if parsed is not None:
        return parsed
    failures: list[tuple[object, str, json.JSONDecodeError]] = []

    def parse(row: object, cell: object) -> object:
        if not isinstance(cell, str):
            return cell  # a missing cell stays missing
        try:
            return json.loads(cell)
        except json.JSONDecodeError as exc:
            failures.append((row, cell, exc))
            return cell

    parsed = pd.Series([parse(row, cell) for row, cell in column.astype(object).items()], index=column.index,
                       dtype=object, name=column.name)  # fmt: skip
    if not failures:
        return parsed
    if names or len(failures) == int(column.notna().sum()):
        return column
    row, cell, exc = failures[0]
    raise ValueError(f"column {column.name!r}: cell {cell[:40]!r} in row {row} looks like a JSON list but is not valid "
                     f"JSON ({exc})")  # fmt: skip


def _check_list_numbers(column: pd.Series) -> None:
    """In a file with decimal commas, no list cell writes ',' between two digits: '[0,5, 1,5]' is valid JSON for
    four integers where the file meant two numbers; a JSON list writes its numbers with points ('[0.5, 1.5]')."""
    text = column.dropna().astype(str)
    found = text[text.str.contains(r"[0-9],[0-9]")]
    if not found.empty:
        raise ValueError(f"column {column.name!r}: cell {found.iloc[0][:40]!r} writes ',' between two digits in a "
                         "file with decimal commas (data.csv.decimal), which a JSON list cannot tell from a decimal "
                         "comma; expected a JSON list, its numbers written with points and ', ' between them")


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
