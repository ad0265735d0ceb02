"""Graph helpers shared by the builders (qbench.variants.onnx_utils): node ordering and build-step failures."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

import onnx
import pytest
from onnx import TensorProto, helper

from qbench.errors import QbenchError, environment_cause
from qbench.variants import onnx_utils
from qbench.variants.node_names import resolve_node_names
from qbench.variants.onnx_utils import build_step, sort_nodes, topologically_sorted


def test_a_sorted_node_list_comes_back_in_its_own_order():
    """Independent nodes are not reordered: a sorted graph's nodes (and what is measured on them) stay as written."""
    nodes = [helper.make_node("Relu", ["x"], ["p"], name="p"), helper.make_node("Neg", ["x"], ["q"], name="q"),
             helper.make_node("Add", ["p", "q"], ["s"], name="s"),
             helper.make_node("Abs", ["x"], ["t"], name="t")]  # fmt: skip
    assert [n.name for n in topologically_sorted(nodes)] == ["p", "q", "s", "t"]
    assert [n.name for n in topologically_sorted(nodes[::-1])] == ["t", "q", "p", "s"]


def test_sort_nodes_orders_subgraphs_too():
    body = helper.make_graph([helper.make_node("Neg", ["inner"], ["out"], name="neg"),
                              helper.make_node("Relu", ["x"], ["inner"], name="relu")],
                             "then", [], [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])  # fmt: skip
    branch = helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=body)
    graph = helper.make_graph([branch], "g", [], [])
    assert sort_nodes(graph)
    assert [n.name for n in graph.node[0].attribute[0].g.node] == ["relu", "neg"]
    assert not sort_nodes(graph), "a sorted graph is left as it is"


def test_a_build_step_failure_keeps_the_whole_message_on_one_line():
    """The onnx checker's first line ends at "of node:": the node it names was cut off."""
    nodes = [helper.make_node("Relu", ["r"], ["y"], name="late_reader"),
             helper.make_node("Relu", ["x"], ["r"], name="relu")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(QbenchError) as caught, build_step("bf16", "BF16 simulation"):
        onnx.checker.check_model(model)
    message = str(caught.value)
    assert message.startswith("variant 'bf16': BF16 simulation: Nodes in a graph must be topologically sorted")
    assert "late_reader" in message and "\n" not in message


def _if_model() -> onnx.ModelProto:
    """/block/mm (main graph) -> If /block/if whose branches hold /block/then/mm and /block/else/mm."""
    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("MatMul", ["h", "w"], [name], name=f"/block/{name}/mm")], name, [],
                                 [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)])  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/block/mm"),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then"), else_branch=branch("else"),
                              name="/block/if")]  # fmt: skip
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
          helper.make_tensor_value_info("c", TensorProto.BOOL, []),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])]  # fmt: skip
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    return helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:], [weight]))


def test_exclude_nodes_naming_only_nodes_inside_a_subgraph_is_refused_naming_the_control_flow_node():
    """Every build rewrites the main graph only: a branch's MatMul was accepted and the exclusion changed nothing.
    A scope also covering main-graph nodes stands for those; a name matching nothing stays an error."""
    model = _if_model()
    for name in ("/block/then/mm", "/block/else"):
        with pytest.raises(QbenchError) as caught:
            resolve_node_names(model, [name], "v")
        assert str(caught.value).startswith(f"variant 'v': exclude_nodes: {name!r} is inside the subgraph of If node "
                                            "'/block/if', which ONNX builds leave float")  # fmt: skip
    assert resolve_node_names(model, ["/block"], "v") == ["/block/mm", "/block/if"]
    assert resolve_node_names(model, ["/block/if", "/block/mm"], "v") == ["/block/if", "/block/mm"]
    with pytest.raises(QbenchError, match="no node named '/block/then/mmm' in the model"):
        resolve_node_names(model, ["/block/then/mmm"], "v")


def _string_table_model(classes: list[str]) -> onnx.ModelProto:
    """A label looked up by index in a constant table of class names, as skl2onnx writes a classifier with string
    classes: an initializer of strings."""
    import numpy as np

    table = onnx.numpy_helper.from_array(np.array(classes, dtype=object), "classes")
    nodes = [helper.make_node("ArgMax", ["x"], ["index"], axis=1, keepdims=0),
             helper.make_node("Gather", ["classes", "index"], ["label"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("label", TensorProto.STRING, [None])],
                              [table])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_graph_with_a_string_initializer_has_one_digest(tmp_path) -> None:
    """A string initializer's values were digested as the addresses of its strings: the same file gave another digest
    each time, so a variant with nothing to convert (the FP32 file itself) was measured again, and its timing noise
    reported as the variant's speed-up. Equal names give one digest, other names another."""
    from qbench.variants.onnx_utils import graph_digest

    paths = {}
    for name, classes in (("a", ["cat", "dog"]), ("copy", ["cat", "dog"]), ("other", ["cat", "dot"])):
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(_string_table_model(classes), str(paths[name]))
    digests = [graph_digest(paths["a"]) for _ in range(3)]
    assert len(set(digests)) == 1 and graph_digest(paths["copy"]) == digests[0] != graph_digest(paths["other"])


def test_a_settled_model_is_parsed_once_for_its_graph_digest(tmp_path, monkeypatch) -> None:
    """The search and the sweep's plan both digest the FP32 model (a parse of every byte): a file unchanged since well
    before is parsed once; rewritten (other content, same path) it is digested anew, and a file written moments ago is
    never remembered (its time stamp could survive a rewrite)."""
    from qbench.variants.onnx_utils import graph_digest

    loads: list[Path] = []
    original = onnx_utils.load_model
    monkeypatch.setattr(onnx_utils, "load_model", lambda path: loads.append(path) or original(path))
    path = tmp_path / "model.onnx"
    onnx.save(_string_table_model(["cat", "dog"]), str(path))
    fresh = [graph_digest(path) for _ in range(2)]
    assert len(loads) == 2  # written just now: not remembered
    past = path.stat().st_mtime_ns - 60_000_000_000
    os.utime(path, ns=(past, past))
    settled = [graph_digest(path) for _ in range(3)]
    assert len(loads) == 3 and settled == fresh[:1] * 3
    onnx.save(_string_table_model(["cat", "dot"]), str(path))
    os.utime(path, ns=(past - 1, past - 1))  # another content, even with a settled time of its own
    assert graph_digest(path) != fresh[0] and len(loads) == 4


def _quantized_matmul(weight: list[int], zero_point: int, scale: float, shape: list[int]) -> onnx.ModelProto:
    """x @ dequantize(weight) reshaped to `shape`: an int8 weight, its scale and zero point, and an int64 shape."""
    nodes = [helper.make_node("DequantizeLinear", ["w", "scale", "zero"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    initializers = [helper.make_tensor("w", TensorProto.INT8, [2, 2], weight),
                    helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
                    helper.make_tensor("zero", TensorProto.INT8, [], [zero_point]),
                    helper.make_tensor("shape", TensorProto.INT64, [len(shape)], shape)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip


def test_kernels_digest_ignores_weights_scales_and_zero_points_but_not_shapes_or_a_zero_point_of_zero(tmp_path):
    """A reduce_range twin differs from its base in its weights' values and scales only: the same kernels, one
    kernels digest, while the graph digests differ. A shape tensor's values, or a zero point of 0 against another,
    make another digest."""
    from qbench.variants.onnx_utils import graph_digest, kernels_digest

    variants = {"base": ([1, -2, 3, 4], 0, 0.5, [1, 2]), "twin": ([1, -1, 2, 2], 0, 1.0, [1, 2]),
                "reshaped": ([1, -2, 3, 4], 0, 0.5, [2, 1]), "shifted": ([1, -2, 3, 4], 3, 0.5, [1, 2])}  # fmt: skip
    paths = {}
    for name, args in variants.items():
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(_quantized_matmul(*args), str(paths[name]))
    assert graph_digest(paths["base"]) != graph_digest(paths["twin"])
    assert kernels_digest(paths["base"]) == kernels_digest(paths["twin"])
    assert kernels_digest(paths["reshaped"]) != kernels_digest(paths["base"])
    assert kernels_digest(paths["shifted"]) != kernels_digest(paths["base"])


def _half_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a model on a disk that fills up: half the model's bytes reach the file it writes, then ENOSPC."""

    def fill_up(model: onnx.ModelProto, file: BinaryIO) -> None:
        data = model.SerializeToString()
        file.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), file.name)

    monkeypatch.setattr(onnx_utils, "write_serialised", fill_up)


def test_a_model_saved_on_a_full_disk_leaves_the_earlier_file_whole_and_names_the_path(tmp_path, monkeypatch):
    """save_model wrote in place: a disk filling up mid-write left a truncated model where a good one was (an FP16
    emulation in the run folder), and the error was a bare OSError (`OSError: [Errno 28] ... (at __init__.py:179)`)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    target = onnx_utils.save_model(model, tmp_path / "models" / "half.emulated.onnx")
    good = target.read_bytes()
    _half_written(monkeypatch)
    with pytest.raises(QbenchError) as caught:
        onnx_utils.save_model(model, target)
    assert str(caught.value) == f"{target}: cannot write the model: No space left on device"
    assert environment_cause(caught.value) == "no space left on device"  # --resume runs such a job again
    assert target.read_bytes() == good
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no staging folder left behind


def test_fields_this_protobuf_does_not_know_are_saved_as_read(tmp_path) -> None:
    """A model from a newer onnx may hold fields this protobuf does not know (kept as unknown fields on reading): the
    piecewise writer sees no such field, so the saved file must still be the model's own bytes, the field included."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])  # fmt: skip
    graph_bytes = graph.SerializeToString() + bytes([0xF8, 0x3E, 0x01])  # field 999, varint 1: unknown to GraphProto
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ClearField("graph")
    raw = model.SerializeToString() + bytes([0x3A]) + onnx_utils._varint(len(graph_bytes)) + graph_bytes  # field 7
    raw += bytes([0xF8, 0x3E, 0x02])  # and one unknown to ModelProto
    with_unknown = onnx.ModelProto.FromString(raw)
    assert with_unknown.graph.node[0].op_type == "Relu"
    saved = onnx_utils.save_model(with_unknown, tmp_path / "m.onnx")
    assert saved.read_bytes() == with_unknown.SerializeToString()
    assert bytes([0xF8, 0x3E, 0x01]) in saved.read_bytes() and bytes([0xF8, 0x3E, 0x02]) in saved.read_bytes()
