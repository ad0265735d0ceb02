"""One-line error messages (qbench.errors)."""

from __future__ import annotations

import errno

import pytest

from qbench.errors import MissingExtraError, QbenchError, environment_cause, expected_one_of


def test_expected_one_of_lists_choices_sorted_and_suggests_the_nearest() -> None:
    assert expected_one_of("labl", ["split", "label"]) == ("got 'labl', expected one of label, "
                                                           "split (did you mean 'label'?)")


def test_choices_that_would_read_as_others_are_quoted() -> None:
    """A header ' s' listed bare read as the column s; an empty name, or one holding the list's comma, vanished."""
    message = expected_one_of("s", ["f0", " s", "a,b", ""])
    assert message.startswith("got 's', expected one of ''") and "' s'" in message and "'a,b'" in message
    assert ", f0" in message and "'f0'" not in message


def test_names_that_do_not_print_as_themselves_are_quoted_in_lists_and_output_descriptions() -> None:
    """A converter's output 'a\nb' was listed raw: the one-line error read 'expected one of a b'."""
    import numpy as np

    from qbench.modelinfo.signature import TensorMeta

    message = expected_one_of("x", ["a\nb", "tab\there", "input_1:0", "é"])
    assert message == "got 'x', expected one of 'a\\nb', input_1:0, 'tab\\there', é"
    assert TensorMeta("a\nb", np.dtype("float32"), (None, 3)).describe() == "'a\\nb' (float32, [None, 3])"
    assert TensorMeta("logits:0", np.dtype("float32"), (None, 3)).describe() == "logits:0 (float32, [None, 3])"


def _raised_from(cause: BaseException, *, hide: bool = False) -> QbenchError:
    try:
        try:
            raise cause
        except BaseException:
            if hide:
                raise QbenchError("the variant failed") from None
            raise QbenchError("cannot write to the run folder") from cause
    except QbenchError as exc:
        return exc


@pytest.mark.parametrize(("exc", "cause"), [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    (OSError(errno.EROFS, "Read-only file system"), "a read-only file system"),  # was the variant's: not resumed
    (OSError(errno.EFBIG, "File too large"), "a file size limit"),  # `ulimit -f`: was the variant's, not resumed
    (MemoryError(), "out of memory"),
    (TimeoutError("timed out"), "a timeout"),
    (ConnectionResetError("reset"), "a lost connection"),
    (FileNotFoundError(errno.ENOENT, "No such file"), None),
    (ValueError("bad graph"), None),
])  # fmt: skip
def test_a_failure_of_the_machine_is_told_from_the_variants_own_along_the_chain_of_causes(
    exc: BaseException, cause: str | None
) -> None:
    assert environment_cause(exc) == cause
    assert environment_cause(_raised_from(exc)) == cause
    assert environment_cause(_raised_from(exc, hide=True)) is None  # `from None`: not its cause


def _onnxruntime_error(size: int, *, arena: bool) -> Exception:
    """What ONNX Runtime's CPU provider really raises running an Expand to `size` floats (a failed allocation when
    `size` cannot fit: Fail from its arena, RuntimeException with std::bad_alloc without one)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 4
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    try:
        session.run(None, {"x": np.ones(1, np.float32), "shape": np.array(size, np.int64).reshape(1)})
    except Exception as exc:  # noqa: BLE001 - the error is the point
        return exc
    raise AssertionError("onnxruntime ran it")


@pytest.mark.parametrize("arena", [True, False])
def test_onnxruntimes_own_allocation_failure_is_out_of_memory(arena: bool) -> None:
    """ONNX Runtime raises its own Fail / RuntimeException, not MemoryError, when an allocation fails: the job was
    recorded as the variant's own failure, and --resume reused it as failed rather than run it again."""
    exc = _onnxruntime_error(2**45, arena=arena)
    assert type(exc).__module__.startswith("onnxruntime") and not isinstance(exc, MemoryError)
    assert environment_cause(exc) == "out of memory"
    assert environment_cause(_raised_from(exc)) == "out of memory"
    wrapped = QbenchError(f"variant fp16: onnxruntime cannot load m.onnx: {exc}")  # as backends re-raise it `from None`
    assert environment_cause(wrapped) == "out of memory"


def test_onnxruntimes_other_failures_stay_the_variants_own() -> None:
    exc = _onnxruntime_error(-3, arena=True)  # an invalid shape: the graph's own error
    assert type(exc).__module__.startswith("onnxruntime")
    assert environment_cause(exc) is None


def test_torchs_allocation_failures_are_out_of_memory() -> None:
    """torch's CPU allocator raises a plain RuntimeError; CUDA's raises torch.OutOfMemoryError (a RuntimeError)."""
    import torch

    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2**62, dtype=torch.uint8)
    assert not isinstance(cpu.value, MemoryError)
    assert environment_cause(cpu.value) == "out of memory"
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 "
                                  "GiB. GPU 0 has a total capacity of 79 GiB")
    assert environment_cause(cuda) == "out of memory"


@pytest.mark.parametrize("message", [
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. Name:'mm' "
    "Status Message: /onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:123 CUDA failure 2: out of memory "
    "; GPU=0 ; hostname=gpu-1 ; expr=cudaMalloc((void**)&p, size);",
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. Name:'c' Status Message: "
    "/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal("
    "size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Available memory of 0 is smaller than "
    "requested bytes of 4194304",
    "[ONNXRuntimeError] : 1 : FAIL : CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0",
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Gemm node. Name:'g' "
    "Status Message: bad allocation",
])  # fmt: skip
def test_onnxruntime_cuda_providers_allocation_failures_are_out_of_memory(message: str) -> None:
    """The CUDA provider's messages, raised as ONNX Runtime raises them (its exception types take the message)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, RuntimeException

    kind = RuntimeException if "RUNTIME_EXCEPTION" in message else Fail
    assert environment_cause(kind(message)) == "out of memory"


def test_an_unexpected_error_is_described_with_what_the_machine_ran_into(monkeypatch):
    """A MemoryError carries no message: the CLI printed `qbench: error: MemoryError: ` and nothing more."""
    import qbench.cli.gate as cli_gate

    monkeypatch.setattr(cli_gate, "address_space_note", lambda: "; ulimit -v lets this process map at most 195 MiB")
    assert cli_gate.describe(MemoryError()) == ("MemoryError (out of memory; ulimit -v "
                                                "lets this process map at most 195 MiB)")
    assert cli_gate.describe(OSError(errno.ENOSPC, "No space left on device")) == (
        "OSError: [Errno 28] No space left on device (no space left on device)")
    assert cli_gate.describe(ValueError("bad value")) == "ValueError: bad value"  # a bug: as before
    assert cli_gate.describe(KeyError()) == "KeyError"
    # CPython's failure of a C function that set no exception, as `compile` gave importing under `ulimit -v 200 MiB`
    null = SystemError("<built-in function compile> returned NULL without setting an exception")
    assert cli_gate.describe(null) == (f"SystemError: {null} (perhaps out of memory; ulimit -v lets this process map "
                                       "at most 195 MiB)")  # fmt: skip
    mapped = ImportError("/x/groupby.so: failed to map segment from shared object")  # the loader's, as pandas' gave
    assert cli_gate.describe(mapped) == (f"ImportError: {mapped} (out of memory; ulimit -v lets this process map at "
                                         "most 195 MiB)")  # fmt: skip
    monkeypatch.setattr(cli_gate, "address_space_note", lambda: "")  # no limit set: no guess about memory
    assert cli_gate.describe(null) == f"SystemError: {null}"


@pytest.mark.parametrize(("error", "describing", "said"), [
    (MemoryError(), MemoryError(), "MemoryError (out of memory; ulimit -v lets this process map at most 200 MiB)"),
    (SystemError(), MemoryError(), "SystemError (out of memory; ulimit -v lets this process map at most 200 MiB)"),
    (MemoryError(), RuntimeError("str failed"),
     "MemoryError (out of memory; ulimit -v lets this process map at most 200 MiB)"),
    (ValueError("x"), RuntimeError("str failed"), "ValueError"),  # nothing says memory ran short: the type alone
])  # fmt: skip
def test_the_last_words_name_the_memory_limit_when_describing_the_error_ran_out_of_memory(
    monkeypatch, capfd, error, describing, said
):
    """Under `ulimit -v 200 MiB` a validate ended `qbench: error: MemoryError` (or `SystemError`) alone in two runs of
    three: describing the error needed memory too, and its fallback dropped the limit that docs/ci.md's line names."""
    import qbench.cli.app as cli_app

    def fails(exc):
        raise describing

    monkeypatch.setattr(cli_app, "describe", fails)
    monkeypatch.setattr(cli_app, "_OUT_OF_MEMORY", " (out of memory; ulimit -v lets this process map at most 200 MiB)")
    cli_app._last_words(error)
    assert capfd.readouterr().err == f"qbench: error: {said}\n"


def test_a_package_that_is_installed_but_cannot_load_is_not_called_missing() -> None:
    """Under `ulimit -v 400 MiB`, importing onnxruntime failed to map a shared library and qbench said `onnxruntime is
    not installed: install it with pip install 'qbench[cpu]'`, a fix for a package that was installed."""
    lib = ".venv/lib/python3.11/site-packages/onnxruntime/capi/onnxruntime_pybind11_state.so"
    try:
        raise ImportError(f"{lib}: failed to map segment from shared object")
    except ImportError:
        error = MissingExtraError("onnxruntime", "cpu")
    assert str(error) == (f"onnxruntime is installed but could not be loaded ({lib}: failed to map segment from shared "
                          "object); if it is a broken install, reinstall it with `pip install --force-reinstall "
                          "'qbench[cpu]'`")  # fmt: skip
    try:
        raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")
    except ImportError:
        error = MissingExtraError("onnxruntime", "cpu")
    assert str(error) == "onnxruntime is not installed: install it with `pip install 'qbench[cpu]'`"
    assert str(MissingExtraError("tensorrt", "tensorrt", hint="see NVIDIA's index")) == (
        "tensorrt is not installed: install it with `pip install 'qbench[tensorrt]'`. see NVIDIA's index")


def test_one_line_joins_lines_but_keeps_the_spaces_of_a_quoted_value() -> None:
    """Every run of whitespace was made one space: a value of two spaces, or a node 'a  b', was shown otherwise."""
    from qbench.errors import one_line

    assert one_line("no node named 'a  b'\n    (did you mean 'a  c'?)\t ") == ("no node named 'a  b' "
                                                                               "(did you mean 'a  c'?)")
    assert one_line("x \r\n\n  y\u2028z") == "x y z" and one_line("1\u00a0000") == "1\u00a0000"
