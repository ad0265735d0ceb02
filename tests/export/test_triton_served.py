"""config.pbtxt against what Triton's onnxruntime backend checks when it loads the model, without Triton's schema
(tritonclient): the backend reads each tensor's shape from an ONNX Runtime session and requires every output's
config dims, after the batch dimension, to equal it exactly (a -1 where the session reports a number fails the
load: `CompareDimsSupported(..., compare_exact=true)` in onnxruntime_backend's onnxruntime_utils.cc)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sweep_factory import make_variant

from qbench.errors import QbenchError
from qbench.export.triton_config import TARGETS, served_shapes, triton_config
from qbench.modelinfo.signature import read_model_info


def _relu(path: Path, output_shape: list | None) -> Path:
    """x [batch, 3] -> Relu -> y, y declared with `output_shape` (None: no shape at all)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _session_dims(path: Path, output: str) -> list[int]:
    """The output's shape as the backend gets it from ONNX Runtime: -1 for a dimension that is not a number."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (meta,) = [o for o in session.get_outputs() if o.name == output]
    return [d if isinstance(d, int) else -1 for d in meta.shape]


def _config(path: Path) -> dict:
    info = served_shapes(read_model_info(path), path)
    return triton_config("m", make_variant("v", "int8"), info, TARGETS["onnxruntime-cpu"], max_queue_delay_us=100)


@pytest.mark.parametrize(
    "declared",
    [["batch", "unk__7"], [None, None], None, ["batch", 3]],
    ids=["named-dim-inference-fixes", "unnamed-dims", "no-shape", "stated"],
)
def test_output_dims_are_the_shape_onnxruntime_reports(tmp_path: Path, declared) -> None:
    """y declared [batch, unk__7] (tf2onnx names dims it could not fix) or [?, ?]: ONNX Runtime infers [batch, 3] and
    reports it, so the config must say dims [3]; it said [-1], which Triton's backend refuses to load ("the model
    expects 2 dimensions (shape [-1,3]) but the model configuration specifies ... [-1,-1]")."""
    path = _relu(tmp_path / "relu.onnx", declared)
    (y,) = _config(path)["output"]
    assert _session_dims(path, "y") == [-1, 3]
    assert [-1, *y["dims"]] == _session_dims(path, "y") and y["dims"] == [3]


def test_a_dynamic_non_batch_output_dim_stays_dynamic(tmp_path: Path) -> None:
    """ids [batch, seq] int64 -> Gather from a [50, 4] table -> hidden [batch, seq, 4]: seq is not known until a
    request comes, so it is -1 in the config, as ONNX Runtime reports it; int64 ids are TYPE_INT64."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    hidden = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", None])
    table = helper.make_tensor("table", TensorProto.FLOAT, [50, 4], [0.5] * 200)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["hidden"])], "g", [ids], [hidden], [table])
    path = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    config = _config(path)
    (out,) = config["output"]
    assert [-1, *out["dims"]] == _session_dims(path, "hidden") == [-1, -1, 4]
    (inp,) = config["input"]
    assert (inp["data_type"], inp["dims"]) == ("TYPE_INT64", [-1])


PINNED = """\
name: "tokens-fp16"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
input {
  name: "input_ids"
  data_type: TYPE_INT64
  dims: [ -1 ]
}
input {
  name: "attention_mask"
  data_type: TYPE_INT64
  dims: [ -1 ]
}
output {
  name: "label"
  data_type: TYPE_INT64
  dims: [ 1 ]
  reshape {
  }
}
instance_group {
  count: 1
  kind: KIND_GPU
}
dynamic_batching {
  preferred_batch_size: [ 1, 8 ]
  max_queue_delay_microseconds: 1000
}
parameters {
  key: "intra_op_thread_count"
  value {
    string_value: "2"
  }
}
parameters {
  key: "inter_op_thread_count"
  value {
    string_value: "1"
  }
}
optimization {
  graph {
    level: -1
  }
  execution_accelerators {
    gpu_execution_accelerator {
      name: "tensorrt"
      parameters {
        key: "precision_mode"
        value: "FP16"
      }
      parameters {
        key: "trt_engine_cache_enable"
        value: "1"
      }
    }
  }
}
"""


def test_the_config_text_is_the_one_checked_against_tritons_schema(tmp_path: Path) -> None:
    """Two int64 inputs [batch, seq] and a label [batch], FP16 at ONNX Runtime's basic level on TensorRT, timed at
    batch 1 and 8 on 2 threads, 1 ms queue delay: the whole config.pbtxt, pinned as parsed into Triton's ModelConfig
    (tritonclient 2.73) and read against Triton's documented rules: dims without the batch dimension, -1 for seq,
    [1] reshaped to [] for the batch-only label, the delay in microseconds, the onnxruntime backend's parameter
    names (intra_op_thread_count, inter_op_thread_count; precision_mode, trt_engine_cache_enable) and graph level
    -1 for basic. Runs without tritonclient; test_triton.py parses such configs with the schema where it is."""
    from qbench.export.pbtxt import to_pbtxt

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])
    nodes = [helper.make_node("Add", ["input_ids", "attention_mask"], ["summed"]),
             helper.make_node("ReduceSum", ["summed", "axis"], ["label"], keepdims=0)]  # fmt: skip
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [1])
    path = tmp_path / "tokens.onnx"
    graph = helper.make_graph(nodes, "tokens", [ids, mask], [label], [axis])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    measured = make_variant("v", "fp16", p50_by_batch={1: 1.0, 8: 2.0},
                            params={"runtime.graph_optimization_level": "basic"})  # fmt: skip
    assert measured.latency is not None and measured.latency.threads == 2
    info = served_shapes(read_model_info(path), path)
    fields = triton_config("tokens-fp16", measured, info, TARGETS["onnxruntime-tensorrt"], max_queue_delay_us=1000)
    assert to_pbtxt(fields) == PINNED


def _with_batch_statistics(path: Path, batch: str | int) -> Path:
    """x [batch, 3] -> y = Relu(x) [batch, 3], with a batch's mean (a scalar) and a constant class table [3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3]),
               helper.make_tensor_value_info("mean", TensorProto.FLOAT, []),
               helper.make_tensor_value_info("classes", TensorProto.INT64, [3])]  # fmt: skip
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("ReduceMean", ["y"], ["mean"], keepdims=0),
             helper.make_node("Constant", [], ["classes"],
                              value=helper.make_tensor("c", TensorProto.INT64, [3], [4, 5, 6]))]  # fmt: skip
    graph = helper.make_graph(nodes, "stats", [x], outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_a_batched_models_outputs_without_a_batch_dimension_are_left_out(tmp_path: Path) -> None:
    """y [batch, 3] beside a scalar batch mean and a constant class table [3]: Triton's batcher cannot split those
    into each request's rows, and its onnxruntime backend checks and returns only the outputs config.pbtxt lists, so
    the config serves y alone (dims [3]) and names the others; the export was refused ('Triton's batching needs a
    dynamic first (batch) dimension, the model has none (a scalar)') though y was the output the gate judged."""
    path = _with_batch_statistics(tmp_path / "stats.onnx", "batch")
    config = _config(path)
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("y", [3])]
    assert config["max_batch_size"] > 0 and "dynamic_batching" in config
    from qbench.export.triton import _left_out_lines
    from qbench.export.triton_config import unbatched_outputs

    info = served_shapes(read_model_info(path), path)
    assert unbatched_outputs(info) == ["mean", "classes"]
    (note,) = [line for line in _left_out_lines(info) if line]  # the exported README says so
    assert note.startswith("config.pbtxt leaves out the model's output(s) `mean`, `classes`: without a batch")
    assert _session_dims(path, "mean") == [] and _session_dims(path, "classes") == [3]


def test_a_scalar_output_of_a_fixed_batch_model_is_dims_1(tmp_path: Path) -> None:
    """The same model with a fixed batch of 2 (x [2, 3]) is served unbatched, every output listed: the scalar mean as
    `dims: [ 1 ]`. It was written with no dims at all, which Triton's model configuration check refuses ('must
    specify dims'); its onnxruntime backend takes a scalar's dims as all 1s (and refuses an empty reshape when the
    model does not batch)."""
    path = _with_batch_statistics(tmp_path / "fixed.onnx", 2)
    config = _config(path)
    assert config["max_batch_size"] == 0
    assert [(o["name"], o["dims"], "reshape" in o) for o in config["output"]] == [
        ("y", [2, 3], False), ("mean", [1], False), ("classes", [3], False)]  # fmt: skip


def test_an_evaluated_output_declared_with_a_fixed_first_dimension_is_refused(tmp_path: Path) -> None:
    """x [batch, 3] -> y declared [1, 3] (ONNX Runtime runs any batch, warning that the shape differs): y is the
    only output, so leaving it out as unbatched wrote a config with no output at all (`output: []`), where the export
    was refused before; it is refused again, naming y. An output the recipe names (model.output) is refused the same
    way beside others that are served."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "declared", [x], [y])
    path = tmp_path / "declared.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    with pytest.raises(QbenchError, match="output 'y': Triton's batching needs a dynamic first .* declares 1 and no"):
        _config(path)
    from qbench.export.triton_config import unbatched_outputs

    info = served_shapes(read_model_info(_with_batch_statistics(tmp_path / "stats.onnx", "batch")),
                         tmp_path / "stats.onnx")  # fmt: skip
    assert unbatched_outputs(info, ["y"]) == ["mean", "classes"]
    with pytest.raises(QbenchError, match="output 'mean': Triton's batching needs .* declares none \\(a scalar\\); "):
        unbatched_outputs(info, ["mean"])
