"""The highest Poisson rate whose p99 the load simulation shows within a budget (qbench.validate.load, .tail).

`_search_once` tries a geometric grid of rates (halving from capacity) and then bisects, on one replay's draws (the
same at every rate: common random numbers, so figures at neighbouring rates are comparable). With batching, p99 is
not monotone in the rate (a higher rate fills batches before the queue delay runs out), so the rate found is the
upper edge of the highest passing interval the grid meets, to `rel_tol`. `search_max_rate` runs it again on GROWTH
times the requests until two searches agree and the edge is placed, within a cost: MAX_BATCHES simulated batches
(the simulation's unit of work, a Python step each at low rates). Timings with a heavy tail (a loaded machine
preempting the runtime for tens of milliseconds in one timed run of a thousand) put the requests over a budget in a
few rare clusters whose share grows about as the rate does, so the rate 5 % above the edge stays undecided however
far the requests grow: a digits MLP timed on 2 CPUs at load 4-6 took 98 simulations and 2.7 million batches (11-20
s) to end unsettled at 320,000 requests. The budget stops such a search before a round it cannot afford, unsettled,
and claims the lower of its last two searches' rates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from qbench.errors import QbenchError
from qbench.results.serving import LoadStats
from qbench.validate.load import LoadReplay, throughput_falls
from qbench.validate.tail import TAIL_SHARE, Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RateSearch:
    """The highest rate whose p99 was shown within the budget (None: not even a near-idle load's was), with its
    figures; `requests`: the simulated requests that showed it (from `search_max_rate`: the most of its searches
    ran, the last; the rate may be the lower of the last two); `undecided`: the rate RESOLUTION above it was neither
    shown within nor over the budget, or (from `search_max_rate`) the searches did not settle within the requests or
    the batches allowed: the rate is claimed low, possibly by more than RESOLUTION; `batches`: the batches simulated
    (from `search_max_rate`: over all its searches); `cut_short`: `search_max_rate` stopped unsettled because its next
    round would have passed the batches allowed (below the requests allowed)."""

    budget_ms: float
    max_rate_rps: float | None
    at_max: LoadStats | None
    simulations: int
    requests: int = 0
    undecided: bool = False
    batches: int = field(default=0, compare=False)  # what the search cost, not what it found
    cut_short: bool = False


_GRID_STEPS = 12  # the search's lowest rate: capacity / 2^12, where queueing is rare
# where capacity / 2 fails, the rates between it and capacity tried first (a long queue delay can fail every rate up to
# capacity / 2, waiting for company, and pass higher ones): a passing window narrower than 1/16 of capacity is missed
_UPPER_GRID = tuple((16 - j) / 16 for j in range(1, 8))  # 15/16 .. 9/16 of capacity


MAX_REQUESTS = 320_000  # the search extends its simulation up to this many requests (GROWTH times at a time)
# the simulated batches a search may spend, over all its rounds: a round that would take it past them is not run
# (a round costs about GROWTH times the one before; 1,000,000 batches are about 1.5 s of one 2-CPU machine's core)
MAX_BATCHES = 1_000_000
GROWTH = 4
# the verdict at one rate (judge_rate) may replay GROWTH times the search's requests (about 0.4 GB and 1-2 s at
# 1,280,000: a rate whose bound the search's most requests left undecided is often decided there)
JUDGE_MAX_REQUESTS = MAX_REQUESTS * GROWTH
RESOLUTION = 0.05  # the bound is tight enough when the rate this much higher is shown over the budget


def search_max_rate(
    replay: LoadReplay,
    budget_ms: float,
    *,
    overhead_ms: float = 0.0,
    rel_tol: float = 0.01,
    max_simulations: int = 60,
    max_requests: int = MAX_REQUESTS,
    max_batches: int | None = MAX_BATCHES,
) -> RateSearch:
    """The highest Poisson rate whose p99 is shown within `budget_ms`: at most 1 % of the simulated requests over the
    budget, up to the upper confidence bound over the regenerative cycles (qbench.validate.tail). The simulated p99
    itself near capacity is often well below the truth (5,000 requests hold few independent queues), so a rate is
    claimed only where the bound passes. The search (`_search_once`) is run again on GROWTH times the requests
    (fresh draws, same seed) until two searches agree within RESOLUTION and the rate RESOLUTION above the one found
    is shown over the budget (not undecided: its share within 1 %, its bound not); the lower of the two is claimed (a
    sample quiet by chance claims high, and stopping on the first that looks decided keeps its luck). A search that
    stops unsettled (at `max_requests`, or before a round whose batches, GROWTH times the last round's, would take it
    past `max_batches`; None: no such bound) claims the lower of its last two searches' rates too (a search that found
    none: no rate), and says so (`undecided`; the latter also `cut_short`)."""
    if not budget_ms > 0:
        raise QbenchError(f"budget_ms must be positive, got {budget_ms}")
    runs, batches, previous, cut_short = 0, 0, None, False
    while True:
        before = replay.batches
        search = _search_once(replay, budget_ms, overhead_ms=overhead_ms, rel_tol=rel_tol,
                              max_simulations=max_simulations)  # fmt: skip
        runs, spent = runs + search.simulations, replay.batches - before
        batches += spent
        requests = replay.draws.requests
        settled = previous is not None and _close(previous.max_rate_rps, search.max_rate_rps) and not search.undecided
        if settled:
            break
        if requests >= max_requests or replay.draws.seed is None:
            limit = "the most allowed" if requests >= max_requests else "all the draws given"
            break
        more = min(requests * GROWTH, max_requests)
        if max_batches is not None and batches + spent * more / requests > max_batches:
            limit = f"the most {max_batches:,} simulated batches allow (timings too noisy to place the edge)"
            cut_short = True
            break
        previous, replay = search, replay.with_requests(more)
    last = search
    if previous is not None and _lower(previous.max_rate_rps, search.max_rate_rps):
        search = previous  # a sample that was quiet by chance claims high
    if not settled:
        earlier = f" ({_rate_text(previous.max_rate_rps)} at {previous.requests:,})" if previous else ""
        logger.info("the highest rate within the %g ms budget, %s, is not settled at %s simulated requests%s, %s: "
                    "claimed %s", budget_ms, _rate_text(last.max_rate_rps), f"{requests:,}", earlier, limit,
                    _rate_text(search.max_rate_rps))  # fmt: skip
    return replace(search, simulations=runs, requests=last.requests, undecided=not settled, batches=batches,
                   cut_short=cut_short)


def _rate_text(rate_rps: float | None) -> str:
    """A searched rate as the report's serving table writes it (82,365 req/s), or that none met the budget."""
    return "no rate" if rate_rps is None else f"{rate_rps:,.0f} req/s"


def _close(before: float | None, after: float | None) -> bool:
    """Two searches' rates agree within RESOLUTION (neither found one: agreed)."""
    if before is None or after is None:
        return before is after
    return abs(after - before) <= RESOLUTION * after


def _lower(earlier: float | None, later: float | None) -> bool:
    """The earlier search's rate is below the later one's (no rate is below every rate)."""
    return later is not None and (earlier is None or earlier < later)


def _search_once(
    replay: LoadReplay, budget_ms: float, *, overhead_ms: float, rel_tol: float, max_simulations: int
) -> RateSearch:
    """On the replay's draws: try the rates of a geometric grid from capacity / 2 down to capacity / 2^12 until one
    passes (where capacity / 2 fails, first 15/16 down to 9/16 of capacity), then bisect to `rel_tol` between it and
    the next one up (which failed, or is capacity). A rate at or above
    capacity fails whatever its simulated p99 (a fast model drains a finite simulation within the budget at any
    rate). From the top, not doubling from the lowest rate until one fails: with batching, p99 falls as the rate
    rises (batches fill before the queue delay runs out), so a long queue delay fails every low rate and passes
    higher ones, and p99 can fail and pass again as rates rise. Bounded: at most `max_simulations` simulations.
    `undecided`: the rate RESOLUTION above the one found (or, none found, the grid's lowest) is neither shown within
    nor over the budget: the bound is too loose to place the edge within RESOLUTION. A rate found within RESOLUTION
    of capacity is placed by capacity, except where a smaller batch serves more requests a second than the full batch
    (qbench.validate.load.throughput_falls): there the requests over the budget come in rare, long excursions into
    full batches, which a quiet replay holds none of, so it is undecided and the search runs on more requests (batch
    1 in 0.5 ms, 8 in 1 ms, 32 in 8 ms behind a batcher of 32: 3,969 req/s of 4,000 was claimed, settled on 5,000 and
    20,000 requests, whose p99 over 200,000 fresh ones was 31 ms against a 20 ms budget)."""
    runs = 0

    def verdict(rate: float) -> tuple[Verdict, LoadStats | None]:
        nonlocal runs
        runs += 1
        return replay.verdict(rate, budget_ms, overhead_ms=overhead_ms)

    low, high, best, lowest = 0.0, replay.capacity_rps, None, Verdict.FAIL
    grid = [replay.capacity_rps / 2**step for step in range(1, _GRID_STEPS + 1)]
    for rate in grid:  # from the top: the first rate passing is the grid's highest
        lowest, stats = verdict(rate)
        if lowest is Verdict.PASS:
            low, best = rate, stats
            break
        if rate == grid[0]:  # capacity / 2 did not pass: the rates above it first
            for upper in (fraction * replay.capacity_rps for fraction in _UPPER_GRID):
                judged, stats = verdict(upper)
                if judged is Verdict.PASS:
                    low, best = upper, stats
                    break
                high = upper
            if best is not None:
                break
        high = rate
    requests = replay.draws.requests
    if best is None:
        return RateSearch(budget_ms, None, None, runs, requests, lowest is Verdict.UNDECIDED)
    while runs < max_simulations and (high - low) > rel_tol * low:
        middle = (low + high) / 2
        judged, stats = verdict(middle)
        if judged is Verdict.PASS:
            low, best = middle, stats
        else:
            high = middle
    beyond = low * (1 + RESOLUTION)
    if beyond < replay.capacity_rps:
        undecided = verdict(beyond)[0] is Verdict.UNDECIDED
    else:  # capacity places the edge, unless full batches are the slowest (throughput_falls): see the docstring
        undecided = throughput_falls(replay.service, replay.batcher.max_batch_size)
    return RateSearch(budget_ms, low, best, runs, requests, undecided)


def judge_rate(
    replay: LoadReplay, rate_rps: float, budget_ms: float, *, overhead_ms: float = 0.0,
    max_requests: int = JUDGE_MAX_REQUESTS, max_batches: int | None = None,
) -> tuple[LoadStats, Verdict]:  # fmt: skip
    """The figures at `rate_rps` and whether they show its p99 within `budget_ms` (qbench.validate.tail: PASS where
    the upper confidence bound of the share of requests over it is within TAIL_SHARE, FAIL where the lower one is
    over, or the rate is at or above capacity; else UNDECIDED), a verdict standing only where the next replay, on
    GROWTH times the requests and draws independent of this one's, gives it too: replayed on more requests while
    undecided or not yet confirmed, up to `max_requests` and before a round that would take it past `max_batches`
    (None: the requests bound it; the verdict then stands as the last replay gave it, but where the replay before it
    gave the opposite one: two independent replays, one within the budget and one over it, show neither, UNDECIDED);
    the figures are the last replay's. The verdict at one rate is a gate's, and cheap beside a search (one rate, not
    dozens), so it may run GROWTH times further than the search, whatever the batches (at batch size 1, 1.7 million,
    about 3 s). Near capacity a replay of 5,000 requests holds few of the long queues the requests over a budget come
    in: M/D/1 at 460 req/s of 500 (true p99 57.3 ms) showed a p99 within a 45.8 ms budget on 5 of 10 seeds, and one at
    480 req/s (114.9 ms) passed even the upper confidence bound. Nor is one replay's share over 1 % a breach: batch 1
    in 0.5 ms, 8 in 1 ms and 32 in 8 ms behind a batcher of 32 at 3,900 of its 4,000 req/s (0.2 % of requests over a 20
    ms budget in 2 million) breached on 7 of 40 seeds, its p99 over the budget in one replay of 20,000-80,000 requests
    that held one excursion into full batches (tests/validate/test_load_rate.py)."""
    spent, previous = 0, None
    # near a capacity that full batches, the slowest per request, set (throughput_falls: rare, long excursions into
    # them), a verdict stands only on the most requests: at 3,980 of 4,000 req/s (true p99 81.6 ms against 20) 7 of 10
    # seeds passed on 5,000 and 20,000. There one cycle can hold most of a run's requests over the budget (45,897 of
    # 1,280,000 at 3,980 req/s), so no bound over cycles shows a breach: two independent replays each with more than
    # TAIL_SHARE over it do
    rare = (rate_rps * (1 + RESOLUTION) >= replay.capacity_rps
            and throughput_falls(replay.service, replay.batcher.max_batch_size))
    confirmed_at = max_requests if rare else 0
    while True:
        before = replay.batches
        stats, bound = replay.within(rate_rps, budget_ms, overhead_ms=overhead_ms)
        this_round = replay.batches - before
        spent += this_round
        if stats.overloaded:  # no replay sustains a rate at or above capacity
            return stats, Verdict.FAIL
        judged, requests = bound.verdict(), replay.draws.requests
        if rare and judged is Verdict.UNDECIDED and bound.share > TAIL_SHARE:  # see `rare`: replays, not cycles, tell
            judged = Verdict.FAIL
        more = min(requests * GROWTH, max_requests)
        settled = judged is Verdict.FAIL or requests >= confirmed_at
        if judged is previous and judged is not Verdict.UNDECIDED and settled:
            return stats, judged
        if requests >= max_requests or replay.draws.seed is None:
            return stats, _unconfirmed(judged, previous)
        if max_batches is not None and spent + this_round * more / requests > max_batches:
            return stats, _unconfirmed(judged, previous)
        previous, replay = judged, replay.with_requests(more, independent=True)


def _unconfirmed(judged: Verdict, previous: Verdict | None) -> Verdict:
    """The verdict of replays that end unconfirmed: the last one's, UNDECIDED where the one before it said the opposite.
    At 3,950 req/s of the batch 1/8/32 model (1.6-2.1 % over a 20 ms budget) 1 of 40 seeds passed on 1,280,000
    requests after 320,000 independent ones breached, and the gate passed it."""
    return Verdict.UNDECIDED if {judged, previous} == {Verdict.PASS, Verdict.FAIL} else judged
