"""Re-timing the search's finalists: interleaved rounds of FP32 and the fastest passing candidates, as many as the time
budget leaves room for while the rounds still disagree.

    p50s, rounds = retime_rounds(time_one, keys, tie=tie, room=room)   # called by qbench.search.run

Each round times FP32 (key None) and every finalist once, in turn, so that each candidate's timing has an FP32 timing
taken under the same machine load beside it. `RETIME_ROUNDS` rounds always run; more follow, up to
`MAX_RETIME_ROUNDS`, while some finalist's speed-up is not yet fixed within half the tie margin (`settled`) and the
budget has room for another round as long as the last one. Three rounds were not enough on a loaded 2-core machine: a
ViT's search finished in 35 s of a 75 s budget and kept ORT static at 1.30x over ORT dynamic at 1.06x, where 5 rounds
of 40-200 runs side by side put them at 0.90-1.00x and 1.25-1.28x; a GRU's pick (only its classifier head quantized)
was reported at 1.71x FP32, the sweep's own timing 0.93x / 1.09x.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence

RETIME_ROUNDS = 3  # interleaved rounds every re-timing runs
MAX_RETIME_ROUNDS = 15  # at most, while the budget lasts and the rounds disagree

Timing = Mapping[int, float]  # batch size -> p50 ms


def round_speedups(fp32: Sequence[Timing], candidate: Sequence[Timing]) -> list[float]:
    """Per round, FP32's timing over the candidate's (geometric mean over the batch sizes both were timed at)."""
    ratios = []
    for reference, timing in zip(fp32, candidate, strict=True):
        shared = [b for b in reference if b in timing and timing[b] > 0 and reference[b] > 0]
        if shared and all(math.isfinite(reference[b]) and math.isfinite(timing[b]) for b in shared):
            ratios.append(math.exp(sum(math.log(reference[b] / timing[b]) for b in shared) / len(shared)))
    return ratios


def uncertainty(ratios: Sequence[float]) -> float:
    """How far the median of per-round speed-ups may be off, relative to it: the standard error of a median
    (1.25 σ / √n), σ estimated robustly from the median absolute deviation (1.4826 MAD), so one outlying round
    does not count as disagreement. inf with fewer than two rounds."""
    if len(ratios) < 2:
        return math.inf
    middle = statistics.median(ratios)
    if middle <= 0:
        return math.inf
    spread = 1.4826 * statistics.median(abs(r - middle) for r in ratios)
    return 1.2533 * spread / math.sqrt(len(ratios)) / middle


def settled(timed: Mapping[Hashable, Sequence[Timing]], tie: float) -> bool:
    """Whether every finalist's speed-up (its per-round ratios to FP32, key None) is fixed within half the tie
    margin: two finalists that far apart are then ranked by their timings, not by which rounds were lucky."""
    fp32 = timed[None]
    return all(uncertainty(round_speedups(fp32, rounds)) <= tie / 2 for key, rounds in timed.items() if key is not None)


def retime_rounds(
    time_one: Callable[[Hashable], dict[int, float]], keys: Sequence[Hashable], *, tie: float,
    room: Callable[[float], bool], clock: Callable[[], float],
) -> tuple[dict[Hashable, dict[int, float]], int]:  # fmt: skip
    """Interleaved rounds timing FP32 (None) and each of `keys` by `time_one`; the median p50 per batch size of
    each, and how many rounds ran. After RETIME_ROUNDS, another round starts only while the finalists are not
    `settled`, fewer than MAX_RETIME_ROUNDS ran, and `room(seconds)` says the budget has `seconds` left for one as
    long as the slowest so far."""
    timed: dict[Hashable, list[dict[int, float]]] = {key: [] for key in [None, *keys]}
    longest = 0.0
    for count in range(1, MAX_RETIME_ROUNDS + 1):
        started = clock()
        for key, rounds in timed.items():
            rounds.append(time_one(key))
        longest = max(longest, clock() - started)
        if count >= RETIME_ROUNDS and (settled(timed, tie) or not room(longest)):
            break
    shared = set.intersection(*(set(t) for rounds in timed.values() for t in rounds))
    medians = {key: {b: statistics.median(t[b] for t in rounds) for b in sorted(shared)}
               for key, rounds in timed.items()}
    return medians, len(timed[None])
