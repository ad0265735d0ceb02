"""Adversarial recipes and data: every bad input is exit 2 with ONE bounded line naming the file and the field.

Each case writes a broken recipe (or data file) next to a valid one built from the user
project of tests/user_model.py, runs `qbench validate` (and `qbench sweep` where the
problem used to surface only after a full sweep), and checks the exit code, that the
error is a single line of bounded length, and that it names the file and the field.
A pathological file must never hang validate: every run has a time limit.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.cli.app import main
from qbench.errors import MAX_VALUE_CHARS

pytest.importorskip("torch")
pytest.importorskip("sklearn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared project builder
from user_model import make_user_project  # noqa: E402

SECONDS_PER_RUN = 30.0  # a pathological recipe must fail fast, never hang


@dataclass(frozen=True)
class Project:
    """The user project (model, table) every case starts from; cases write their own recipe into tmp_path."""

    model: Path
    data: Path

    def recipe(self) -> dict[str, Any]:
        return {
            "name": "adversarial",
            "model": {"path": str(self.model)},
            "data": {
                "path": str(self.data),
                "inputs": {"x": "features"},
                "label": "y",
                "calibration": {"filter": {"subset": "calib"}, "samples": 16, "batch_size": 8},
                "evaluation": {"filter": {"subset": "test"}, "batch_size": 16},
                "slices": [{"by": "band"}],
            },
            "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
            "latency": {"batch_sizes": [1, 4], "warmup": 1, "iterations": 2},
            "gate": {"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5},
            "tracking": {"uri": "sqlite:///mlflow.db"},
            "output_dir": "reports",
        }

    def table(self) -> pd.DataFrame:
        return pd.read_parquet(self.data)


Builder = Callable[[Path, Project], Path]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    root = tmp_path_factory.mktemp("adversarial_project")
    make_user_project(root)
    return Project(model=root / "model" / "tumour_mlp.onnx", data=root / "data" / "patients.parquet")


# -- builders -------------------------------------------------------------------------------------


def _write(folder: Path, recipe: dict[str, Any] | str | bytes, name: str = "recipe.yaml") -> Path:
    path = folder / name
    if isinstance(recipe, bytes):
        path.write_bytes(recipe)
    else:
        path.write_text(recipe if isinstance(recipe, str)
                        else yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


def _set(recipe: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = [int(part) if part.isdigit() else part for part in dotted.split(".")]
    node: Any = recipe
    for part in parents:
        node = node[part] if isinstance(part, int) or part in node else node.setdefault(part, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()


def changed(*edits: tuple[str, Any]) -> Builder:
    """The valid recipe with `dotted.path: value` edits (value _DELETE removes the key)."""

    def build(folder: Path, project: Project) -> Path:
        recipe = project.recipe()
        for dotted, value in edits:
            _set(recipe, dotted, value if value is _DELETE else copy.deepcopy(value))
        return _write(folder, recipe)

    return build


def raw(content: str | bytes) -> Builder:
    return lambda folder, project: _write(folder, content)


def valid_then(text: str) -> Builder:
    """The valid recipe's YAML followed by `text` (for duplicate keys, which a dict cannot hold)."""
    return lambda folder, project: _write(folder, yaml.safe_dump(project.recipe(), sort_keys=False) + text)


def unquoted_name(value: str) -> Builder:
    """The valid recipe with `name:` written unquoted (YAML then reads 2024-01-01 as a date, not text)."""

    def build(folder: Path, project: Project) -> Path:
        text = yaml.safe_dump(project.recipe(), sort_keys=False)
        return _write(folder, text.replace("name: adversarial", f"name: {value}", 1))

    return build


def with_table(transform: Callable[[pd.DataFrame], pd.DataFrame | str], suffix: str = ".parquet",
               *edits: tuple[str, Any]) -> Builder:  # fmt: skip
    """The valid recipe over a changed copy of the table (a string result is written verbatim as the file)."""

    def build(folder: Path, project: Project) -> Path:
        table = transform(project.table())
        data = folder / f"rows{suffix}"
        if isinstance(table, str):
            data.write_text(table)
        elif suffix == ".csv":
            table.to_csv(data, index=False)
        else:
            table.to_parquet(data, index=False)
        return changed(("data.path", str(data)), *edits)(folder, project)

    return build


def with_files(setup: Callable[[Path], None], *edits: tuple[str, Any]) -> Builder:
    def build(folder: Path, project: Project) -> Path:
        setup(folder)
        return changed(*edits)(folder, project)

    return build


def _nan_rows(column: str, rows: list[int], value: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def transform(table: pd.DataFrame) -> pd.DataFrame:
        targets = set(table.index[table["subset"] == "test"][rows])
        cells = [np.array(cell, dtype=np.float32) for cell in table[column]]
        for row in targets:
            cells[row][3] = value
        return table.assign(**{column: cells})

    return transform


def _csv_text(rows: list[str]) -> Callable[[pd.DataFrame], str]:
    header = "x,y,subset,band"
    good = '"[' + ", ".join(["0.5"] * 30) + ']",1,test,small'
    calib = '"[' + ", ".join(["0.5"] * 30) + ']",0,calib,small'
    return lambda table: "\n".join([header, good, calib, good, *rows, good]) + "\n"


def _laughs() -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


# -- cases ----------------------------------------------------------------------------------------
# (id, builder, substrings the message must hold, also run `qbench sweep`)

TYPE_CONFUSION = [
    ("bool-for-float", changed(("gate.max_drop", True)), ["gate.max_drop", "True"]),
    ("string-for-float", changed(("gate.max_drop", "0.1")), ["gate.max_drop", "'0.1'"]),
    ("string-for-int", changed(("data.calibration.samples", "10")), ["data.calibration.samples"]),
    ("float-for-int", changed(("data.calibration.samples", 10.0)), ["data.calibration.samples", "10.0"]),
    ("float-for-int-opset", changed(("model.opset", 17.0)), ["model.opset"]),
    ("string-for-bool", changed(("variants.0.per_channel", "yes")), ["variants[0].per_channel"]),
    ("int-for-bool", changed(("variants.0.per_channel", 1)), ["variants[0].per_channel"]),
    ("bool-for-int", changed(("latency.iterations", True)), ["latency.iterations"]),
    ("negative-warmup", changed(("latency.warmup", -1)), ["latency.warmup", "-1"]),
    ("zero-threads", changed(("latency.threads", 0)), ["latency.threads"]),
    ("negative-limit", changed(("data.evaluation.limit", -5)), ["data.evaluation.limit"]),
    ("negative-batch", changed(("data.evaluation.batch_size", -64)), ["data.evaluation.batch_size"]),
    ("string-in-int-list", changed(("latency.batch_sizes", ["1", 4])), ["latency.batch_sizes[0]"]),
    ("scalar-for-list", changed(("latency.batch_sizes", 4)), ["latency.batch_sizes"]),
    ("string-for-list-backends", changed(("backends", "onnxruntime-cpu")), ["backends"]),
    ("string-for-list-applies", changed(("gate.applies_to", "int8*")), ["gate.applies_to"]),
    ("string-percentile", changed(("variants.0", {"name": "p", "precision": "int8", "calibrator": "percentile",
                                                  "percentile": "99.9"})), ["variants[0].percentile"]),  # fmt: skip
    ("float-seed", changed(("data.calibration.seed", 1.5)), ["data.calibration.seed"]),
    ("int-for-name", changed(("name", 123)), ["name", "123"]),
    ("list-for-dict-inputs", changed(("data.inputs", ["x"])), ["data.inputs"]),
    ("string-for-dict-data", changed(("data", "rows.parquet")), ["data"]),
    ("list-for-dict-model", changed(("model", ["model.onnx"])), ["model"]),
    ("list-for-dict-gate", changed(("gate", [])), ["gate"]),
    ("string-for-dict-tracking", changed(("tracking", "sqlite:///x.db")), ["tracking"]),
    ("dict-for-list-variants", changed(("variants", {"name": "a", "precision": "fp16"})), ["variants"]),
    ("string-for-dict-variant", changed(("variants", ["int8"])), ["variants[0]"]),
    ("dict-for-list-slices", changed(("data.slices", {"by": "band"})), ["data.slices"]),
    ("list-for-string-label", changed(("data.label", ["y"])), ["data.label"]),
    ("dict-for-string-label", changed(("data.label", {"column": "y"})), ["data.label"]),
    ("dict-for-string-input-name", changed(("data.inputs.x", {"name": "features"})), ["data.inputs.x"]),
    ("int-for-path", changed(("output_dir", 5)), ["output_dir"]),
    ("list-for-path", changed(("data.path", ["a.parquet", "b.parquet"])), ["data.path"]),
    ("dict-for-path", changed(("model.path", {"file": "m.onnx"})), ["model.path"]),
    ("unicode-recipe-name", changed(("name", "模型-ü")), ["name", "模型"]),
    ("unicode-variant-name", changed(("variants.0.name", "ïnt8 ✓")), ["variants[0].name"]),
    ("empty-name", changed(("name", "")), ["name"]),
    ("unknown-top-key", changed(("gates", {"max_drop": 0.1})), ["gates", "did you mean 'gate'"]),
    ("unknown-nested-key", changed(("data.evaluation.batchsize", 8)), ["data.evaluation.batchsize"]),
    ("unknown-variant-key", changed(("variants.0.calibratr", "minmax")), ["variants[0].calibratr"]),
    ("int-key-in-inputs", changed(("data.inputs", {1: "features"})), ["data.inputs", "keys are text"]),
    ("missing-data", changed(("data", _DELETE)), ["data", "required"]),
    ("null-model", changed(("model", None)), ["model"]),
    ("negative-samples", changed(("data.calibration.samples", -3)), ["data.calibration.samples", "-3"]),
    ("empty-inputs", changed(("data.inputs", {})), ["data.inputs"]),
    ("empty-experiment", changed(("tracking.experiment", "")), ["tracking.experiment"]),
]

YAML_STRUCTURE = [
    ("billion-laughs", raw(_laughs()), ["recipe.yaml", "aliases expand"]),
    ("recursive-alias", raw("name: &a [x, *a]\n"), ["recipe.yaml", "line 1", "alias"]),
    ("duplicate-top-key", valid_then("name: other\n"), ["recipe.yaml", "duplicate key 'name'"]),
    ("duplicate-nested-key", raw("name: a\ngate:\n  max_drop: 0.1\n  max_drop: 0.2\n"),
     ["line 4", "duplicate key 'max_drop'"]),
    ("deep-nesting", raw("name: " + "[" * 5000 + "]" * 5000 + "\n"), ["recipe.yaml", "nested"]),
    ("huge-string", raw("name: " + "x" * 50_000 + "\n"), ["recipe.yaml", "line 1", "characters"]),
    ("huge-list", raw("variants: [" + ", ".join(["1"] * 20_000) + "]\n"), ["recipe.yaml", "entries"]),
    ("oversized-file", raw("# padding\n" * 120_000 + "name: a\n"), ["recipe.yaml", "bytes"]),
    ("binary-garbage", raw(bytes(range(256)) * 64), ["recipe.yaml", "binary"]),
    ("invalid-utf8", raw(b"name: \xff\xfe\xfa\n"), ["recipe.yaml", "invalid YAML"]),
    ("empty-file", raw(""), ["recipe.yaml", "empty"]),
    ("only-comments", raw("# a recipe, some day\n"), ["recipe.yaml", "empty"]),
    ("top-level-list", raw("- name: a\n- name: b\n"), ["recipe.yaml", "got a list"]),
    ("top-level-scalar", raw("just a string\n"), ["recipe.yaml", "got a string"]),
    ("top-level-number", raw("42\n"), ["recipe.yaml", "got a number"]),
    ("tab-indent", raw("name: a\nmodel:\n\tpath: m.onnx\n"), ["recipe.yaml", "line 3", "invalid YAML"]),
    ("python-tag", raw("name: !!python/object/apply:os.system ['true']\n"), ["recipe.yaml", "line 1", "tag"]),
    ("complex-key", raw("? [a, b]\n: 1\n"), ["recipe.yaml", "single value"]),
    ("unclosed-bracket", raw("name: x\nmodel: [unclosed\n"), ["recipe.yaml", "invalid YAML"]),
    ("date-for-name", unquoted_name("2024-01-01"), ["name", "datetime.date"]),
]  # fmt: skip

FILES = [
    ("missing-model", changed(("model.path", "nowhere.onnx")), ["model.path", "not found"]),
    ("folder-for-model", with_files(lambda f: (f / "m.onnx").mkdir(), ("model.path", "m.onnx")),
     ["model.path", "folder"]),  # fmt: skip
    ("garbage-model", with_files(lambda f: (f / "m.onnx").write_bytes(b"\x00garbage" * 10), ("model.path", "m.onnx")),
     ["model.path", "m.onnx"]),  # fmt: skip
    ("missing-data-file", changed(("data.path", "nowhere.parquet")), ["data.path", "not found"]),
    ("garbage-parquet",
     with_files(lambda f: (f / "d.parquet").write_bytes(b"PAR1 not really"), ("data.path", "d.parquet")),
     ["data.path", "d.parquet"]),  # fmt: skip
    ("unsupported-format", with_files(lambda f: (f / "d.xlsx").write_bytes(b"x"), ("data.path", "d.xlsx")),
     ["data.path", "d.xlsx"]),  # fmt: skip
    ("empty-csv", with_files(lambda f: (f / "d.csv").write_text(""), ("data.path", "d.csv")), ["data.path", "d.csv"]),
    ("missing-calibration-file", changed(("data.calibration.path", "nowhere.csv")), ["data.calibration.path"]),
    ("plain-folder-for-data", with_files(lambda f: (f / "dd").mkdir(), ("data.path", "dd")), ["data.path", "dd"]),
]  # fmt: skip

FILTERS = [
    ("list-for-scalar", changed(("data.evaluation.filter", {"band": ["small", "large"]})),
     ["data.evaluation.filter", "band", "in:"]),  # fmt: skip
    ("empty-filter", changed(("data.evaluation.filter", {})), ["data.evaluation.filter", "non-empty"]),
    ("empty-condition", changed(("data.calibration.filter", {"subset": {}})), ["data.calibration.filter", "subset"]),
    ("ne-with-list", changed(("data.evaluation.filter", {"subset": {"ne": ["calib", "x"]}})),
     ["data.evaluation.filter", "'ne'", "single value"]),  # fmt: skip
    ("eq-with-mapping", changed(("data.evaluation.filter", {"subset": {"eq": {"a": 1}}})),
     ["data.evaluation.filter", "'eq'"]),  # fmt: skip
    ("in-with-scalar", changed(("data.evaluation.filter", {"subset": {"in": "test"}})),
     ["data.evaluation.filter", "'in'", "list"]),  # fmt: skip
    ("in-empty-list", changed(("data.evaluation.filter", {"subset": {"in": []}})), ["data.evaluation.filter", "'in'"]),
    ("in-nested-list", changed(("data.evaluation.filter", {"subset": {"in": [["test"]]}})),
     ["data.evaluation.filter", "single value"]),  # fmt: skip
    ("lt-with-string", changed(("data.evaluation.filter", {"mean_radius": {"lt": "12"}})),
     ["data.evaluation.filter", "'lt'", "number"]),  # fmt: skip
    ("lt-with-bool", changed(("data.evaluation.filter", {"mean_radius": {"lt": True}})),
     ["data.evaluation.filter", "'lt'"]),  # fmt: skip
    ("lt-with-nan", changed(("data.evaluation.filter", {"mean_radius": {"lt": float("nan")}})),
     ["data.evaluation.filter", "finite"]),  # fmt: skip
    ("eq-nan", changed(("data.evaluation.filter", {"mean_radius": float("nan")})), ["data.evaluation.filter", "NaN"]),
    ("unknown-op", changed(("data.evaluation.filter", {"subset": {"equals": "test"}})),
     ["data.evaluation.filter", "'equals'"]),  # fmt: skip
    ("string-for-filter", changed(("data.evaluation.filter", "subset == test")), ["data.evaluation.filter"]),
    ("int-column-name", changed(("data.evaluation.filter", {7: "test"})), ["data.evaluation.filter"]),
    ("slice-filter-list", changed(("data.slices", [{"name": "s", "filter": {"band": ["small"]}}])),
     ["data.slices[0].filter", "band"]),  # fmt: skip
    ("unknown-column", changed(("data.evaluation.filter", {"subsett": "test"})),
     ["data.evaluation.filter.subsett", "did you mean 'subset'"]),  # fmt: skip
    ("selects-nothing", changed(("data.evaluation.filter", {"subset": "holdout"})),
     ["data.evaluation.filter", "no rows"]),
]  # fmt: skip

# problems that used to surface only after a whole sweep: also checked through `qbench sweep`
PREFLIGHT = [
    ("no-variants", changed(("variants", [])), ["variants", "no variant"]),
    ("only-fp32", changed(("variants", [{"name": "fp32", "precision": "fp32"}])), ["variants", "no variant"]),
    ("gate-matches-nothing", changed(("gate.applies_to", ["fp16*", "int4"])),
     ["gate.applies_to", "matches no variant"]),
    ("gate-only-reference", changed(("gate.applies_to", ["fp32"])), ["gate.applies_to", "reference"]),
    ("output-dir-is-file", with_files(lambda f: (f / "out").write_text("x"), ("output_dir", "out")),
     ["output_dir", "is a file"]),  # fmt: skip
    ("output-dir-under-file", with_files(lambda f: (f / "out").write_text("x"), ("output_dir", "out/reports")),
     ["output_dir", "is a file"]),  # fmt: skip
    ("tracking-unknown-scheme", changed(("tracking.uri", "ftp://mlflow.example/x")), ["tracking.uri", "scheme"]),
    ("tracking-bare-path", changed(("tracking.uri", "./mlruns")), ["tracking.uri", "sqlite:///"]),
    ("tracking-missing-folder", changed(("tracking.uri", "sqlite:///no/such/folder/m.db")),
     ["tracking.uri", "folder not found"]),  # fmt: skip
    ("tracking-db-is-folder", with_files(lambda f: (f / "m.db").mkdir(), ("tracking.uri", "sqlite:///m.db")),
     ["tracking.uri", "folder"]),  # fmt: skip
    ("latency-batch-too-big", changed(("latency.batch_sizes", [1, 10**12])), ["latency.batch_sizes[1]", "GiB"]),
    ("eval-batch-too-big", changed(("data.evaluation.batch_size", 10**13)), ["data.evaluation.batch_size", "GiB"]),
    ("named-slice-calib-only", changed(("data.slices", [{"name": "cal", "filter": {"subset": "calib"}}])),
     ["data.slices[0]", "'cal'", "evaluation rows"]),  # fmt: skip
    ("ragged-csv-long-row", with_table(_csv_text(['"[0.5]",1,test,small,EXTRA']), ".csv"),
     ["data.path", "rows.csv", "line 5", "5 fields"]),  # fmt: skip
    ("ragged-csv-short-row", with_table(_csv_text(['"[0.5]",1']), ".csv"),
     ["data.path", "rows.csv", "line 5", "2 fields"]),
    ("nan-inputs", with_table(_nan_rows("x", [0, 5, 9], np.nan)), ["data.inputs.x", "'x': 3 rows", "slices:", "drop"]),
    ("inf-inputs", with_table(_nan_rows("x", [2], np.inf)), ["data.inputs.x", "'x': 1 row", "band="]),
    ("nan-inputs-under-limit",
     with_table(_nan_rows("x", [1], -np.inf), ".parquet", ("data.evaluation.limit", 5), ("data.slices", [])),
     ["data.inputs.x", "evaluation rows"]),  # fmt: skip
    ("nan-inputs-bad-policy", changed(("data.nonfinite_inputs", "ignore")), ["data.nonfinite_inputs", "drop"]),
]  # fmt: skip


def _params(cases: list[tuple[str, Builder, list[str]]], *, sweep: bool) -> list[Any]:
    return [pytest.param(builder, expected, sweep, id=case_id) for case_id, builder, expected in cases]


ALL_CASES = (
    _params(TYPE_CONFUSION, sweep=False)
    + _params(YAML_STRUCTURE, sweep=False)
    + _params(FILES, sweep=False)
    + _params(FILTERS, sweep=False)
    + _params(PREFLIGHT, sweep=True)
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    started = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - started
    assert elapsed < SECONDS_PER_RUN, f"{argv[0]} took {elapsed:.1f} s"
    return code, capsys.readouterr().err


def _the_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    return errors[0]


LONGEST_LINE = 12 * MAX_VALUE_CHARS
"""A message is never cut (its end is the fix), but every user value in it is abbreviated to MAX_VALUE_CHARS: a
recipe's 10,000-character string or list makes no longer a line than this, beside the paths it names."""


def test_the_base_recipe_is_valid(project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cases below break one thing each in a recipe that passes validate."""
    code, err = _run(["validate", str(changed()(tmp_path, project))], capsys)
    assert code == 0, err


@pytest.mark.parametrize(("build", "expected", "also_sweep"), ALL_CASES)
def test_bad_input_is_one_line_exit_2(
    build: Builder,
    expected: list[str],
    also_sweep: bool,
    project: Project,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = build(tmp_path, project)
    commands = [["validate", str(recipe)]] + ([["sweep", str(recipe)]] if also_sweep else [])
    for argv in commands:
        code, err = _run(argv, capsys)
        line = _the_error_line(err)
        assert code == 2, f"{argv[0]}: {err}"
        assert len(line) <= LONGEST_LINE + 2 * len(str(tmp_path)), line  # values quoted abbreviated: no flood
        assert line.startswith(f"error: {recipe}"), line
        for fragment in expected:
            assert fragment in line, f"{fragment!r} not in {line!r}"
    assert not (tmp_path / "reports").exists()  # nothing was swept


def test_missing_recipe_and_folder_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["validate", str(tmp_path / "absent.yaml")], capsys)
    assert code == 2 and "absent.yaml: recipe file not found" in _the_error_line(err)
    (tmp_path / "folder.yaml").mkdir()
    code, err = _run(["validate", str(tmp_path / "folder.yaml")], capsys)
    assert code == 2 and "folder.yaml: is a folder" in _the_error_line(err)


def test_long_values_are_cut_in_messages(project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "n" * 5000
    code, err = _run(["validate", str(changed(("variants.0.calibrator", name))(tmp_path, project))], capsys)
    line = _the_error_line(err)
    assert code == 2 and "variants[0].calibrator" in line
    assert len(line) < 400 and "nnn...nnn" in line


def test_dropping_nonfinite_rows_is_counted(project: Project, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`data.nonfinite_inputs: drop`: validate passes and says how many rows each column cost."""
    build = with_table(_nan_rows("x", [0, 5, 9], np.nan), ".parquet", ("data.nonfinite_inputs", "drop"))
    recipe = build(tmp_path, project)
    code, err = _run(["validate", str(recipe)], capsys)
    assert code == 0, err
    assert "3 evaluation rows dropped for NaN/inf inputs (x: 3)" in " ".join(err.split())

