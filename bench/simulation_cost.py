"""What the load simulation's search for the highest rate costs when the timed runs are noisy, and what it claims:
the search bounded in simulated batches (qbench.validate.load_search.MAX_BATCHES) against the same search unbounded
(`max_batches=None`: every round up to 320,000 requests, as before the bound), side by side on the same replays.

A digits-sized MLP (scikit-learn's MLPClassifier, 64 hidden units, exported with skl2onnx) is swept with the digits
demo's recipe (FP32, FP16, INT8 static and dynamic; a 20 ms budget at 5,000 req/s, batches up to 32, 1 ms delay)
while `--busy` processes spin on the CPUs, so its timed runs hold stalls as a loaded CI runner's do. Every search the
sweep ran is recorded (its replay, budget and overhead) and run again, unbounded and bounded in turn, `--rounds`
times; the table gives per search (one per variant, in the sweep's order) the rounds' median CPU seconds, the batches
simulated, the simulations, the requests of the last round, the rate claimed and whether it settled, with the load
average before and after. The unbounded search claims the lower of its last two rounds' rates where it does not settle
(the old code claimed the last round's); its rounds, and so its cost, are the old code's.

    python bench/simulation_cost.py [--busy 3] [--rounds 3] [--out bench/out/simulation_cost.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bench_output import write_json
from rich.console import Console
from rich.table import Table

import qbench.validate.load_search as load_search
from qbench.demo.digits import make_digits_demo
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from qbench.validate.load_search import MAX_BATCHES, search_max_rate


def write_mlp_recipe(root: Path) -> Path:
    """The digits demo's recipe on an MLP trained on its train split (no FP8 or extra INT8 calibrators)."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPClassifier

    make_digits_demo(root)
    table = pd.read_parquet(root / "data" / "digits.parquet")
    train = table[table["split"] == "train"]
    pixels = np.stack(train["pixels"].to_numpy()).astype(np.float32)
    model = MLPClassifier((64,), max_iter=300, random_state=0).fit(pixels, train["label"])
    onnx_model = to_onnx(model, pixels[:1], options={id(model): {"zipmap": False}}, target_opset=17)
    (root / "models" / "mlp.onnx").write_bytes(onnx_model.SerializeToString())
    text = (root / "recipes" / "digits.yaml").read_text().replace("digits.onnx", "mlp.onnx")
    text = text.replace("{pixels: input}", "{pixels: X}").replace("name: digits-cnn", "name: digits-mlp")
    dropped = ("fp8", "int8-entropy", "int8-p99.9")
    text = "\n".join(line for line in text.splitlines() if not any(f"name: {name}," in line for name in dropped))
    path = root / "recipes" / "mlp.yaml"
    path.write_text(text.replace('applies_to: ["int8-*", "fp8"]', 'applies_to: ["int8-*"]'))
    return path


def recorded_searches(recipe: Path, busy: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Sweep `recipe` while `busy` processes spin; each search the sweep ran (its arguments), and the sweep's phases."""
    searches: list[dict[str, Any]] = []

    def recording(replay, budget_ms, **options):  # noqa: ANN001, ANN003, ANN202 - the sweep's call, recorded
        started, wall = time.process_time(), time.perf_counter()
        found = search_max_rate(replay, budget_ms, **options)
        searches.append({"replay": replay, "budget_ms": budget_ms, "options": options,
                         "in_sweep": {"cpu_s": time.process_time() - started, "wall_s": time.perf_counter() - wall}})
        return found

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    load_search.search_max_rate = recording  # qbench.serving imports it where it simulates, after this
    try:
        timings = run_sweep(load_recipe(recipe), track=False).results.timings
    finally:
        load_search.search_max_rate = search_max_rate
        for spinner in spinners:
            spinner.terminate()
            spinner.wait()
    return searches, timings


def timed(search: dict[str, Any], max_batches: int | None) -> dict[str, Any]:
    started, wall = time.process_time(), time.perf_counter()
    found = search_max_rate(search["replay"], search["budget_ms"], max_batches=max_batches, **search["options"])
    return {"cpu_s": time.process_time() - started, "wall_s": time.perf_counter() - wall, "batches": found.batches,
            "simulations": found.simulations,
            "requests": found.requests, "rate_rps": found.max_rate_rps, "settled": not found.undecided}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=3, help="processes spinning on the CPUs while the sweep times")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out/simulation_cost.json"))
    args = parser.parse_args()
    console = Console(width=150)
    with tempfile.TemporaryDirectory(prefix="qbench-simcost-") as tmp:
        searches, phases = recorded_searches(write_mlp_recipe(Path(tmp)), args.busy)
    load_before = os.getloadavg()
    rows = []
    for index, search in enumerate(searches):
        runs: dict[str, list[dict[str, Any]]] = {"unbounded": [], "bounded": []}
        for _ in range(args.rounds):  # interleaved: the machine's load moves both alike
            runs["unbounded"].append(timed(search, None))
            runs["bounded"].append(timed(search, MAX_BATCHES))
        for how, measured in runs.items():
            rows.append({"search": index, "how": how, **measured[-1],
                         "cpu_s": statistics.median(m["cpu_s"] for m in measured),
                         "wall_s": statistics.median(m["wall_s"] for m in measured)})  # fmt: skip
    load_after = os.getloadavg()
    table = Table(title=f"the rate search per variant (sweep under {args.busy} spinning processes; load average "
                        f"{load_before[0]:.2f} before the searches, {load_after[0]:.2f} after)")  # fmt: skip
    for column in ("search", "how", "CPU s (median)", "wall s (median)", "batches", "simulations", "requests",
                   "rate req/s", "settled"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("search", "how") else "right")
    for row in rows:
        rate = "none" if row["rate_rps"] is None else f"{row['rate_rps']:,.0f}"
        table.add_row(str(row["search"]), row["how"], f"{row['cpu_s']:.2f}", f"{row['wall_s']:.2f}",
                      f"{row['batches']:,}",
                      str(row["simulations"]), f"{row['requests']:,}", rate, str(row["settled"]))  # fmt: skip
    console.print(table)
    in_sweep = ", ".join(f"{s['in_sweep']['wall_s']:.2f} s ({s['in_sweep']['cpu_s']:.2f} s CPU)" for s in searches)
    console.print(f"the sweep (bounded search): simulation {phases.get('simulation', 0.0):.2f} s of "
                  f"{phases['total']:.2f} s; its searches {in_sweep}")  # fmt: skip
    return write_json(args.out, {"busy": args.busy, "rounds": args.rounds, "load_average": [load_before, load_after],
                                 "sweep_phases_s": phases, "in_sweep": [s["in_sweep"] for s in searches],
                                 "searches": rows}, console)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
