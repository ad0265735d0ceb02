"""How many CPUs other processes kept busy while a model was timed: the load timing windows cannot see.

Windows that agree say the load did not change *during* one measurement, not that two measurements ran under
the same load. In an A/A test on a shared 2-core machine (bench/aa_latency.py: FP32's graph re-saved with an
Identity, swept as a variant) speed-ups of 0.56-1.80x came with windows agreeing within 1-4 %: other processes
were busy while one of the two was timed. So every timed point records `others_cpus`: the CPUs (of those this
process may run on) that other processes, and this process's Python threads other than the timing one (`cpu_sample`),
used, on average over its timed runs, and a report names the points
timed beside such a load: their speed-ups may be off by far more than their spreads say. Such a point (`contended`)
ranks no variant by speed: the frontier and every "faster / slower than FP32" claim compare it with nothing
(qbench.frontier), and the report marks the speed-ups taken from it.

A process can also crowd itself: intra-op threads beyond the CPUs its affinity mask and cgroup quota allow
(qbench.environment.CpuAllowance) take turns on them. Under `taskset -c 0` a CNN timed with 2 threads had a p99 of
12.2 ms against 0.10 ms with 1 (p50 0.05 ms either way): such timings describe a smaller machine than the recipe's
threads say, and `oversubscribed` names them. A cgroup CPU quota is CPU time per period, not CPUs: threads beyond
it (2 under 1.5 CPUs, 1 under 0.5) use up each period's quota before it ends and wait out the rest (CFS throttling),
so their tail is the quota's; `oversubscribed` names those too, by the quota.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qbench.environment import binding_quota, recorded_quota

if TYPE_CHECKING:  # pragma: no cover
    import psutil

    from qbench.results.schema import LatencyPoint, LatencyResult, SweepResults

# Other processes using half a CPU on average held one of ours half of the time: enough to move a p50 by more
# than the timing windows' 5 % (the A/A test's outliers ran beside one to two busy CPUs).
CONTENDED_CPUS = 0.5


def contended(point: LatencyPoint | None) -> bool:
    """Whether `point` was timed while other processes kept CONTENDED_CPUS or more busy (False when not recorded)."""
    return point is not None and point.others_cpus >= CONTENDED_CPUS


def oversubscribed(latency: LatencyResult | None) -> str:
    """How `latency`'s intra-op threads outnumbered what it was timed on, in words ('' when they did not, or either
    is not recorded): `_crowding`'s."""
    return _crowding(latency)[0]


def _crowding(latency: LatencyResult | None) -> tuple[str, bool]:
    """`oversubscribed`'s words, and whether the cgroup CPU quota is what the threads outnumbered ('2 threads under a
    cgroup quota of 1.50 CPUs (affinity 8)': each period the threads used up the quota and waited for the next, so a
    fractional quota crowds as many threads as it rounds up to), else the usable CPUs ('4 threads on 2 usable CPUs
    (affinity 2)')."""
    if latency is None or latency.threads is None:
        return "", False
    threads, machine = latency.threads, latency.machine
    cpus, quota = machine.get("cpus"), recorded_quota(machine)
    if not isinstance(cpus, int):
        return "", False
    affinity = f"affinity {machine['affinity_cpus']}" if "affinity_cpus" in machine else ""
    plural = "s" * (threads != 1)
    binding = binding_quota(machine)  # the quota crowds them only where it binds
    if binding is not None and threads > binding:
        pinned = f" ({affinity})" * bool(affinity)
        return f"{threads} thread{plural} under a cgroup quota of {binding:.2f} CPUs{pinned}", True
    if threads <= cpus:
        return "", False
    limits = ", ".join(limit for limit in (affinity, f"cgroup quota {quota:.2f} CPUs" if quota else "") if limit)
    return f"{threads} thread{plural} on {cpus} usable CPU{'s' * (cpus != 1)}" + (f" ({limits})" * bool(limits)), False


def threads_that_fit(machine: dict[str, Any]) -> int:
    """The most intra-op threads `machine` times unhindered: its usable CPUs, at most its quota rounded down (0 under
    a quota below 1 CPU, where even one thread is throttled)."""
    cpus, quota = int(machine.get("cpus") or 0), recorded_quota(machine)
    return cpus if quota is None else min(cpus, math.floor(quota))


def oversubscription_note(latency: LatencyResult | None) -> str:
    """The note a variant timed with more threads than usable CPUs, or than its cgroup quota, carries ('' for one
    that was not)."""
    crowded, by_quota = _crowding(latency)
    if not crowded or latency is None:
        return ""
    if by_quota:
        why = ("the threads used up each period's quota before the period ended and waited out the rest (CFS "
               "throttling), so its latencies, its tail most, are the quota's rather than the model's (and so are the "
               "SLO verdict and cost per inference taken from them)")  # fmt: skip
    else:
        why = ("the threads took turns on the CPUs, so its latencies (and the SLO verdict and cost per inference "
               f"taken from them) describe a smaller machine than {latency.threads} threads")  # fmt: skip
    fit = threads_that_fit(latency.machine)
    remedy = f"set latency.threads to at most {fit}, or time it" if fit >= 1 else "time it"
    return f"latency timed with {crowded}: {why}; {remedy} where {cpus_allowed(latency.threads)}"


def cpus_allowed(threads: int) -> str:
    """'1 CPU is allowed', '4 CPUs are allowed': where a timing of `threads` threads crowds nothing."""
    return f"{threads} CPU{' is' if threads == 1 else 's are'} allowed"


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant: busy on this process's CPUs (every process) and the timing's own: this
    process's, less its other Python threads' (`cpu_sample`)."""

    wall_s: float
    busy_s: float
    own_s: float


def cpu_sample() -> CpuSample:
    """Now's counters (psutil; the CPUs of this process's affinity where the platform has one). The timing's own CPU
    is the calling thread's and the runtime's native threads' (ONNX Runtime's and torch's pools, spinning included:
    the model's cost), not that of this process's other Python threads: MLflow's system-metrics sampler, the progress
    bar's refresh, another job's measurement take CPUs from the model as another process would, so they count as
    others' (as one process they hid that load). Where the platform does not list threads, the whole process's."""
    import psutil

    per_cpu = psutil.cpu_times(percpu=True)
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    busy = 0.0
    for index in mine:
        if index < len(per_cpu):
            times = per_cpu[index]
            busy += sum(times) - times.idle - getattr(times, "iowait", 0.0)
    process = psutil.Process()
    own = process.cpu_times()
    return CpuSample(time.perf_counter(), busy, own.user + own.system - _helper_threads_s(process))


def _helper_threads_s(process: psutil.Process) -> float:
    """CPU seconds of this process's Python threads other than the calling one (0 where threads are not listed)."""
    import psutil

    helpers = {thread.native_id for thread in threading.enumerate() if thread is not threading.current_thread()}
    try:
        return sum(t.user_time + t.system_time for t in process.threads() if t.id in helpers)
    except (psutil.AccessDenied, NotImplementedError):
        return 0.0


# The kernel's CPU counters advance in clock ticks (10 ms at the usual 100 Hz): over a window of a millisecond one
# tick of anyone's work read as 10 busy CPUs (a probe on 2 CPUs was told 'other processes kept 39.85 CPUs busy').
# Over 0.25 s a tick per CPU is 0.04 CPUs; a shorter window says nothing about the load.
MIN_WINDOW_S = 0.25


def others_cpus(start: CpuSample, end: CpuSample) -> float:
    """CPUs other processes kept busy between two samples, on average (never below 0: the counters tick at
    different moments); NaN when less time passed than the counters can resolve (MIN_WINDOW_S)."""
    wall = end.wall_s - start.wall_s
    if wall < MIN_WINDOW_S:
        return math.nan
    return max(0.0, ((end.busy_s - start.busy_s) - (end.own_s - start.own_s)) / wall)


def contention_notes(results: SweepResults) -> list[str]:
    """A note per backend with a point timed while other processes kept CONTENDED_CPUS or more busy, naming the
    busiest point and the quietest one: a speed-up between them compares loads, not variants."""
    notes = []
    for backend in results.backends():
        timed = [v for v in results.variants if v.backend == backend and v.status == "ok" and v.latency is not None
                 and "identical_to" not in v.params]  # a twin reports its twin's timing: name the one timed
        points = [(p.others_cpus, v.variant, p.batch_size) for v in timed
                  for p in v.latency.points  # type: ignore[union-attr]
                  if math.isfinite(p.others_cpus)]  # fmt: skip
        busy = max(points, default=None, key=lambda point: point[0])
        if busy is None or busy[0] < CONTENDED_CPUS:
            continue
        quiet = min(points, key=lambda point: point[0])
        notes.append(f"{backend}: other processes kept {busy[0]:.2f} CPUs busy while {busy[1]} was timed at batch "
                     f"{busy[2]} ({quiet[0]:.2f} while {quiet[1]} was, at batch {quiet[2]}): speed-ups on it may be "
                     "off by far more than the timing windows' spread; "
                     "time the sweep on a machine nothing else runs on")  # fmt: skip
    return notes
