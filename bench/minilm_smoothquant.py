"""qbench SmoothQuant INT8 (smoothing on the ONNX graph + Linear-only INT8) against ORT's dynamic quantizers.

Contenders, on recipes/minilm.yaml (seq 128; its calibration rows, evaluation sentences and topics):
  fp32                  the exported FP32 encoder
  ort-dynamic           `quantize_dynamic(fp32, out)` with every default (per-tensor S8 weights)
  ort-dynamic-pc        `quantize_dynamic(..., per_channel=True, reduce_range=False)`
  sq-a<alpha>           qbench `smoothquant: {alpha}` with calibrator minmax (static activations),
                        per-channel weights, reduce_range as the recipe default resolves it (auto);
                        alpha 0.5 plus a small sweep over 0.3-0.8 (same graph shape, other scales)
  sq-auto               `alpha: auto`: per Linear input, the alpha (or none) with the least output error
  sq-a0.5-dynamic       alpha 0.5 with calibrator dynamic (activations quantized per batch)
  sq-a0.5-unfolded      alpha 0.5 with `fold: false`: a Mul before every smoothed input (what folding saves)
  linear-minmax         `technique: linear`: the same Linear-only static INT8 without smoothing

Latency: the interleaved loop of bench/minilm_int8.py (one session alive at a time; medians of each
round's p50). Accuracy: cosine vs FP32 per evaluation row, mean / min, the worst topic, and the
issue-11 gate (mean cosine >= 0.995 and every topic >= 0.99). "time to produce" is the build time.

    python bench/minilm_smoothquant.py [--rounds 3] [--iterations 20] [--threads 2] [--alphas 0.3 0.4 0.5 0.6 0.7 0.8]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from minilm_int8 import accuracy, console, interleaved_latency, write_record
from onnxruntime.quantization import quantize_dynamic
from rich.console import Console
from rich.table import Table

from qbench.preflight.prepare import Prepared, prepare
from qbench.recipe.spec import VariantSpec, load_recipe
from qbench.variants import build_variant
from qbench.variants.base import BuildContext
from qbench.variants.onnx_utils import quiet_stdout, scratch_dir

GATE = {"mean_cosine": 0.995, "topic_cosine": 0.99}


def ort_dynamic(prepared: Prepared, out: Path) -> tuple[dict[str, Path], dict[str, float]]:
    """ORT's dynamic quantizer, defaults and per-channel without reduce_range; returns paths and build seconds."""
    fp32 = prepared.source.onnx_path
    options = {"ort-dynamic": {}, "ort-dynamic-pc": {"per_channel": True, "reduce_range": False}}
    paths, seconds = {}, {}
    for name, extra in options.items():
        paths[name] = out / f"{name}.onnx"
        started = time.perf_counter()
        with scratch_dir("qbench-bench-"), quiet_stdout():
            quantize_dynamic(fp32, paths[name], **extra)
        seconds[name] = time.perf_counter() - started
    return paths, seconds


def smoothquant_variants(
    prepared: Prepared, out: Path, alphas: list[float]
) -> tuple[dict[str, Path], dict[str, float], dict[str, Any]]:
    """qbench's SmoothQuant variants, built through the variant registry as a recipe would build them."""
    specs = [
        VariantSpec(name=f"sq-a{a:g}", precision="int8", calibrator="minmax", smoothquant={"alpha": a}) for a in alphas
    ]
    specs.append(VariantSpec(name="sq-auto", precision="int8", calibrator="minmax", smoothquant={"alpha": "auto"}))
    specs.append(VariantSpec(name="sq-a0.5-dynamic", precision="int8", calibrator="dynamic", smoothquant={}))
    # the same smoothing with a Mul before every smoothed input instead of folding it into the producers
    specs.append(
        VariantSpec(name="sq-a0.5-unfolded", precision="int8", calibrator="minmax", smoothquant={"fold": False})
    )
    specs.append(VariantSpec(name="linear-minmax", precision="int8", technique="linear", calibrator="minmax"))
    ctx = BuildContext(reference_path=prepared.source.onnx_path, workdir=out, calibration=prepared.calibration_batches)
    paths, seconds, params = {}, {}, {}
    for spec in specs:
        built = build_variant(spec, ctx)
        paths[spec.name], seconds[spec.name], params[spec.name] = built.onnx_path, built.build_seconds, built.params
        console.print(f"built {spec.name} in {built.build_seconds:.1f} s: {_describe(built.params)}")
    return paths, seconds, params


def _describe(params: dict[str, Any]) -> str:
    keys = ("smoothed_groups", "alphas_chosen", "folded_into", "inserted_muls", "quantized_linears", "float_matmuls",
            "reduce_range")
    return ", ".join(f"{k} {params[k]}" for k in keys)


def report(latency: dict[str, Any], cosines: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    table = Table(title="all-MiniLM-L6-v2, seq 128: speed vs FP32 (median p50 of interleaved rounds; NOISY machine)")
    columns = ("contender", "b1 ms", "b16 ms", "speed b1", "speed b16", "mean cos", "min cos", "worst topic", "gate",
               "build s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("contender", "worst topic", "gate") else "right")
    summary = {}
    for name, per in latency.items():
        speed = {b: latency["fp32"][b]["p50_ms"] / per[b]["p50_ms"] for b in per}
        c = cosines[name]
        passed = c["mean_cosine"] >= GATE["mean_cosine"] and c["worst_slice_cosine"] >= GATE["topic_cosine"]
        summary[name] = {"speedup_b1": speed["b1"], "speedup_b16": speed["b16"], **c, "gate": passed,
                         "build_seconds": seconds.get(name, 0.0)}  # fmt: skip
        table.add_row(name, f"{per['b1']['p50_ms']:.1f}", f"{per['b16']['p50_ms']:.1f}", f"{speed['b1']:.2f}×",
                      f"{speed['b16']:.2f}×", f"{c['mean_cosine']:.4f}", f"{c['min_cosine']:.4f}",
                      f"{c['worst_slice']} {c['worst_slice_cosine']:.4f}", "pass" if passed else "fail",
                      f"{seconds.get(name, 0.0):.1f}")  # fmt: skip
    Console(width=150).print(table)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=Path("recipes/minilm.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    parser.add_argument("--out", type=Path, default=Path("bench/out/minilm_smoothquant.json"))
    args = parser.parse_args()

    started = time.perf_counter()
    work = (args.out.parent / "minilm_smoothquant").resolve()
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(load_recipe(args.recipe))
    ort_paths, seconds = ort_dynamic(prepared, work)
    sq_paths, sq_seconds, sq_params = smoothquant_variants(prepared, work, sorted(set(args.alphas) | {0.5}))
    models = {"fp32": prepared.source.onnx_path, **ort_paths, **sq_paths}
    # the worst slice among the topics (the recipe also slices by length; the gate is per topic)
    topics = dataclasses.replace(prepared, slices={k: v for k, v in prepared.slices.items() if k.startswith("topic")})
    cosines = accuracy(models, topics, args.threads)
    latency = interleaved_latency(models, prepared.evaluation_feeds, args)
    summary = report(latency, cosines, {**seconds, **sq_seconds})
    write_record(args, started, {"gate": GATE},
                 {"summary": summary, "latency": latency, "smoothquant_params": sq_params})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
