"""A folder of Parquet part files (Spark/Hive layouts) reads as the one table its parts hold, or is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.load import load_table
from qbench.errors import RecipeError

RECIPE = Path("recipe.yaml")


def _rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "features": list(rng.normal(size=(9, 4)).astype(np.float32)),
        "label": rng.integers(0, 3, 9),
        "region": ["apac"] * 3 + ["eu"] * 2 + ["us"] * 4,
        "device": list("abcabcabc"),
    })  # fmt: skip


def _write_parts(folder: Path, frame: pd.DataFrame, keys: list[str]) -> None:
    """Write `frame` as Spark does: one part per value of `keys`, those columns only in the folder names."""
    groups = frame.groupby(keys, sort=True) if keys else [((), frame)]
    for number, (values, part) in enumerate(groups):
        values = values if isinstance(values, tuple) else (values,)
        target = folder.joinpath(*(f"{key}={value}" for key, value in zip(keys, values)))
        target.mkdir(parents=True, exist_ok=True)
        part.drop(columns=keys).to_parquet(target / f"part-{number:05d}.parquet", index=False)
    (folder / "_SUCCESS").write_text("")


def _same(folder_table: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(folder_table.columns) == list(expected.columns)
    for column in expected.columns:
        assert [np.asarray(v).tolist() for v in folder_table[column]] == [np.asarray(v).tolist()
                                                                          for v in expected[column]]


def test_a_hive_partitioned_folder_reads_the_rows_with_the_partition_column(tmp_path: Path) -> None:
    """Before, a folder without state.json was refused: the partition column lives only in the folder names."""
    rows = _rows()
    _write_parts(tmp_path / "data", rows, ["region"])
    table = load_table(tmp_path / "data", recipe_file=RECIPE)
    _same(table, rows[["features", "label", "device", "region"]])
    assert table.attrs["source"] == "data"


def test_a_folder_of_parts_without_partitions_reads_every_part_in_path_order(tmp_path: Path) -> None:
    rows = _rows()
    (tmp_path / "data").mkdir()
    for number, start in enumerate(range(0, 9, 4)):  # parts named so that path order is row order
        rows.iloc[start : start + 4].to_parquet(tmp_path / "data" / f"part-{number:05d}.parquet", index=False)
    (tmp_path / "data" / ".part-00000.parquet.crc").write_bytes(b"not parquet")
    _same(load_table(tmp_path / "data", recipe_file=RECIPE), rows)


def test_partition_values_are_read_as_csv_cells_are(tmp_path: Path) -> None:
    """Numbers where every value is one, except the columns that keep their text (a `by` slice: 007 and 7 are two
    slices); Spark's null folder is missing; escapes are decoded."""
    rows = pd.DataFrame({"x": [1, 2, 3, 4], "year": [2023, 2023, 2024, 2024]})
    _write_parts(tmp_path / "years", rows, ["year"])
    assert load_table(tmp_path / "years", recipe_file=RECIPE)["year"].tolist() == [2023, 2023, 2024, 2024]
    for code, x in (("007", 1), ("7", 2), ("__HIVE_DEFAULT_PARTITION__", 3), ("a%2Fb", 4)):
        (tmp_path / "codes" / f"code={code}").mkdir(parents=True)
        pd.DataFrame({"x": [x]}).to_parquet(tmp_path / "codes" / f"code={code}" / "part.parquet")
    codes = load_table(tmp_path / "codes", recipe_file=RECIPE, text_columns=["code"])["code"].tolist()
    assert codes[:2] == ["007", "7"] and pd.isna(codes[2]) and codes[3] == "a/b"


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"a.parquet": {"x": [1]}, "b.parquet": {"x": [1.5]}},
         r"part b.parquet holds columns x: double, part a.parquet "
         r"x: int64; expected every part to hold the same columns"),
        ({"a.parquet": {"x": [1]}, "b.parquet": {"x": [1], "z": [2]}},
         r"part b.parquet holds columns x: int64, z: int64"),
        ({"a=1/p.parquet": {"x": [1]}, "b=2/p.parquet": {"x": [1]}},
         r"b=2/p.parquet is under partition keys \(b\), a=1/p.parquet under \(a\); expected every part under the same"),
        ({"x=1/p.parquet": {"x": [1]}}, r"column 'x' is both in part x=1/p.parquet and in its folder name"),
        ({"a.parquet": {"x": [1]}, "b.csv": None}, r"b.csv is not a .parquet file; expected a folder of Parquet part"),
    ],
)  # fmt: skip
def test_parts_that_disagree_are_refused_naming_the_part(tmp_path: Path, parts: dict, message: str) -> None:
    """pyarrow's own dataset takes the first part's schema: another part's extra column would be dropped silently."""
    for name, columns in parts.items():
        (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        if columns is None:
            (tmp_path / "data" / name).write_text("x\n1\n")
        else:
            pd.DataFrame(columns).to_parquet(tmp_path / "data" / name, index=False)
    with pytest.raises(RecipeError, match=r"recipe.yaml: data.path: cannot read data: " + message):
        load_table(tmp_path / "data", recipe_file=RECIPE)
