"""How often the simulated verdict at a budget's rate is wrong or undecided, over many seeds, near a capacity that
full batches set (qbench.validate.load_verdict.judge_rate, the verdict `qbench gate` judges the SLO by).

A timing table as data (batch 1 in 0.5 ms, 8 in 1 ms, 32 in 8 ms: 4,000 req/s at full batches, 8,000 at batches of
8), a batcher of 32 with a 2 ms delay, a 20 ms budget. For each rate, each seed's verdict (pass / fail / undecided)
is counted, beside the share of requests over the budget on long independent replays of fresh draws (the truth the
verdicts are wrong or right about: a share at most 1 % is a p99 within the budget).

    python bench/slo_verdict_near_capacity.py [--seeds 40] [--rates 3800,3900,3950,4000] [--truth 20000000]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from qbench.validate.load import Batcher, Draws, LoadReplay, MeasuredServiceTimes
from qbench.validate.load_verdict import JUDGE_MAX_REQUESTS, judge_rate

TIMINGS = {1: np.full(200, 0.5), 8: np.full(200, 1.0), 32: np.full(200, 8.0)}
BUDGET_MS = 20.0
BATCHER = Batcher(32, 2.0)


def _share_over(service: MeasuredServiceTimes, rate: float, requests: int) -> float:
    """The share of `requests` over the budget, over independent replays of at most JUDGE_MAX_REQUESTS pooled (one
    replay of 4 million requests put 2.65 % over it at 3,950 req/s, 171 million 1.79 %)."""
    replay, pooled = LoadReplay(service, BATCHER, Draws.make(min(requests, JUDGE_MAX_REQUESTS), seed=10_000)), None
    for again in range(-(-requests // JUDGE_MAX_REQUESTS)):
        again_replay = replay.with_requests(replay.draws.requests, independent=True, again=again + 1)
        stats, _, cycles = again_replay.run(rate, BUDGET_MS)
        if stats.overloaded:
            return 1.0
        pooled = cycles if pooled is None else pooled.joined(cycles)
    return float(pooled.over.sum() / pooled.requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--rates", default="3800,3900,3950,4000")
    parser.add_argument("--truth", type=int, default=20_000_000, help="requests of the replays that give the truth")
    args = parser.parse_args()
    service = MeasuredServiceTimes(TIMINGS)
    for rate in (float(r) for r in args.rates.split(",")):
        truth = _share_over(service, rate, args.truth)
        verdicts: Counter[str] = Counter()
        started = time.process_time()
        for seed in range(args.seeds):
            verdicts[judge_rate(LoadReplay(service, BATCHER, Draws.make(5000, seed)), rate, BUDGET_MS)[1].value] += 1
        seconds = (time.process_time() - started) / args.seeds
        print(f"{rate:,.0f} req/s: {truth:.3%} over {BUDGET_MS:g} ms in {args.truth:,} requests; verdicts over "
              f"{args.seeds} seeds {dict(verdicts)}; {seconds:.2f} s of CPU a verdict")


if __name__ == "__main__":
    main()
