"""Opening a CSV or TSV file and checking its records: compression and encoding, the header, and every record
against it (qbench.data.text_tables reads the cells).

Spreadsheets and databases export more than the table: a trailing delimiter on every line adds columns with no
name (`a;b;;`), and exports joined into one file repeat the header line mid-file. An unnamed column holding no value
is left out (two of them were refused as a column '' named twice); one holding values is `Unnamed: <position>`, as
pandas names an index written without a name. A repeated header is refused naming its row:
read as data, it turns every column of numbers into text, and a row of column names becomes a slice (`g=g`), a
class or a text fed to the model.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import lzma
import re
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

import pandas as pd

from qbench.errors import short_repr

DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
"""The delimiters a CSV file may use (spreadsheets in locales with decimal commas write ';'), by name."""


_OPENERS: dict[str, Callable[..., IO[Any]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
"""Compressed text tables by their last suffix (`rows.csv.gz`); pandas infers the same compression from it."""

COMPRESSED_SUFFIXES = frozenset(_OPENERS)


def open_data(path: Path, mode: str = "rb", **text: Any) -> IO[Any]:
    """Open a data file, decompressing it as its last suffix says (`rows.csv.gz`); `text` as for open()."""
    return _OPENERS.get(path.suffix.lower(), open)(path, mode, **text)



def check_unique_columns(names: Sequence[str], where: str) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where} names column {repeated[0]!r} {names.count(repeated[0])} times; expected each "
                         "column once")  # fmt: skip



def check_csv_records(path: Path, encoding: str, delimiter: str) -> list[str]:
    """Every record has as many fields as the header: pandas would pad a short row with NaN silently. Returns the
    header."""
    limit = csv.field_size_limit(sys.maxsize)  # a cell may hold a whole image as a JSON list
    try:
        header, counts = _csv_header(path, encoding, delimiter, _field_counts)
        if counts is None or (counts != len(header)).any():  # a ragged record, or a blank line (allowed), or a
            # record csv cannot read: read again record by record, to tell which and report the first problem
            _csv_header(path, encoding, delimiter, partial(_check_field_counts, header=header))
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


def _csv_header(path: Path, encoding: str, delimiter: str, rest: Callable[[Any], Any]) -> tuple[list[str], Any]:
    """The header of a CSV file (checked), and `rest` applied to a csv.reader over the records after it. A header
    read as one column that holds another delimiter is refused naming it: every recipe column would be missing."""
    with open_data(path, "rt", newline="", encoding=encoding, errors="replace") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        header = next((record for record in reader if len(record) > 1 or (record and record[0].strip())), [])
        if not header:  # pandas: "No columns to parse from file"
            raise ValueError("the file holds no header line; expected a line naming the columns, then a line per row")
        other = next((sep for sep in DELIMITERS if sep != delimiter and len(header) == 1 and sep in header[0]), None)
        if other is not None:
            raise ValueError(f"the header is one column {short_repr(header[0])}: the file looks separated by "
                             f"{other!r}; expected {DELIMITERS[delimiter]}-separated values (a file separated "
                             f"otherwise is declared so: data.csv: {{delimiter: {other!r}}})")  # fmt: skip
        # pandas would read 'y' and rename the second to 'y.1'; unnamed columns are named and checked by read_records
        check_unique_columns([name for name in header if not is_unnamed(name)], "the header")
        return header, rest(reader)


_BYTE_ORDER_MARKS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))
_MARKED = {"utf-8-sig": ("utf-8", "utf-8-sig"), "utf-16": ("utf-16", "utf-16-le", "utf-16-be")}
"""The encodings a declared `data.encoding` may name for a file starting with each byte order mark (codecs names)."""


def text_encoding(path: Path, declared: str | None = None) -> str:
    """How a text table is encoded: its byte order mark's encoding (a spreadsheet's "Unicode text" export is UTF-16
    with one), else `declared` (the recipe's `data.encoding`), else UTF-8. A declared encoding other than the mark's
    is a ValueError: the mark's bytes would be read as text ('ï»¿' before the first column's name)."""
    with open_data(path) as handle:
        start = handle.read(3)
    marked = next((encoding for mark, encoding in _BYTE_ORDER_MARKS if start.startswith(mark)), None)
    if marked is None:
        if declared is not None and codecs.lookup(declared).name != "utf-8":
            _refuse_utf8_read_as(path, declared)
        return declared or "utf-8"
    if declared is not None and codecs.lookup(declared).name not in _MARKED[marked]:
        shown = "UTF-8" if marked == "utf-8-sig" else "UTF-16"
        raise ValueError(f"it starts with a {shown} byte order mark, but data.encoding is {declared!r}; expected "
                         f"data.encoding: {_MARKED[marked][0]} for this file, or none (the mark is read)")
    return marked


def _refuse_utf8_read_as(path: Path, declared: str) -> None:
    """A ValueError where a file declared `declared` is UTF-8 text holding characters beyond ASCII that `declared`
    reads as others: every 'é' would become 'Ã©' (latin-1, cp1252), silently, in labels, slices and text inputs.
    Text in a single-byte encoding with such characters is almost never valid UTF-8 (an 'é' alone, 0xe9, is not), so
    valid UTF-8 is what the file holds."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    with open_data(path) as handle:
        while chunk := handle.read(1 << 20):
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError:
                return  # not UTF-8: the declared encoding is the file's story
            if not text.isascii():
                word = re.search(r"\S*[^\x00-\x7f]\S*", text)
                shown = word.group(0)[:40] if word else next(c for c in text if not c.isascii())
                read = shown.encode("utf-8").decode(declared, errors="replace")
                if read != shown:
                    raise ValueError(f"it is UTF-8 text, but data.encoding is {declared!r}, which reads {shown!r} as "
                                     f"{read!r}; expected data.encoding: utf-8 for this file, or none")  # fmt: skip
                return


def undecodable_at(path: Path, encoding: str) -> str:
    """Where a text table stops being `encoding` text: 'line 3 (byte 57: 0xe9)', counting lines from 1 and bytes
    (of the decompressed file) from 0; '' when it decodes (the error came from elsewhere)."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    fed, lines = 0, 1
    with open_data(path) as handle:
        while chunk := handle.read(1 << 20):
            state = decoder.getstate()
            try:
                lines += decoder.decode(chunk).count("\n")
            except UnicodeDecodeError as exc:
                before = codecs.getincrementaldecoder(encoding)(errors="strict")
                before.setstate(state)
                buffered = len(state[0])
                lines += before.decode(chunk[: max(exc.start - buffered, 0)]).count("\n")
                offset = fed - buffered + exc.start
                return f"line {lines} (byte {offset}: 0x{exc.object[exc.start]:02x})"
            fed += len(chunk)
    return ""


def is_unnamed(name: str) -> bool:
    """Whether a header field names no column (empty, or spaces: a trailing delimiter)."""
    return not name.strip()


def column_names(header: list[str]) -> list[str]:
    """The names of a CSV file's columns: its header's, an unnamed column's `Unnamed: <position>` (as pandas names an
    index written without a name)."""
    return [f"Unnamed: {position}" if is_unnamed(name) else name for position, name in enumerate(header)]


def checked_records(df: pd.DataFrame, header: list[str]) -> pd.DataFrame:
    """A CSV file's table as pandas read it (its columns `column_names(header)`), checked against the header
    (check_repeated_header), the columns the header names none of left out where they hold no value."""
    check_repeated_header(df, header)
    empty = [name for name, field in zip(df.columns, header) if is_unnamed(field) and _blank(df[name]).all()]
    return df.drop(columns=empty) if empty else df


def _blank(cells: pd.Series) -> pd.Series:
    return cells.isna() | (cells.astype(str).str.strip() == "")


def check_repeated_header(df: pd.DataFrame, header: Sequence[str]) -> None:
    """ValueError naming the first row that repeats the `header` (every cell its column's name, an unnamed column's
    empty; a byte order mark before the first ignored), as exports joined into one file hold: read as data, its
    cells would turn columns of numbers into text and be a slice, a class or a row fed to the model."""
    named = next((position for position, name in enumerate(header) if not is_unnamed(name)), None)
    key = df.iloc[:, named] if named is not None else None
    if key is None or pd.api.types.is_numeric_dtype(key):
        return  # a column of numbers holds no name: the usual case costs one dtype check
    text = key.astype(object).where(key.notna(), "").astype(str).str.lstrip("\ufeff")
    for position in (text == header[named]).to_numpy().nonzero()[0]:
        cells = ["" if pd.isna(cell) else str(cell).lstrip("\ufeff") for cell in df.iloc[position]]
        if all(cell == name or is_unnamed(name) and not cell.strip() for cell, name in zip(cells, header)):
            shown = ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")
            raise ValueError(f"row {df.index[position]} repeats the header ({shown}), as exports joined into one file "
                             "do; expected the header once, on the first line (remove the repeated header lines)")
