"""Token ids past the embedding table they index: one line from `qbench validate`, before anything runs.

They were found by ONNX Runtime on the batch holding them: a row past the 8 that validate runs passed validate, then
failed FP32 and every variant of the sweep with "indices element out of data bounds" naming a Gather node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.preflight.lookups import Lookup, constant_lookups

VOCABULARY = 10


def _embedding_classifier() -> onnx.ModelProto:
    """ids int64 [N, 3] -> Cast to int32 -> Gather rows of a [10, 4] table -> mean over tokens -> logits [N, 2]."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.normal(size=(VOCABULARY, 4)).astype(np.float32), "table"),
                 numpy_helper.from_array(rng.normal(size=(4, 2)).astype(np.float32), "w")]  # fmt: skip
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["table", "ids32"], ["vectors"], name="embedding"),
        helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _project(root: Path, ids: np.ndarray, model: onnx.ModelProto | None = None) -> Path:
    onnx.save(model or _embedding_classifier(), str(root / "model.onnx"))
    rows = len(ids)
    split = np.where(np.arange(rows) < rows // 2, "calib", "eval")
    pd.DataFrame({"tokens": list(ids), "y": np.arange(rows) % 2, "split": split}).to_parquet(root / "rows.parquet")
    recipe = {
        "name": "lookups",
        "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"tokens": "ids"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "dynamic"}],
        "output_dir": "reports",
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _ids(rows: int = 40) -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCABULARY, size=(rows, 3))


def test_the_table_an_input_indexes_is_found_through_casts(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_embedding_classifier(), str(path))
    assert constant_lookups(path) == {"ids": Lookup("embedding", VOCABULARY)}


@pytest.mark.parametrize(("row", "what"), [(31, "evaluation"), (5, "calibration")])
def test_an_id_past_the_table_is_named_with_its_column_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: int, what: str
) -> None:
    ids = _ids()
    ids[row, 2] = VOCABULARY + 2  # evaluation row 31 is the 12th evaluation row: past the 8 that validate runs
    code = main(["validate", str(_project(tmp_path, ids))])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        f"recipe.yaml: data.inputs: column 'tokens' (model input 'ids'): 1 {what} row holds ids outside the table "
        f"node 'embedding' looks them up in (10 entries), e.g. row {row}: 12; expected ids from 0 to 9"
    )


@pytest.mark.parametrize("bag", [False, True])
def test_a_negative_id_is_refused_though_gather_would_read_it_from_the_tables_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bag: bool
) -> None:
    """ONNX's Gather reads -1 as the table's last row, so a sentinel -1 for an unknown user passed validate and every
    variant was judged on it as the last user's row; torch's nn.Embedding and nn.EmbeddingBag refuse it."""
    ids = _ids()
    ids[31, 1] = -1
    model = _embedding_bag_classifier(tmp_path) if bag else None
    assert main(["validate", str(_project(tmp_path, ids, model))]) == 2
    error = capsys.readouterr().err.strip()
    assert "data.inputs: column 'tokens' (model input 'ids'): 1 evaluation row holds ids outside the table " in error
    assert error.endswith(
        "(10 entries), e.g. row 31: -1; expected ids from 0 to 9 (ONNX's Gather would read a negative id from the "
        "table's end, -1 as row 9, where torch's nn.Embedding refuses it: give unknown ids a row of their own, or "
        "write the row meant)"
    )


def test_an_id_past_the_table_in_a_row_the_search_chooses_on_is_named_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Selection rows (here an evaluation row left out by data.evaluation.limit) are fed to FP32 and every candidate
    of a search: only the evaluation and the fitted calibration rows were checked, so validate passed and the sweep
    built and measured every other variant before the search failed on ONNX Runtime's 'indices element out of data
    bounds' (exit 2, the search's variant unusable)."""
    ids = _ids()
    ids[39, 0] = VOCABULARY + 3  # the last evaluation row: past the limit of 10, so a selection row
    recipe = _project(tmp_path, ids)
    spec = yaml.safe_load(recipe.read_text())
    spec["data"]["evaluation"]["limit"] = 10
    spec["variants"] = [{"name": "int8", "precision": "int8", "calibrator": "auto"}]
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["validate", str(recipe)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "recipe.yaml: data.inputs: column 'tokens' (model input 'ids'): 1 selection row holds ids outside the table "
        "node 'embedding' looks them up in (10 entries), e.g. row 39: 13; expected ids from 0 to 9"
    )


def test_ids_within_the_table_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(_project(tmp_path, _ids()))]) == 0, capsys.readouterr().err


def _control_flow_classifier(form: str) -> onnx.ModelProto:
    """ids int64 [N, 3] -> the embedding lookup inside control flow -> logits [N, 2]: a Scan over the 3 tokens whose
    body looks each token's row up (`scan`), a Loop carrying the ids into its body (`loop`), or an If whose branch
    reads `ids` by its outer name (`if`)."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.normal(size=(VOCABULARY, 4)).astype(np.float32), "table"),
                 numpy_helper.from_array(rng.normal(size=(4, 2)).astype(np.float32), "w")]  # fmt: skip
    value = helper.make_tensor_value_info
    if form == "scan":
        body = helper.make_graph(
            [helper.make_node("Gather", ["table", "token"], ["row"], name="embedding"),
             helper.make_node("Add", ["total_in", "row"], ["total_out"])], "step",
            [value("total_in", TensorProto.FLOAT, ["batch", 4]), value("token", TensorProto.INT64, ["batch"])],
            [value("total_out", TensorProto.FLOAT, ["batch", 4])])  # fmt: skip
        # a zero row per batch row: table[ids[:, 0]] * 0
        nodes = [helper.make_node("Gather", ["table", "first"], ["start"]),
                 helper.make_node("Mul", ["start", "zero"], ["total0"]),
                 helper.make_node("Scan", ["total0", "ids"], ["pooled"], body=body, num_scan_inputs=1,
                                  scan_input_axes=[1])]  # fmt: skip
        first = [helper.make_node("Gather", ["ids", "column0"], ["first"], axis=1)]
        constants += [numpy_helper.from_array(np.array(0, np.int64), "column0"),
                      numpy_helper.from_array(np.array(0.0, np.float32), "zero")]  # fmt: skip
        nodes = first + nodes
    else:
        inside = "ids_in" if form == "loop" else "ids"
        lookup = [helper.make_node("Gather", ["table", inside], ["vectors"], name="embedding"),
                  helper.make_node("ReduceMean", ["vectors"], ["mean"], axes=[1], keepdims=0)]  # fmt: skip
        if form == "loop":
            body = helper.make_graph([*lookup, helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                                      helper.make_node("Identity", ["ids_in"], ["ids_out"])], "body",
                                     [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                                      value("ids_in", TensorProto.INT64, ["batch", 3])],
                                     [value("cond_out", TensorProto.BOOL, []),
                                      value("ids_out", TensorProto.INT64, None),
                                      value("mean", TensorProto.FLOAT, None)])  # fmt: skip
            nodes = [helper.make_node("Loop", ["once", "", "ids"], ["ids_last", "means"], body=body),
                     helper.make_node("ReduceMean", ["means"], ["pooled"], axes=[0], keepdims=0)]  # fmt: skip
            constants.append(numpy_helper.from_array(np.array(1, np.int64), "once"))
        else:
            branch = helper.make_graph(lookup, "branch", [], [value("mean", TensorProto.FLOAT, None)])
            nodes = [helper.make_node("Constant", [], ["yes"], value=numpy_helper.from_array(np.array(True))),
                     helper.make_node("If", ["yes"], ["pooled"], then_branch=branch, else_branch=branch)]  # fmt: skip
    nodes.append(helper.make_node("MatMul", ["pooled", "w"], ["logits"]))
    graph = helper.make_graph(nodes, form, [value("ids", TensorProto.INT64, ["batch", 3])],
                              [value("logits", TensorProto.FLOAT, ["batch", 2])], constants)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("form", ["scan", "loop", "if"])
def test_a_table_looked_up_inside_control_flow_is_found(tmp_path: Path, form: str) -> None:
    """The walk read the main graph only: an id past the table looked up inside a Scan body passed `qbench validate`
    and failed FP32 and every variant of the sweep with ONNX Runtime's 'indices element out of data bounds'."""
    path = tmp_path / "m.onnx"
    onnx.save(_control_flow_classifier(form), str(path))
    assert constant_lookups(path) == {"ids": Lookup("embedding", VOCABULARY)}


def test_an_id_past_a_table_a_scan_body_looks_up_is_named_with_its_column_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _ids()
    ids[31, 2] = VOCABULARY + 2
    code = main(["validate", str(_project(tmp_path, ids, _control_flow_classifier("scan")))])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(
        "recipe.yaml: data.inputs: column 'tokens' (model input 'ids'): 1 evaluation row holds ids outside the table "
        "node 'embedding' looks them up in (10 entries), e.g. row 31: 12; expected ids from 0 to 9"
    )


def _fused_embedding_classifier() -> onnx.ModelProto:
    """What ONNX Runtime's transformer optimizer writes for a BERT's embeddings: ids int64 [N, 3] -> Cast to int32 ->
    com.microsoft EmbedLayerNormalization (word table [10, 4], positions [3, 4], segments [2, 4]) -> mean -> logits."""
    rng = np.random.default_rng(0)
    arrays = {"word": (VOCABULARY, 4), "position": (3, 4), "segment": (2, 4), "w": (4, 2)}
    constants = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
                 for name, shape in arrays.items()]
    constants += [numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
                  numpy_helper.from_array(np.zeros(4, np.float32), "beta")]  # fmt: skip
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["segments"], ["segments32"], to=TensorProto.INT32),
        helper.make_node("EmbedLayerNormalization",
                         ["ids32", "segments32", "word", "position", "segment", "gamma", "beta"],
                         ["vectors", "mask_index"], name="fused_embedding", domain="com.microsoft",
                         epsilon=1e-5),  # fmt: skip
        helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fused_embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3]),
         helper.make_tensor_value_info("segments", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        constants,
    )  # fmt: skip
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def test_the_tables_a_fused_embedding_layer_normalization_indexes_are_found(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_fused_embedding_classifier(), str(path))
    assert constant_lookups(path) == {"ids": Lookup("fused_embedding", VOCABULARY, negative=False),
                                      "segments": Lookup("fused_embedding", 2, negative=False)}  # fmt: skip


@pytest.mark.parametrize(("bad", "shown"), [(VOCABULARY + 2, 12), (-1, -1)])
def test_an_id_outside_a_fused_embedding_table_is_named_before_onnx_runtime_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: int, shown: int
) -> None:
    """EmbedLayerNormalization refuses negative ids too ("input index out of range"), unlike Gather."""
    onnx.save(_fused_embedding_classifier(), str(tmp_path / "model.onnx"))
    ids = _ids()
    ids[31, 2] = bad
    segments = np.zeros_like(ids)
    split = np.where(np.arange(len(ids)) < len(ids) // 2, "calib", "eval")
    pd.DataFrame({"tokens": list(ids), "types": list(segments), "y": np.arange(len(ids)) % 2, "split": split}).to_parquet(
        tmp_path / "rows.parquet"
    )
    recipe = {
        "name": "fused-lookups",
        "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"tokens": "ids", "types": "segments"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}}, "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "dynamic"}],
        "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "recipe.yaml: data.inputs: column 'tokens' (model input 'ids'): 1 evaluation row holds ids outside the table "
        f"node 'fused_embedding' looks them up in (10 entries), e.g. row 31: {shown}; expected ids from 0 to 9"
    )


def _embedding_bag_classifier(tmp_path: Path) -> onnx.ModelProto:
    """ids int64 [N, 3] -> torch's nn.EmbeddingBag over a [10, 4] table (mean of each row's bag) -> logits [N, 2], as
    torch's TorchScript exporter writes it: each bag's ids are a Slice of the ids inside a Loop, then a Gather."""
    import torch

    class Bag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = torch.nn.EmbeddingBag(VOCABULARY, 4, mode="mean")
            self.head = torch.nn.Linear(4, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.bag(ids))

    torch.manual_seed(0)
    path = tmp_path / "bag.onnx"
    torch.onnx.export(Bag().eval(), (torch.zeros(2, 3, dtype=torch.int64),), str(path), input_names=["ids"],
                      output_names=["logits"], dynamic_axes={"ids": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=17, dynamo=False)  # fmt: skip
    return onnx.load(str(path))


def test_a_table_an_embedding_bag_looks_up_through_a_slice_of_the_ids_is_found(tmp_path: Path) -> None:
    """The walk followed casts and reshapes only: torch's EmbeddingBag slices the ids before its Gather, so an item id
    past the table passed `qbench validate` and failed the FP32 run with ONNX Runtime's 'indices element out of data
    bounds' on a Loop node, or a torch model's export check with 'Index 0 of input takes value 12'."""
    path = tmp_path / "m.onnx"
    onnx.save(_embedding_bag_classifier(tmp_path), str(path))
    (lookup,) = constant_lookups(path).values()
    assert (lookup.size, lookup.partial) == (VOCABULARY, True)


def test_an_id_past_an_embedding_bag_table_is_named_with_its_column_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _ids()
    ids[31, 2] = VOCABULARY + 2
    code = main(["validate", str(_project(tmp_path, ids, _embedding_bag_classifier(tmp_path)))])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert "data.inputs: column 'tokens' (model input 'ids'): 1 evaluation row holds ids outside the " in error
    assert "(10 entries), e.g. row 31: 12; expected ids from 0 to 9" in error


def _two_tables_of_one_input() -> onnx.ModelProto:
    """ids int64 [N, 2] holding (user, item): column 0 looked up in a [30, 4] table, column 1 in a [10, 4] one, each
    through a Gather of the ids (`ids[:, 0]`), as a recommender taking both ids in one tensor is exported."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.normal(size=(30, 4)).astype(np.float32), "users"),
                 numpy_helper.from_array(rng.normal(size=(VOCABULARY, 4)).astype(np.float32), "items"),
                 numpy_helper.from_array(np.array(0, np.int64), "zero"),
                 numpy_helper.from_array(np.array(1, np.int64), "one"),
                 numpy_helper.from_array(rng.normal(size=(4, 2)).astype(np.float32), "w")]  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["ids", "zero"], ["user"], axis=1),
        helper.make_node("Gather", ["ids", "one"], ["item"], axis=1),
        helper.make_node("Gather", ["users", "user"], ["u"], name="user_table"),
        helper.make_node("Gather", ["items", "item"], ["i"], name="item_table"),
        helper.make_node("Mul", ["u", "i"], ["ui"]),
        helper.make_node("MatMul", ["ui", "w"], ["logits"]),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    graph = helper.make_graph(nodes, "two_tables", [ids], [logits], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_ids_that_reach_tables_through_selections_of_them_are_checked_against_the_largest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each table sees only its column of the ids: a user id of 25 is within the users' table though past the items',
    so it passes; an id past both tables is refused."""
    path = tmp_path / "m.onnx"
    onnx.save(_two_tables_of_one_input(), str(path))
    assert constant_lookups(path) == {"ids": Lookup("user_table", 30, partial=True)}
    ids = np.random.default_rng(1).integers(0, VOCABULARY, size=(40, 2))
    ids[:, 0] = 25
    assert main(["validate", str(_project(tmp_path, ids, _two_tables_of_one_input()))]) == 0, capsys.readouterr().err
    ids[31, 0] = 31
    assert main(["validate", str(_project(tmp_path, ids, _two_tables_of_one_input()))]) == 2
    assert "(30 entries), e.g. row 31: 31; expected ids from 0 to 29" in capsys.readouterr().err


EMBEDDING_FACTORY = """
from torch import nn

class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.table(ids).mean(dim=1))

def build():
    return Bag()
"""


def test_an_id_past_the_table_in_a_qat_training_row_is_named_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """QAT fine-tunes on its `qat.train` rows, which the check did not read: an id past the embedding there passed
    validate and failed that variant's training in torch ('index out of range in self') after FP32 was measured."""
    pytest.importorskip("torch")
    (tmp_path / "bag_factory.py").write_text(EMBEDDING_FACTORY)
    ids = np.random.default_rng(1).integers(0, VOCABULARY, size=(60, 3))
    ids[7, 1] = VOCABULARY  # a training row
    split = ["train"] * 20 + ["calib"] * 20 + ["eval"] * 20
    pd.DataFrame({"tokens": list(ids), "y": np.arange(60) % 2, "split": split}).to_parquet(tmp_path / "rows.parquet")
    recipe = {
        "name": "qat-lookups",
        "model": {"torch": "bag_factory:build", "example_inputs": {"ids": [1, 3]}, "input_dtypes": {"ids": "int64"},
                  "output_names": ["logits"]},
        "data": {"path": "rows.parquet", "inputs": {"tokens": "ids"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}}, "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8-qat", "precision": "int8", "calibrator": "minmax",
                      "qat": {"train": {"filter": {"split": "train"}}}}],
        "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "recipe.yaml: data.inputs: column 'tokens' (model input 'ids'): 1 int8-qat training row holds ids outside the "
        "table node '/table/Gather' looks them up in (10 entries), e.g. row 7: 10; expected ids from 0 to 9"
    )


def _category_classifier(zeros: int) -> onnx.ModelProto:
    """code string [N, 1] -> OneHotEncoder over a, b, c (zeros = 0: skl2onnx's handle_unknown='error') -> logits."""
    weights = numpy_helper.from_array(np.array([[1, -1], [-1, 1], [0.5, 0.5]], dtype=np.float32), "w")
    nodes = [
        helper.make_node("OneHotEncoder", ["code"], ["hot"], name="encode", domain="ai.onnx.ml",
                         cats_strings=["a", "b", "c"], zeros=zeros),
        helper.make_node("Flatten", ["hot"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "categories", [helper.make_tensor_value_info("code", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])], [weights],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _category_project(root: Path, codes: list[str], zeros: int) -> Path:
    onnx.save(_category_classifier(zeros), str(root / "model.onnx"))
    split = np.where(np.arange(len(codes)) < len(codes) // 2, "calib", "eval")
    pd.DataFrame({"code": codes, "y": np.arange(len(codes)) % 2, "split": split}).to_parquet(root / "rows.parquet")
    recipe = {
        "name": "categories", "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"code": "code"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "dynamic"}], "output_dir": "reports",
    }  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "recipe.yaml"


@pytest.mark.parametrize(("row", "what"), [(31, "evaluation"), (5, "calibration")])
def test_a_category_an_encoder_refuses_is_named_with_its_column_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: int, what: str
) -> None:
    """ONNX Runtime fails the batch holding it (`Unknown Category and zeros = 0`); validate blamed the model ('the
    FP32 reference does not run on onnxruntime-cpu') where the row was among its first, the sweep's batch otherwise."""
    codes = ["abc"[i % 3] for i in range(40)]
    codes[row] = "latam"
    assert main(["validate", str(_category_project(tmp_path, codes, zeros=0))]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"recipe.yaml: data.inputs: column 'code' (model input 'code'): 1 {what} row holds categories the "
        f"OneHotEncoder 'encode' does not know, e.g. row {row}: 'latam'; expected one of its 3 categories (a, b, c): "
        "converted with zeros = 0 (scikit-learn's handle_unknown='error'), the graph fails on any other; leave those "
        "rows out with a filter, or convert the encoder with handle_unknown='ignore' (an all-zero encoding)"
    )


def test_an_encoder_that_encodes_unknown_categories_as_zeros_checks_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes = ["abc"[i % 3] for i in range(40)]
    codes[31] = "latam"
    path = _category_project(tmp_path, codes, zeros=1)
    assert constant_lookups(tmp_path / "model.onnx") == {}
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err




def _column_transformer(one_input: bool) -> onnx.ModelProto:
    """skl2onnx's conversion of a ColumnTransformer of two OneHotEncoders (handle_unknown='error') over string columns
    c0 and c1, as model inputs 'c0' and 'c1' (one per DataFrame column), or one input 'codes' [N, 2] holding both: each
    encoder reads its column through a constant-index selection (a Gather; before it an ArrayFeatureExtractor where
    one input holds both), never the input itself."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    train = pd.DataFrame({"c0": ["a", "b", "a", "b"] * 5, "c1": ["x", "y", "y", "x"] * 5})
    first, second = ([0], [1]) if one_input else (["c0"], ["c1"])
    encoders = ColumnTransformer([("first", OneHotEncoder(handle_unknown="error"), first),
                                  ("second", OneHotEncoder(handle_unknown="error"), second)])  # fmt: skip
    classifier = LogisticRegression()
    pipeline = make_pipeline(encoders, classifier).fit(train.to_numpy() if one_input else train, np.arange(20) % 2)
    types = ([("codes", StringTensorType([None, 2]))] if one_input
             else [("c0", StringTensorType([None, 1])), ("c1", StringTensorType([None, 1]))])  # fmt: skip
    return to_onnx(pipeline, initial_types=types, options={id(classifier): {"zipmap": False}},
                   target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip


def test_each_encoder_behind_skl2onnx_column_selection_is_checked_on_its_own_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown category in one column, past validate's first 8 rows, failed the sweep's batch in ONNX Runtime
    (`Unknown Category and zeros = 0`) after `qbench validate` passed: the check followed no column selection, so it
    found no encoder in a model skl2onnx converts. 'a' is known to the first column's encoder, not to the second's."""
    onnx.save(_column_transformer(one_input=False), str(tmp_path / "model.onnx"))
    rows = pd.DataFrame({"c0": ["a", "b"] * 20, "c1": ["x", "x", "y", "y"] * 10, "y": np.arange(40) % 2,
                         "split": ["calib"] * 20 + ["eval"] * 20})  # fmt: skip
    rows.loc[31, "c1"] = "a"
    rows.to_parquet(tmp_path / "rows.parquet")
    recipe = {
        "name": "columns", "model": {"path": "model.onnx", "output": "probabilities"},
        "data": {"path": "rows.parquet", "inputs": {"c0": "c0", "c1": "c1"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "dynamic"}], "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "recipe.yaml: data.inputs: column 'c1' (model input 'c1'): 1 evaluation row holds categories the "
        "OneHotEncoder 'OneHotEncoder1' does not know, e.g. row 31: 'a'; expected one of its 2 categories (x, y): "
        "converted with zeros = 0 (scikit-learn's handle_unknown='error'), the graph fails on any other; leave those "
        "rows out with a filter, or convert the encoder with handle_unknown='ignore' (an all-zero encoding)"
    )


def test_encoders_of_one_input_read_the_columns_its_selections_pick(tmp_path: Path) -> None:
    """One string input [N, 2] of both columns: each encoder is found with the column it reads (an
    ArrayFeatureExtractor picking along the last axis, then a Gather along axis 1), and reads that column alone."""
    onnx.save(_column_transformer(one_input=True), str(tmp_path / "model.onnx"))
    (lookup,) = constant_lookups(tmp_path / "model.onnx").values()
    first, second = lookup.encoders
    assert (first.categories, second.categories) == (("a", "b"), ("x", "y"))
    feed = np.array([["a", "x"], ["b", "y"], ["b", "x"]], dtype=object)
    assert first.read(feed).ravel().tolist() == ["a", "b", "b"]
    assert second.read(feed).ravel().tolist() == ["x", "y", "x"]
