"""The node names explain, fallback and exclude_nodes work with on a model whose layers are local functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_sensitivity import INT8, WIDTH, write_fragile_project

from qbench.errors import QbenchError
from qbench.explain.sensitivity import explain_variant
from qbench.recipe.spec import load_recipe
from qbench.variants import BuildContext, build_variant
from qbench.variants.node_names import resolve_node_names
from qbench.variants.onnx_utils import load_model

LAYERS = ("/layers.0/Block", "/layers.1/Block")


def functions_model(path: Path) -> Path:
    """x -> Block -> Block -> head -> y[4], Block(a) = (Relu(a @ w_up)) @ w_down a local function, its call nodes
    named as a module-exporting exporter names them."""
    block = helper.make_function(
        "local", "Block", ["a", "w_up", "w_down"], ["out"],
        [helper.make_node("MatMul", ["a", "w_up"], ["u"], name="up"),
         helper.make_node("Relu", ["u"], ["r"], name="act"),
         helper.make_node("MatMul", ["r", "w_down"], ["out"], name="down")],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    rng = np.random.default_rng(4)
    weights = {f"{k}{i}": rng.normal(size=(WIDTH, WIDTH)) / 4 for i in range(2) for k in ("up", "down")}
    weights["w_head"] = rng.normal(size=(WIDTH, 4)) / 4
    graph = helper.make_graph(
        [helper.make_node("Block", ["x", "up0", "down0"], ["h0"], domain="local", name=LAYERS[0]),
         helper.make_node("Block", ["h0", "up1", "down1"], ["h1"], domain="local", name=LAYERS[1]),
         helper.make_node("MatMul", ["h1", "w_head"], ["y"], name="head")],
        "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[block], ir_version=8)  # fmt: skip
    onnx.save(model, str(path))
    return path


def test_explain_groups_an_inlined_model_by_its_call_sites(tmp_path):
    """The inlined nodes were `up__1`, `down__1`, `up__2`...: `--group layer` made a group of each node, and
    nothing a user saw named the layer. Grouped by layer, the two call sites and the head are ranked."""
    path = write_fragile_project(tmp_path, [INT8])
    functions_model(tmp_path / "model.onnx")
    result = explain_variant(load_recipe(path), "int8", group_by="layer")
    assert result.quantized_nodes == 5
    assert {cost.group: cost.nodes for cost in result.costs} == {
        "/layers.0": ("/layers.0/Block/down", "/layers.0/Block/up"),
        "/layers.1": ("/layers.1/Block/down", "/layers.1/Block/up"),
        "head": ("head",),
    }


def test_exclude_nodes_names_a_call_site_and_a_body_name_is_answered_with_the_call_sites(tmp_path):
    """`exclude_nodes: [/layers.1/Block]` (the node a user reads in the un-inlined model) was refused as no node;
    it now keeps every node of that call float. The function body's own name (`up`, or onnx's `up__2`) is refused
    in one line that names the inlined nodes it may mean."""
    functions_model(tmp_path / "m.onnx")
    model = load_model(tmp_path / "m.onnx")
    assert resolve_node_names(model, [LAYERS[1], "head"], "v") == [f"{LAYERS[1]}/{n}" for n in ("up", "act", "down")] + ["head"]
    for name in ("up", "up__2"):
        with pytest.raises(QbenchError,
                           match=r"exclude_nodes: no node named '[a-z_0-9]+' in the model \(nodes of local "
                                              r"functions are named after their call site: '/layers.0/Block/up', "
                                              r"'/layers.1/Block/up'\)"):  # fmt: skip
            resolve_node_names(model, [name], "v")
    with pytest.raises(QbenchError, match=r"did you mean '/layers.1/Block'"):
        resolve_node_names(model, ["/layers.1/Blocks"], "v")
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(16, WIDTH)).astype(np.float32)}]
    spec = load_recipe(write_fragile_project(tmp_path / "p", [{**INT8, "exclude_nodes": [LAYERS[1]]}])).variants[0]
    built = build_variant(spec, BuildContext(tmp_path / "m.onnx", tmp_path / "out", batches))
    assert built.params["quantized_nodes"] == 3  # layer 0's two MatMuls and the head


def test_explaining_a_variant_whose_only_layers_sit_in_an_if_branch_says_why_in_one_line(tmp_path, capsys):
    """The MatMuls sit inside If branches, which the quantizers leave float: the INT8 variant is the FP32 model. The
    sweep's note read 'no MatMul node in the standard ONNX domain' (there are two) and explain 'has no quantized node
    to rank'; both now say where the MatMuls are and explain that there is nothing to explain (exit 2, one line)."""
    from qbench.cli.app import main

    path = write_fragile_project(tmp_path, [INT8])
    rng = np.random.default_rng(0)
    branches = [helper.make_graph([helper.make_node("MatMul", ["x", w], [w + "_out"], name=f"in_{w}")], w, [],
                                  [helper.make_tensor_value_info(w + "_out", TensorProto.FLOAT, ["batch", 4])])
                for w in ("w_then", "w_else")]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
         helper.make_node("If", ["c"], ["y"], then_branch=branches[0], else_branch=branches[1], name="cond")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(rng.normal(size=(WIDTH, 4)).astype(np.float32), w) for w in ("w_then", "w_else")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "model.onnx"))  # fmt: skip
    assert main(["explain", str(path), "--variant", "int8", "--no-track"]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert error == ["error: explain: variant 'int8' quantizes no node, so "
                     "nothing to explain: nothing to quantize (no MatMul "
                     "node in the standard ONNX domain; 2 MatMul only inside control-flow subgraphs (If/Loop/Scan), "
                     "which quantization leaves float)"]  # fmt: skip


def test_explaining_a_variant_calibrated_on_zeros_says_the_calibration_left_nothing_to_quantize(tmp_path, capsys):
    """Calibration rows all zero: every tensor's range was 0, so the static INT8 variant left its nodes float. explain
    said only 'quantizes no node, so nothing to explain', as for a model with nothing to quantize; it names the
    calibration now."""
    import pandas as pd

    from qbench.cli.app import main

    path = write_fragile_project(tmp_path, [INT8], fragile=())
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["x"] = [np.zeros(WIDTH, np.float32) if split == "calib" else x for x, split in zip(table.x, table.split)]
    table.to_parquet(tmp_path / "data.parquet")
    assert main(["explain", str(path), "--variant", "int8", "--no-track"]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert error.startswith("error: explain: variant 'int8' quantizes no node, so nothing to explain: ")
    assert "node(s) had no usable calibration range (" in error and ": 0 on every calibration row" in error


def test_an_empty_exclude_nodes_name_is_answered_with_the_names_given_to_unnamed_nodes(tmp_path):
    """Converters leave nodes unnamed; qbench names them <op type>_<position> on load, but `exclude_nodes: ['']` was
    answered `no node named '' in the model`, false of a model holding two unnamed nodes, and silent on what to
    write."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="act"), helper.make_node("MatMul", ["r", "w"], ["m"]),
         helper.make_node("Identity", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[w],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    model = load_model(tmp_path / "m.onnx")
    with pytest.raises(QbenchError, match=r"exclude_nodes: got an empty name; expected a node's name: a node the model "
                                          r"leaves unnamed is named <op type>_<its position in the main graph, from 0> "
                                          r"\(here 'MatMul_1', 'Identity_2'\)$"):  # fmt: skip
        resolve_node_names(model, [""], "v")
    assert resolve_node_names(model, ["MatMul_1"], "v") == ["MatMul_1"]
