"""Recipe schema: defaults, resolution, and the one-line errors users see (golden messages)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qbench.errors import RecipeError
from qbench.recipe.spec import load_recipe

BASE = {
    "name": "toy",
    "model": {"path": "model.onnx"},
    "data": {"path": "rows.parquet", "inputs": {"x": "input"}, "label": "y"},
}


def write_recipe(tmp_path: Path, body: dict | str) -> Path:
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    path = tmp_path / "recipe.yaml"
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return path


def with_changes(**sections) -> dict:
    recipe = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    recipe.update(sections)
    return recipe


def error_of(tmp_path: Path, body: dict | str) -> str:
    path = write_recipe(tmp_path, body)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    return str(caught.value).replace(str(path), "recipe.yaml")


def test_defaults_and_paths_resolve_relative_to_the_recipe(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, BASE))
    assert recipe.model_path == (tmp_path / "model.onnx").resolve()
    assert recipe.data_path == (tmp_path / "rows.parquet").resolve()
    assert recipe.backends == ["onnxruntime-cpu"]
    assert recipe.latency.batch_sizes == [1, 32]
    assert recipe.gate.metric == "accuracy" and recipe.gate.max_drop is None and recipe.gate.tolerance == "auto"
    assert [v.name for v in recipe.all_variants()] == ["fp32"]
    assert len(recipe.sha256) == 64


def test_fp32_is_always_first_and_variant_options_are_kept(tmp_path):
    body = with_changes(variants=[
        {"name": "q", "precision": "int8", "calibrator": "percentile", "percentile": 99.9},
        {"name": "half", "precision": "fp16"},
    ])  # fmt: skip
    recipe = load_recipe(write_recipe(tmp_path, body))
    assert [v.name for v in recipe.all_variants()] == ["fp32", "q", "half"]
    assert recipe.variants[0].percentile == 99.9


def test_fingerprint_ignores_the_gate_but_not_the_model(tmp_path):
    path = write_recipe(tmp_path, BASE)
    before = load_recipe(path).fingerprint()
    path.write_text(yaml.safe_dump(with_changes(gate={"max_drop": 0.5})))
    assert load_recipe(path).fingerprint() == before
    (tmp_path / "model.onnx").write_bytes(b"another model")
    assert load_recipe(path).fingerprint() != before


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"variants": [{"name": "a", "precision": "int8", "calibrator": "minmax"},
                          {"name": "b", "precision": "int8", "calibrator": "entrpy"}]},
            "recipe.yaml: variants[1].calibrator: got 'entrpy', expected one of auto, dynamic, entropy, minmax, "
            "percentile (did you mean 'entropy'?) for int8",
        ),
        (
            {"variants": [{"name": "a", "precision": "int4"}]},
            "recipe.yaml: variants[0].precision: got 'int4', expected one of bf16, fp16, fp32, fp8, int8 "
            "(did you mean 'int8'?)",
        ),
        (
            {"variants": [{"name": "a", "precision": "fp16", "calibrator": "minmax"}]},
            "recipe.yaml: variants[0].calibrator: applies only to int8/fp8 variants, not fp16",
        ),
        (
            {"variants": [{"name": "a", "precision": "int8", "calibrator": "minmax", "percentile": 99.0}]},
            "recipe.yaml: variants[0].percentile: applies to calibrator percentile, not 'minmax'",
        ),
        (
            {"variants": [{"name": "a", "precision": "fp8", "calibrator": "dynamic"}]},
            "recipe.yaml: variants[0].calibrator: got 'dynamic', expected one of entropy, minmax, percentile for fp8",
        ),
        (  # an optimize_model BERT's fused Attention: refused with the recipe, not once the sweep has started
            {"variants": [{"name": "a", "precision": "fp8", "calibrator": "minmax",
                           "op_types": ["MatMul", "Attention"]}]},
            "recipe.yaml: variants[0].op_types: fp8 cannot quantize Attention; expected some of Conv, ConvTranspose, "
            "Gemm, MatMul",
        ),
        (
            {"variants": [{"name": "a", "precision": "fp8", "calibrator": "minmax", "reduce_range": True}]},
            "recipe.yaml: variants[0].reduce_range: does not apply to fp8 variants",
        ),
        (
            {"variants": [{"name": "a", "precision": "int8", "calibrator": "dynamic", "activation_type": "int8"}]},
            "recipe.yaml: variants[0].activation_type: does not apply to dynamic int8 variants",
        ),
        (  # ORT's static quantizer refuses it mid-sweep: refused at load instead
            {"variants": [{"name": "a", "precision": "int8", "calibrator": "minmax", "activation_type": "int8",
                           "weight_type": "uint8"}]},
            "recipe.yaml: variants[0].weight_type: uint8 weights with int8 activations are not a format ONNX Runtime "
            "quantizes; expected weight_type: int8, or activation_type: uint8",
        ),
        (
            {"variants": [{"name": "a", "precision": "int8"}]},
            "recipe.yaml: variants[0].calibrator: int8 needs one of auto, dynamic, entropy, minmax, percentile",
        ),
        (
            {"variants": [{"name": "a", "precision": "fp16"}, {"name": "a", "precision": "bf16"}]},
            "recipe.yaml: variants: duplicate variant name 'a'",
        ),
        (  # models/int8.onnx and models/INT8.onnx, jobs/build_fp32.json and jobs/build_FP32.json: one file on macOS
            {"variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"},
                          {"name": "INT8", "precision": "int8", "calibrator": "entropy"}]},
            "recipe.yaml: variants: 'int8' and 'INT8' differ only in case; expected names that differ whatever their "
            "case (each names files, which a case-insensitive file system such as macOS's or Windows' holds as one)",
        ),
        (  # its model and fp16's emulation were both models/fp16.emulated.onnx: the later build overwrote the other
            {"variants": [{"name": "fp16", "precision": "fp16"},
                          {"name": "fp16.Emulated", "precision": "int8", "calibrator": "minmax"}]},
            "recipe.yaml: variants[1].name: got 'fp16.Emulated', expected a name not ending in .emulated or .trt: "
            "models/fp16.Emulated.onnx is where qbench writes the emulated or TensorRT model of a variant 'fp16'",
        ),
        (
            {"variants": [{"name": "FP32", "precision": "fp16"}]},
            "recipe.yaml: variants: 'FP32' and 'fp32' differ only in case; expected names that differ whatever their "
            "case (each names files, which a case-insensitive file system such as macOS's or Windows' holds as one)",
        ),
        (
            {"backends": ["onnxruntime-cpus"]},
            "recipe.yaml: backends: got 'onnxruntime-cpus', expected one of onnxruntime-cpu, onnxruntime-cuda, "
            "onnxruntime-tensorrt, tensorrt, torch-cpu, torch-cuda (did you mean 'onnxruntime-cpu'?)",
        ),
        (
            {"gate": {"metric": "cosine"}},
            "recipe.yaml: gate.metric: got 'cosine', expected one of accuracy, agreement, flip_rate, kl_mean, "
            "max_abs_error for task 'classification'",
        ),
        (
            {"latency": {"batch_sizes": [1, 0]}},
            "recipe.yaml: latency.batch_sizes[1]: input should be greater than 0, got 0",
        ),
        (
            {"variants": [{"name": "q", "precision": "int8", "calibrator": "minmax", "qat": {"epochs": 1}}]},
            "recipe.yaml: variants[0].qat: needs a PyTorch model source (model.torch); "
            "this recipe's model is an ONNX file",
        ),
        (
            {"variants": [{"name": "q", "precision": "int8", "calibrator": "minmax", "qat": {},
                           "exclude_nodes": ["n"]}]},
            "recipe.yaml: variants[0].exclude_nodes: does not apply to QAT variants",
        ),
        # it said "'label' needs data.label", which task embedding refuses: the user was sent from one error to another
        (
            {"task": "embedding", "model": {"torch": "pkg.models:build", "example_inputs": {"x": [1, 4]}},
             "gate": {"metric": "cosine"},
             "variants": [{"name": "q", "precision": "int8", "calibrator": "minmax", "qat": {"loss": "label"}}]},
            "recipe.yaml: variants[0].qat.loss: task 'embedding' has no label loss; use 'distill'",
        ),
        (
            {"backends": ["onnxruntime-cpu", "torch-cpu"]},
            "recipe.yaml: backends[1]: torch-cpu needs a PyTorch model source (model.torch)",
        ),
        (
            {"model": {"path": "model.onnx", "weights": "w.pt"}},
            "recipe.yaml: model.weights: applies only to a PyTorch model (`torch:`), not to an ONNX file",
        ),
        (
            {"model": {"path": "model.onnx", "factory_arguments": {"hidden": 16}}},
            "recipe.yaml: model.factory_arguments: applies only to a PyTorch model (`torch:`), not to an ONNX file",
        ),
        (
            {"model": {"torch": "pkg.models:build"}},
            "recipe.yaml: model.example_inputs: a PyTorch model needs the shape of each input, "
            "e.g. {input: [1, 3, 224, 224]}",
        ),
        (
            {"model": {"torch": "pkg.models.build", "example_inputs": {"x": [1, 4]}}},
            "recipe.yaml: model.torch: got 'pkg.models.build', expected 'package.module:factory'",
        ),
        (  # `$` matched before the final newline: 'fp16\n' named files and split the gate's verdict line in two
            {"variants": [{"name": "fp16\n", "precision": "fp16"}]},
            "recipe.yaml: variants[0].name: got 'fp16\\n', expected letters, digits and _ . + - (starting with a "
            "letter or digit)",
        ),
        (
            {"name": "toy\n"},
            "recipe.yaml: name: got 'toy\\n', expected letters, digits and _ . + - (starting with a letter or digit)",
        ),
        (
            {"variants": [{"name": "q", "precision": "int8", "calibrator": "minmax", "keep_float": ["Softmax\n"]}]},
            "recipe.yaml: variants[0].keep_float: got 'Softmax\\n', expected a rule (attention_matmuls, masks) or an "
            "ONNX op type such as Softmax",
        ),
        (
            {"model": {"torch": "pkg.models:build\n", "example_inputs": {"x": [1, 4]}}},
            "recipe.yaml: model.torch: got 'pkg.models:build\\n', expected 'package.module:factory'",
        ),
        (
            {"variants": [{"name": "v" * 101, "precision": "fp16"}]},
            "recipe.yaml: variants[0].name: got a name of 101 characters, expected at most 100 (it names files)",
        ),
        (
            {"search": {"name": "s" * 101}},
            "recipe.yaml: search.name: got a name of 101 characters, expected at most 100 (it names files)",
        ),
        (
            {"tracking": {"uri": "file:///tmp/mlruns"}},
            "recipe.yaml: tracking.uri: got 'file:///tmp/mlruns': MLflow refuses its file store (maintenance mode); "
            "expected a database store such as sqlite:///mlflow.db, or set MLFLOW_ALLOW_FILE_STORE=true",
        ),
        (
            {"gate": {"max_drop": float("inf")}},
            "recipe.yaml: gate.max_drop: input should be a finite number, got inf",
        ),
        (
            {"task": "regresion"},
            "recipe.yaml: task: got 'regresion', expected one of classification, embedding, multilabel, "
            "regression, span, structured (did you mean 'regression'?)",
        ),
        (
            {"task": "detection"},
            "recipe.yaml: task: task 'detection' is not supported as such: use task 'structured', which hands each "
            "row's outputs and label to your own metrics (recipe `metrics:`) and gates on them",
        ),
    ],
)
def test_schema_errors_name_file_field_and_expectation(tmp_path, changes, expected):
    assert error_of(tmp_path, with_changes(**changes)) == expected


def test_unknown_key_suggests_the_close_one(tmp_path):
    body = with_changes(latency={"batch_size": [1]})
    assert error_of(tmp_path, body) == (
        "recipe.yaml: latency.batch_size: unknown key 'batch_size' (did you mean 'batch_sizes'?); "
        "expected one of batch_sizes, warmup, iterations, threads, stability"
    )


def test_filter_operators_are_checked_at_load_time(tmp_path):
    data = dict(BASE["data"], evaluation={"filter": {"ink": {"lower": 0.3}}})
    message = error_of(tmp_path, with_changes(data=data))
    assert message.startswith("recipe.yaml: data.evaluation.filter: column 'ink': operator got 'lower'")
    assert "expected one of eq, ge, gt, in, le, lt, ne, not_in" in message


@pytest.mark.parametrize(("written", "meant"), [
    ("gte", "'ge' here: greater than or equal to"),  # by closeness 'gt', which leaves out the bound
    ("$lte", "'le' here: less than or equal to"),  # MongoDB's
    ("nin", "'not_in' here: none of a list"),  # by closeness 'in', its opposite
    ("__gte", "'ge' here: greater than or equal to"),  # Django's lookup suffix
    (">=", "'ge' here: greater than or equal to"),
])
def test_other_query_languages_operators_are_named_by_meaning(tmp_path, written, meant):
    data = dict(BASE["data"], evaluation={"filter": {"ts": {written: "2024-01-01"}}})
    message = error_of(tmp_path, with_changes(data=data))
    assert message.startswith(f"recipe.yaml: data.evaluation.filter: column 'ts': operator got {written!r}")
    assert message.endswith(f"({written!r} is written {meant})")
    assert "did you mean" not in message


def test_slice_needs_by_or_name_and_filter(tmp_path):
    data = dict(BASE["data"], slices=[{"name": "faint"}])
    assert error_of(tmp_path, with_changes(data=data)) == (
        "recipe.yaml: data.slices[0]: a slice needs `by: <column>`, or both `name` and `filter`, "
        "or `by_length` + `buckets`"
    )


@pytest.mark.parametrize("name", ["overall", "slo"])
def test_a_slice_cannot_take_the_name_of_a_gate_scope(tmp_path, name):
    """A 3-row slice named 'overall' escaped min_slice_size (only the real overall scope is exempt) and its breach
    read as the overall figure."""
    data = dict(BASE["data"], slices=[{"name": name, "filter": {"ink": {"lt": 0.3}}}])
    assert error_of(tmp_path, with_changes(data=data)) == (
        f"recipe.yaml: data.slices[0].name: {name!r} is the gate's own scope; call the slice something else"
    )


def test_missing_required_and_missing_files(tmp_path):
    body = {k: v for k, v in BASE.items() if k != "model"}
    assert error_of(tmp_path, body) == "recipe.yaml: model: required field is missing"
    recipe = with_changes(model={"path": "nowhere.onnx"})
    assert error_of(tmp_path, recipe).startswith("recipe.yaml: model.path: file not found: ")


def test_invalid_yaml_names_the_line(tmp_path):
    assert error_of(tmp_path, "name: x\nmodel: [unclosed\n").startswith("recipe.yaml: line 3: invalid YAML")


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "absent.yaml")


def test_anchors_and_merge_keys_within_bounds_still_load(tmp_path):
    text = (
        "name: toy\nmodel: {path: model.onnx}\n"
        "data: {path: rows.parquet, inputs: {x: input}, label: y}\n"
        "variants:\n  - &int8 {name: a, precision: int8, calibrator: minmax}\n"
        "  - {<<: *int8, name: b, calibrator: entropy}\n"
    )
    recipe = load_recipe(write_recipe(tmp_path, text))
    assert [(v.name, v.calibrator) for v in recipe.variants] == [("a", "minmax"), ("b", "entropy")]


def test_strict_types_keep_integers_as_numbers_and_strings_as_paths(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, with_changes(gate={"max_drop": 0, "max_slice_drop": 1})))
    assert recipe.gate.max_drop == 0.0 and isinstance(recipe.gate.max_slice_drop, float)
    assert error_of(tmp_path, with_changes(gate={"max_drop": "0"})) == (
        "recipe.yaml: gate.max_drop: expected a number, got '0'"
    )


def test_filters_accept_every_documented_form(tmp_path):
    data = dict(BASE["data"], evaluation={"filter": {
        "split": "eval", "ink": {"lt": 0.3, "ge": 0}, "region": {"in": ["n", None]}, "kind": {"ne": None},
        "flag": True,
    }})  # fmt: skip
    recipe = load_recipe(write_recipe(tmp_path, with_changes(data=data)))
    assert recipe.data.evaluation.filter["region"] == {"in": ["n", None]}


def test_an_unquoted_date_in_a_filter_is_the_text_it_was_written_as(tmp_path):
    """YAML reads `2024-01-31` as a date object: `eq` refused it as not a single value, `lt` as not a number."""
    data = dict(BASE["data"], evaluation={"filter": {"day": "DAY", "seen": "SEEN"}})
    text = yaml.safe_dump(with_changes(data=data))
    dates = {"DAY": "{ge: 2024-01-01, lt: 2024-02-01 08:00:00}", "SEEN": "{in: [2024-01-05]}"}
    recipe = load_recipe(write_recipe(tmp_path, text.replace("DAY", dates["DAY"]).replace("SEEN", dates["SEEN"])))
    assert recipe.data.evaluation.filter == {"day": {"ge": "2024-01-01", "lt": "2024-02-01 08:00:00"},
                                             "seen": {"in": ["2024-01-05"]}}  # fmt: skip
    message = error_of(tmp_path, text.replace("DAY", "{lt: [1]}").replace("SEEN", "x"))
    assert "data.evaluation.filter: column 'day': 'lt' expects a finite number, or a date or time written as text" in message


def test_latency_stability_defaults_null_and_bounds(tmp_path):
    adaptive = load_recipe(write_recipe(tmp_path, BASE)).latency.stability
    assert (adaptive.threshold, adaptive.windows, adaptive.window_runs, adaptive.max_seconds) == (0.05, 3, None, 10.0)
    fixed = load_recipe(write_recipe(tmp_path, with_changes(latency={"stability": None})))
    assert fixed.latency.stability is None
    body = with_changes(latency={"iterations": 500, "stability": {"max_iterations": 100}})
    message = error_of(tmp_path, body)
    assert "stability.max_iterations: got 100, expected at least iterations (500)" in message
    assert "latency.stability.windows" in error_of(tmp_path, with_changes(latency={"stability": {"windows": 1}}))


def test_a_recipe_with_several_problems_names_where_the_others_are_and_what_is_wrong_there(tmp_path):
    """Only the first problem is spelled out; the others' fields are named with what is wrong there in a few words, so
    one edit can fix them all (the line said 'at latency.warmup' alone: a misspelt key and a wrong type read alike)."""
    body = with_changes(latency={"batch_size": [1], "warmup": "x", "threads": -1})
    message = error_of(tmp_path, body)
    assert message.count("(and 2 more problems: ") == 1 and message.endswith(")")
    others = dict(o.split(": ", 1) for o in message.split("(and 2 more problems: ")[1].removesuffix(")").split("; "))
    first = message.split(": ")[1]
    assert sorted([first, *others]) == ["latency.batch_size", "latency.threads", "latency.warmup"]
    briefs = {"latency.batch_size": "unknown key", "latency.warmup": "expected a whole number",
              "latency.threads": "input should be greater than 0"}  # fmt: skip
    assert others == {field: briefs[field] for field in others}


UNQUOTED_NAMES = """\
name: toy
model: {path: model.onnx, output: 13}
data: {path: rows.parquet, inputs: {x: input}, label: y}
"""


def test_a_name_yaml_reads_as_a_number_says_to_quote_it(tmp_path):
    """PyTorch's exporter numbers unnamed outputs ('13'); unquoted, YAML hands the recipe the integer 13."""
    assert error_of(tmp_path, UNQUOTED_NAMES) == (
        "recipe.yaml: model.output: expected a string, got 13 (YAML "
        "reads it as a number: quote it, '13', to keep it text)"
    )


def test_class_names_yaml_reads_as_booleans_say_to_quote_them_and_count_each_field_once(tmp_path):
    """`classes: [no, yes]` arrives as [False, True]; classes take text or whole numbers (pydantic reports each member
    of that union at each entry: two fields, not four problems)."""
    body = UNQUOTED_NAMES.replace("output: 13", "output: p").replace("label: y}", "label: y, classes: [no, yes]}")
    assert error_of(tmp_path, body) == (
        "recipe.yaml: data.classes[0]: expected a string or a whole number, got False (YAML reads unquoted "
        "yes/no/on/off/true/false as true or false: quote text such as 'no') (and 1 more problem: data.classes[1]: expected a string or a whole number)"
    )


def test_a_section_whose_entries_are_all_commented_out_is_named_as_yaml_null(tmp_path):
    """`gate:` above only commented-out entries is YAML's null: the error said 'got None', Python's word, not what
    the file holds or why."""
    body = UNQUOTED_NAMES.replace("output: 13", "output: p") + "gate:\n  # max_drop: 0.01\n"
    assert error_of(tmp_path, body) == (
        "recipe.yaml: gate: expected a mapping (key: value, ...), got None (YAML's null: a key with nothing after it, "
        "or whose entries are all commented out)"
    )


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_numpy_or_torch_would_refuse_is_a_one_line_error(tmp_path, seed):
    """np.random.default_rng(-1) raises only when the sweep draws calibration rows, after the variants' set-up."""
    data = {**BASE["data"], "calibration": {"seed": seed}}
    message = error_of(tmp_path, with_changes(data=data))
    assert message.startswith("recipe.yaml: data.calibration.seed: input should be")


def test_a_list_label_names_the_distinct_label_columns_of_a_multilabel_recipe(tmp_path):
    """A multilabel table with one 0/1 column per label: `data.label` lists them (qbench.data.labels reads them)."""
    wide = ["toxic", "obscene", "insult"]
    multilabel = {"task": "multilabel", "gate": {"metric": "micro_f1"}}
    data = {**BASE["data"], "label": wide}
    assert load_recipe(write_recipe(tmp_path, with_changes(**multilabel, data=data))).data.label_columns == tuple(wide)
    assert load_recipe(write_recipe(tmp_path, with_changes(**multilabel))).data.label_columns == ("y",)
    assert error_of(tmp_path, with_changes(data=data)) == (
        "recipe.yaml: data.label: a list of columns (one 0/1 column per label) is read by task multilabel only; "
        "expected one label column for task 'classification'"
    )
    expected = "expected one column name, or (task multilabel) the distinct 0/1 columns of the labels"
    for label, got in (([], "an empty list"), (["toxic", "insult", "toxic"], "column 'toxic' twice")):
        error = error_of(tmp_path, with_changes(**multilabel, data={**BASE["data"], "label": label}))
        assert error.startswith(f"recipe.yaml: data.label: got {got}; {expected}")


def test_a_value_inside_a_list_or_mapping_of_a_union_field_is_named_where_it_lies(tmp_path):
    """`data.label` is a name or a list of names: a list holding a number got pydantic's first member's error,
    'data.label: expected a string, got ['toxic', 3]', as if the list itself were wrong. The member taking the
    value's kind says where: data.label[1]; so for a text input's tokenizer inside `data.inputs`."""
    multilabel = {"task": "multilabel", "gate": {"metric": "micro_f1"}}
    error = error_of(tmp_path, with_changes(**multilabel, data={**BASE["data"], "label": ["toxic", 3]}))
    assert error == ("recipe.yaml: data.label[1]: expected a string, got 3 (YAML reads it as a number: quote it, '3', "
                     "to keep it text)")  # fmt: skip
    error = error_of(tmp_path, with_changes(**multilabel, data={**BASE["data"], "label": [True, "toxic", 4]}))
    assert error.startswith("recipe.yaml: data.label[0]: expected a string, got True (YAML reads unquoted")
    assert error.endswith("(and 1 more problem: data.label[2]: expected a string)")
    inputs = {"text": {"tokenizer": {"path": 7}}}
    assert error_of(tmp_path, with_changes(data={**BASE["data"], "inputs": inputs})).startswith(
        "recipe.yaml: data.inputs.text.tokenizer.path: expected a string, got 7"
    )
    assert error_of(tmp_path, with_changes(data={**BASE["data"], "label": 3})).startswith(
        "recipe.yaml: data.label: expected a string or a list ([a, b, ...]), got 3"
    )


@pytest.mark.parametrize(("task", "metric"), [("classification", "accuracy"), ("regression", "mae"),
                                              ("multilabel", "micro_f1"), ("embedding", "cosine")])  # fmt: skip
def test_a_gate_naming_no_metric_gates_the_tasks_headline_one(tmp_path, task, metric):
    """The gate's metric defaulted to 'accuracy' whatever the task: a regression recipe leaving it out was refused."""
    data = {k: v for k, v in BASE["data"].items() if not (task == "embedding" and k == "label")}
    assert load_recipe(write_recipe(tmp_path, with_changes(task=task, data=data))).gate.metric == metric
    gated = load_recipe(write_recipe(tmp_path, with_changes(task=task, data=data, gate={"max_drop": 0.5})))
    assert (gated.gate.metric, gated.gate.max_drop) == (metric, 0.5)


def test_a_csv_dialect_beside_no_csv_file_is_refused(tmp_path):
    """`data.csv` set for a Parquet table was ignored silently: the user believed the file was read as declared."""
    data = dict(BASE["data"], csv={"delimiter": ";"})
    assert error_of(tmp_path, with_changes(data=data)) == (
        "recipe.yaml: data.csv: describes .csv/.tsv files, but data.path is rows.parquet; remove it"
    )
    (tmp_path / "extra.tsv.gz").write_bytes(b"")
    calibrated = dict(data, calibration={"path": "extra.tsv.gz"})
    assert load_recipe(write_recipe(tmp_path, with_changes(data=calibrated))).data.csv.delimiter == ";"


def test_a_gate_left_without_a_metric_over_several_outputs_is_asked_to_name_one(tmp_path):
    """Each evaluated output's metrics are prefixed with its name: the default 'accuracy' matches none of them, and
    the error said "got 'accuracy'", as if the recipe had written it."""
    message = error_of(tmp_path, with_changes(model={"path": "model.onnx", "outputs": ["a", "b"]}))
    assert message.startswith("recipe.yaml: gate.metric: not set, and task 'classification' evaluates several outputs "
                              "(a, b), each with its own metrics named 'output/metric'; expected one of a/accuracy, ")
    assert "b/accuracy" in message and "got" not in message and "\n" not in message
    named = with_changes(model={"path": "model.onnx", "outputs": ["a", "b"]}, gate={"metric": "b/accuracy"})
    assert load_recipe(write_recipe(tmp_path, named)).gate.metric == "b/accuracy"


@pytest.mark.parametrize(
    ("name", "why"),
    [("nl\nPASS int8 overall", "holds \\n"), ("ctl\x01x", "holds \\x01"), ("", "is empty"),
     (" ", "has spaces at an end"),
     (" faint", "has spaces at an end"), ("e\u0301", "has accents not composed as NFC")],
)
def test_a_named_slice_must_print_as_itself(tmp_path, name, why):
    """The recipe took these: a newline forged a gate line, \\x01 made the JUnit XML unreadable, and an empty or
    padded name printed like another slice's (a `by` slice's values are quoted for that; a recipe's names are not)."""
    data = dict(BASE["data"], slices=[{"name": name, "filter": {"ink": {"lt": 0.3}}}])
    assert error_of(tmp_path, with_changes(data=data)) == (
        f"recipe.yaml: data.slices[0].name: got {name!r}, which {why}; expected a name that prints as itself "
        "(printable characters, no spaces at either end, NFC): it is printed as written in the gate's lines and reports"
    )


def test_a_named_slice_may_use_any_printable_text(tmp_path):
    data = dict(BASE["data"], slices=[{"name": "São Paulo | a/b <x> 50% 🙂", "filter": {"ink": {"lt": 0.3}}}])
    assert load_recipe(write_recipe(tmp_path, with_changes(data=data))).data.slices[0].name == "São Paulo | a/b <x> 50% 🙂"


def test_every_recipe_field_is_placed_by_what_depends_on_it() -> None:
    """A field added later must be placed on purpose: an include list (the results' sections) left `task_options`
    out, so results of other task options were judged current."""
    from qbench.recipe.spec import JUDGED_SECTIONS, RESULT_SECTIONS, RUN_FIELDS, Recipe

    placed = [*RESULT_SECTIONS, *JUDGED_SECTIONS, *RUN_FIELDS]
    assert sorted(placed) == sorted(Recipe.model_fields)  # each field once, none left out
    for section, fields in RUN_FIELDS.items():
        annotation = Recipe.model_fields[section].annotation
        assert set(fields) <= set(getattr(annotation, "model_fields", {})), section


@pytest.mark.parametrize("section", ["task_options", "analysis", "backend_resources"])
def test_results_are_stale_once_a_section_their_figures_depend_on_changed(tmp_path: Path, section: str) -> None:
    """These sections were not compared: `qbench gate` judged results made with other task options (or without the
    range analysis, or timed on another GPU kind) as current for today's recipe."""
    from qbench.gate.fresh import stale_sections
    from qbench.recipe.executor import BackendResources
    from qbench.recipe.spec import AnalysisSpec

    recorded = load_recipe(write_recipe(tmp_path, with_changes(backends=["onnxruntime-cpu", "onnxruntime-cuda"])))
    edited = {"task_options": {"nn_queries": 50}, "analysis": AnalysisSpec(ranges=False),
              "backend_resources": {"onnxruntime-cuda": BackendResources(accelerator="L4")}}[section]  # fmt: skip
    current = recorded.model_copy(update={section: edited})
    assert stale_sections(current, recorded) == [
        f"stale results: recipe section {section!r} changed since the sweep: re-run `qbench sweep`"]
    assert stale_sections(recorded.model_copy(update={"gate": recorded.gate.model_copy(update={"max_drop": 0.5})}),
                          recorded) == []  # fmt: skip


def test_executor_timeout_loads_for_ray_and_is_refused_in_one_line_elsewhere(tmp_path: Path) -> None:
    """`executor.timeout_s` bounds a Ray job on its worker; a local sweep's job runs in the sweep's own process,
    which cannot end it without ending the sweep, so a timeout there is refused rather than silently ignored."""
    recipe = load_recipe(write_recipe(tmp_path, with_changes(executor={"kind": "ray", "timeout_s": 90})))
    assert recipe.executor.timeout_s == 90
    assert load_recipe(write_recipe(tmp_path, BASE)).executor.timeout_s is None
    assert error_of(tmp_path, with_changes(executor={"timeout_s": 90})) == (
        "recipe.yaml: executor: timeout_s applies to `kind: ray` only (a job in the sweep's own process cannot be "
        "ended without the sweep: bound a local sweep by its CI job's timeout)")
    assert "executor.timeout_s" in error_of(tmp_path, with_changes(executor={"kind": "ray", "timeout_s": 0}))


def test_a_label_column_fed_as_a_model_input_is_refused_where_labels_are_answers(tmp_path):
    """A classifier fed its own label column (a one-hot of it added to its scores) scored accuracy 1.0 in FP32 and
    every variant, and the gate passed an INT8 build whose errors on the other inputs hid behind the leak (exit 0).
    A reconstruction (task regression or structured: an autoencoder judged against its own input) may feed it."""
    leaked = {**BASE["data"], "inputs": {"x": "input", "y": "label_input"}}
    assert error_of(tmp_path, with_changes(data=leaked)) == (
        "recipe.yaml: data.inputs: column 'y' is data.label too: the model would be fed the answer it is scored "
        "against, so its accuracy and every variant's drop would measure that leak (a variant's errors on the other "
        "inputs hide behind it); expected the label column kept out of data.inputs (task 'classification')")
    paired = {**BASE["data"], "inputs": {"q": {"tokenizer": {"path": "tok", "pair": "y"}}}}
    assert "column 'y' is data.label too" in error_of(tmp_path, with_changes(data=paired))
    (tmp_path / "tok").mkdir()
    multilabel = {**BASE["data"], "label": ["toxic", "insult"], "inputs": {"x": "input", "insult": "flag"}}
    assert "column 'insult' is data.label too" in error_of(
        tmp_path, with_changes(task="multilabel", gate={"metric": "micro_f1"}, data=multilabel))
    reconstruction = {**BASE["data"], "inputs": {"y": "input"}}
    assert load_recipe(write_recipe(tmp_path, with_changes(task="regression", data=reconstruction))).data.inputs


def test_calibration_group_by_loads_and_is_a_column_name(tmp_path):
    data = dict(BASE["data"], calibration={"samples": 100, "group_by": "query_id"})
    recipe = load_recipe(write_recipe(tmp_path, with_changes(data=data)))
    assert recipe.data.calibration.group_by == "query_id"
    assert load_recipe(write_recipe(tmp_path, BASE)).data.calibration.group_by is None
    data = dict(BASE["data"], calibration={"group_by": 3})
    assert error_of(tmp_path, with_changes(data=data)).startswith("recipe.yaml: data.calibration.group_by: ")
