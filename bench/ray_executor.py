"""Local vs Ray executor on one machine: the same sweep run by both, side by side in one run.

What: a sweep of the digits CNN (FP32 + 11 variants: FP16, BF16, FP8, INT8 static with minmax / entropy /
percentile calibration, per-tensor and per-channel, symmetric activations, INT8 dynamic; 24 jobs) on ONNX
Runtime CPU, run with `executor: local` and `executor: ray`, alternating (local, ray, local, ray, ...) so drift of
the machine hits both. Tracking is off: what is measured is the executors, not MLflow.

How: the digits demo (model, table) is built in a temporary folder; each round gets its own copy of the
recipe, run folder and build store, so nothing is reused between rounds. The Ray rounds run on a local
cluster this script starts before the first round and stops after the last: `ray.init` with 2 CPUs, one
unit of the timing resource (`qbench_timing`: one measurement at a time, as on a real node) and every
process bound to 127.0.0.1. Ray on Linux turns `_node_ip_address="127.0.0.1"` into the machine's
routable address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which this script sets before importing Ray.

Reported per round, from the sweep and from the per-job records (<run>/jobs/*.json, `times`: `submitted`
to the executor and `recorded` by the driver, `started` and `ended` in the worker):

    wall            the whole sweep (run_sweep: data preparation, jobs, report)
    jobs phase      from the first job handed to the executor to the last one recorded
    job time        the sum over jobs of (ended - started): building or measuring, nothing else
    start latency   per job, started - submitted, less the time its resources were taken by other jobs
                    (all the CPUs busy, or, for a measurement, the timing slot busy): handing the job to a
                    worker, the worker's own start-up and its data preparation (once per Ray worker process)
    collect latency per job, recorded - ended: handing the result back and the driver taking it in
    overhead/job    mean over jobs of start latency + collect latency
    idle/job        (jobs phase - time at least one job was running) / jobs: time nothing ran at all, which
                    for the local executor (one job at a time) is the driver's work between jobs

A job's resources count as held from its `started` to its `ended`, so the start-up of a neighbour on
another worker is not counted as waiting. Both executors must give identical accuracy figures (every
variant, backend, metric and slice); the script says so, or names what differs, and exits 1 on a difference.

    python bench/ray_executor.py [--rounds 3] [--out bench/out/ray_executor.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from qbench.demo.digits import make_digits_demo
from qbench.execute.plan import TIMING_RESOURCE
from qbench.execute.records import JOBS_FOLDER, PLAN_FILE, read_records
from qbench.results.schema import to_jsonable
from qbench.sweep.runner import run_sweep

EXECUTORS = ("local", "ray")
CLUSTER_CPUS = 2
VARIANTS = [
    {"name": "fp16", "precision": "fp16"},
    {"name": "bf16", "precision": "bf16"},
    {"name": "fp8", "precision": "fp8", "calibrator": "minmax"},
    {"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"},
    {"name": "int8-minmax-pc", "precision": "int8", "calibrator": "minmax", "per_channel": True},
    {"name": "int8-entropy", "precision": "int8", "calibrator": "entropy"},
    {"name": "int8-entropy-pc", "precision": "int8", "calibrator": "entropy", "per_channel": True},
    {"name": "int8-p99.9", "precision": "int8", "calibrator": "percentile", "percentile": 99.9},
    {"name": "int8-p99.99-pc", "precision": "int8", "calibrator": "percentile", "percentile": 99.99,
     "per_channel": True},
    {"name": "int8-minmax-sym", "precision": "int8", "calibrator": "minmax", "symmetric_activations": True},
    {"name": "int8-dynamic", "precision": "int8", "calibrator": "dynamic"},
]  # fmt: skip


def write_recipe(demo: Path, target: Path, executor: str) -> Path:
    """The digits recipe with the bench's variants, short fixed-count timing, no tracking, in `target`."""
    target.mkdir(parents=True)
    recipe = {
        "name": "digits-cnn",
        "task": "classification",
        "model": {"path": str(demo / "models" / "digits.onnx")},
        "data": {
            "path": str(demo / "data" / "digits.parquet"),
            "inputs": {"pixels": "input"},
            "label": "label",
            "calibration": {"filter": {"split": "calib"}, "samples": 256, "seed": 0, "stratify_by": "condition"},
            "evaluation": {"filter": {"split": "eval"}},
            "slices": [{"by": "condition"}, {"by": "contrast"}, {"name": "faint", "filter": {"ink": {"lt": 0.2}}}],
        },
        "variants": VARIANTS,
        "backends": ["onnxruntime-cpu"],
        "latency": {"batch_sizes": [1, 32], "warmup": 10, "iterations": 100, "threads": 1, "stability": None},
        "gate": {"metric": "accuracy", "max_drop": 0.01, "max_slice_drop": 0.02, "applies_to": ["int8-*", "fp8"]},
        "analysis": {"ranges": False},
        "output_dir": str(target / "reports"),
        "executor": {"kind": executor, "store": str(target / "store")},
    }
    path = target / "qbench.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def start_cluster() -> tuple[Any, float]:
    """A local Ray cluster bound to 127.0.0.1 (2 CPUs, one timing slot); returns ray and its start-up seconds."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read when ray is imported
    ray = importlib.import_module("ray")
    started = time.perf_counter()
    ray.init(num_cpus=CLUSTER_CPUS, resources={TIMING_RESOURCE: 1}, _node_ip_address="127.0.0.1",
             include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    seconds = time.perf_counter() - started
    addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
    if addresses != {"127.0.0.1"}:
        raise SystemExit(f"the Ray cluster is not bound to 127.0.0.1: {sorted(addresses)}")
    return ray, seconds


def accuracy_figures(outcome: Any) -> dict[str, Any]:
    """variant@backend -> status and accuracy (overall, slices, agreement): what must not depend on the executor."""
    return {v.key: {"status": v.status, "accuracy": to_jsonable(v.accuracy)} for v in outcome.results.variants}


def blocked_seconds(job: dict[str, Any], others: list[dict[str, Any]], cpus: int, timing_slots: int) -> float:
    """How long, between being submitted and starting, `job` could not have started: every CPU was running
    another job, or (for a job that times a model) every timing slot was."""
    low, high = job["submitted"], job["started"]
    points = sorted({low, high, *(t for o in others for t in (o["started"], o["ended"]) if low < t < high)})
    blocked = 0.0
    for a, b in zip(points, points[1:]):
        middle = (a + b) / 2
        running = [o for o in others if o["started"] <= middle < o["ended"]]
        timing = sum(1 for o in running if o["timing"])
        if len(running) >= cpus or (job["timing"] and timing >= timing_slots):
            blocked += b - a
    return blocked


def covered_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of `intervals`."""
    total, end = 0.0, float("-inf")
    for low, high in sorted(intervals):
        if high > end:
            total += high - max(low, end)
            end = high
    return total


def job_timeline(run_dir: Path, cpus: int, timing_slots: int) -> list[dict[str, Any]]:
    """Every job that ran, from its record: its times, start and collect latency (seconds)."""
    plan = json.loads((run_dir / PLAN_FILE).read_text())
    timing = {job["id"]: "timing slot" in job["needs"] for job in plan["jobs"]}
    jobs = [{"job": record.job, "timing": timing[record.job], **record.times}
            for record in read_records(run_dir).values() if record.times and "started" in record.times]  # fmt: skip
    for job in jobs:
        others = [o for o in jobs if o is not job]
        job["start_latency"] = job["started"] - job["submitted"] - blocked_seconds(job, others, cpus, timing_slots)
        job["collect_latency"] = job["recorded"] - job["ended"]
    return jobs


def one_round(demo: Path, target: Path, executor: str, slots: tuple[int, int]) -> tuple[dict[str, Any], dict]:
    recipe = write_recipe(demo, target, executor)
    started = time.perf_counter()
    outcome = run_sweep(recipe, track=False)
    wall = time.perf_counter() - started
    jobs = job_timeline(outcome.run_dir, *slots)
    phase = max(j["recorded"] for j in jobs) - min(j["submitted"] for j in jobs)
    job_time = sum(j["ended"] - j["started"] for j in jobs)
    busy = covered_seconds([(j["started"], j["ended"]) for j in jobs])
    planned = len(json.loads((outcome.run_dir / PLAN_FILE).read_text())["jobs"])
    row = {
        "executor": executor,
        "wall_s": wall,
        "jobs_phase_s": phase,
        "jobs_planned": planned,
        "jobs_run": len(jobs),
        "job_time_s": job_time,
        "parallelism": job_time / phase,
        "start_latency_ms_median": 1000 * statistics.median(j["start_latency"] for j in jobs),
        "collect_latency_ms_median": 1000 * statistics.median(j["collect_latency"] for j in jobs),
        "overhead_ms_per_job": 1000 * statistics.mean(j["start_latency"] + j["collect_latency"] for j in jobs),
        "idle_ms_per_job": 1000 * (phase - busy) / len(jobs),
        "gate_exit_code": outcome.gate.exit_code,
        "records": str(outcome.run_dir / JOBS_FOLDER),
        "jobs": jobs,
    }
    return row, accuracy_figures(outcome)


def differences(figures: list[tuple[str, dict]]) -> list[str]:
    """What differs from the first round's figures, one line per variant@backend and round."""
    (first_name, first), lines = figures[0], []
    for name, other in figures[1:]:
        for key in sorted(set(first) | set(other)):
            if first.get(key) != other.get(key):
                lines.append(f"{key}: {first_name} and {name} differ")
    return lines


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per executor, the median over its rounds of every figure."""
    keys = [k for k, v in rows[0].items() if isinstance(v, float | int) and not isinstance(v, bool)]
    return {executor: {k: statistics.median(r[k] for r in rows if r["executor"] == executor) for k in keys}
            for executor in EXECUTORS}  # fmt: skip


def print_table(console: Console, rows: list[dict[str, Any]], medians: dict[str, dict[str, float]]) -> None:
    table = Table(title=f"local vs Ray executor: digits CNN, FP32 + {len(VARIANTS)} variants on onnxruntime-cpu "
                  f"(Ray: local cluster, {CLUSTER_CPUS} CPUs, 1 timing slot)")  # fmt: skip
    columns = ("executor", "round", "wall s", "jobs phase s", "jobs", "Σ job s", "parallelism",
               "start ms (median)", "collect ms (median)", "overhead ms/job", "idle ms/job")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("executor", "round") else "right")

    def cells(r: dict[str, Any]) -> list[str]:
        return [f"{r['wall_s']:.1f}", f"{r['jobs_phase_s']:.1f}", f"{r['jobs_run']:.0f}", f"{r['job_time_s']:.1f}",
                f"{r['parallelism']:.2f}", f"{r['start_latency_ms_median']:.1f}",
                f"{r['collect_latency_ms_median']:.1f}", f"{r['overhead_ms_per_job']:.1f}",
                f"{r['idle_ms_per_job']:.1f}"]  # fmt: skip

    for index, row in enumerate(rows):
        table.add_row(row["executor"], str(index // len(EXECUTORS) + 1), *cells(row))
    for executor in EXECUTORS:
        table.add_row(executor, "median", *cells(medians[executor]), style="bold")
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per executor, alternating")
    parser.add_argument("--out", type=Path, default=Path("bench/out/ray_executor.json"))
    args = parser.parse_args()

    console = Console()
    rows: list[dict[str, Any]] = []
    figures: list[tuple[str, dict]] = []
    ray, cluster_start_s = start_cluster()
    try:
        resources = ray.cluster_resources()
        slots = {"local": (1, 1), "ray": (int(resources["CPU"]), int(resources[TIMING_RESOURCE]))}
        with tempfile.TemporaryDirectory(prefix="qbench-bench-ray-") as tmp:
            root = Path(tmp)
            make_digits_demo(root)
            for round_index in range(args.rounds):
                for executor in EXECUTORS:
                    name = f"{executor}-{round_index + 1}"
                    console.print(f"round {round_index + 1}: {executor} executor")
                    row, accuracy = one_round(root, root / name, executor, slots[executor])
                    rows.append(row)
                    figures.append((name, accuracy))
    finally:
        stopped = time.perf_counter()
        ray.shutdown()
        cluster_stop_s = time.perf_counter() - stopped

    medians = summary(rows)
    print_table(console, rows, medians)
    differ = differences(figures)
    console.print(f"Ray cluster: started in {cluster_start_s:.1f} s, stopped in {cluster_stop_s:.1f} s "
                  f"(not in the rounds' wall time)")  # fmt: skip
    if differ:
        console.print("[red]accuracy figures differ:[/red]\n  " + "\n  ".join(differ))
    else:
        console.print(f"accuracy figures identical across all {len(figures)} rounds and both executors "
                      f"({len(figures[0][1])} variant@backend results, every metric and slice)")  # fmt: skip

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "ray": ray.__version__},
        "variants": [v["name"] for v in VARIANTS], "rounds_per_executor": args.rounds,
        "cluster": {"cpus": CLUSTER_CPUS, "timing_slots": 1, "node_ip": "127.0.0.1",
                    "start_s": cluster_start_s, "stop_s": cluster_stop_s},
        "identical_accuracy": not differ, "differences": differ,
        "summary": medians, "rounds": rows,
    }, indent=2))  # fmt: skip
    console.print(f"wrote {args.out}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
