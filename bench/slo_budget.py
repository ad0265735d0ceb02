"""Which variant meets the latency budget at the traffic served, without breaking accuracy, and at what cost?

Runs the sweep of each recipe (default: recipes/digits.yaml and recipes/minilm.yaml, with their own
`slo:` and `cost:` sections) untracked, judges it with the recipe's gate (accuracy and the SLO),
and prints per recipe the table

    variant -> p99 under load at the budget rate -> max rate within budget -> cost per million
            -> accuracy verdict -> SLO verdict

and the chosen variant: the cheapest (USD per million at its highest rate within budget) among
those accurate enough and within budget (qbench.report.serving.cheapest, as `qbench gate` says it).
The load figures are qbench's simulation (Poisson arrivals, dynamic batcher, one model instance)
replayed from the service times the sweep measured on this machine; cost per million at the max
rate = price per hour / 3600 / max rate x 1e6.

    python bench/slo_budget.py [--recipe recipes/minilm.yaml] [--limit 96] [--variants fp16,int8-dynamic]
                               [--price onnxruntime-cpu=0.085] [--out bench/out/slo_budget.json]

--limit / --variants reduce a slow recipe (say so when quoting the figures); the JSON records what
was run (rows, variants, latency and load settings, machine). The digits assets are built into
a temporary folder when the repository has none (models/, data/ are not in git).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_output import write_json
from rich.console import Console
from rich.table import Table

from qbench.environment import describe_environment
from qbench.gate.evaluate import GateReport
from qbench.pricing import with_prices
from qbench.recipe.spec import Recipe, load_recipe
from qbench.report.serving import accuracy_verdict, cheapest, slo_verdict
from qbench.results.schema import SweepResults, VariantResult
from qbench.sweep.runner import run_sweep

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPES = (ROOT / "recipes" / "digits.yaml", ROOT / "recipes" / "minilm.yaml")


def _digits_assets(recipe_path: Path, scratch: Path) -> Path:
    """recipes/digits.yaml reads ../models and ../data: build them in `scratch` when the repository has none."""
    recipe = recipe_path.resolve()
    if (recipe.parent.parent / "models" / "digits.onnx").is_file():
        return recipe
    from qbench.demo.digits import make_digits_demo

    make_digits_demo(scratch, seed=0)
    copied = scratch / "recipes" / recipe.name
    copied.parent.mkdir(parents=True, exist_ok=True)
    copied.write_text(recipe.read_text())  # the given recipe beside the built assets
    return copied


def _reduced(recipe: Recipe, limit: int | None, variants: list[str] | None) -> Recipe:
    data = recipe.data
    if limit is not None:
        data = data.model_copy(update={"evaluation": data.evaluation.model_copy(update={"limit": limit})})
    chosen = recipe.variants
    if variants is not None:
        unknown = sorted(set(variants) - {v.name for v in recipe.variants})
        if unknown:
            raise SystemExit(f"--variants: {unknown[0]!r} is not a variant of {recipe.source}")
        chosen = [v for v in recipe.variants if v.name in variants]
    return recipe.model_copy(update={"data": data, "variants": chosen})


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _row(results: SweepResults, gate: GateReport, variant: VariantResult) -> dict[str, Any]:
    serving = variant.serving
    at_rate = serving.at_rate if serving else None
    costs = serving.usd_per_million if serving else {}
    return {
        "variant": variant.variant,
        "backend": variant.backend,
        "status": variant.status,
        "p50_ms_b1": _number(variant.latency.at(1).p50_ms) if variant.latency and variant.latency.at(1) else None,
        "preprocess_ms_per_row": _number(serving.preprocess_ms_per_row) if serving else None,
        "p99_ms_at_rate": _number(at_rate.p99_ms) if at_rate else None,
        "mean_batch_at_rate": _number(at_rate.mean_batch_size) if at_rate else None,
        "max_rate_rps": _number(serving.max_rate_rps) if serving else None,
        "usd_per_million_at_max_rate": _number(costs.get("max_rate")),
        "usd_per_million": {key: _number(value) for key, value in costs.items()},  # b<batch>: back-to-back batches
        "bound": serving.bound.verdict if serving and serving.bound else None,
        "accuracy": accuracy_verdict(results, gate, variant),
        "slo": slo_verdict(gate, variant),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _table(name: str, rows: list[dict[str, Any]], rate: float | None, budget: float | None) -> Table:
    table = Table(title=f"{name}: p99 budget {budget:g} ms at {rate:g} req/s" if rate and budget else name)
    for header in ("variant", "p99 ms at budget rate", "max req/s within budget", "$ per million at max rate",
                   "accuracy", "SLO", "bound (estimate)"):  # fmt: skip
        table.add_column(header, justify="right" if "$" in header or "ms" in header or "req" in header else "left")
    for row in rows:
        table.add_row(row["variant"], _fmt(row["p99_ms_at_rate"], ".3g"), _fmt(row["max_rate_rps"], ",.0f"),
                      _fmt(row["usd_per_million_at_max_rate"], ".4g"), row["accuracy"], row["slo"],
                      row["bound"] or "—")  # fmt: skip
    return table


def run_one(path: Path, *, limit: int | None, variants: list[str] | None, prices: list[str],
            scratch: Path) -> dict[str, Any]:
    recipe = load_recipe(_digits_assets(path, scratch) if path.name.startswith("digits") else path)
    recipe = with_prices(_reduced(recipe, limit, variants), prices)
    recipe = recipe.model_copy(update={"output_dir": scratch / "reports"})
    started = time.perf_counter()
    outcome = run_sweep(recipe, track=False)
    seconds = time.perf_counter() - started
    results, gate = outcome.results, outcome.gate
    rows = [_row(results, gate, v) for v in results.variants]
    choice = cheapest(results, gate)
    slo = recipe.slo
    return {
        "recipe": recipe.name,
        "recipe_file": str(path),
        "evaluation_rows": results.evaluation_rows,
        "variants": [v.name for v in recipe.all_variants()],
        "reduced": {"limit": limit, "variants": variants},
        "latency": recipe.latency.model_dump(mode="json"),
        "slo": slo.model_dump(mode="json") if slo else None,
        "price_per_hour": dict(recipe.cost.price_per_hour) if recipe.cost else {},
        "gate_exit_code": gate.exit_code,
        "rows": rows,
        "chosen": None if choice is None else {"variant": choice.variant.variant, "backend": choice.variant.backend,
                                               "max_rate_rps": choice.max_rate_rps,
                                               # no rate claimed: the simulated one, which bounds it (else null)
                                               "rate_bound_rps": choice.rate_bound_rps,
                                               "usd_per_million": choice.usd_per_million},  # fmt: skip
        "sweep_seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, action="append",
                        help="recipe file (repeatable); default digits + minilm")  # fmt: skip
    parser.add_argument("--limit", type=int, help="evaluate at most this many rows (every recipe)")
    parser.add_argument("--variants", help="comma-separated variant names to keep (FP32 is always built)")
    parser.add_argument("--price", action="append", default=[], help="backend=USD per hour over the recipe's cost")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "slo_budget.json")
    args = parser.parse_args(argv)
    variants = args.variants.split(",") if args.variants else None
    console = Console(width=160)
    report: dict[str, Any] = {"environment": describe_environment(), "recipes": []}
    with tempfile.TemporaryDirectory(prefix="qbench-slo-") as scratch:
        for path in args.recipe or DEFAULT_RECIPES:
            figures = run_one(path, limit=args.limit, variants=variants, prices=args.price, scratch=Path(scratch))
            report["recipes"].append(figures)
            slo = figures["slo"] or {}
            console.print(_table(figures["recipe"], figures["rows"], slo.get("rate_rps"), slo.get("p99_ms")))
            chosen = figures["chosen"]
            console.print(f"{figures['recipe']}: {figures['evaluation_rows']} evaluation rows, "
                          f"price {figures['price_per_hour']} USD/h, gate exit {figures['gate_exit_code']}, "
                          f"sweep {figures['sweep_seconds']} s; chosen: "
                          + (f"{chosen['variant']}@{chosen['backend']} (up to {chosen['max_rate_rps']:,.0f} req/s, "
                             f"${chosen['usd_per_million']:.4g} per million)" if chosen else "none"))  # fmt: skip
    return write_json(args.out, report, console)


if __name__ == "__main__":
    sys.exit(main())
