"""Model info of graphs converters produce: sequence/map outputs and outputs that copy an input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from qbench.modelinfo import read_model_info


def _save(tmp_path: Path, nodes: list, inputs: list, outputs: list, ml: bool = False) -> Path:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=opsets)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def test_a_zipmap_output_is_a_map_with_its_class_keys(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    map_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    probabilities = helper.make_value_info("probabilities", map_type)
    zipmap = helper.make_node("ZipMap", ["x"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[1, 5, 7])
    info = read_model_info(_save(tmp_path, [zipmap], [x], [probabilities], ml=True))
    meta = info.outputs["probabilities"]
    assert (meta.kind, meta.dtype, meta.shape, meta.class_keys) == ("map", np.dtype("float32"), (None, 3), (1, 5, 7))
    assert meta.describe() == "probabilities (seq(map(int64,tensor(float32))))"


def test_other_non_tensor_outputs_are_kept_and_named(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    sequence = helper.make_value_info("parts", helper.make_sequence_type_proto(helper.make_tensor_type_proto(1, None)))
    node = helper.make_node("SequenceConstruct", ["x", "x"], ["parts"])
    meta = read_model_info(_save(tmp_path, [node], [x], [sequence])).outputs["parts"]
    assert (meta.kind, meta.type_name) == ("other", "seq(tensor(float32))")


def test_outputs_copying_an_input_are_marked(tmp_path: Path) -> None:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None, 4])
    copy = helper.make_tensor_value_info("ids_copy", TensorProto.FLOAT, [None, 4])
    real = helper.make_tensor_value_info("doubled", TensorProto.INT64, [None, 4])
    nodes = [
        helper.make_node("Identity", ["input_ids"], ["i1"]),
        helper.make_node("Cast", ["i1"], ["ids_copy"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["input_ids", "input_ids"], ["doubled"]),
    ]
    outputs = read_model_info(_save(tmp_path, nodes, [ids], [copy, real])).outputs
    assert outputs["ids_copy"].passthrough_of == "input_ids"
    assert outputs["doubled"].passthrough_of is None
