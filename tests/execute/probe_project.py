"""A user's project for the execution tests: the tumour MLP (tests/user_model.py) with a custom metric that
is also a probe, so a test can see, count and disturb the measure jobs wherever they run.

The metric (`probe_<tag>:agreement_probe`, top-1 accuracy) appends its process id to `calls.log` next to
it on every call, and obeys two control files there:

    interrupt_at   holds N: on the N-th call, SIGINT to its own process (the sweep's, with the local executor)
    segv_at        holds N (or N M ...): the N-th call kills its own process with SIGSEGV, once (a native library's
                   crash), then the M-th...
    kill_tree_at   holds N: the N-th call stops its parent (the supervising `qbench` process: SIGSTOP, it records
                   nothing then), writes `tree_stopped`, and kills its own process (SIGKILL), once; the test then
                   kills the parent (the whole process tree killed from outside: a cancelled CI job)
    hang_once      the first call that sees it writes `worker.pid` and sleeps, so the test can kill that process
    hold_after     holds N: every call after the N-th waits while the file exists (a job held mid-measurement)
    fail_at        holds N and an errno name (ENOSPC), MemoryError, ValueError or OnnxRuntimeMemory (ONNX Runtime's
                   own error for an allocation it could not make, raised by ONNX Runtime): the N-th call raises it,
                   once; with a count K after it, the K calls from the N-th (a metric raising on every scope of one job)

It is a fixture builder, not a test module.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

VARIANTS = ["fp16", "int8-minmax"]  # the sweep the executor tests run (with FP32: three measure jobs)

PROBE_SOURCE = '''\
import errno
import os
import signal
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def _onnxruntime_out_of_memory():
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones(1, np.float32), "shape": np.array([2**45], np.int64)})  # 128 TiB: it fails


def agreement_probe(outputs, labels):
    calls = HERE / "calls.log"
    with calls.open("a") as log:
        log.write(f"{os.getpid()}\\n")
    count = len(calls.read_text().splitlines())
    stop = HERE / "interrupt_at"
    if stop.is_file() and count >= int(stop.read_text()):
        stop.unlink()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises in the main thread before this ends
    segv = HERE / "segv_at"
    if segv.is_file() and count >= int(segv.read_text().split()[0]):
        later = segv.read_text().split()[1:]
        if later:
            segv.write_text(" ".join(later))
        else:
            segv.unlink()
        os.kill(os.getpid(), signal.SIGSEGV)
    tree = HERE / "kill_tree_at"
    if tree.is_file() and count >= int(tree.read_text()):
        tree.unlink()
        os.kill(os.getppid(), signal.SIGSTOP)
        (HERE / "tree_stopped").write_text("stopped")
        os.kill(os.getpid(), signal.SIGKILL)
    fail = HERE / "fail_at"
    if fail.is_file() and count >= int(fail.read_text().split()[0]):
        first, what, *times = fail.read_text().split()
        if count + 1 >= int(first) + int(times[0] if times else 1):
            fail.unlink()
        if what == "MemoryError":
            raise MemoryError()
        if what == "OnnxRuntimeMemory":
            _onnxruntime_out_of_memory()
        if what == "ValueError":
            raise ValueError("this variant's outputs cannot be scored")
        code = getattr(errno, what)
        raise OSError(code, os.strerror(code))
    hold = HERE / "hold_after"
    while hold.is_file() and count > int(hold.read_text() or 0):
        time.sleep(0.05)
    hang = HERE / "hang_once"
    if hang.is_file():
        hang.unlink()
        (HERE / "worker.pid").write_text(str(os.getpid()))
        time.sleep(120)
    return float(np.mean(np.argmax(outputs, axis=1) == labels))
'''


def write_probe_recipe(
    project: Path, target: Path, *, variants: list[str], executor: dict[str, Any] | None = None
) -> Path:
    """The user's recipe in `target` with only `variants`, 5 timed runs at batch 1, the probe metric (a module
    name of its own, so modules cached by earlier tests are not reused), a build store and reports in `target`."""
    recipe = yaml.safe_load((project / "qbench.yaml").read_text())
    module = f"probe_{secrets.token_hex(4)}"
    (target / f"{module}.py").write_text(PROBE_SOURCE)
    recipe["model"]["path"] = str(project / recipe["model"]["path"])
    recipe["data"]["path"] = str(project / recipe["data"]["path"])
    recipe["variants"] = [v for v in recipe["variants"] if v["name"] in variants]
    recipe["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 5, "threads": 1, "stability": None}
    recipe["metrics"] = [{"name": "probe", "function": f"{module}:agreement_probe", "higher_is_better": True}]
    recipe["tracking"]["uri"] = f"sqlite:///{target / 'mlflow.db'}"
    recipe["output_dir"] = str(target / "reports")
    recipe["analysis"] = {"ranges": False}
    recipe["gate"]["applies_to"] = ["*"]
    recipe["executor"] = {"store": str(target / "store"), **(executor or {})}
    path = target / "qbench.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def probe_calls(target: Path) -> list[int]:
    """The process id of every probe call so far."""
    log = target / "calls.log"
    return [int(line) for line in log.read_text().split()] if log.is_file() else []


def figures(results: Any) -> dict[str, dict[str, Any]]:
    """variant@backend -> status and every accuracy metric, overall and per slice (what must not change)."""
    table = {}
    for v in results.variants:
        accuracy = v.accuracy
        slices = {s.name: s.metrics for s in accuracy.slices} if accuracy else {}
        table[v.key] = {"status": v.status, "overall": accuracy.overall.metrics if accuracy else None, **slices}
    return table
