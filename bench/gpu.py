"""What do FP16, BF16 and FP8 buy on an NVIDIA GPU? FP32 / FP16 / BF16 / FP8 of the digits CNN and of
MiniLM, at batch 1 and 64: p50 / p99 latency and throughput, and the accuracy drop vs FP32.

Everything goes through qbench's library API (`run_sweep` on recipes derived from the repository's):
- torch-cuda: every precision eager and through `torch.compile` (variants named `<precision>-compile`);
- onnxruntime-cuda, onnxruntime-tensorrt, tensorrt: every precision's ONNX variant, where installed.
Backends that cannot run here are listed with the reason. Each model gets two sweeps (torch, ONNX),
each with its own FP32 reference; the digits assets are rebuilt in a temporary folder when missing.

    python bench/gpu.py [--models digits,minilm] [--batch-sizes 1,64] [--warmup 20] [--iterations 200]
                        [--eval-limit N] [--out bench/out/gpu.json]

Without a visible NVIDIA GPU it prints "no GPU: nothing measured" and writes a JSON file that says
so, and exits 0. Importing this file needs no GPU and no GPU package.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
MODELS = {"digits": REPO / "recipes" / "digits-torch.yaml", "minilm": REPO / "recipes" / "minilm.yaml"}
PRECISIONS = ({"precision": "fp32"}, {"precision": "fp16"}, {"precision": "bf16"},
              {"precision": "fp8", "calibrator": "minmax"})  # fmt: skip
TORCH_BACKENDS = ("torch-cuda",)
ONNX_BACKENDS = ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt")
# recipe fields holding paths, relative to the recipe file
_PATH_FIELDS = (("model", "path"), ("model", "weights"), ("data", "path"), ("data", "calibration", "path"))


@dataclass(frozen=True)
class Settings:
    batch_sizes: tuple[int, ...]
    warmup: int
    iterations: int
    eval_limit: int | None
    compile: bool = True  # torch backends: also each precision through torch.compile


def variant_specs(compiled_twins: bool) -> list[dict[str, Any]]:
    """FP32 first (the sweep's reference, eager), then the other precisions; with `-compile` twins for torch."""
    specs = [{"name": p["precision"], **p} for p in PRECISIONS]
    if compiled_twins:
        specs += [{**spec, "name": f"{spec['name']}-compile", "compile": True} for spec in specs]
    return specs


def derived_recipe(source: Path, assets: Path, backends: Sequence[str], settings: Settings, workdir: Path,
                   variants: list[dict[str, Any]] | None = None) -> Path:  # fmt: skip
    """A copy of `source` with absolute paths (relative ones resolved against `assets`), the bench's
    variants (default: every precision, with `-compile` twins on torch backends; no INT8 search), backends
    and latency settings, writing its reports under `workdir`."""
    raw = yaml.safe_load(source.read_text())
    for path_field in _PATH_FIELDS:
        *parents, leaf = path_field
        section = raw
        for key in parents:
            section = section.get(key) or {}
        if section.get(leaf) is not None:
            section[leaf] = str((assets / section[leaf]).resolve())
    if variants is None:
        variants = variant_specs(compiled_twins=settings.compile and any(b.startswith("torch-") for b in backends))
    raw["variants"] = variants
    raw.pop("search", None)
    if raw.get("gate"):  # the source's gate names its own variants; the bench's are judged alike
        raw["gate"]["applies_to"] = [spec["name"] for spec in variants if spec["precision"] != "fp32"]
    raw["backends"] = list(backends)
    prices = {name: price for name, price in ((raw.get("cost") or {}).get("price_per_hour") or {}).items()
              if name in backends}  # fmt: skip
    if prices:
        raw["cost"]["price_per_hour"] = prices
    else:
        raw.pop("cost", None)  # priced only for backends the bench does not run
    raw["latency"] = {"batch_sizes": list(settings.batch_sizes), "warmup": settings.warmup,
                      "iterations": settings.iterations, "threads": None}  # fmt: skip
    if settings.eval_limit is not None:
        raw["data"].setdefault("evaluation", {})["limit"] = settings.eval_limit
    raw["output_dir"] = str(workdir / "reports")
    target = workdir / f"{raw['name']}-{'-'.join(backends)}.yaml"
    target.write_text(yaml.safe_dump(raw, sort_keys=False))
    return target


def has_torch_source(recipe: Path) -> bool:
    """Whether the recipe's model is a PyTorch factory (the torch backends need one)."""
    return (yaml.safe_load(recipe.read_text()).get("model") or {}).get("torch") is not None


def usable_backends(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The backends that can run here, and why each other one cannot."""
    from qbench.backends import get_backend
    from qbench.errors import QbenchError

    usable, unusable = [], {}
    for name in names:
        try:
            get_backend(name).check_available()
            usable.append(name)
        except QbenchError as exc:
            unusable[name] = str(exc)
    return usable, unusable


@contextmanager
def importable_from(folder: Path) -> Iterator[None]:
    """A recipe's `model.torch` factory may live beside it: keep that folder importable from the derived copy."""
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def measure(model: str, backends: Sequence[str], settings: Settings, workdir: Path) -> list[dict[str, Any]]:
    """One sweep of `model`'s recipe on `backends`; one row per variant, backend and batch size (or per failure)."""
    from qbench.recipe.spec import load_recipe
    from qbench.sweep.runner import run_sweep

    source, recipe_path = model_recipe(model, backends, settings, workdir)
    with importable_from(source.parent):
        outcome = run_sweep(load_recipe(recipe_path), track=False)
    compiled = {spec["name"] for spec in variant_specs(compiled_twins=True) if spec.get("compile")}
    metric = outcome.results.gate_metric
    rows = []
    for result in outcome.results.variants:
        base = {"model": model, "backend": result.backend, "variant": result.variant, "precision": result.precision,
                "compiled": result.variant in compiled, "status": result.status}  # fmt: skip
        if result.status != "ok" or result.latency is None:
            rows.append({**base, "error": result.error})
            continue
        accuracy = result.accuracy.overall if result.accuracy is not None else None
        quality = {"metric": metric, "value": accuracy.metrics.get(metric) if accuracy else None,
                   "drop_vs_fp32": accuracy.drops.get(metric) if accuracy else None}  # fmt: skip
        for point in result.latency.points:
            rows.append({**base, **quality, "batch_size": point.batch_size, "p50_ms": point.p50_ms,
                         "p99_ms": point.p99_ms, "items_per_s": point.items_per_s,
                         "gpu_compute_ms": _gpu_compute(result.params, point.batch_size)})  # fmt: skip
    return rows


def measure_model(model: str, torch_backends: Sequence[str], onnx_backends: Sequence[str], settings: Settings,
                  workdir: Path, skipped: dict[str, str]) -> list[dict[str, Any]]:  # fmt: skip
    """The torch sweep (when the recipe has a PyTorch source) and the ONNX sweep of one model; a sweep
    that cannot run is recorded in `skipped` and the bench goes on."""
    from qbench.errors import QbenchError

    source = MODELS.get(model)
    sweeps = [list(torch_backends) if source is not None and source.is_file() and has_torch_source(source) else [],
              list(onnx_backends)]  # fmt: skip
    rows = []
    for backends in (b for b in sweeps if b):
        try:
            rows += measure(model, backends, settings, workdir)
        except QbenchError as exc:
            skipped[f"{model} on {', '.join(backends)}"] = str(exc)
    return rows


def _gpu_compute(params: dict[str, Any], batch_size: int) -> float | None:
    """The tensorrt backend's device-only p50 for this batch size (None for other backends)."""
    figures = params.get("runtime.gpu_compute_ms") or {}
    return (figures.get(str(batch_size)) or {}).get("p50")


def model_assets(model: str, source: Path, workdir: Path) -> Path:
    """The folder `source`'s relative paths start from: the repository's recipes/ when the files they name
    exist, else demo files written under `workdir` (the digits model and data; MiniLM's sentences)."""
    if model == "digits":
        return digits_assets(workdir)
    if model == "minilm" and not (REPO / "calibration" / "minilm" / "evaluation.jsonl").is_file():
        from qbench.demo.minilm import write_text_sets

        write_text_sets(workdir / "minilm" / "calibration" / "minilm")
        return workdir / "minilm" / "recipes"
    return source.parent


def model_recipe(model: str, backends: Sequence[str], settings: Settings, workdir: Path,
                 variants: list[dict[str, Any]] | None = None) -> tuple[Path, Path]:  # fmt: skip
    """(the repository's recipe of `model`, a derived copy of it for `backends`); QbenchError when unknown."""
    from qbench.errors import QbenchError

    source = MODELS.get(model)
    if source is None or not source.is_file():
        raise QbenchError(f"no recipe at {source}" if source else f"unknown model {model!r}")
    assets = model_assets(model, source, workdir)
    return source, derived_recipe(source, assets, backends, settings, workdir, variants)


def digits_assets(workdir: Path) -> Path:
    """The folder the digits recipe's relative paths start from: the repository's recipes/ when its
    models/ and data/ exist, else a fresh demo built under `workdir`."""
    if (REPO / "models" / "digits.pt").is_file() and (REPO / "data" / "digits.parquet").is_file():
        return REPO / "recipes"
    from qbench.demo.digits import make_digits_demo

    make_digits_demo(workdir / "digits")
    return workdir / "digits" / "recipes"


def environment(gpus: Sequence[str]) -> dict[str, Any]:
    from qbench.environment import describe_environment

    return {"gpus": list(gpus), **describe_environment()}


def print_table(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="GPU latency and accuracy (p50 / p99 in ms; drop of the task metric vs FP32)")
    for column in ("model", "backend", "variant", "batch", "p50", "p99", "items/s", "GPU p50", "drop", "status"):
        table.add_column(column, justify="right" if column not in ("model", "backend", "variant", "status") else "left")
    for row in rows:
        measured = "batch_size" in row
        drop = row.get("drop_vs_fp32")
        table.add_row(
            row["model"], row["backend"], row["variant"], str(row.get("batch_size", "")),
            f"{row['p50_ms']:.3f}" if measured else "", f"{row['p99_ms']:.3f}" if measured else "",
            f"{row['items_per_s']:.0f}" if measured else "",
            f"{row['gpu_compute_ms']:.3f}" if row.get("gpu_compute_ms") is not None else "",
            f"{drop:+.4f}" if drop is not None else "",
            row["status"] if measured else f"{row['status']}: {row['error']}",
        )  # fmt: skip
    console.print(table)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="digits,minilm", help="comma-separated: digits, minilm")
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N rows only")
    parser.add_argument("--no-compile", action="store_true", help="torch backends: no torch.compile twins")
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends to try instead of the GPU ones (torch-cpu: a dry run anywhere)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "gpu.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=160)  # a CI log or a remote run's output: no wrapped rows
    from qbench.backends.onnxruntime_gpu import probe_gpus

    probe = probe_gpus()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    chosen = args.backends.split(",") if args.backends else None
    if not probe.names and chosen is None:
        console.print(f"no GPU: nothing measured ({probe.reason})")
        args.out.write_text(json.dumps({"measured": False, "reason": f"no GPU: {probe.reason}"}, indent=2))
        return 0
    settings = Settings(tuple(int(b) for b in args.batch_sizes.split(",")), args.warmup, args.iterations,
                        args.eval_limit, compile=not args.no_compile)  # fmt: skip
    torch_backends, unusable = usable_backends([b for b in chosen or TORCH_BACKENDS if b.startswith("torch-")])
    onnx_backends, unusable_onnx = usable_backends([b for b in chosen or ONNX_BACKENDS if not b.startswith("torch-")])
    unusable |= unusable_onnx
    for name, reason in unusable.items():
        console.print(f"[yellow]{name} skipped:[/] {reason}")
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}  # "<model> on <backends>" -> why that sweep did not run
    with tempfile.TemporaryDirectory(prefix="qbench-gpu-bench-") as tmp:
        workdir = Path(tmp)
        for model in args.models.split(","):
            rows += measure_model(model, torch_backends, onnx_backends, settings, workdir, skipped)
    for sweep, reason in skipped.items():
        console.print(f"[yellow]{sweep} skipped:[/] {reason}")
    print_table(console, rows)
    payload = {"measured": bool(rows), "environment": environment(probe.names), "settings": asdict(settings),
               "unusable_backends": unusable, "skipped_sweeps": skipped, "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
