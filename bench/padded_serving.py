"""Is the highest rate qbench claims for a padded text model met by a real load of its whole row mix?

A tiny BERT (random weights, 2 layers, hidden 128) exported to ONNX with dynamic batch and sequence axes, fed
`padding: longest` rows: short queries (8 tokens) and a few long documents (100 tokens), in a fixed shuffle. As the
sweep does, each batch size is timed over the rows' timed batches (`timed_batches`, each cut back to its own
longest row), the load is simulated from those timings (`LoadReplay`, `search_max_rate`), and the simulated rate
is served for real and stepped down (`served_max_rate`) by two servers:

- `first batch`: qbench before: the rows of the first timed batch only, at that batch's one length;
- `whole mix`: qbench now (`server_for` with `padding`): every timed row, each batch cut back to its own longest row.

Each claim is then checked by an independent open-loop load of the whole mix (`serve` of every evaluation row, each
batch padded to its own longest row), `--checks` runs of a quarter second at the claimed rate (fresh arrivals,
the next rows): the share of those runs
whose p99 is over the budget or that fell behind. The machine is shared: its load average is recorded.

    python bench/padded_serving.py [--long-share 0.05] [--budget-ms 40] [--out bench/out/padded_serving.json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from bench_output import write_json
from rich.console import Console

from qbench.data.text import Padding
from qbench.validate.latency import timed_batches
from qbench.validate.load import Batcher, Draws, LoadReplay, MeasuredServiceTimes
from qbench.validate.load_search import search_max_rate
from qbench.validate.serve import real_server, serve, served_max_rate, served_stats

ROOT = Path(__file__).resolve().parents[1]
SHORT, LONG, WIDTH = 8, 100, 100


class _Runner:
    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session

    def run(self, feeds):
        return self.session.run(None, feeds)


def _model(folder: Path) -> Path:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, attn_implementation="eager")  # fmt: skip
    bert = BertModel(config).eval().requires_grad_(False)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]

    path = folder / "bert.onnx"
    example = (torch.ones(2, 16, dtype=torch.int64), torch.ones(2, 16, dtype=torch.int64))
    axes = {"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}}
    torch.onnx.export(Pooled(), example, str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["out"], dynamic_axes=axes, dynamo=False)  # fmt: skip
    return path


def _rows(count: int, long_share: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < long_share, LONG, SHORT)
    mask = (np.arange(WIDTH) < lengths[:, None]).astype(np.int64)
    return {"input_ids": rng.integers(1, 1000, size=(count, WIDTH)) * mask, "attention_mask": mask}


def _samples(runner: _Runner, feeds, padding: Padding, sizes, iterations: int) -> dict[int, np.ndarray]:
    out = {}
    for size in sizes:
        batches = timed_batches(feeds, size, padding)
        for batch in batches[:3]:
            runner.run(batch)
        times = np.empty(iterations)
        for i in range(iterations):
            start = time.perf_counter()
            runner.run(batches[i % len(batches)])
            times[i] = (time.perf_counter() - start) * 1000
        out[size] = times
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--long-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--budget-ms", type=float, default=40.0)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--checks", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "padded_serving.json")
    args = parser.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        runner = _Runner(ort.InferenceSession(str(_model(Path(tmp))), options, providers=["CPUExecutionProvider"]))
    feeds = _rows(args.rows, args.long_share, args.seed)
    padding = Padding("attention_mask", ("input_ids", "attention_mask"))
    batcher = Batcher(args.max_batch, args.delay_ms)
    samples = _samples(runner, feeds, padding, [1, args.max_batch], args.iterations)
    replay = LoadReplay(MeasuredServiceTimes(samples), batcher, Draws.make(5000, 0))
    simulated = search_max_rate(replay, args.budget_ms).max_rate_rps
    batches = timed_batches(feeds, args.max_batch)
    every = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    first = padding.trim(timed_batches(feeds, args.max_batch, padding)[0])
    servers = {"first batch": real_server(runner, first, batcher, 0),
               "whole mix": real_server(runner, every, batcher, 0, padding=padding)}  # fmt: skip
    result = {"load_average_before": os.getloadavg(), "budget_ms": args.budget_ms, "long_share": args.long_share,
              "long_rows": int((feeds["attention_mask"].sum(1) == LONG).sum()), "rows": args.rows,
              "first_batch_width": int(first["input_ids"].shape[1]), "simulated_max_rate_rps": simulated,
              "timed_p50_ms": {str(k): float(np.median(v)) for k, v in samples.items()},
              "timed_p99_ms": {str(k): float(np.percentile(v, 99)) for k, v in samples.items()},
              "claims": {}}  # fmt: skip
    for name, server in servers.items():
        claim = served_max_rate(server, simulated, args.budget_ms).max_rate_rps if simulated else None
        checks = []
        for check in range(args.checks if claim else 0):
            requests = max(200, int(claim * 0.25))
            arrivals = np.cumsum(Draws.make(requests, 100 + check).unit_gaps) * (1000.0 / claim)
            stats = served_stats(serve(runner, feeds, arrivals, batcher, padding=padding, first_row=check * requests),
                                 claim)  # fmt: skip
            checks.append({"p99_ms": stats.p99_ms, "overloaded": stats.overloaded})
        missed = sum(c["p99_ms"] > args.budget_ms or c["overloaded"] for c in checks)
        result["claims"][name] = {"max_rate_rps": claim, "whole_mix_checks": checks, "missed": missed}
        print(f"{name}: claimed {claim} req/s; whole-mix load missed the {args.budget_ms} ms budget in {missed} of "
              f"{len(checks)} runs (p99 {[round(c['p99_ms'], 1) for c in checks]})")
    result["load_average_after"] = os.getloadavg()
    print({k: v for k, v in result.items() if k != "claims"})
    write_json(args.out, result, Console())


if __name__ == "__main__":
    main()
