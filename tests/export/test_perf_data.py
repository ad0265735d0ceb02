"""perf_analyzer's --input-data file in a Triton export: the rows qbench timed, in a form perf_analyzer batches into
requests the model accepts (integer ids within their table, bool masks, strings, fixed batches)."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from qbench.export.perf_data import SAMPLE_SEED, input_data_steps, rows_file, sample_rows, write_input_data
from qbench.export.triton import INPUT_DATA_FILE, export_triton
from qbench.modelinfo.signature import read_model_info
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep

try:
    from tritonclient.grpc import model_config_pb2
    from tritonclient.utils import triton_to_np_dtype
except ImportError:  # qbench's export needs no tritonclient; only the check that reads config.pbtxt's types does
    model_config_pb2 = triton_to_np_dtype = None

VOCABULARY, TOKENS, ROWS = 50, 6, 96


def ids_model(path: Path) -> None:
    """ids int64 [N, 6] -> Gather from a 50-row table, masked by mask bool [N, 6], summed, beside feat float [N, 4] ->
    logits [N, 3]; pooled [N, 8] is a second, unevaluated output."""
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", TOKENS]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", TOKENS]),
              helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", 4])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]),
               helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 8])]  # fmt: skip
    weights = [numpy_helper.from_array(rng.normal(size=(VOCABULARY, 8)).astype(np.float32), "table"),
               numpy_helper.from_array(rng.normal(size=(12, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([1], np.int64), "axis1"),
               numpy_helper.from_array(np.array([2], np.int64), "axis2")]  # fmt: skip
    nodes = [helper.make_node("Gather", ["table", "ids"], ["embedded"]),
             helper.make_node("Cast", ["mask"], ["weights"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["weights", "axis2"], ["weights3"]),
             helper.make_node("Mul", ["embedded", "weights3"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axis1"], ["pooled"], keepdims=0),
             helper.make_node("Concat", ["pooled", "feat"], ["joined"], axis=1),
             helper.make_node("MatMul", ["joined", "w"], ["logits"])]  # fmt: skip
    graph = helper.make_graph(nodes, "ids", inputs, outputs, weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def ids_project(root: Path, rows: int, seed: int, *, data: dict, gate: dict, **extra: list) -> pd.DataFrame:
    """`ids_model` at root/model.onnx, `rows` rows of its inputs and a label (and the `extra` columns) in
    root/data.parquet, and the recipe root/ids.yaml with its FP16 variant over them; returns the table."""
    ids_model(root / "model.onnx")
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({
        "ids": list(rng.integers(0, VOCABULARY, (rows, TOKENS))), "mask": list(rng.random((rows, TOKENS)) > 0.3),
        "feat": list(rng.normal(size=(rows, 4)).astype(np.float32)), "y": rng.integers(0, 3, rows), **extra,
    })  # fmt: skip
    table.to_parquet(root / "data.parquet")
    recipe = {
        "name": "ids", "model": {"path": "model.onnx", "output": "logits"},
        "data": {"path": "data.parquet", "inputs": {"ids": "ids", "mask": "mask", "feat": "feat"}, "label": "y",
                 **data},
        "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
        "latency": {"batch_sizes": [1, 4], "warmup": 1, "iterations": 5, "threads": 1},
        "gate": gate, "output_dir": "reports", "analysis": {"ranges": False},
    }  # fmt: skip
    (root / "ids.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return table


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("ids")
    table = ids_project(root, ROWS, 1, split=["calib"] * 32 + ["eval"] * 64,
                        data={"calibration": {"filter": {"split": "calib"}},
                              "evaluation": {"filter": {"split": "eval"}}},
                        gate={"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5})  # fmt: skip
    run_sweep(root / "ids.yaml", track=False)
    export = export_triton(load_recipe(root / "ids.yaml"), "fp16", "onnxruntime-cpu", root / "repo")
    return export.model_dir, table[table.split == "eval"].reset_index(drop=True)


def _decoded(tensor: dict, dtype: np.dtype) -> np.ndarray:
    if isinstance(tensor["content"], list):
        return np.array(tensor["content"], dtype=object).reshape(tensor["shape"])
    return np.frombuffer(base64.b64decode(tensor["content"]["b64"]), dtype=dtype).reshape(tensor["shape"])


@pytest.mark.skipif(model_config_pb2 is None,
                    reason="Triton's model-config schema comes with tritonclient (pip install "
                    "'qbench[triton]'); the other tests here check the data file without it")  # fmt: skip
def test_every_perf_analyzer_command_sends_requests_the_model_accepts(exported) -> None:
    """The README's commands name the data file, and each batch perf_analyzer builds from it (consecutive steps,
    typed as config.pbtxt says) runs in ONNX Runtime and holds the evaluation rows (all 64: in evaluation order):
    without the file, perf_analyzer's random bytes make token ids far outside the 50-row table and every request
    fails."""
    model_dir, evaluation = exported
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    dtypes = {t.name: triton_to_np_dtype(model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_"))
              for t in config.input}  # fmt: skip
    steps = json.loads((model_dir / INPUT_DATA_FILE).read_text())["data"]
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    commands = [shlex.split(line) for line in (model_dir / "README.md").read_text().splitlines()
                if line.startswith("perf_analyzer ")]  # fmt: skip
    assert len(commands) == 2
    for words in commands:
        assert words[words.index("--input-data") + 1] == INPUT_DATA_FILE
        batch = int(words[words.index("-b") + 1])
        feeds = {name: np.stack([_decoded(steps[k % len(steps)][name], dtype) for k in range(batch)])
                 for name, dtype in dtypes.items()}  # fmt: skip
        logits, pooled = session.run(None, feeds)
        assert logits.shape == (batch, 3) and np.isfinite(logits).all()
        np.testing.assert_array_equal(feeds["ids"], np.stack(evaluation.ids[:batch]))
        np.testing.assert_array_equal(feeds["mask"], np.stack(evaluation["mask"][:batch]))
        assert feeds["mask"].dtype == np.bool_ and feeds["feat"].dtype == np.float32


def test_steps_are_rows_or_one_whole_fixed_batch_and_strings_stay_strings() -> None:
    """A batched model's step is one row (a batch-only input's row is shape [1], as its config dims); a fixed-batch
    model's one step is its whole batch, rows repeated from the top when fewer; string inputs are lists of strings."""
    feeds = {"x": np.arange(12, dtype=np.float16).reshape(3, 4), "label": np.array([7, 8, 9], np.int64),
             "colour": np.array([["red"], ["blue"], ["red"]], dtype=object)}  # fmt: skip
    steps = input_data_steps(feeds, fixed_batch=None)
    assert len(steps) == 3
    assert steps[1]["x"]["shape"] == [4] and _decoded(steps[1]["x"], np.float16).tolist() == [4, 5, 6, 7]
    assert steps[2]["label"]["shape"] == [1] and _decoded(steps[2]["label"], np.int64).tolist() == [9]
    assert steps[1]["colour"] == {"content": ["blue"], "shape": [1]}
    (whole,) = input_data_steps(feeds, fixed_batch=4)
    assert whole["x"]["shape"] == [4, 4] and _decoded(whole["label"], np.int64).tolist() == [7, 8, 9, 7]
    assert whole["colour"]["content"] == ["red", "blue", "red", "red"]


def test_sample_rows_is_seeded_stratified_by_slice_combination_and_in_evaluation_order() -> None:
    """100 evaluation rows, slice `rare` holds the last 10: a sample of 10 takes 1 rare row and 9 others (shares of
    10 % and 90 %), none twice, in evaluation order, the same rows on every call; fewer rows than asked: all of them."""
    rows = np.arange(500, 600)
    rare = np.arange(100) >= 90
    picked = sample_rows(rows, {"rare": rare, "common": ~rare}, 10)
    assert picked.tolist() == sample_rows(rows, {"rare": rare, "common": ~rare}, 10).tolist()
    assert len(set(picked.tolist())) == 10 and picked.tolist() == sorted(picked.tolist())
    assert int(np.isin(picked, rows[rare]).sum()) == 1
    assert sample_rows(rows, {}, 200).tolist() == rows.tolist()
    assert len(sample_rows(rows, {}, 10)) == 10


def test_input_data_is_a_sample_across_all_evaluation_rows_with_the_rows_recorded(tmp_path: Path) -> None:
    """160 evaluation rows sorted by kind (the first 128 `a`, the last 32 `b`, sliced by kind): the file holds 64
    rows, 51 and 13 of them by the slices' shares (largest remainder of 51.2 and 12.8), each step the very row the
    recorded table position names; the first 64 rows would hold no `b` row at all."""
    rows = 160
    table = ids_project(tmp_path, rows, 2, kind=["a"] * 128 + ["b"] * 32, data={"slices": [{"by": "kind"}]},
                        gate={"metric": "agreement", "max_drop": 0.5})  # fmt: skip
    path = write_input_data(tmp_path / INPUT_DATA_FILE, load_recipe(tmp_path / "ids.yaml"),
                            read_model_info(tmp_path / "model.onnx"), fixed_batch=None)  # fmt: skip
    steps = json.loads(path.read_text())["data"]
    drawn = json.loads(rows_file(path).read_text())
    assert drawn["seed"] == SAMPLE_SEED and drawn["evaluation_rows"] == rows
    assert drawn["slices"] == {"kind=a": 51, "kind=b": 13}
    assert len(steps) == len(drawn["rows"]) == 64 and drawn["rows"] == sorted(set(drawn["rows"]))
    for step, row in zip(steps, drawn["rows"], strict=True):
        np.testing.assert_array_equal(_decoded(step["ids"], np.int64), table.ids[row])
        np.testing.assert_array_equal(_decoded(step["feat"], np.float32), table.feat[row])
