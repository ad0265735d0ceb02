"""Are qbench's CPU figures for FP16, BF16 and FP8 what a GPU computing natively in those types gives?

On a CPU, qbench measures an FP16/BF16/FP8 variant by running its ONNX graph on ONNX Runtime, which
computes much of it in float32 (an emulation). This bench runs the same variants natively on an NVIDIA
GPU (the torch-cuda backend: the module in float16/bfloat16, FP8 through torchao's float8 linears) and
compares, per precision, on the recipe's evaluation rows:

- the error qbench predicts on the CPU (SQNR of the ONNX Runtime CPU outputs vs FP32 on the CPU),
- the error the GPU really makes (SQNR of the GPU outputs vs FP32 on the GPU),
- how far the CPU figure is from the GPU's (SQNR of CPU vs GPU outputs of the same precision),
- the task metric's drop vs FP32 on each, and the share of rows where both agree (top-1 / same sign).

An emulation is faithful when its predicted error is about the real one (SQNRs within a few dB) and its
metric drop is the GPU's. FP8 differs by construction: the ONNX variant uses static calibrated scales,
torchao's float8 dynamic per-tensor scales; the bench shows by how much.

    python bench/gpu_fidelity.py [--models digits,minilm] [--eval-limit N] [--out bench/out/gpu_fidelity.json]

Without a visible NVIDIA GPU it says so, writes a JSON file that says so, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import MODELS, Settings, environment, importable_from, model_recipe  # noqa: E402

PRECISIONS = ({"name": "fp16", "precision": "fp16"}, {"name": "bf16", "precision": "bf16"},
              {"name": "fp8", "precision": "fp8", "calibrator": "minmax"})  # fmt: skip
CPU_BACKEND, GPU_BACKEND = "onnxruntime-cpu", "torch-cuda"


def sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB of `test` against `reference` (inf when identical)."""
    reference, test = np.asarray(reference, np.float64), np.asarray(test, np.float64)
    noise = float(np.sum((reference - test) ** 2))
    signal = float(np.sum(reference**2))
    return float("inf") if noise == 0 else 10.0 * float(np.log10(signal / noise))


def row_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of rows where two outputs agree: the same arg-max for a score matrix, else a cosine of at least 0.999."""
    a, b = np.asarray(a, np.float64).reshape(len(a), -1), np.asarray(b, np.float64).reshape(len(b), -1)
    if a.shape[1] > 1 and a.shape[1] <= 1000:
        return float(np.mean(a.argmax(1) == b.argmax(1)))
    cosine = np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return float(np.mean(cosine >= 0.999))


def compare_model(model: str, recipe_path: Path, workdir: Path, native: str = GPU_BACKEND) -> list[dict[str, Any]]:
    """One row per precision: the CPU emulation and the GPU's native figures for the same variant."""
    from qbench.backends import get_backend
    from qbench.preflight.prepare import prepare
    from qbench.recipe.spec import VariantSpec, load_recipe, reference_variant
    from qbench.validate.measure import measure
    from qbench.variants import BuildContext, build_variant
    from qbench.variants.torch_forms import attach_torch_form

    recipe = load_recipe(recipe_path)
    prepared = prepare(recipe, track=False)
    metric = recipe.gate.metric
    cpu, gpu = get_backend(CPU_BACKEND), get_backend(native)

    def built(spec: VariantSpec) -> Any:
        ctx = BuildContext(prepared.source.onnx_path, workdir / model / spec.name, prepared.calibration_batches,
                           torch_model=prepared.source.torch, fixed_batch=prepared.batch)  # fmt: skip
        return attach_torch_form(build_variant(spec, ctx), spec, prepared.source.torch)

    fp32 = built(reference_variant())
    fp32_cpu, fp32_gpu = measure(cpu, fp32, prepared), measure(gpu, fp32, prepared)
    output = prepared.outputs[0].name
    rows = [{"model": model, "precision": "fp32", "metric": metric,
             "sqnr_gpu_vs_cpu_db": sqnr_db(fp32_cpu.outputs[output], fp32_gpu.outputs[output]),
             "agreement_cpu_gpu": row_agreement(fp32_cpu.outputs[output], fp32_gpu.outputs[output]),
             "kernels_gpu": fp32_gpu.result.params.get("runtime.kernels")}]  # fmt: skip
    for fields in PRECISIONS:
        spec = VariantSpec(**fields)
        variant = built(spec)
        on_cpu = measure(cpu, variant, prepared, reference=fp32_cpu.reference)
        on_gpu = measure(gpu, variant, prepared, reference=fp32_gpu.reference)
        row: dict[str, Any] = {"model": model, "precision": spec.precision, "metric": metric}
        for where, measured in (("cpu", on_cpu), ("gpu", on_gpu)):
            row[f"status_{where}"] = measured.result.status
            if measured.result.status != "ok" or measured.outputs is None:
                row[f"error_{where}"] = measured.result.error
        if on_cpu.outputs is None or on_gpu.outputs is None:
            rows.append(row)
            continue
        emulated, native = on_cpu.outputs[output], on_gpu.outputs[output]
        row |= {
            "sqnr_cpu_vs_fp32_db": sqnr_db(fp32_cpu.outputs[output], emulated),
            "sqnr_gpu_vs_fp32_db": sqnr_db(fp32_gpu.outputs[output], native),
            "sqnr_cpu_vs_gpu_db": sqnr_db(native, emulated),
            "drop_cpu": on_cpu.result.accuracy.overall.drops.get(metric) if on_cpu.result.accuracy else None,
            "drop_gpu": on_gpu.result.accuracy.overall.drops.get(metric) if on_gpu.result.accuracy else None,
            "agreement_cpu_gpu": row_agreement(emulated, native),
            "kernels_cpu": on_cpu.result.params.get("runtime.kernels"),
            "kernels_gpu": on_gpu.result.params.get("runtime.kernels"),
        }
        rows.append(row)
    return rows


def print_table(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="CPU emulation vs native GPU arithmetic (SQNR in dB; higher = closer)")
    for column in ("model", "precision", "SQNR cpu vs fp32", "SQNR gpu vs fp32", "SQNR cpu vs gpu", "drop cpu",
                   "drop gpu", "rows agreeing", "status"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("model", "precision", "status") else "right")

    def db(value: float | None) -> str:
        return "" if value is None else ("inf" if value == float("inf") else f"{value:.1f}")

    def signed(value: float | None) -> str:
        return "" if value is None else f"{value:+.4f}"

    for row in rows:
        status = "; ".join(f"{w}: {row[f'error_{w}']}" for w in ("cpu", "gpu") if row.get(f"error_{w}")) or "ok"
        table.add_row(row["model"], row["precision"], db(row.get("sqnr_cpu_vs_fp32_db")),
                      db(row.get("sqnr_gpu_vs_fp32_db")),
                      db(row.get("sqnr_cpu_vs_gpu_db", row.get("sqnr_gpu_vs_cpu_db"))),
                      signed(row.get("drop_cpu")), signed(row.get("drop_gpu")),
                      f"{row['agreement_cpu_gpu']:.4f}" if "agreement_cpu_gpu" in row else "", status)  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="digits,minilm", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N rows only")
    parser.add_argument("--native-backend", default=GPU_BACKEND, help="torch-cpu: a dry run of the bench anywhere")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "gpu_fidelity.json")
    args = parser.parse_args(argv)
    console = Console(width=160)  # a CI log or a remote run's output: no wrapped rows
    from qbench.backends import get_backend
    from qbench.backends.onnxruntime_gpu import probe_gpus
    from qbench.errors import QbenchError

    args.out.parent.mkdir(parents=True, exist_ok=True)
    probe = probe_gpus()
    try:
        get_backend(args.native_backend).check_available()
    except QbenchError as exc:
        console.print(f"no GPU: nothing measured ({exc})")
        args.out.write_text(json.dumps({"measured": False, "reason": f"no GPU: {exc}"}, indent=2))
        return 0
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    settings = Settings((1,), 0, 100, args.eval_limit)  # no timing; a recipe's slo wants 100
    with tempfile.TemporaryDirectory(prefix="qbench-gpu-fidelity-") as tmp:
        workdir = Path(tmp)
        for model in args.models.split(","):
            try:
                backends = [CPU_BACKEND, args.native_backend]
                source, recipe_path = model_recipe(model, backends, settings, workdir, variants=list(PRECISIONS))
                with importable_from(source.parent):
                    rows += compare_model(model, recipe_path, workdir, args.native_backend)
            except QbenchError as exc:
                skipped[model] = str(exc)
                console.print(f"[yellow]{model} skipped:[/] {exc}")
    print_table(console, rows)
    payload = {"measured": bool(rows), "environment": environment(probe.names), "skipped": skipped, "rows": rows}
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
