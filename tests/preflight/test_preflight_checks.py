"""Checks run by validate and at the start of a sweep: plan, destinations, batch memory (hand-computed bytes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.errors import RecipeError
from qbench.modelinfo.signature import ModelInfo, TensorMeta
from qbench.preflight.checks import (
    check_batch_memory,
    check_destinations,
    check_node_names,
    check_plan,
    fixed_batch,
    unread_inputs,
    warn_unread_inputs,
    with_fixed_batch,
)
from qbench.recipe.spec import load_recipe


def _recipe(tmp_path: Path, **changes: object):
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    body = {
        "name": "toy",
        "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "input"}},
        "variants": [{"name": "half", "precision": "fp16"}],
        "latency": {"batch_sizes": [1, 32]},
        **changes,
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(body))
    return load_recipe(tmp_path / "recipe.yaml")


def test_batch_memory_compares_bytes_per_row_times_batch_with_what_is_available(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, latency={"batch_sizes": [1, 32]})
    feeds = {"input": np.zeros((10, 4, 4), np.float32), "mask": np.zeros((10, 16), np.int64)}  # 64 + 128 bytes/row
    largest = 192 * 64  # the default evaluation batch size (64) is the largest batch here
    check_batch_memory(recipe, feeds, available=largest)
    with pytest.raises(RecipeError) as caught:
        check_batch_memory(recipe, feeds, available=largest - 1)
    assert "data.evaluation.batch_size: a batch of 64 rows needs" in str(caught.value)
    assert "(192 bytes per row)" in str(caught.value)


def test_destinations_accept_a_folder_still_to_be_made_and_resolve_against_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _recipe(tmp_path, output_dir="out/deeper", tracking={"uri": "sqlite:///mlflow.db"})
    monkeypatch.chdir(tmp_path.parent)
    assert recipe.output_path == (tmp_path / "out" / "deeper").resolve()
    assert recipe.tracking_uri == f"sqlite:///{(tmp_path / 'mlflow.db').resolve().as_posix()}"
    check_destinations(recipe, track=True)
    assert not (tmp_path / "out").exists()  # validate creates nothing


def test_an_unwritable_store_is_ignored_without_tracking(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    recipe = _recipe(tmp_path, tracking={"uri": "sqlite:///db"})
    check_destinations(recipe, track=False)
    with pytest.raises(RecipeError, match=r"tracking\.uri: the sqlite database .*db is a folder"):
        check_destinations(recipe, track=True)


def test_the_default_tracking_store_is_checked_as_one_the_recipe_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe without tracking.uri logs to $MLFLOW_TRACKING_URI, else ./mlflow.db: a CI job whose working directory
    is read-only ran its sweep until MLflow failed on that store after the first build. Now it is refused at the
    start, the line naming the store and how to choose another."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    recipe = _recipe(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    check_destinations(recipe, track=False)
    with pytest.raises(RecipeError) as refused:
        check_destinations(recipe, track=True)
    assert str(refused.value) == (
        f"{tmp_path / 'recipe.yaml'}: tracking.uri: {blocker} is a file; expected a writable folder (tracking.uri is "
        f"not set, so runs go to sqlite:///{blocker}/mlflow.db: set tracking.uri or $MLFLOW_TRACKING_URI, or run "
        "with --no-track)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(blocker.parent)
    check_destinations(recipe, track=True)  # ./mlflow.db in a writable working directory


def test_one_glob_matching_no_variant_is_a_recipe_error_naming_it(tmp_path: Path) -> None:
    """A typo in one glob would leave the variant it meant unjudged while the gate passes."""
    variants = [{"name": "half", "precision": "fp16"},
                {"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"}]  # fmt: skip
    check_plan(_recipe(tmp_path, variants=variants, gate={"applies_to": ["half", "int8-*"]}))
    with pytest.raises(RecipeError) as caught:
        check_plan(_recipe(tmp_path, variants=variants, gate={"applies_to": ["half", "int8-minmx"]}))
    assert str(caught.value) == (
        f"{tmp_path / 'recipe.yaml'}: gate.applies_to[1]: 'int8-minmx' matches no variant; expected a glob over the "
        "variants half, int8-minmax (did you mean 'int8-minmax'?)"
    )
    with pytest.raises(RecipeError, match=r"slo\.applies_to\[0\]: 'int8' matches no variant"):
        check_plan(_recipe(tmp_path, variants=variants, slo={"p99_ms": 5.0, "batch_size": 1, "applies_to": ["int8"]}))
    with pytest.raises(RecipeError, match=r"gate\.applies_to: got \[\], expected at least one glob"):
        check_plan(_recipe(tmp_path, variants=variants, gate={"applies_to": []}))


def test_a_search_variant_the_gate_does_not_judge_is_warned_about(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    recipe = _recipe(tmp_path, gate={"applies_to": ["half"]}, search={"name": "int8-auto"})
    check_plan(recipe)
    assert [r.getMessage() for r in caplog.records] == [
        "gate.applies_to: ['half'] does not match the search's variant 'int8-auto': the search meets the gate's "
        "tolerances but `qbench gate` will not judge its pick"
    ]
    caplog.clear()
    check_plan(_recipe(tmp_path, gate={"applies_to": ["half", "int8-*"]}, search={"name": "int8-auto"}))
    assert caplog.records == []


def _model(**shapes: tuple[int | None, ...]) -> ModelInfo:
    return ModelInfo({name: TensorMeta(name, np.dtype(np.float32), shape) for name, shape in shapes.items()}, {}, 17)


def test_a_fixed_batch_model_refuses_the_batch_sizes_a_recipe_sets_otherwise(tmp_path: Path) -> None:
    """An export without a dynamic batch axis: every batch-size field the recipe sets to another size is named in
    one line with the recipe file and the model's batch; a field set to that batch, or left out, is fine."""
    assert fixed_batch(_recipe(tmp_path), _model(input=(None, 4), mask=(None, 16))) is None
    assert fixed_batch(_recipe(tmp_path), _model(input=(8,))) is None  # rank 1: a batch of scalars or one row
    with pytest.raises(RecipeError) as caught:
        fixed_batch(_recipe(tmp_path,
                            data={"path": "rows.parquet", "inputs": {"x": "input"}, "evaluation": {"batch_size": 64}}),
                    _model(input=(8, 4)))  # fmt: skip
    assert str(caught.value) == (
        f"{tmp_path / 'recipe.yaml'}: latency.batch_sizes: model input 'input' has a fixed batch dimension of 8 "
        "(shape [8, 4]), so it runs batches of 8 only; expected latency.batch_sizes: [8] (now [1, 32]), "
        "data.evaluation.batch_size: 8 (now 64), or leave them out to take the model's batch, or a model exported "
        "with a dynamic batch axis"
    )
    assert fixed_batch(_recipe(tmp_path, latency={"batch_sizes": [8]}), _model(input=(8, 4))) == 8
    assert fixed_batch(_recipe(tmp_path, latency={"iterations": 5}), _model(input=(8, 4))) == 8
    with pytest.raises(RecipeError, match="fix different batch sizes"):
        fixed_batch(_recipe(tmp_path, latency={"batch_sizes": [1]}), _model(input=(1, 4), mask=(2, 16)))


def test_a_static_axis_0_beside_a_dynamic_axis_names_that_axis_in_the_batch_error(tmp_path: Path) -> None:
    """A features-first export (`x: [64, 'N']`) looks like a fixed batch of 64: the error must not leave the
    advice to run batches of 64 alone (rows would be fed along the features), but name the dynamic axis."""
    with pytest.raises(RecipeError) as caught:
        fixed_batch(_recipe(tmp_path), _model(input=(64, None)))
    assert str(caught.value).endswith(
        "or a model exported with a dynamic batch axis; axis 1 of 'input' is dynamic and looks like the batch: "
        "if it is, export the model batch-first (qbench feeds data rows along axis 0)"
    )


def _named(**shapes: tuple[int | str | None, ...]) -> ModelInfo:
    """A model whose inputs name their dynamic dims: a str is a dim_param (a dynamic dim of that name)."""
    metas = {name: TensorMeta(name, np.dtype(np.float32), tuple(None if isinstance(d, str) else d for d in shape),
                              dim_names=tuple(d if isinstance(d, str) else None for d in shape))
             for name, shape in shapes.items()}  # fmt: skip
    return ModelInfo(metas, {}, 17)


def test_inputs_that_disagree_on_axis_0_share_no_batch_and_are_refused(tmp_path: Path) -> None:
    """A PyG-style GNN (x ['num_nodes', F], edge_index [2, 'num_edges']) was read as a fixed batch of 2 and the
    error advised `latency.batch_sizes: [2]` and a batch-first export of the edges: one sample (a graph) is not a
    row of axis 0. Inputs fixing axis 0 beside inputs leaving it dynamic are refused in one line saying so; a
    dynamic dim named like the batch on a later axis (a sequence-first LSTM's h0) is named as the likely batch."""
    gnn = _named(x=("num_nodes", 6), edge_index=(2, "num_edges"))
    with pytest.raises(RecipeError) as caught:
        fixed_batch(_recipe(tmp_path), gnn)
    assert str(caught.value).startswith(
        f"{tmp_path / 'recipe.yaml'}: model.path: the model's inputs share no batch axis: x ['num_nodes', 6] leaves "
        "axis 0 dynamic, edge_index [2, 'num_edges'] fixes it; qbench feeds one sample per data row along axis 0 of "
        "every input, so a model whose one call is one sample along other axes"
    )
    assert str(caught.value).endswith("each row's graph padded to one size")  # no advice to feed edges as rows
    with pytest.raises(RecipeError) as caught:  # the recipe's batch sizes are not what is wrong
        fixed_batch(_recipe(tmp_path, latency={"batch_sizes": [2]}), gnn)
    assert "share no batch axis" in str(caught.value)
    lstm = _named(x=("seq", "batch", 4), h0=(2, "batch", 8))
    with pytest.raises(RecipeError) as caught:
        fixed_batch(_recipe(tmp_path), lstm)
    assert str(caught.value).endswith(
        "; axis 1 ('batch') of 'x' is named like the batch: if it is, export the model batch-first"
    )
    # one batch every input shares, fixed or dynamic, and rank-1 inputs beside it, are not refused
    assert fixed_batch(_recipe(tmp_path, latency={"batch_sizes": [8]}), _named(x=(8, 4), mask=(8, "n"))) == 8
    assert fixed_batch(_recipe(tmp_path), _named(x=("batch", "n", 8), mask=("batch", "n"), lengths=(1,))) is None
    # a tensor every axis of which is fixed beside a dynamic batch is one per call (data.inputs refuses it so), no GNN
    assert fixed_batch(_recipe(tmp_path), _named(x=("batch", 6), proj=(6, 3))) is None


def test_an_initial_state_of_one_layer_beside_a_dynamic_batch_is_a_fixed_batch_of_1(tmp_path: Path) -> None:
    """A batch-first GRU with its initial state as an input: x ['batch', 5, 3], h0 [1, 'batch', 8] (torch lays h0
    out layers-first even batch-first, so the advice to export batch-first cannot be followed). Refused as sharing
    no batch axis; a batch of one row feeds both inputs one row (x [1, 5, 3], h0 [1, 1, 8]): a fixed batch of 1, as
    every fixed axis 0 of 1 is. Two layers (h0 [2, 'batch', 8]) share no batch and stay refused."""
    gru = _named(x=("batch", 5, 3), h0=(1, "batch", 8))
    one = _recipe(tmp_path, latency={"batch_sizes": [1]})
    assert fixed_batch(one, gru) == 1
    assert fixed_batch(one, _named(x=("batch", 4), table=(1, 16), lengths=(1,))) == 1
    with pytest.raises(RecipeError, match="share no batch axis: x \\['batch', 5, 3\\] leaves axis 0 dynamic, h0 \\[2,"):
        fixed_batch(_recipe(tmp_path), _named(x=("batch", 5, 3), h0=(2, "batch", 8)))


def test_a_fixed_batch_is_every_batch_size_a_recipe_leaves_out(tmp_path: Path) -> None:
    written = _recipe(tmp_path, latency={"iterations": 5})
    recipe = with_fixed_batch(written, 8)
    assert (recipe.latency.batch_sizes, recipe.latency.iterations) == ([8], 5)
    # results record the recipe as written: the gate parses that record again to tell stale results
    assert recipe.model_dump(mode="json", exclude_unset=True) == written.model_dump(mode="json", exclude_unset=True)
    assert (recipe.data.evaluation.batch_size, recipe.data.calibration.batch_size) == (8, 8)
    assert recipe.source == tmp_path / "recipe.yaml"
    budget = _recipe(tmp_path, latency={"iterations": 100}, slo={"p99_ms": 5, "batch_size": 1})
    with pytest.raises(RecipeError) as caught:
        with_fixed_batch(budget, 8)
    assert str(caught.value) == (f"{tmp_path / 'recipe.yaml'}: slo.batch_size: got 1, expected one of the latency "
                                 "batch sizes 8: the model's fixed batch, the only one timed")  # fmt: skip
    searched = _recipe(tmp_path, latency={"batch_sizes": [1, 16]}, search={"batch_sizes": [16]})
    with pytest.raises(RecipeError) as caught:
        with_fixed_batch(searched, 1)
    assert str(caught.value) == (f"{tmp_path / 'recipe.yaml'}: search.batch_sizes: got 16, expected one of the "
                                 "latency batch sizes 1: the model's fixed batch, the only one timed")  # fmt: skip


@pytest.mark.parametrize("store", ["blocked/builds", "blocked"])
def test_a_build_store_that_cannot_be_a_writable_folder_is_a_preflight_error(tmp_path: Path, store: str) -> None:
    recipe = _recipe(tmp_path, executor={"store": store})
    check_destinations(recipe, track=False)  # a folder still to be made is fine
    (tmp_path / "blocked").write_text("a file")
    with pytest.raises(RecipeError) as caught:
        check_destinations(recipe, track=False)
    assert f"executor.store: {tmp_path / 'blocked'}" in str(caught.value)
    assert str(caught.value).endswith("expected a writable folder for built variants")


def test_the_default_build_store_is_checked_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").write_text("a file where qbench's cache should be")
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RecipeError,
                       match=r"executor\.store: .*cache \(in the path of "
                             r".*builds\) is a file; expected a writable folder for "
                       r"built variants \(the default, in qbench's cache: set executor\.store or \$QBENCH_CACHE_DIR\)"):
        check_destinations(_recipe(tmp_path), track=False)
    check_destinations(_recipe(tmp_path, executor={"store": "s3://bucket/builds"}), track=False)  # checked when used


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions do not bind root")
def test_a_read_only_build_store_is_a_preflight_error(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store").chmod(0o555)
    try:
        with pytest.raises(RecipeError, match=r"executor\.store: folder .*store is not writable; expected a writable"):
            check_destinations(_recipe(tmp_path, executor={"store": "store"}), track=False)
    finally:
        (tmp_path / "store").chmod(0o755)


def test_exclude_nodes_are_checked_against_the_model_naming_the_entry(tmp_path: Path) -> None:
    """`validate` names the recipe entry of an exclusion that no build can honour: a node inside an If's branch
    (float in every ONNX build whatever the recipe says) or a node that does not exist."""
    from onnx import TensorProto, helper, save

    branch = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="branch_mm")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="if")]  # fmt: skip
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
          helper.make_tensor_value_info("c", TensorProto.BOOL, []),
          helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 2]),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])]  # fmt: skip
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    int8 = {"name": "q", "precision": "int8", "calibrator": "dynamic"}

    def recipe_excluding(excluded: list[str]):
        recipe = _recipe(tmp_path,
                         variants=[{"name": "half", "precision": "fp16"}, {**int8, "exclude_nodes": excluded}])
        save(helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:], [weight])), str(recipe.model_path))
        return recipe

    for excluded, problem in ((["mm", "branch_mm"], "'branch_mm' is inside the subgraph of If node 'if'"),
                              (["mm", "nosuch"], "no node named 'nosuch' in the model")):  # fmt: skip
        recipe = recipe_excluding(excluded)
        with pytest.raises(RecipeError) as caught:
            check_node_names(recipe, recipe.model_path)
        assert str(caught.value).startswith(f"{recipe.source}: variants[1].exclude_nodes[1]: {problem}")
    recipe = recipe_excluding(["mm", "if"])
    check_node_names(recipe, recipe.model_path)


def test_an_input_no_evaluated_output_reads_is_warned_about_with_its_column(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A slice column fed as a model input the graph never reads (`gid`), and one read only on the way to an output
    that is not evaluated (`aux_in`), were fed without a word: their cells change no figure. An input read inside an
    If's branch by name (`bias`, an outer-scope read) is read; so is one the evaluated output reads (`x`)."""
    from onnx import TensorProto, helper, save

    def value(name: str, shape: list) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    branch = helper.make_graph([helper.make_node("Add", ["h", "bias"], ["t"])], "then", [], [value("t", None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
             helper.make_node("Neg", ["aux_in"], ["aux"])]  # fmt: skip
    inputs = [value("x", ["n", 2]), value("gid", ["n"]), value("bias", ["n", 2]), value("aux_in", ["n"])]
    outputs = [value("y", ["n", 2]), value("aux", ["n"])]
    constants = [helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0]),
                 helper.make_tensor("c", TensorProto.BOOL, [], [True])]  # fmt: skip
    recipe = _recipe(tmp_path, data={"path": "rows.parquet", "inputs": {
        "x": "x", "group_id": "gid", "b": "bias", "a": "aux_in"}})  # fmt: skip
    save(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, constants)), str(recipe.model_path))
    with caplog.at_level("WARNING", logger="qbench"):
        warn_unread_inputs(recipe, recipe.model_path, ["y"])
    end = "no node the evaluated output(s) 'y' are computed from reads it"
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        f"model input 'gid' (fed from data column 'group_id'): {end}",
        f"model input 'aux_in' (fed from data column 'a'): {end}",
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="qbench"):
        warn_unread_inputs(recipe, recipe.model_path, ["y", "aux"])
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["model input 'gid'"]
    assert unread_inputs(recipe.model_path) == {"gid": False}  # every graph output reads the others



def test_an_input_whose_shape_alone_the_outputs_read_is_warned_about(tmp_path: Path, caplog) -> None:
    """An attention mask an export dropped but for its length (Shape -> Gather -> a Reshape of x): y's values are the
    same whatever the mask holds (checked with onnxruntime), so padding changes figures it should not; it was fed
    without a word, as Shape counted as reading it. An input whose values the output reads (x) is not named."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper, save

    nodes = [helper.make_node("Shape", ["mask"], ["mask_shape"]),
             helper.make_node("Concat", ["mask_shape", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 1])],
        [numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one")])  # fmt: skip
    recipe = _recipe(tmp_path, data={"path": "rows.parquet", "inputs": {"x": "x", "attention_mask": "mask"}})
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(recipe.model_path))
    session = ort.InferenceSession(str(recipe.model_path), providers=["CPUExecutionProvider"])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ones, zeros = np.ones((2, 4), np.int64), np.zeros((2, 4), np.int64)
    assert np.array_equal(session.run(None, {"x": x, "mask": ones})[0], session.run(None, {"x": x, "mask": zeros})[0])
    with caplog.at_level("WARNING", logger="qbench"):
        warn_unread_inputs(recipe, recipe.model_path, ["y"])
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "model input 'mask' (fed from data column 'attention_mask'): the evaluated output(s) 'y' are computed from its "
        "shape alone (Shape/Size), never its values"]
    assert unread_inputs(recipe.model_path) == {"mask": True}  # its shape tells rows of other lengths apart


def test_an_id_whose_shape_alone_the_outputs_read_tells_no_inputs_apart(tmp_path: Path) -> None:
    """600 rows of 100 feature rows, each with its own id fed to an input the graph reads only the batch size of
    (Shape -> Reshape of x): the ids were digested as they are, 600 inputs, and the gate judged agreement on evidence
    six times what it held. A shape read tells a cell only by its shape: 100 inputs; cells of other lengths stay
    apart."""
    import pandas as pd
    from onnx import TensorProto, helper, numpy_helper, save

    from qbench.data.content import content_table
    from qbench.gate.checks import evaluation_from_data

    nodes = [helper.make_node("Shape", ["row_id"], ["rows"]),
             helper.make_node("Concat", ["rows", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2]),
         helper.make_tensor_value_info("row_id", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one")])  # fmt: skip
    recipe = _recipe(tmp_path, data={"path": "rows.parquet", "inputs": {"x": "x", "id": "row_id"}, "label": "y"})
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(recipe.model_path))
    features = np.tile(np.arange(200, dtype=np.float32).reshape(100, 2), (6, 1))
    pd.DataFrame({"x": list(features), "id": np.arange(600), "y": np.arange(600) % 2}).to_parquet(recipe.data_path)
    assert evaluation_from_data(recipe).distinct_inputs == {"overall": 100}  # as the gate re-derives them
    lengths = pd.DataFrame({"x": [[1.0], [1.0], [1.0]], "id": [[1, 2], [3, 4], [5, 6, 7]], "y": [0, 0, 0]})
    shown = content_table(lengths, recipe.data, recipe_file=recipe.source, unread=unread_inputs(recipe.model_path))
    assert shown["id"].tolist() == ["(2,)", "(2,)", "(3,)"]


def _gnn(path: Path) -> None:
    """A PyG-style graph classifier for one graph a call: node features x ['num_nodes', 3], edge_index
    [2, 'num_edges']; each edge carries its source node's projected features, averaged over the edges: [1, 2]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Gather", ["edge_index", "zero"], ["src"], axis=0),
         helper.make_node("Gather", ["h", "src"], ["messages"], axis=0),
         helper.make_node("ReduceMean", ["messages", "axes"], ["out"], keepdims=1)],
        "gnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["num_nodes", 3]),
         helper.make_tensor_value_info("edge_index", TensorProto.INT64, [2, "num_edges"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 6, "w"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "axes")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


@pytest.mark.parametrize("batch_sizes", [[1, 8], [2]])
def test_validate_refuses_a_gnn_fed_a_graph_per_row_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], batch_sizes: list[int]
) -> None:
    """One graph per row (x cells [4, 3], edge_index cells [2, 5]): the sweep stops before anything runs, on the
    model's axes, with the recipe's batch sizes as the old error advised ([2]) or not."""
    from qbench.cli import main

    _gnn(tmp_path / "model.onnx")
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": [rng.normal(size=(4, 3)).tolist() for _ in range(40)],
                  "edge_index": [rng.integers(0, 4, (2, 5)).tolist() for _ in range(40)],
                  "label": rng.integers(0, 2, 40)}).to_parquet(tmp_path / "rows.parquet")  # fmt: skip
    recipe = {"name": "gnn", "model": {"path": "model.onnx"}, "latency": {"batch_sizes": batch_sizes},
              "data": {"path": "rows.parquet", "inputs": {"x": "x", "edge_index": "edge_index"}, "label": "label",
                       "calibration": {"samples": 16}},
              "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", "--no-track", str(tmp_path / "recipe.yaml")]) == 2
    [line] = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.path: the model's inputs share no batch axis: "
                           "x ['num_nodes', 3] leaves axis 0 dynamic, "
                           "edge_index [2, 'num_edges'] fixes it; ")  # fmt: skip
