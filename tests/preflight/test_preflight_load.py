"""The FP32 reference must load on every backend the recipe names: a sweep refuses one that does not in one line
naming the file, model.path, the runtime's version and what it supports, before it builds anything."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import BACKENDS
from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.cli.app import main
from qbench.errors import QbenchError


def _model(*, ir: int = 8, opset: int = 17, custom_op: bool = False) -> onnx.ModelProto:
    """x [batch, 4] -> logits [batch, 3] = x @ w (then a custom-domain op when `custom_op`)."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h" if custom_op else "logits"])]
    opsets = [helper.make_opsetid("", opset)]
    if custom_op:
        nodes.append(helper.make_node("Frobnicate", ["h"], ["logits"], domain="com.example"))
        opsets.append(helper.make_opsetid("com.example", 1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                              [w])  # fmt: skip
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir
    return model


def _project(tmp_path: Path, model: onnx.ModelProto, backends: list[str] | None = None) -> Path:
    onnx.save(model, tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    table = pd.DataFrame({"x": list(rng.normal(size=(32, 4)).astype(np.float32)), "label": rng.integers(0, 3, 32)})
    table.to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "unloadable", "task": "classification", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label", "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "dyn", "precision": "int8", "calibrator": "dynamic"}],
              "executor": {"store": "store"}, "gate": {"metric": "accuracy"}}  # fmt: skip
    if backends is not None:
        recipe["backends"] = backends
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return tmp_path / "recipe.yaml"


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _weights_outside(path: Path) -> None:
    model = onnx.load(path)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)  # fmt: skip
    (path.parent / "weights.bin").unlink()


CASES = {
    "ir-too-new": (_model(ir=99), None, ["Unsupported model IR version: 99", "the model is IR version 99"]),
    "opset-too-new": (_model(opset=99), None, ["Opset 99", "with opsets ai.onnx 99",
                                                "the runtime implements opsets ai.onnx up to"]),
    "unknown-domain": (_model(custom_op=True), None, ["com.example:Frobnicate", "com.example not at all"]),
    "truncated": (_model(), _truncated, ["cannot read ONNX model"]),
    "external-data-missing": (_model(), _weights_outside, ["keeps its weights in 'weights.bin', not found"]),
}


def _nothing_built(folder: Path) -> None:
    """No run folder, and the build store holds at most the sweep's copies of its inputs (store/sources)."""
    assert not (folder / "reports").exists()
    store = folder / "store"
    assert not store.exists() or {p.name for p in store.iterdir()} <= {"sources", ".in-use"}


def _error_line(err: str) -> str:
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    return line


@pytest.mark.parametrize("command", ["sweep", "validate"])
@pytest.mark.parametrize("case", CASES)
def test_a_reference_the_runtime_cannot_load_is_refused_before_anything_is_built(tmp_path, capsys, case, command):
    model, damage, expected = CASES[case]
    recipe = _project(tmp_path, model)
    if damage is not None:
        damage(tmp_path / "model.onnx")
    argv = ["sweep", "--no-track", str(recipe)] if command == "sweep" else ["validate", str(recipe)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = _error_line(err)
    assert line.startswith(f"error: {recipe}: model.path: "), line
    assert str(tmp_path / "model.onnx") in line
    for fragment in expected:
        assert fragment in line, line
    if damage is None:  # onnx reads the file; the runtime refuses it: named with its version and the fix
        assert f"does not load on onnxruntime-cpu: onnxruntime {onnxruntime.__version__} cannot load it" in line
        assert line.endswith("or install a runtime that supports it"), line
        assert "onnxruntime_src" not in line and "::" not in line.replace("com.example:Frobnicate", ""), line
    assert "[ONNXRuntimeError]" not in err
    _nothing_built(tmp_path)


def _defined_twice(kind: str) -> onnx.ModelProto:
    """A graph naming one tensor twice, as torch.onnx's dynamo exporter (torch 2.13) wrote them: a module returning its
    input unchanged became `Identity(x) -> x` beside the graph input x; an output named `embedding` collided with
    the tensor of BERT's embedding lookup inside the graph."""
    model = _model()
    if kind == "returned-input":
        model.graph.node.append(helper.make_node("Identity", ["x"], ["x"]))
        model.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]))
    else:
        model.graph.node[0].output[0] = "h"
        model.graph.node.extend([helper.make_node("Relu", ["h"], ["logits"]),
                                 helper.make_node("Abs", ["h"], ["logits"])])  # fmt: skip
    return model


@pytest.mark.parametrize("kind", ["returned-input", "output-name-taken"])
def test_a_graph_defining_a_name_twice_is_named_as_invalid_not_as_a_version_problem(tmp_path, capsys, kind):
    """IR 8 and opset 17 are versions the runtime knows: the refusal used to end with 'export it at an IR version
    and opsets it supports', which re-exporting cannot fix. The onnx checker's reason and the fix are given."""
    recipe = _project(tmp_path, _defined_twice(kind))
    assert main(["validate", str(recipe)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {recipe}: model.path: {tmp_path / 'model.onnx'}: the FP32 reference does not load "
                           f"on onnxruntime-cpu: onnxruntime {onnxruntime.__version__} cannot load it: "), line
    assert "the model is IR version 8 with opsets ai.onnx 17; the runtime implements opsets ai.onnx up to" in line
    assert ("versions it knows, but the graph itself is not valid ONNX (onnx checker: Graph must be in single static "
            "assignment (SSA) form, however ") in line, line
    assert line.endswith("expected a valid graph: re-export the model or repair the graph: a name is defined twice, so "
                         "give every output a name no tensor inside the graph has, and return no input unchanged as an "
                         "output"), line
    assert "export it at an IR version" not in line
    _nothing_built(tmp_path)


@pytest.mark.parametrize("where", ["graph", "if-branch"])
def test_nodes_sharing_a_name_are_named_as_the_cause_not_a_version_problem(tmp_path, capsys, where):
    """Two MatMuls both named 'dense' (a converter naming each node after its layer): the onnx checker accepts the
    graph, ONNX Runtime refuses it, and the refusal ended with 'export it at an IR version and opsets it supports'.
    It names the shared name now, also inside a subgraph."""
    model = _model()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
             helper.make_node("Relu", ["h"], ["r"], name=""),
             helper.make_node("Abs", ["r"], ["a"], name=""),
             helper.make_node("MatMul", ["a", "w2"], ["logits"], name="dense")]
    model.graph.initializer.append(numpy_helper.from_array(np.eye(3, dtype=np.float32), "w2"))
    if where == "graph":
        model.graph.ClearField("node")
        model.graph.node.extend(nodes)
    else:
        model.graph.node[0].output[0] = "x_w"
        inside = [helper.make_node("MatMul", ["x_w", "w2"], ["p"], name="dense"),
                  helper.make_node("Relu", ["p"], ["r"]),
                  helper.make_node("MatMul", ["r", "w2"], ["logits"], name="dense")]  # fmt: skip
        branch = helper.make_graph(inside, "b", [], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
        other = helper.make_graph([helper.make_node("Identity", ["x_w"], ["logits"])], "o", [],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
        model.graph.initializer.append(numpy_helper.from_array(np.array(True), "c"))
        model.graph.node.append(helper.make_node("If", ["c"], ["logits"], then_branch=branch, else_branch=other))
    recipe = _project(tmp_path, model)
    assert main(["validate", str(recipe)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "cannot load it: " in line and "two nodes with same node name (dense)" in line, line
    assert line.endswith("versions it knows, but 2 nodes of one graph "
                         "share the name 'dense'; expected each node's name unique in its graph (or empty): re-export "
                         "the model or rename those nodes"), line
    _nothing_built(tmp_path)


class _RefusesEverything(OnnxRuntimeCPU):
    """A second backend whose runtime cannot load the reference that ONNX Runtime's CPU provider loads."""

    name = "onnxruntime-picky"

    def check_loads(self, path: Path) -> None:
        raise QbenchError("picky-runtime 0.1 cannot load it: no kernel for MatMul")


def test_a_reference_one_backend_cannot_load_is_refused_once_naming_that_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(BACKENDS._entries, _RefusesEverything.name, _RefusesEverything)
    recipe = _project(tmp_path, _model(), backends=["onnxruntime-cpu", _RefusesEverything.name])
    assert main(["sweep", "--no-track", str(recipe)]) == 2
    err = capsys.readouterr().err
    line = _error_line(err)
    assert line.startswith(f"error: {recipe}: model.path: {tmp_path / 'model.onnx'}: the FP32 reference does not "
                           "load on onnxruntime-picky (backends[1]): picky-runtime 0.1 cannot load it: no kernel for "
                           "MatMul; the model is IR version 8 with opsets ai.onnx 17; the runtime implements opsets "
                           "ai.onnx up to"), line  # fmt: skip
    assert err.count("no kernel for MatMul") == 1
    _nothing_built(tmp_path)


def test_a_long_refusal_is_printed_whole_on_one_line_by_the_qbench_command(tmp_path):
    """In a CI log (no terminal) the end of the line, the fix, must be there however long the paths make it."""
    import os
    import subprocess
    import sys

    deep = tmp_path.joinpath(*[f"folder-{i:02d}-with-a-rather-long-name" for i in range(10)])
    deep.mkdir(parents=True)
    recipe = _project(deep, _model(custom_op=True))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "validate", str(recipe)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2
    line = _error_line(done.stderr)
    assert len(line) > 1000  # far past where a line was cut before
    assert line.startswith(f"error: {recipe}: model.path: {deep / 'model.onnx'}: the FP32 reference does not load")
    assert line.endswith("or install a runtime that supports it") and "…" not in line, line


def _text_model(locale: str) -> onnx.ModelProto:
    """text string [batch, 1] -> lowercased through a StringNormalizer in `locale`, as skl2onnx's TfidfVectorizer
    writes it -> a score per row from a LabelEncoder."""
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in (("flat", [-1]), ("column", [-1, 1]))]
    nodes = [helper.make_node("Reshape", ["text", "flat"], ["words"]),
             helper.make_node("StringNormalizer", ["words"], ["lower"], case_change_action="LOWER", locale=locale),
             helper.make_node("LabelEncoder", ["lower"], ["found"], domain="ai.onnx.ml", keys_strings=["a", "b"],
                              values_floats=[0.2, 0.8], default_float=0.5),
             helper.make_node("Reshape", ["found", "column"], ["score"])]  # fmt: skip
    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 1])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return helper.make_model(helper.make_graph(nodes, "g", [text], [score], shapes), ir_version=8, opset_imports=opsets)


@pytest.mark.parametrize("command", ["sweep", "validate"])
def test_a_locale_the_machine_lacks_is_named_as_the_cause_not_a_version_problem(tmp_path, capfd, command):
    """skl2onnx's text pipelines lowercase in locale en_US.UTF-8, which slim containers lack. The preflight's refusal
    quoted ONNX Runtime's 'Failed to construct locale ... ::<lambda()>' and ended with 'export it at an IR version and
    opsets it supports', which re-exporting cannot fix, after ONNX Runtime's own two-line log of it on stderr. One
    line now names the locale and the two ways out."""
    onnx.save(_text_model("xx_NOWHERE.UTF-8"), tmp_path / "model.onnx")
    pd.DataFrame({"text": ["A", "b", "c", "B"] * 8, "label": [0, 1, 0, 1] * 8}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "text", "task": "classification", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"text": "text"}, "label": "label",
                       "calibration": {"samples": 16}},
              "variants": [{"name": "dyn", "precision": "int8", "calibrator": "dynamic"}],
              "executor": {"store": "store"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    argv = ["sweep", "--no-track"] if command == "sweep" else ["validate"]
    assert main([*argv, str(tmp_path / "recipe.yaml")]) == 2
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [_error_line(err)]
    assert _error_line(err) == (
        f"error: {tmp_path / 'recipe.yaml'}: model.path: {tmp_path / 'model.onnx'}: the FP32 reference does not load "
        f"on onnxruntime-cpu: onnxruntime {onnxruntime.__version__} cannot load it on this machine: a StringNormalizer "
        "node asks for the locale 'xx_NOWHERE.UTF-8', which this machine does not have; install it (e.g. `locale-gen "
        "xx_NOWHERE.UTF-8`) or give the node a locale attribute naming one that `locale -a` lists (C.UTF-8; a node "
        "without one, as skl2onnx writes it, asks for en_US.UTF-8)"
    )
    _nothing_built(tmp_path)
