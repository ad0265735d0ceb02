"""Text tables in the encodings production exports write: UTF-8 (a byte order mark read), another declared in
`data.encoding`, and undecodable bytes named by line and byte."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from pydantic import ValidationError

from qbench.data.csv_records import undecodable_at
from qbench.data.load import load_table
from qbench.errors import RecipeError
from qbench.recipe.data import DataSpec

RECIPE = Path("qbench.yaml")
ROWS = "x,label,topic\n1.5,0,garden\n2.5,1,café\n3.5,0,thé\n"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_a_table_in_a_declared_single_byte_encoding_reads_its_accents(tmp_path: Path, suffix: str, encoding: str):
    path = tmp_path / f"rows{suffix}"
    if suffix == ".csv":
        path.write_bytes(ROWS.encode(encoding))
    else:
        path.write_bytes('{"x": 1.5, "topic": "café"}\n{"x": 2.5, "topic": "thé"}\n'.encode(encoding))
    assert load_table(path, recipe_file=RECIPE, encoding=encoding)["topic"].tolist()[-2:] == ["café", "thé"]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_undecodable_bytes_are_one_error_naming_line_byte_and_the_field(tmp_path: Path, suffix: str):
    path = tmp_path / f"rows{suffix}"
    text = ROWS if suffix == ".csv" else '{"x": 1.5, "topic": "garden"}\n{"x": 2.5, "topic": "café"}\n'
    path.write_bytes(text.encode("latin-1"))
    # .csv: 'x,label,topic\n' is 14 bytes, '1.5,0,garden\n' 13, then '2.5,1,caf' 9: é at byte 36 of line 3
    # .jsonl: the first line is 30 bytes, then '{"x": 2.5, "topic": "caf' 24: é at byte 54 of line 2
    where = "line 3 (byte 36: 0xe9)" if suffix == ".csv" else "line 2 (byte 54: 0xe9)"
    with pytest.raises(RecipeError) as error:
        load_table(path, recipe_file=RECIPE)
    assert str(error.value) == (f"qbench.yaml: data.path: cannot read rows{suffix}: {where} is not utf-8 text; set "
                                "data.encoding to the encoding the file was written in (cp1252 for most Windows and "
                                "Excel exports, latin-1, utf-16, ...)")  # fmt: skip


def test_undecodable_at_counts_across_read_blocks_and_decompresses(tmp_path: Path):
    """The 1 MiB blocks split a two-byte 'é' (its second byte opens the next block); the bad byte lies beyond."""
    head = "a" * ((1 << 20) - 1) + "é\n" + "b\n" * 3
    data = head.encode("utf-8") + b"\xff\n"
    path = tmp_path / "rows.csv.gz"
    path.write_bytes(gzip.compress(data))
    assert undecodable_at(path, "utf-8") == f"line 5 (byte {len(head.encode('utf-8'))}: 0xff)"
    assert undecodable_at(path, "latin-1") == ""


def test_a_utf8_byte_order_mark_is_read_and_a_declared_encoding_contradicting_a_mark_is_refused(tmp_path: Path):
    path = tmp_path / "rows.csv"
    path.write_bytes(ROWS.encode("utf-8-sig"))
    assert list(load_table(path, recipe_file=RECIPE).columns) == ["x", "label", "topic"]
    assert load_table(path, recipe_file=RECIPE, encoding="UTF8")["topic"].iloc[1] == "café"
    with pytest.raises(RecipeError, match=r"cannot read rows.csv: it starts with a UTF-8 byte order mark, but "
                                          r"data.encoding is 'cp1252'; expected data.encoding: utf-8 for this file"):
        load_table(path, recipe_file=RECIPE, encoding="cp1252")


def test_a_utf16_export_without_a_mark_reads_where_declared(tmp_path: Path):
    path = tmp_path / "rows.tsv"
    path.write_bytes(ROWS.replace(",", "\t").encode("utf-16-le"))
    assert load_table(path, recipe_file=RECIPE, encoding="utf-16-le")["topic"].tolist() == ["garden", "café", "thé"]


def test_the_encoding_field_is_loaded_and_checked(tmp_path: Path):
    assert DataSpec.model_validate({"path": "rows.csv", "inputs": {"x": "X"}, "encoding": "cp1252"}).encoding == "cp1252"
    with pytest.raises(ValidationError, match="got 'latin9x', which names no text encoding Python knows"):
        DataSpec.model_validate({"path": "rows.csv", "inputs": {"x": "X"}, "encoding": "latin9x"})
    for codec in ("rot13", "base64", "zlib"):  # codecs Python knows that encode no text as bytes: open() refuses them
        with pytest.raises(ValidationError, match=f"got '{codec}', which names no text encoding Python knows"):
            DataSpec.model_validate({"path": "rows.csv", "inputs": {"x": "X"}, "encoding": codec})
    with pytest.raises(ValidationError, match="encoding: describes .csv/.tsv/.jsonl/.ndjson files, but data.path is "
                                              "rows.parquet"):
        DataSpec.model_validate({"path": "rows.parquet", "inputs": {"x": "X"}, "encoding": "cp1252"})


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_utf8_text_declared_in_a_single_byte_encoding_is_refused_not_garbled(tmp_path: Path, suffix: str,
                                                                             encoding: str) -> None:  # fmt: skip
    """Before, every 'é' of a UTF-8 export read as 'Ã©' where the recipe declared latin-1: slice 'topic=cafÃ©',
    labels and text inputs garbled, silently."""
    path = tmp_path / f"rows{suffix}"
    text = ROWS if suffix == ".csv" else '{"x": 1.5, "topic": "garden"}\n{"x": 2.5, "topic": "café"}\n'
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(RecipeError) as error:
        load_table(path, recipe_file=RECIPE, encoding=encoding)
    word = "2.5,1,café" if suffix == ".csv" else '"café"}'
    assert str(error.value) == ("qbench.yaml: data.path: cannot read "
                                f"rows{suffix}: it is UTF-8 text, but data.encoding "
                                f"is {encoding!r}, which reads {word!r} as "
                                f"{word.encode().decode(encoding)!r}; expected "
                                "data.encoding: utf-8 for this file, or none")  # fmt: skip
    path.write_bytes(text.replace("é", "e").encode("utf-8"))  # ASCII: the same text in either encoding, read
    assert len(load_table(path, recipe_file=RECIPE, encoding=encoding)) == text.count("\n") - (suffix == ".csv")
