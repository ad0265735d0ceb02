"""How config.pbtxt batches models whose inputs do not all take their rows on a dynamic axis 0, read with Triton's
own model-config schema: Triton batches a model (max_batch_size > 0) only when every input and listed output has
a dynamic first dimension; any other model is served unbatched, each request one whole batch as the sweep ran it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from sweep_factory import make_variant

from qbench.export.pbtxt import to_pbtxt
from qbench.export.perf_data import input_data_steps
from qbench.export.triton import perf_analyzer_commands
from qbench.export.triton_config import TARGETS, fixed_batch_of, served_shapes, triton_config
from qbench.modelinfo.signature import read_model_info

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="Triton's schema: qbench[triton]")


def _recurrent(path: Path) -> Path:
    """A recurrent net's interface as torch exports it batch-first: x [batch, 3] and its initial state h0 [1, batch,
    3] (layers x directions first, batch second) -> y [batch, 3] and the final state hn [1, batch, 3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    h0 = helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, "batch", 3])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
               helper.make_tensor_value_info("hn", TensorProto.FLOAT, [1, "batch", 3])]  # fmt: skip
    nodes = [helper.make_node("Add", ["x", "h0"], ["hn"]),
             helper.make_node("ReduceSum", ["hn", "layers"], ["y"], keepdims=0)]  # fmt: skip
    layers = numpy_helper.from_array(np.array([0], dtype=np.int64), "layers")
    graph = helper.make_graph(nodes, "recurrent", [x, h0], outputs, [layers])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_an_initial_state_fixing_a_batch_of_one_is_served_unbatched(tmp_path: Path) -> None:
    """The sweep runs such a model at its fixed batch of 1 (h0's static axis 0 beside x's dynamic one); its export was
    refused ("tensor 'h0': Triton's batching needs a dynamic first (batch) dimension, the model has 1") though Triton
    serves it unbatched: max_batch_size 0, every tensor's whole shape (-1 where ONNX Runtime takes any length), no
    dynamic batcher, each request one batch of 1 row, as timed."""
    path = _recurrent(tmp_path / "recurrent.onnx")
    info = served_shapes(read_model_info(path), path)
    assert fixed_batch_of(info) == 1

    measured = make_variant("v", "int8", p50_by_batch={1: 1.0})
    fields = triton_config("m", measured, info, TARGETS["onnxruntime-cpu"], max_queue_delay_us=100)
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    assert config.max_batch_size == 0 and config.WhichOneof("scheduling_choice") is None
    dims = {t.name: list(t.dims) for t in (*config.input, *config.output)}
    assert dims == {"x": [-1, 3], "h0": [1, -1, 3], "y": [-1, 3], "hn": [1, -1, 3]}
    assert not any(t.HasField("reshape") for t in (*config.input, *config.output))

    # without batching, Triton's onnxruntime backend compares these dims with the session's whole shapes
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reported = {t.name: [d if isinstance(d, int) else -1 for d in t.shape]
                for t in (*session.get_inputs(), *session.get_outputs())}  # fmt: skip
    assert reported == dims

    (command,) = perf_analyzer_commands("m", measured, batched=False)
    assert " -b 1 " in command
    rows = {"x": np.ones((4, 3), np.float32), "h0": np.zeros((4, 1, 3), np.float32)}
    (step,) = input_data_steps(rows, fixed_batch=1)
    assert {name: tensor["shape"] for name, tensor in step.items()} == {"x": [1, 3], "h0": [1, 1, 3]}


def test_the_load_point_of_a_fixed_batch_model_gets_no_command_replaying_it() -> None:
    """qbench simulates a fixed-batch model's load as single rows at the rate, each batch filled up to the model's
    rows. Its config has no dynamic batcher (max_batch_size 0), so the README's 'same load' command, each request a
    whole batch of 8 rows at 100 req/s, sent 800 rows/s to Triton where qbench simulated 100, under a text naming a
    batcher 'as in config.pbtxt'. A batched model's README keeps its command."""
    from qbench.export.triton import _load_lines
    from qbench.results.serving import LoadStats, ServingResult

    at_rate = LoadStats(100.0, 300, 0.9, 1.8, 2.7, 1.0, 0.4, 1.2, 99.0)
    serving = ServingResult(preprocess_ms_per_row=0.01, budget_ms=50.0, rate_rps=100.0, max_batch_size=8,
                            max_queue_delay_ms=2.0, requests=300, seed=0, at_rate=at_rate)  # fmt: skip
    measured = dataclasses.replace(make_variant("v", "int8", p50_by_batch={8: 1.0}), serving=serving)

    fixed = "\n".join(_load_lines("m", measured, 8))
    assert "--request-rate-range" not in fixed and "as in config.pbtxt" not in fixed
    assert "Triton cannot serve that load" in fixed and "filled up to the model's 8 rows" in fixed
    batched = _load_lines("m", measured, None)
    (command,) = [line for line in batched if line.startswith("perf_analyzer")]
    assert "--request-rate-range 100:100:1" in command and " -b 1 " in command
