"""Is adaptive timing worth it? Fixed-count vs adaptive p50s of one variant, repeated in one run.

On the digits demo CNN (FP32, ONNX Runtime CPU), each mode times the same model several times,
interleaved (fixed, adaptive, adaptive with a small minimum, then again), each measurement with a
fresh session and one session alive at a time, as a sweep does. Per batch size and mode: the
coefficient of variation of p50 across repeats (stdev / mean: lower means a figure you can
trust from a single measurement), the seconds each measurement took (warm-up included), the
timed runs made and how many measurements ended stable.

    python bench/latency_stability.py [--repeats 5] [--threads 2] [--out bench/out/latency_stability.json]

On a shared machine the figures are noisy: compare the modes within one run only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from qbench.backends import get_backend
from qbench.backends.base import RunOptions
from qbench.demo.digits import make_digits_demo
from qbench.recipe.spec import StabilitySpec
from qbench.results.schema import LatencyPoint
from qbench.validate.latency import measure_steady_state
from qbench.variants import BuiltVariant

BATCH_SIZES = (1, 32)


@dataclass(frozen=True)
class Mode:
    name: str
    iterations: int
    stability: StabilitySpec | None


MODES = (
    Mode("fixed 200", 200, None),
    Mode("adaptive (min 200, defaults)", 200, StabilitySpec()),
    Mode("adaptive (min 30)", 30, StabilitySpec()),
)


def measure_once(model: Path, batch: np.ndarray, threads: int, warmup: int, mode: Mode) -> tuple[LatencyPoint, float]:
    """One measurement through qbench's backend and latency loop: the point and its wall seconds."""
    runner = get_backend("onnxruntime-cpu").load(BuiltVariant("fp32", "fp32", model), RunOptions(threads=threads))
    try:
        start = time.perf_counter()
        [point] = measure_steady_state(runner, {"input": batch}, [len(batch)], warmup, mode.iterations,
                                       stability=mode.stability)  # fmt: skip
        seconds = time.perf_counter() - start
    finally:
        runner.close()
    return point, seconds


def _finite_or_none(value: float) -> float | None:
    """NaN (no window closed, or fixed-count timing) is null in the JSON."""
    return value if math.isfinite(value) else None


def compare(model: Path, repeats: int, threads: int, warmup: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for batch_size in BATCH_SIZES:
        batch = rng.random((batch_size, 1, 8, 8), dtype=np.float32)
        runs: dict[str, list[tuple[LatencyPoint, float]]] = {mode.name: [] for mode in MODES}
        for _ in range(repeats):  # interleaved: every mode sees the same background load in turn
            for mode in MODES:
                runs[mode.name].append(measure_once(model, batch, threads, warmup, mode))
        for mode in MODES:
            p50s = [point.p50_ms for point, _ in runs[mode.name]]
            seconds = [s for _, s in runs[mode.name]]
            rows.append({
                "batch_size": batch_size, "mode": mode.name, "repeats": repeats, "threads": threads,
                "p50_ms": p50s, "p50_cv": statistics.stdev(p50s) / statistics.mean(p50s),
                "seconds": seconds, "mean_seconds": statistics.mean(seconds),
                "iterations": [point.iterations for point, _ in runs[mode.name]],
                "stable": [point.stable for point, _ in runs[mode.name]],
                "spread": [_finite_or_none(point.spread) for point, _ in runs[mode.name]],
                "iqr_ratio": [_finite_or_none(point.iqr_ratio) for point, _ in runs[mode.name]],
            })  # fmt: skip
    return rows


def _stable_count(flags: list[bool | None]) -> str:
    judged = [f for f in flags if f is not None]
    return f"{sum(judged)}/{len(judged)}" if judged else "not judged"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/out/latency_stability.json"))
    args = parser.parse_args()

    console = Console(width=140)  # no folding in logs
    with tempfile.TemporaryDirectory(prefix="qbench-bench-") as tmp:
        root = Path(tmp)
        make_digits_demo(root)
        rows = compare(root / "models" / "digits.onnx", args.repeats, args.threads, args.warmup)

    table = Table(title=f"p50 across {args.repeats} repeated measurements of one variant (digits CNN, FP32, "
                        f"{args.threads} threads; shared machine: noisy)")  # fmt: skip
    for column in ("batch", "mode", "p50 ms (median)", "p50 CV", "s / measurement", "timed runs (median)", "stable"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for row in rows:
        table.add_row(str(row["batch_size"]), row["mode"], f"{statistics.median(row['p50_ms']):.4f}",
                      f"{row['p50_cv']:.1%}", f"{row['mean_seconds']:.2f}",
                      f"{statistics.median(row['iterations']):.0f}",
                      _stable_count(row["stable"]))  # fmt: skip
    console.print(table)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"latency_stability": rows}, indent=2))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
