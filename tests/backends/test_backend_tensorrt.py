"""The TensorRT backend: clear errors without TensorRT or a GPU, the pure parts of engine building
(tensorrt_spec: network mode, profile, cache key, model hash, what TensorRT cannot run), the runner's engine
switching on stand-in engines (all run everywhere), and a real engine against ORT CPU (marked gpu)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from matmul_model import WEIGHT, save_onnx
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import get_backend
from qbench.backends import onnxruntime_gpu as gpu_module
from qbench.backends import tensorrt as trt_module
from qbench.backends.base import Backend, Runner, RunOptions
from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.backends.onnxruntime_gpu import GpuProbe
from qbench.backends.tensorrt import EnginePlan, TensorRT, TensorRTRunner
from qbench.backends.tensorrt_spec import (
    DEFAULT_MAX_BATCH,
    ENGINE_SETTINGS,
    InputRange,
    engine_cache_key,
    engine_profile,
    engine_settings,
    max_batch_size,
    model_sha256,
    profile_covers,
    tensorrt_onnx,
    unsupported_by_tensorrt,
)
from qbench.cli.app import main
from qbench.errors import MissingExtraError, QbenchError
from qbench.modelinfo.signature import read_model_info
from qbench.variants.base import BuiltVariant


def _qdq_model(path: Path, zero_point_type: int, zero_point: int) -> Path:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul, with the given activation zero point."""
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["xq"], name="quant_x"),
            helper.make_node("DequantizeLinear", ["xq", "scale", "zp"], ["xd"], name="dequant_x"),
            helper.make_node("MatMul", ["xd", "w"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor("scale", TensorProto.FLOAT, [], [0.05]),
            helper.make_tensor("zp", zero_point_type, [], [zero_point]),
            helper.make_tensor("w", TensorProto.FLOAT, [3, 2], WEIGHT.ravel()),
        ],
    )
    return save_onnx(graph, path)


def _variant(path: Path, precision: str = "fp32", **params: str) -> BuiltVariant:
    return BuiltVariant(name=precision, precision=precision, onnx_path=path, params=dict(params))


# -- availability errors (run everywhere) ---------------------------------------------------------


def test_registered_backend_meets_the_protocol() -> None:
    backend = get_backend("tensorrt")
    assert isinstance(backend, TensorRT) and isinstance(backend, Backend) and backend.name == "tensorrt"


def test_missing_tensorrt_names_the_extra_and_nvidias_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail, installed or not
    with pytest.raises(MissingExtraError) as caught:
        TensorRT().check_available()
    assert caught.value.extra == "tensorrt"
    message = str(caught.value)
    assert "pip install 'qbench[tensorrt]'" in message
    assert "pip install --extra-index-url https://pypi.nvidia.com tensorrt" in message


def test_tensorrt_without_a_visible_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    monkeypatch.setattr(gpu_module, "probe_gpus", lambda: GpuProbe((), "the NVIDIA driver reports no GPU"))
    with pytest.raises(QbenchError, match="no NVIDIA GPU visible: the NVIDIA driver reports no GPU; tensorrt") as e:
        TensorRT().check_available()
    assert not isinstance(e.value, MissingExtraError)


def test_validate_names_the_backend_field_and_the_extra(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    (tmp_path / "data.csv").write_text("a\n1\n2\n")
    recipe = tmp_path / "trt.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "trt-check", "model": {"path": str(model_path)}, "data": {"path": "data.csv", "inputs": {"a": "x"}},
        "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu", "tensorrt"],
    }))  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    assert "trt.yaml: backends[1]: tensorrt is not installed: install it with `pip install 'qbench[tensorrt]'`" in err
    assert "https://pypi.nvidia.com" in err


# -- what an engine is built from (pure) ---------------------------------------------------------------


def test_network_mode_follows_the_precision() -> None:
    assert engine_settings("fp16").set_flags == ("FP16",) and not engine_settings("fp16").strongly_typed
    assert engine_settings("bf16").set_flags == ("BF16",)
    assert engine_settings("fp32").cleared_flags == ("TF32",) and engine_settings("fp32").strongly_typed
    for quantized in ("int8", "fp8"):  # explicit quantization: types from the Q/DQ nodes, no precision flags
        settings = engine_settings(quantized)
        assert settings.strongly_typed and settings.set_flags == () and settings.cleared_flags == ()
    with pytest.raises(QbenchError, match="did you mean 'fp16'"):
        engine_settings("fp61")


def test_profile_spans_the_batch_and_fixes_other_dynamic_dims() -> None:
    image = {"input": (None, 1, 8, 8)}
    [r] = engine_profile(image, max_batch=64)
    assert (r.name, r.min, r.opt, r.max) == ("input", (1, 1, 8, 8), (64, 1, 8, 8), (64, 1, 8, 8))
    text = {"ids": (None, None), "mask": (None, None)}
    assert engine_profile(text, max_batch=32) is None  # the sequence length is not known before a batch runs
    ids, mask = engine_profile(text, max_batch=32, observed={"ids": (4, 128), "mask": (4, 128)})
    assert ids == InputRange("ids", (1, 128), (32, 128), (32, 128)) and mask.max == (32, 128)
    [static] = engine_profile({"x": (2, 3)}, max_batch=64)
    assert static.min == static.max == (2, 3)  # a static batch stays what the model says


def test_profile_covers_only_shapes_within_every_range() -> None:
    profile = (InputRange("ids", (1, 128), (32, 128), (32, 128)),)
    assert profile_covers(profile, {"ids": (1, 128)}) and profile_covers(profile, {"ids": (32, 128)})
    assert not profile_covers(profile, {"ids": (33, 128)})
    assert not profile_covers(profile, {"ids": (4, 64)})
    assert not profile_covers(profile, {"ids": (4, 128, 1)})
    assert not profile_covers(profile, {"mask": (4, 128)})


def test_cache_key_changes_with_everything_an_engine_depends_on() -> None:
    profile = engine_profile({"x": (None, 3)}, max_batch=64)
    base = {"model_sha256": "ab" * 32, "settings": ENGINE_SETTINGS["fp32"], "profile": profile,
            "tensorrt_version": "10.13.0", "gpu_name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    key = engine_cache_key(**base)
    assert key == engine_cache_key(**base) and len(key) == 64
    changes = {
        "model_sha256": "cd" * 32,
        "settings": ENGINE_SETTINGS["fp16"],
        "profile": engine_profile({"x": (None, 3)}, max_batch=32),
        "tensorrt_version": "10.14.1",
        "gpu_name": "NVIDIA L4",
    }
    keys = {field: engine_cache_key(**{**base, field: value}) for field, value in changes.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(changes), keys
    assert engine_cache_key(**{**base, "settings": ENGINE_SETTINGS["int8"]}) != engine_cache_key(
        **{**base, "settings": ENGINE_SETTINGS["bf16"]}
    )


def test_model_hash_is_by_content_and_includes_external_data(tmp_path: Path, model_path: Path) -> None:
    copy = tmp_path / "renamed.onnx"
    copy.write_bytes(model_path.read_bytes())
    assert model_sha256(copy) == model_sha256(model_path)  # the variant's file name does not matter
    model = onnx.load(str(model_path))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(WEIGHT, "w"))  # raw bytes: can go external
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=0)  # fmt: skip
    before = model_sha256(tmp_path / "ext.onnx")
    data = tmp_path / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:-4] + np.float32(9.0).tobytes())  # same graph file, other weights
    assert model_sha256(tmp_path / "ext.onnx") != before


def test_model_hash_includes_external_data_held_by_a_subgraph(tmp_path: Path) -> None:
    """onnx's save_as_external_data moves every tensor out, an If branch's weights too: the engine cache key used to
    hash only the main graph's initializers' files, so other weights in a branch reused the stale engine."""
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    branch = helper.make_graph([helper.make_node("MatMul", ["x", "w_branch"], ["out"])], "then", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                               [numpy_helper.from_array(weight, "w_branch")])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)], "if_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "branch.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="branch.onnx.data", size_threshold=0)
    before = model_sha256(path)
    data = tmp_path / "branch.onnx.data"
    data.write_bytes(data.read_bytes()[:-4] + np.float32(-1.0).tobytes())  # same graph file, other branch weights
    assert model_sha256(path) != before


def test_what_tensorrt_cannot_run_is_named(tmp_path: Path, model_path: Path) -> None:
    assert unsupported_by_tensorrt(model_path) is None
    assert unsupported_by_tensorrt(_qdq_model(tmp_path / "sym.onnx", TensorProto.INT8, 0)) is None
    asymmetric = unsupported_by_tensorrt(_qdq_model(tmp_path / "asym.onnx", TensorProto.INT8, 3))
    assert asymmetric is not None and "'quant_x'" in asymmetric and "symmetric_activations: true" in asymmetric
    assert "uint8" in (unsupported_by_tensorrt(_qdq_model(tmp_path / "u8.onnx", TensorProto.UINT8, 0)) or "")
    dynamic = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
         helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["y"])],
        "dynamic_int8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 2])],
        [helper.make_tensor("w", TensorProto.UINT8, [3, 2], [1, 2, 3, 4, 5, 6])],
    )  # fmt: skip
    reason = unsupported_by_tensorrt(save_onnx(dynamic, tmp_path / "dyn.onnx"))
    assert reason is not None and "DynamicQuantizeLinear, MatMulInteger" in reason


def test_supports_checks_the_file_the_precision_and_the_graph(tmp_path: Path, model_path: Path) -> None:
    backend = TensorRT()
    assert backend.supports(_variant(model_path)) is None
    assert "not found" in (backend.supports(_variant(tmp_path / "missing.onnx")) or "")
    assert "network mode" in (backend.supports(_variant(model_path, "int4")) or "")
    asymmetric = _qdq_model(tmp_path / "asym.onnx", TensorProto.UINT8, 128)
    assert "symmetric" in (backend.supports(_variant(asymmetric, "int8")) or "")


def test_tensorrt_specific_export_and_batch_sizes(tmp_path: Path, model_path: Path) -> None:
    special = tmp_path / "fp8.trt.onnx"
    assert tensorrt_onnx(_variant(model_path, "fp8", tensorrt_onnx=str(special))) == special
    assert tensorrt_onnx(_variant(model_path, "fp8")) == model_path
    assert max_batch_size(RunOptions(threads=1)) == DEFAULT_MAX_BATCH

    @dataclass(frozen=True)
    class WithBatchSizes(RunOptions):  # what the lead may add to RunOptions
        batch_sizes: tuple[int, ...] = ()

    assert max_batch_size(WithBatchSizes(batch_sizes=(1, 128, 32))) == 128
    assert max_batch_size(WithBatchSizes()) == DEFAULT_MAX_BATCH


# -- engine building and caching, on a stand-in for the tensorrt module --------------------------------------


class _FakeTensorRT:
    """The slice of TensorRT's Python API that build_engine uses, recording what it is asked to do."""

    __version__ = "10.99-standin"
    NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=3)
    BuilderFlag = types.SimpleNamespace(FP16="FP16", BF16="BF16", TF32="TF32")

    def __init__(self, parses: bool = True, builds: bool = True) -> None:
        self.parses, self.builds = parses, builds
        self.network_flags: list[int] = []
        self.set_flags: list[str] = []
        self.cleared_flags: list[str] = []
        self.shapes: list[tuple] = []
        self.builds_done = 0

    def Builder(self, logger: object) -> _FakeTensorRT:
        return self

    def create_network(self, flags: int) -> str:
        self.network_flags.append(flags)
        return "network"

    def OnnxParser(self, network: str, logger: object) -> types.SimpleNamespace:
        error = types.SimpleNamespace(desc=lambda: "No importer registered for op: Foo")
        return types.SimpleNamespace(parse_from_file=lambda path: self.parses, num_errors=1, get_error=lambda i: error)

    def create_builder_config(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(set_flag=self.set_flags.append, clear_flag=self.cleared_flags.append,
                                     add_optimization_profile=lambda profile: None)  # fmt: skip

    def create_optimization_profile(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(set_shape=lambda *shape: self.shapes.append(shape))

    def build_serialized_network(self, network: str, config: object) -> bytes | None:
        self.builds_done += 1
        return b"serialised engine" if self.builds else None


def _logger(*errors: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(errors=list(errors))


def test_build_engine_asks_for_the_settings_network_mode_and_profile(model_path: Path) -> None:
    profile = engine_profile({"x": (None, 3)}, max_batch=64)
    fp16 = _FakeTensorRT()
    assert (
        trt_module.build_engine(fp16, model_path, engine_settings("fp16"), profile, _logger()) == b"serialised engine"
    )
    assert fp16.network_flags == [0] and fp16.set_flags == ["FP16"] and fp16.shapes == [("x", (1, 3), (64, 3), (64, 3))]
    int8 = _FakeTensorRT()
    trt_module.build_engine(int8, model_path, engine_settings("int8"), profile, _logger())
    assert int8.network_flags == [1 << 3] and int8.set_flags == [] and int8.cleared_flags == []
    fp32 = _FakeTensorRT()
    trt_module.build_engine(fp32, model_path, engine_settings("fp32"), profile, _logger())
    assert fp32.cleared_flags == ["TF32"]


def test_build_engine_failures_are_one_line_user_errors(model_path: Path) -> None:
    profile = engine_profile({"x": (None, 3)}, max_batch=8)
    with pytest.raises(QbenchError, match="cannot parse .*No importer registered for op: Foo"):
        trt_module.build_engine(_FakeTensorRT(parses=False), model_path, engine_settings("fp32"), profile, _logger())
    with pytest.raises(QbenchError, match="could not build an engine .*: out of memory"):
        trt_module.build_engine(_FakeTensorRT(builds=False), model_path, engine_settings("fp32"), profile,
                                _logger("out of memory"))  # fmt: skip


def test_engine_source_builds_once_then_reads_the_cache(tmp_path: Path, model_path: Path) -> None:
    fake = _FakeTensorRT()
    settings = engine_settings("fp16")
    source = trt_module.EngineSource(fake, model_path, settings, "GPU", tmp_path, _logger())  # type: ignore[arg-type]
    profile = engine_profile({"x": (None, 3)}, max_batch=64)
    first = source.plan(profile)
    again = source.plan(profile)
    assert (first.cache_hit, again.cache_hit) == (False, True) and fake.builds_done == 1
    assert again.data == first.data == b"serialised engine" and again.path == first.path
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no partial file left behind
    source.plan(engine_profile({"x": (None, 3)}, max_batch=128))
    assert fake.builds_done == 2  # another profile is another engine


# -- the runner's engine switching, on stand-in engines ----------------------------------------------------


class _FakeSource:
    """EngineSource's interface: plans carry the profile; the first one counts as a cache miss."""

    def __init__(self) -> None:
        self.settings = ENGINE_SETTINGS["fp32"]
        self.gpu_name = "stand-in GPU"
        self.logger = None
        self.profiles: list[tuple[InputRange, ...]] = []

    def plan(self, profile: tuple[InputRange, ...]) -> EnginePlan:
        self.profiles.append(profile)
        return EnginePlan(b"", Path(f"/cache/{len(self.profiles)}.engine"), len(self.profiles) > 1, 1.5, profile)


class _FakeEngine:
    """LoadedEngine's interface; 'runs' the model on the host (y = x @ WEIGHT, else a sum) in 0.25 ms of GPU time."""

    def __init__(self, trt: object, torch: object, plan: EnginePlan, outputs: list[str], logger: object) -> None:
        self.plan, self.outputs = plan, outputs

    def execute(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
        if "x" in feeds:
            return [feeds["x"] @ WEIGHT], 0.25
        return [np.array(sum(float(a.sum()) for a in feeds.values()), dtype=np.float32)], 0.25

    def release(self) -> None:
        self.plan = None


@pytest.fixture()
def fake_runner(monkeypatch: pytest.MonkeyPatch, model_path: Path) -> tuple[TensorRTRunner, _FakeSource]:
    monkeypatch.setattr(trt_module, "LoadedEngine", _FakeEngine)
    source = _FakeSource()
    fake_trt = types.SimpleNamespace(__version__="10.99")
    runner = TensorRTRunner(fake_trt, None, source, read_model_info(model_path), max_batch=8)  # type: ignore[arg-type]
    runner.start()
    return runner, source


def test_runner_builds_at_start_and_switches_engines_for_bigger_batches(
    fake_runner: tuple[TensorRTRunner, _FakeSource],
) -> None:
    runner, source = fake_runner
    assert isinstance(runner, Runner)
    assert [r.max for r in source.profiles[0]] == [(8, 3)]  # built at start: only the batch is dynamic
    x = np.ones((8, 3), dtype=np.float32)
    np.testing.assert_allclose(runner.run({"x": x})[0], x @ WEIGHT)
    runner.run({"x": x[:1]})
    assert len(source.profiles) == 1  # batches 8 and 1 are inside the profile
    runner.run({"x": np.ones((20, 3), dtype=np.float32)})
    assert [r.max for r in source.profiles[1]] == [(20, 3)]  # a bigger batch got an engine that covers it
    described = runner.describe()
    assert described["engines_used"] == 2 and described["engine_cache"] == "hit"
    assert described["gpu_compute_ms"] == {
        "1": {"p50": 0.25, "p99": 0.25, "runs": 1},
        "8": {"p50": 0.25, "p99": 0.25, "runs": 1},
        "20": {"p50": 0.25, "p99": 0.25, "runs": 1},
    }
    assert described["profile"] == {"x": {"min": (1, 3), "opt": (20, 3), "max": (20, 3)}}
    assert described["network"] == "strongly typed, -TF32" and described["device"] == "stand-in GPU"


def test_runner_rejects_missing_inputs_and_use_after_close(fake_runner: tuple[TensorRTRunner, _FakeSource]) -> None:
    runner, _ = fake_runner
    with pytest.raises(QbenchError, match="lack model input"):
        runner.run({"y": np.ones((1, 3), dtype=np.float32)})
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.run({"x": np.ones((1, 3), dtype=np.float32)})


def test_runner_defers_the_build_when_a_dimension_needs_a_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["ids"], ["total"], keepdims=0)],
        "seq",
        [helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["batch", "sequence"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
    )
    path = save_onnx(graph, tmp_path / "seq.onnx")
    monkeypatch.setattr(trt_module, "LoadedEngine", _FakeEngine)
    source = _FakeSource()
    fake_trt = types.SimpleNamespace(__version__="10.99")
    runner = TensorRTRunner(fake_trt, None, source, read_model_info(path), 16)  # type: ignore[arg-type]
    runner.start()
    assert source.profiles == [] and "engine_cache" not in runner.describe()
    [total] = runner.run({"ids": np.ones((4, 128), dtype=np.float32)})
    assert float(total) == 512.0
    assert [(r.min, r.max) for r in source.profiles[0]] == [((1, 128), (16, 128))]  # fixed to the batch's length


# -- on a GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_engine_matches_onnxruntime_cpu_and_is_cached(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install 'qbench[tensorrt]')")
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    backend = TensorRT()
    backend.check_available()
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    cpu = OnnxRuntimeCPU().load(_variant(model_path), RunOptions())
    expected = cpu.run({"x": x})[0]
    cpu.close()
    for expected_cache in ("miss", "hit"):
        runner = backend.load(_variant(model_path), RunOptions())
        try:
            np.testing.assert_allclose(runner.run({"x": x})[0], expected, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(runner.run({"x": x[:1]})[0], expected[:1], rtol=1e-4, atol=1e-5)
            described = runner.describe()
            assert described["engine_cache"] == expected_cache and described["engines_used"] == 1
            assert described["gpu_compute_ms"]["16"]["runs"] == 1 and described["gpu_compute_ms"]["16"]["p50"] > 0
        finally:
            runner.close()
    assert len(list((tmp_path / "cache" / "engines").glob("*.engine"))) == 1


@pytest.mark.gpu
def test_fp16_engine_stays_close_to_fp32(model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install 'qbench[tensorrt]')")
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    runner = TensorRT().load(_variant(model_path, "fp16"), RunOptions())
    try:
        np.testing.assert_allclose(runner.run({"x": x})[0], x @ WEIGHT, rtol=1e-2, atol=1e-2)
        assert runner.describe()["network"] == "weakly typed, +FP16"
    finally:
        runner.close()
