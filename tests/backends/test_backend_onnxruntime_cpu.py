"""The ONNX Runtime CPU backend on a tiny MatMul + Add model built with onnx.helper."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qbench.backends import get_backend
from qbench.backends.base import Backend, Runner, RunOptions
from qbench.backends.onnxruntime import OnnxRuntimeBackend
from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.errors import MissingExtraError, QbenchError
from qbench.validate.accuracy import evaluate_accuracy, run_batched
from qbench.validate.latency import measure_cold_start, measure_steady_state
from qbench.variants.base import BuiltVariant

WEIGHT = np.arange(6, dtype=np.float32).reshape(3, 2) / 4
BIAS = np.array([0.5, -0.5], dtype=np.float32)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = x @ WEIGHT + BIAS, x: (batch, 3) float32."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "matmul_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [3, 2], WEIGHT.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, [2], BIAS),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path_factory.mktemp("model") / "matmul_add.onnx"
    onnx.save(model, str(path))
    return path


def _variant(path: Path, **hints: str) -> BuiltVariant:
    return BuiltVariant(name="fp32", precision="fp32", onnx_path=path, session_hints=dict(hints))


def test_registered_backend_meets_the_protocol() -> None:
    backend = get_backend("onnxruntime-cpu")
    assert isinstance(backend, OnnxRuntimeCPU) and isinstance(backend, Backend)
    assert backend.name == "onnxruntime-cpu"
    backend.check_available()  # CPU is always there


def test_load_run_and_describe(model_path: Path) -> None:
    runner = OnnxRuntimeCPU().load(_variant(model_path), RunOptions(threads=1))
    assert isinstance(runner, Runner)
    x = np.array([[1, 2, 3], [0, 0, 0]], dtype=np.float32)
    (y,) = runner.run({"x": x})
    np.testing.assert_allclose(y, x @ WEIGHT + BIAS, rtol=1e-6)
    description = runner.describe()
    assert description["runtime"] == "onnxruntime"
    assert description["providers"][0] == "CPUExecutionProvider"
    assert description["intra_op_threads"] == 1
    assert description["graph_optimization_level"] == "all"
    assert description["version"]
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.run({"x": x})


def test_unset_threads_are_the_usable_cpus_not_the_runtime_default(model_path: Path, monkeypatch) -> None:
    """ONNX Runtime's own default counts the host's physical cores: under a 1-CPU quota (or `taskset -c 0`) its pool
    would take turns on one CPU. Unset threads are the usable CPUs (qbench.environment.default_threads)."""
    from qbench import environment

    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(64, 1.0))
    runner = OnnxRuntimeCPU().load(_variant(model_path), RunOptions())
    assert runner.describe()["intra_op_threads"] == 1
    runner.close()


@pytest.mark.parametrize("level", ["disable", "basic", "extended"])
def test_graph_optimization_hint_is_honoured(model_path: Path, level: str) -> None:
    runner = OnnxRuntimeCPU().load(_variant(model_path, graph_optimization_level=level), RunOptions(threads=1))
    assert runner.describe()["graph_optimization_level"] == level
    runner.close()


def test_bad_hint_and_bad_model_are_user_errors(model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(QbenchError, match="did you mean 'basic'"):
        OnnxRuntimeCPU().load(_variant(model_path, graph_optimization_level="basci"), RunOptions())
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(QbenchError, match="cannot load"):
        OnnxRuntimeCPU().load(_variant(garbage), RunOptions())


def _rejected_at(monkeypatch: pytest.MonkeyPatch, levels: tuple[str, ...]) -> None:
    """onnxruntime's InferenceSession refusing the graph (INVALID_GRAPH) at `levels` of graph optimisation, as 1.30's
    fusion of an FP8 Q/DQ MatMul into MatMulIntegerToFloat does at the extended levels; loading as usual at others."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph

    real = ort.InferenceSession

    def session(path: str, sess_options: ort.SessionOptions, **kwargs: object) -> ort.InferenceSession:
        if sess_options.graph_optimization_level.name in levels:
            raise InvalidGraph("[ONNXRuntimeError] : 10 : INVALID_GRAPH : "
                               "Type 'tensor(float8e4m3fn)' of input is invalid")
        return real(path, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", session)


def test_a_graph_only_the_extended_optimisations_reject_runs_at_the_basic_level_saying_so(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rejected_at(monkeypatch, ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"))
    runner = OnnxRuntimeCPU().load(_variant(model_path), RunOptions(threads=1))
    assert runner.describe()["graph_optimization_level"] == "basic"
    (note,) = runner.result_fields(runner.describe())["notes"]
    assert "at optimisation level all (" in note and "INVALID_GRAPH" in note and "measured at level basic" in note
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(runner.run({"x": x})[0], x @ WEIGHT + BIAS, rtol=1e-6)
    runner.close()


def test_a_graph_rejected_at_every_level_is_not_loaded(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rejected_at(monkeypatch, ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"))
    with pytest.raises(QbenchError, match="onnxruntime cannot load .*INVALID_GRAPH"):
        OnnxRuntimeCPU().load(_variant(model_path), RunOptions())


def test_supports_needs_the_model_file(model_path: Path, tmp_path: Path) -> None:
    assert OnnxRuntimeCPU().supports(_variant(model_path)) is None
    assert "not found" in OnnxRuntimeCPU().supports(_variant(tmp_path / "missing.onnx"))


class _AbsentProviderBackend(OnnxRuntimeBackend):
    """A provider this CPU-only onnxruntime lacks: ORT falls back to CPU with only a warning."""

    name = "onnxruntime-absent"
    providers = ("NoSuchExecutionProvider", "CPUExecutionProvider")
    extra = "gpu"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_silent_provider_fallback_is_refused(model_path: Path) -> None:
    with pytest.raises(QbenchError, match="fell back to CPUExecutionProvider"):
        _AbsentProviderBackend().load(_variant(model_path), RunOptions())


def test_missing_provider_or_runtime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingExtraError, match=r"qbench\[gpu\]") as caught:
        _AbsentProviderBackend().check_available()
    assert caught.value.extra == "gpu"
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(MissingExtraError, match="onnxruntime is not installed"):
        OnnxRuntimeCPU().check_available()


def test_accuracy_and_latency_end_to_end(model_path: Path) -> None:
    backend = OnnxRuntimeCPU()
    feeds = {"x": np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)}
    runner, session_create_ms, first_run_ms = measure_cold_start(
        lambda: backend.load(_variant(model_path), RunOptions(threads=1)), feeds
    )
    try:
        assert session_create_ms > 0 and first_run_ms > 0
        outputs = run_batched(runner, feeds, batch_size=4)
        np.testing.assert_allclose(outputs, feeds["x"] @ WEIGHT + BIAS, rtol=1e-5, atol=1e-6)
        result = evaluate_accuracy("classification", outputs, outputs, None, {})
        assert result.overall.metrics["agreement"] == 1.0
        points = measure_steady_state(runner, feeds, batch_sizes=[1, 16], warmup=2, iterations=20)
    finally:
        runner.close()
    assert [p.batch_size for p in points] == [1, 16]
    for point in points:
        assert 0 < point.p50_ms <= point.p95_ms <= point.p99_ms
        assert point.items_per_s > 0


def _near_tie_mlp(path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """relu(x @ w1) @ w2 with 2,048-long reductions and classes 0 and 1 tied to ~1e-6: a change in the order of
    the summation (threads splitting it, another kernel) flips the top class of some rows. Returns path, w1, w2."""
    rng = np.random.default_rng(1)
    w1 = (rng.standard_normal((2048, 256)) / 45).astype(np.float32)
    w2 = (rng.standard_normal((256, 4)) / 4).astype(np.float32)
    w2[:, 1] = w2[:, 0] + (rng.standard_normal(256) * 1e-7).astype(np.float32)
    w2[:, 2:] -= 10.0  # classes 0 and 1 on top
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "near_tie",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("w1", TensorProto.FLOAT, w1.shape, w1.ravel()),
         helper.make_tensor("w2", TensorProto.FLOAT, w2.shape, w2.ravel())],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path, w1, w2


def test_scored_outputs_do_not_depend_on_the_thread_count(tmp_path: Path) -> None:
    """A sweep scores a variant in the session it times, with latency.threads: the figures it reports as repeatable
    (docs/demo.md, "What is repeatable") must be the same bits whatever that count, across sessions and runs."""
    path, w1, w2 = _near_tie_mlp(tmp_path / "near_tie.onnx")
    x = np.random.default_rng(2).standard_normal((300, 2048)).astype(np.float32)
    in_float64 = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    assert np.mean(np.abs(in_float64[:, 0] - in_float64[:, 1]) < 1e-5) > 0.9  # the ties are real
    outputs = {}
    for threads in (1, 2, 4, 8, None, 1):
        runner = OnnxRuntimeCPU().load(_variant(path), RunOptions(threads=threads))
        try:
            outputs[threads] = run_batched(runner, {"x": x}, batch_size=32)
        finally:
            runner.close()
        np.testing.assert_array_equal(outputs[threads], outputs[1], err_msg=f"threads={threads}")
    # the model does tell summation orders apart: float64's order puts another class on top of some rows
    assert np.any(outputs[1].argmax(axis=1) != in_float64.argmax(axis=1))


def test_a_string_normalizer_whose_locale_is_missing_is_named_with_the_fix(tmp_path: Path) -> None:
    """skl2onnx's text vectorizers lowercase through a StringNormalizer without a locale attribute, which ONNX Runtime
    reads as en_US.UTF-8, a locale containers often lack: its refusal ended in a compiler's lambda name and 'install
    necessary language-pack-XX'. The error names the locale and the two ways out; the second says the attribute may
    have to be added (setting one skl2onnx wrote is not possible: it writes none)."""
    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, [None, 1])
    shapes = [onnx.numpy_helper.from_array(np.array(s, np.int64), n) for n, s in (("flat", [-1]), ("column", [-1, 1]))]
    nodes = [helper.make_node("Reshape", ["text", "flat"], ["words"]),
             helper.make_node("StringNormalizer", ["words"], ["lower"], case_change_action="LOWER",
                              locale="xx_NOWHERE.UTF-8"),
             helper.make_node("LabelEncoder", ["lower"], ["found"], domain="ai.onnx.ml", keys_strings=["a", "b"],
                              values_floats=[0.2, 0.8], default_float=0.5),
             helper.make_node("Reshape", ["found", "column"], ["score"])]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "g", [text], [score], shapes), ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("ai.onnx.ml", 3)])  # fmt: skip
    path = tmp_path / "text.onnx"
    onnx.save(model, str(path))
    with pytest.raises(QbenchError) as caught:
        OnnxRuntimeCPU().load(_variant(path), RunOptions())
    assert str(caught.value) == (
        f"variant fp32: onnxruntime cannot load {path}: a "
        "StringNormalizer node asks for the locale 'xx_NOWHERE.UTF-8', which this machine does not have; install it "
        "(e.g. `locale-gen xx_NOWHERE.UTF-8`) or give the node a locale attribute naming one that `locale -a` lists "
        "(C.UTF-8; a node without one, as skl2onnx writes it, asks for en_US.UTF-8)"
    )


def test_a_failing_run_is_raised_without_the_runtime_logging_it_too(tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture) -> None:
    """A kernel failing at run time (a Gather past its table, as ONNX Runtime 1.32's opset-23 Attention fails on a
    dynamo export's broadcast mask) is raised for qbench to report in one line; the runtime logged it to stderr too, a
    coloured `[E:onnxruntime ...] ExecuteKernel` block before that line, once for every run that failed."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=1)], "gather_past_the_table",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor("index", TensorProto.INT64, [1], [7])],
    )  # fmt: skip
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    runner = get_backend("onnxruntime-cpu").load(_variant(path), RunOptions(threads=1))
    capfd.readouterr()
    with pytest.raises(Exception, match="out of data bounds"):
        runner.run({"x": np.ones((2, 3), np.float32)})
    err = capfd.readouterr().err
    assert "E:onnxruntime" not in err and "ExecuteKernel" not in err, err
    runner.close()


def test_onnx_runtime_s_own_log_stays_out_of_a_sweep_s_output(tmp_path: Path) -> None:
    """A model carrying an unused initializer (as exporters leave them) made ONNX Runtime print a coloured
    `[W:onnxruntime:...] Removing initializer 'unused'` line amid the sweep's output from every session qbench does
    not configure itself: its calibrator's in the INT8 build, and range analysis's. Run as `qbench` runs, in a
    process of its own, as the runtime's log is the process's."""
    import subprocess

    import yaml

    rng = np.random.default_rng(0)
    unused = onnx.numpy_helper.from_array(np.ones(4, np.float32), "unused")
    weight = onnx.numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "unused_initializer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
                              [weight, unused])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "rows.npz", x=rng.normal(size=(48, 3)).astype(np.float32), label=rng.integers(0, 2, 48))
    recipe = {"name": "unused", "model": {"path": "model.onnx"},
              "data": {"path": "rows.npz", "inputs": {"x": "x"}, "label": "label", "calibration": {"samples": 16}},
              "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", str(tmp_path / "recipe.yaml"), "--no-track"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "int8" in done.stdout + done.stderr
    assert "onnxruntime:" not in done.stderr
