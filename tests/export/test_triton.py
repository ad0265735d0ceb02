"""Triton export: the config parsed with Triton's own model-config protobuf, the measured model file,
the perf_analyzer README, and the gate as the gatekeeper (refused unless --force)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from sweep_factory import make_variant

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.export.pbtxt import EnumValue, to_pbtxt
from qbench.export.triton import export_triton, external_data_files
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results, write_results
from qbench.results.serving import LoadStats, ServingResult
from qbench.sweep.runner import run_sweep

try:
    from tritonclient.grpc import model_config_pb2
except ImportError:  # qbench's export needs no tritonclient; only these checks against Triton's schema do
    model_config_pb2 = None
needs_schema = pytest.mark.skipif(
    model_config_pb2 is None, reason="Triton's model-config schema comes with "
                                     "tritonclient (pip install 'qbench[triton]'); "
    "test_triton_served.py checks the same configs without it",
)  # fmt: skip

CPU = "onnxruntime-cpu"
BATCH_SIZES = [1, 4, 8]


def tiny_model(path: Path) -> Path:
    """features (batch, 2, 3) -> Flatten -> MatMul -> Add -> scores (batch, 3) -> Softmax -> probabilities."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Flatten", ["features"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 2, 3])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(rng.normal(size=(6, 3)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.normal(size=(3,)).astype(np.float32), "b")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def tiny_project(root: Path, gate: dict) -> Path:
    """Model, 160 rows (64 calibration, 96 evaluation in groups a/b) and a recipe; returns the recipe path."""
    root.mkdir(parents=True, exist_ok=True)
    tiny_model(root / "model.onnx")
    rng = np.random.default_rng(1)
    features = rng.normal(size=(160, 6)).astype(np.float32)
    pd.DataFrame({
        "x": list(features), "y": rng.integers(0, 3, size=160),
        "split": ["calib"] * 64 + ["eval"] * 96, "group": (["a", "b"] * 80),
    }).to_parquet(root / "data.parquet")  # fmt: skip
    recipe = {
        "name": "tiny", "model": {"path": "model.onnx", "output": "scores"},
        "data": {"path": "data.parquet", "inputs": {"x": "features"}, "label": "y",
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}, "slices": [{"by": "group"}]},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"},
                     {"name": "int8-dyn", "precision": "int8", "calibrator": "dynamic"}],
        "backends": [CPU],
        "latency": {"batch_sizes": BATCH_SIZES, "warmup": 1, "iterations": 7, "threads": 1},
        "gate": gate, "output_dir": str(root / "reports"),
    }  # fmt: skip
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


# fp16 of a linear model cannot lose half its agreement: it passes; int8 is outside applies_to
PASSING_GATE = {"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5, "applies_to": ["fp16"]}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe swept for real (no MLflow); returns the recipe path."""
    recipe = tiny_project(tmp_path_factory.mktemp("tiny"), PASSING_GATE)
    run_sweep(recipe, track=False)
    return recipe


def parse_config(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@needs_schema
def test_passing_variant_exports_a_config_triton_parses(swept: Path, tmp_path: Path) -> None:
    recipe = load_recipe(swept)
    export = export_triton(recipe, "fp16", CPU, tmp_path / "repo")
    config = parse_config(export.config_path)
    Config = model_config_pb2.ModelConfig

    assert export.model_dir == tmp_path / "repo" / "tiny-fp16" and export.gate_status == "pass"
    assert (config.name, config.platform, config.backend) == ("tiny-fp16", "onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == 8
    assert list(config.dynamic_batching.preferred_batch_size) == BATCH_SIZES
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    [features] = config.input
    assert (features.name, features.data_type, list(features.dims)) == ("features", model_config_pb2.TYPE_FP32, [2, 3])
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("scores", model_config_pb2.TYPE_FP32, [3]), ("probabilities", model_config_pb2.TYPE_FP32, [3]),
    ]  # fmt: skip
    [group] = config.instance_group
    assert (group.count, group.kind) == (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "intra_op_thread_count": "1", "inter_op_thread_count": "1",
    }  # fmt: skip
    assert not config.HasField("optimization")  # ORT's default graph level (all), no accelerator on CPU
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert set(f.name for f, _ in config.ListFields()) == {
        "name", "platform", "backend", "max_batch_size", "input", "output", "instance_group", "dynamic_batching",
        "parameters",
    }  # fmt: skip
    assert Config.DESCRIPTOR.full_name == "inference.ModelConfig"


def test_model_file_is_the_measured_artifact(swept: Path, tmp_path: Path) -> None:
    recipe = load_recipe(swept)
    measured = read_results(latest_results(recipe)).find("fp16", CPU)
    export = export_triton(recipe, "fp16", CPU, tmp_path)
    assert export.model_path == export.model_dir / "1" / "model.onnx"
    assert export.model_path.read_bytes() == Path(measured.model_path).read_bytes()
    assert export.model_sha256 == hashlib.sha256(Path(measured.model_path).read_bytes()).hexdigest()
    assert onnx.load(str(export.model_path)).graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_a_model_edited_since_the_sweep_is_refused_even_at_the_same_size(swept: Path, tmp_path: Path) -> None:
    recipe = load_recipe(swept)
    path = Path(read_results(latest_results(recipe)).find("fp16", CPU).model_path)
    original = path.read_bytes()
    edited = bytearray(original)
    edited[-8] ^= 0xFF  # a weight byte: same size, another model
    try:
        path.write_bytes(bytes(edited))
        with pytest.raises(QbenchError,
                           match=r"fp16@onnxruntime-cpu: gate status 'fail' \(the model file .* is not the "
                           r"model measured"):  # the gate refuses results whose model changed
            export_triton(recipe, "fp16", CPU, tmp_path / "repo")
        with pytest.raises(QbenchError,
                           match=r"fp16@onnxruntime-cpu: model file .* is not the model the sweep measured"):
            export_triton(recipe, "fp16", CPU, tmp_path / "forced", force=True)  # --force overrides a verdict, not this
    finally:
        path.write_bytes(original)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").rglob("model.onnx"))


def test_readme_reproduces_each_latency_point(swept: Path, tmp_path: Path) -> None:
    recipe = load_recipe(swept)
    export = export_triton(recipe, "fp16", CPU, tmp_path)
    readme = export.readme_path.read_text()
    commands = [line for line in readme.splitlines() if line.startswith("perf_analyzer ")]
    # requests per perf_analyzer window: qbench's timed runs over its closed timing windows (at least 7 // 3)
    points = read_results(latest_results(recipe)).find("fp16", CPU).latency.points
    expected_requests = {p.batch_size: p.iterations // len(p.window_p50_ms) for p in points}
    assert all(count >= 7 // 3 for count in expected_requests.values())
    assert len(commands) == len(BATCH_SIZES)
    for command, batch_size in zip(commands, BATCH_SIZES):
        flags = command.split()
        assert flags[flags.index("-m") + 1] == "tiny-fp16" and flags[flags.index("-b") + 1] == str(batch_size)
        assert "--concurrency-range 1:1" in command and "--measurement-mode count_windows" in command
        assert flags[flags.index("--measurement-request-count") + 1] == str(expected_requests[batch_size])
        assert flags[flags.index("--input-data") + 1] == "perf_input_data.json" and "--shape" not in command
    assert export.model_sha256 in readme and "**pass**" in readme


def test_not_gated_variant_is_refused_in_one_line_and_exported_with_force(swept: Path, tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    args = ["export", "triton", str(swept), "--variant", "int8", "--backend", CPU, "--to", str(repo)]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "int8@onnxruntime-cpu: gate status 'not gated'" in err and "--force" in err and "Traceback" not in err
    assert not repo.exists()
    assert main([*args, "--force"]) == 0
    assert 'name: "tiny-int8"' in (repo / "tiny-int8" / "config.pbtxt").read_text().splitlines()
    assert "Exported with --force" in (repo / "tiny-int8" / "README.md").read_text()


@pytest.mark.parametrize("name", ["", "my model", "models/tiny", ".hidden", "tiny\n", "x" * 256])
def test_a_name_triton_cannot_load_as_itself_is_refused_naming_the_flag(swept: Path, tmp_path: Path, capsys,
                                                                         name: str) -> None:
    """`--name ""` exported under the default name, and 'tiny\n' passed the name pattern (`$` matches before a final
    newline) and wrote a folder whose name ends in a newline: each is now refused in one line naming --name (exit 2),
    nothing written; spaces, a slash and a leading dot were refused without naming the flag."""
    repo = tmp_path / "repo"
    args = ["export", "triton", str(swept), "--variant", "fp16", "--backend", CPU, "--to", str(repo), "--name", name]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"Triton model name, --name: got {name!r}, expected a letter or digit" in " ".join(err.split())
    assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err  # one line, wrapped at most once
    assert not repo.exists()


def test_the_sweeps_notes_on_a_variant_travel_with_it(swept: Path, tmp_path: Path) -> None:
    """Dynamic INT8's accuracy depends on what is batched together: under Triton's dynamic batcher that matters."""
    export = export_triton(load_recipe(swept), "int8-dyn", CPU, tmp_path / "repo", force=True)
    readme = (export.model_dir / "README.md").read_text()
    notes = read_results(latest_results(load_recipe(swept))).find("int8-dyn", CPU).notes
    assert any(note.startswith("rows depend on their batch") for note in notes)  # measured (qbench.validate.batch_mix)
    assert "## Notes from the sweep" in readme and all(f"- {note}" in readme for note in notes)


def test_stale_results_are_refused(swept: Path, tmp_path: Path) -> None:
    """Results made from other data are not a pass, whatever their checks say (fail closed)."""
    project = tmp_path / "copy"
    recipe_path = tiny_project(project, PASSING_GATE)
    results = latest_results(load_recipe(swept))
    (project / "reports" / "tiny" / "run").mkdir(parents=True)
    (project / "reports" / "tiny" / "run" / "results.json").write_bytes(results.read_bytes())
    pd.read_parquet(project / "data.parquet").iloc[:-1].to_parquet(project / "data.parquet")  # the data changed
    with pytest.raises(QbenchError, match=r"fp16@onnxruntime-cpu: gate status 'unusable' \(stale results: data \("):
        export_triton(load_recipe(recipe_path), "fp16", CPU, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


# -- a breach, on synthetic results of the tiny recipe --------------------------------------------


@pytest.fixture
def breached(swept: Path, tmp_path: Path) -> Path:
    """The tiny recipe with a strict slice gate, and its real results edited (and re-signed, consistently) so that
    int8 gets 5 % of slice group=b's rows more wrong than FP32 (whole rows, as a real run would): a breach of that
    slice while staying within the overall tolerance."""
    gate = {"metric": "accuracy", "max_drop": 0.05, "max_slice_drop": 0.02, "applies_to": ["*"],
            "unresolved": "note"}  # a tiny project: its passes cannot resolve these drops, which is not the point here
    recipe = load_recipe(tiny_project(tmp_path / "strict", gate))
    results = read_results(latest_results(load_recipe(swept)))
    reference = results.find("fp32", CPU).accuracy
    wrong = math.ceil(0.05 * reference.slice("group=b").size)

    def lowered(scope, rows: int):
        """`scope` with `rows` more rows wrong than FP32's, its recorded drop the one a sweep takes."""
        value = reference.slice(scope.name) if scope.name != "overall" else reference.overall
        accuracy = value.metrics["accuracy"] - rows / scope.size
        return dataclasses.replace(scope, metrics={**scope.metrics, "accuracy": accuracy},
                                   drops={**scope.drops, "accuracy": value.metrics["accuracy"] - accuracy})  # fmt: skip

    variants = []
    for measured in results.variants:
        if measured.variant == "int8":
            accuracy = measured.accuracy
            slices = tuple(lowered(s, wrong if s.name == "group=b" else 0) for s in accuracy.slices)
            accuracy = dataclasses.replace(accuracy, overall=lowered(accuracy.overall, wrong), slices=slices)
            measured = dataclasses.replace(measured, accuracy=accuracy)
        variants.append(measured)
    write_results(dataclasses.replace(results, variants=tuple(variants)),
                  recipe.output_dir / "tiny" / "20260101-000000" / "results.json")  # fmt: skip
    return recipe.source


def test_breaching_variant_is_refused_naming_the_breach(breached: Path, tmp_path: Path, capsys) -> None:
    args = ["export", "triton", str(breached), "--variant", "int8", "--backend", CPU, "--to", str(tmp_path / "repo")]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    size = read_results(latest_results(load_recipe(breached))).find("fp32", CPU).accuracy.slice("group=b").size
    drop = math.ceil(0.05 * size) / size  # the rows the fixture made wrong
    assert f"int8@onnxruntime-cpu: gate status 'fail' (1 breach(es), worst group=b: drop {drop:.4f} > 0.0200)" in err
    assert main([*args, "--force"]) == 0
    export_dir = tmp_path / "repo" / "tiny-int8"
    assert f"max_batch_size: {max(BATCH_SIZES)}" in (export_dir / "config.pbtxt").read_text().splitlines()
    assert "**fail**" in (export_dir / "README.md").read_text()


def test_passing_variant_of_the_same_results_exports(breached: Path, tmp_path: Path) -> None:
    export = export_triton(load_recipe(breached), "fp16", CPU, tmp_path, model_name="digits_fp16")
    assert export.gate_status == "pass" and 'name: "digits_fp16"' in export.config_path.read_text().splitlines()
    with pytest.raises(QbenchError, match="already exists"):
        export_triton(load_recipe(breached), "fp16", CPU, tmp_path, model_name="digits_fp16")
    again = export_triton(load_recipe(breached), "fp16", CPU, tmp_path, model_name="digits_fp16", overwrite=True)
    assert again.model_path.is_file()


def test_the_readme_names_every_metric_the_verdict_was_judged_on(swept: Path, tmp_path: Path) -> None:
    """Results swept gating agreement, judged by a recipe gating agreement and accuracy (gate.metrics; the gate
    section leaves results current): the README said 'Gate on agreement', the sweep's metric, not what was judged."""
    gate = {"metrics": [{"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5},
                        {"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5}], "applies_to": ["fp16"]}
    recipe = load_recipe(tiny_project(tmp_path / "both", gate))
    results = read_results(latest_results(load_recipe(swept)))
    assert results.gate_metric == "agreement" and results.gate_metrics == ()
    write_results(results, recipe.output_dir / "tiny" / "20260101-000000" / "results.json")
    export = export_triton(recipe, "fp16", CPU, tmp_path / "repo")
    assert export.gate_status == "pass"
    assert "Gate on accuracy, agreement: **pass**." in export.readme_path.read_text()


# -- GPU targets and the text format --------------------------------------------------------------


@needs_schema
@pytest.mark.parametrize(
    ("backend", "precision", "mode"), [("tensorrt", "fp16", "FP16"), ("onnxruntime-tensorrt", "int8", "FP32")]
)
def test_tensorrt_backends_get_the_tensorrt_accelerator_on_gpu(tmp_path: Path, backend, precision, mode) -> None:
    from qbench.export.triton import TARGETS, triton_config
    from qbench.modelinfo.signature import read_model_info

    model = tiny_model(tmp_path / "m.onnx")
    measured = make_variant("v", precision, backend=backend, p50_by_batch={1: 1.0, 16: 9.0})
    fields = triton_config("m", measured, read_model_info(model), TARGETS[backend], max_queue_delay_us=250)
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    [accelerator] = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {"precision_mode": mode, "trt_engine_cache_enable": "1"}
    assert config.platform == "onnxruntime_onnx" and config.dynamic_batching.max_queue_delay_microseconds == 250
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 16]


@needs_schema
def test_graph_level_and_unsupported_backend(tmp_path: Path, breached: Path) -> None:
    from qbench.export.triton import TARGETS, triton_config
    from qbench.modelinfo.signature import read_model_info

    measured = make_variant("v", "int8", params={"runtime.graph_optimization_level": "basic"})
    fields = triton_config("m", measured, read_model_info(tiny_model(tmp_path / "m.onnx")), TARGETS[CPU],
                           max_queue_delay_us=0)  # fmt: skip
    assert text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig()).optimization.graph.level == -1
    with pytest.raises(QbenchError, match="backend got 'torch-cpu', expected one of onnxruntime-cpu"):
        export_triton(load_recipe(breached), "fp16", "torch-cpu", tmp_path)


@needs_schema
def test_pbtxt_quotes_strings_and_writes_enums_bare() -> None:
    text = to_pbtxt({"name": 'a"b\\c', "max_batch_size": 2,
                     "input": [{"data_type": EnumValue("TYPE_BF16"), "dims": [-1]}]})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == 'a"b\\c' and config.input[0].data_type == model_config_pb2.TYPE_BF16
    assert list(config.input[0].dims) == [-1]


@needs_schema
def test_pbtxt_writes_any_tensor_name_so_that_it_reads_back_the_same() -> None:
    """A converter's name with a tab, a newline, a control character, a quote or non-ASCII letters: the export
    refused control characters with a bare ValueError (exit 2, 'qbench: error: ValueError'), where protobuf's text
    format has escapes for each and Triton must be given the model's exact name."""
    names = ["in\tput:0", "a\nb", "x\x01\x7fy", "é/名前 🙂", "q'\"\\",
             "StatefulPartitionedCall/model/dense/BiasAdd:0"]
    text = to_pbtxt({"input": [{"name": n, "dims": [1]} for n in names]})
    assert "\t" not in text and text.count("\n") == len(names) * 4  # each input's 4 lines; no raw tab or newline
    assert [i.name for i in text_format.Parse(text, model_config_pb2.ModelConfig()).input] == names


def test_external_data_files_are_listed(tmp_path: Path) -> None:
    model = onnx.load(str(tiny_model(tmp_path / "m.onnx")))
    onnx.save(model, str(tmp_path / "big.onnx"), save_as_external_data=True, location="big.data", size_threshold=0)
    assert external_data_files(tmp_path / "big.onnx") == ["big.data"]
    assert external_data_files(tmp_path / "m.onnx") == []


def _classifier_with(tmp_path: Path, probabilities: onnx.ValueInfoProto, last: onnx.NodeProto) -> Path:
    """x (batch, 3) -> ArgMax -> label (batch,) int64, and x -> `last` -> `probabilities`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])
    nodes = [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0), last]
    graph = helper.make_graph(nodes, "clf", [x], [label, probabilities])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    path = tmp_path / "clf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(path))
    return path


@needs_schema
def test_a_batch_only_output_is_dims_1_reshaped_to_a_scalar(tmp_path: Path) -> None:
    from qbench.export.triton import TARGETS, triton_config
    from qbench.modelinfo.signature import read_model_info

    probabilities = helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 3])
    model = _classifier_with(tmp_path, probabilities, helper.make_node("Softmax", ["x"], ["p"], axis=1))
    fields = triton_config("m", make_variant("v", "int8"), read_model_info(model), TARGETS[CPU], max_queue_delay_us=0)
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    label, scores = config.output
    assert (label.name, label.data_type, list(label.dims)) == ("label", model_config_pb2.TYPE_INT64, [1])
    assert label.HasField("reshape") and list(label.reshape.shape) == []
    assert list(scores.dims) == [3] and not scores.HasField("reshape")


def test_a_zipmap_output_is_refused_naming_it(tmp_path: Path) -> None:
    from qbench.export.triton import TARGETS, triton_config
    from qbench.modelinfo.signature import read_model_info

    map_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    zipmap = helper.make_node("ZipMap", ["x"], ["p"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])
    model = _classifier_with(tmp_path, helper.make_value_info("p", map_type), zipmap)
    with pytest.raises(QbenchError,
                       match=r"tensor 'p' is a seq\(map\(int64,tensor\(float32\)\)\), not a tensor.*zipmap"):
        triton_config("m", make_variant("v", "int8"), read_model_info(model), TARGETS[CPU], max_queue_delay_us=0)


@needs_schema
def test_the_load_scenario_sets_the_queue_delay_and_gets_its_own_command(swept: Path, tmp_path: Path) -> None:
    """Results simulated under load (slo:) at 250 req/s with a 2.5 ms queue delay: config.pbtxt batches with that
    delay and the README replays the same Poisson load; --max-queue-delay-us still overrides it."""
    recipe = load_recipe(swept)
    results = read_results(latest_results(recipe))
    at_rate = LoadStats(250.0, 4000, 0.9, 1.8, 2.7, 1.0, 0.4, 1.3, 249.0)
    serving = ServingResult(preprocess_ms_per_row=0.01, budget_ms=5.0, rate_rps=250.0, max_batch_size=8,
                            max_queue_delay_ms=2.5, requests=4000, seed=0, at_rate=at_rate)  # fmt: skip
    variants = tuple(dataclasses.replace(v, serving=serving) if v.variant == "fp16" else v for v in results.variants)
    loaded = tmp_path / "loaded" / "results.json"
    write_results(dataclasses.replace(results, variants=variants), loaded)

    export = export_triton(recipe, "fp16", CPU, tmp_path / "repo", results_path=loaded)
    config = parse_config(export.config_path)
    assert config.dynamic_batching.max_queue_delay_microseconds == 2500
    # the simulated batcher: it waits for 8 requests or the delay; a preferred size of 1 would never wait
    assert config.max_batch_size == 8 and list(config.dynamic_batching.preferred_batch_size) == [8]
    readme = export.readme_path.read_text()
    (command,) = [line for line in readme.splitlines() if "--request-rate-range" in line]
    flags = command.split()
    assert flags[flags.index("--request-rate-range") + 1] == "250:250:1" and flags[flags.index("-b") + 1] == "1"
    assert "--request-distribution poisson" in command and "--percentile=99" in command
    assert flags[flags.index("--measurement-request-count") + 1] == "4000"
    assert "p99 2.700 ms, mean batch 1.30 over 4000 requests" in readme

    again = export_triton(recipe, "fp16", CPU, tmp_path / "other", results_path=loaded, max_queue_delay_us=0)
    assert parse_config(again.config_path).dynamic_batching.max_queue_delay_microseconds == 0
    plain = export_triton(recipe, "fp16", CPU, tmp_path / "plain")  # no load scenario: the default, no command
    assert parse_config(plain.config_path).dynamic_batching.max_queue_delay_microseconds == 100
    assert "--request-rate-range" not in plain.readme_path.read_text()


def _triton_batch(queued: int, waited_past_delay: bool, config) -> int:
    """The batch Triton's dynamic batcher sends from `queued` one-row requests once a model instance is free (its
    documented rule: the largest preferred size it can form, at once; past the max queue delay, the largest batch
    max_batch_size allows; else it waits: 0)."""
    preferred = [size for size in config.dynamic_batching.preferred_batch_size if size <= queued]
    if preferred and not waited_past_delay:
        return max(preferred)
    if waited_past_delay or queued >= config.max_batch_size:
        return min(queued, config.max_batch_size)
    return 0


@needs_schema
def test_the_config_batches_as_the_load_scenario_simulated(tmp_path: Path) -> None:
    """Timed at batch 1, 4 and 8; the load scenario simulated a batcher of at most 4 requests that waits up to 2 ms.
    Triton's batcher must then do what the simulation's did: hold 1 to 3 requests until the delay, send 4 at once,
    never more than 4. Written as before (every timed size preferred, max_batch_size 8), it sent a lone request at
    once and 6 queued ones as a batch of 4 + 1 + 1: a batcher whose p99 the sweep never simulated."""
    from qbench.export.triton import TARGETS, triton_config
    from qbench.modelinfo.signature import read_model_info

    at_rate = LoadStats(250.0, 4000, 0.9, 1.8, 2.7, 1.0, 0.4, 1.3, 249.0)
    serving = ServingResult(preprocess_ms_per_row=0.01, budget_ms=5.0, rate_rps=250.0, max_batch_size=4,
                            max_queue_delay_ms=2.0, requests=4000, seed=0, at_rate=at_rate)  # fmt: skip
    measured = dataclasses.replace(make_variant("v", "int8", p50_by_batch={1: 1.0, 4: 2.0, 8: 3.0}), serving=serving)
    fields = triton_config("m", measured, read_model_info(tiny_model(tmp_path / "m.onnx")), TARGETS[CPU],
                           max_queue_delay_us=2000)  # fmt: skip
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    assert (config.max_batch_size, list(config.dynamic_batching.preferred_batch_size)) == (4, [4])
    simulated = [min(q, 4) if q >= 4 or late else 0 for q in range(1, 10) for late in (False, True)]
    assert [_triton_batch(q, late, config) for q in range(1, 10) for late in (False, True)] == simulated

    from qbench.export.triton import perf_analyzer_commands

    commands = perf_analyzer_commands("m", measured)  # batch 8 is more than this config admits
    assert [c.split()[c.split().index("-b") + 1] for c in commands] == ["1", "4"]
    plain = make_variant("v", "int8", p50_by_batch={1: 1.0, 4: 2.0, 8: 3.0})  # no load scenario: as before
    fields = triton_config("m", plain, read_model_info(tmp_path / "m.onnx"), TARGETS[CPU], max_queue_delay_us=100)
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    assert (config.max_batch_size, list(config.dynamic_batching.preferred_batch_size)) == (8, [1, 4, 8])
    assert len(perf_analyzer_commands("m", plain)) == 3


@needs_schema
def test_a_model_with_a_fixed_batch_is_served_unbatched_with_whole_batch_requests(tmp_path: Path) -> None:
    """x: [8, 3] (an export without a dynamic batch axis): Triton cannot batch it, so max_batch_size is 0, the dims
    are the whole shapes, there is no dynamic batcher, and perf_analyzer sends one request of the whole batch."""
    from qbench.export.triton import TARGETS, fixed_batch_of, perf_analyzer_commands, triton_config
    from qbench.modelinfo.signature import read_model_info

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 3])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [8])
    probabilities = helper.make_tensor_value_info("p", TensorProto.FLOAT, [8, 3])
    nodes = [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
             helper.make_node("Softmax", ["x"], ["p"], axis=1)]  # fmt: skip
    path = tmp_path / "fixed.onnx"
    graph = helper.make_graph(nodes, "fixed", [x], [label, probabilities])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    info = read_model_info(path)
    assert fixed_batch_of(info) == 8

    measured = make_variant("v", "int8", p50_by_batch={8: 2.0})
    fields = triton_config("m", measured, info, TARGETS[CPU], max_queue_delay_us=100)
    config = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig())
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[8, 3], [8], [8, 3]]
    assert not any(t.HasField("reshape") for t in config.output)
    (command,) = perf_analyzer_commands("m", measured, batched=False)
    assert " -b 1 " in command

    # the same graph with a dynamic batch axis is batched as before
    dynamic = tmp_path / "dynamic.onnx"
    for value in (*graph.input, *graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(dynamic))
    batched = text_format.Parse(to_pbtxt(triton_config("m", measured, read_model_info(dynamic), TARGETS[CPU],
                                                       max_queue_delay_us=100)), model_config_pb2.ModelConfig())  # fmt: skip
    assert batched.max_batch_size == 8 and list(batched.dynamic_batching.preferred_batch_size) == [8]
    assert [list(t.dims) for t in batched.input] == [[3]]


@needs_schema
def test_an_output_whose_shape_the_file_leaves_out_gets_its_inferred_dims(tmp_path: Path) -> None:
    """y = Relu(x) with y declared without a shape (not even a rank): config.pbtxt needs its dims, which ONNX shape
    inference gives ([batch, 3] -> dims [3]); the output was refused as 'a scalar' before. An output whose shape
    inference cannot find (a custom op's) is named in one line."""
    from qbench.export.triton import TARGETS, triton_config
    from qbench.export.triton_config import served_shapes
    from qbench.modelinfo.signature import read_model_info

    def model(name: str, node: onnx.NodeProto, opsets: list) -> Path:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
        graph = helper.make_graph([node], name, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(path))
        return path

    path = model("relu", helper.make_node("Relu", ["x"], ["y"]), [helper.make_opsetid("", 17)])
    info = served_shapes(read_model_info(path), path)
    fields = triton_config("m", make_variant("v", "int8"), info, TARGETS[CPU], max_queue_delay_us=0)
    [y] = text_format.Parse(to_pbtxt(fields), model_config_pb2.ModelConfig()).output
    assert (y.name, list(y.dims)) == ("y", [3])

    custom = model("custom", helper.make_node("Foo", ["x"], ["y"], domain="com.example"),
                   [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])  # fmt: skip
    with pytest.raises(QbenchError, match=r"output 'y': the model states no shape for it \(not even its rank\)"):
        served_shapes(read_model_info(custom), custom)
