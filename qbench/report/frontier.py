"""The latency-accuracy frontier in words: per backend and batch size, its variants from fastest to most accurate
(the console, report.md and the MLflow sweep run's description show the same lines)."""

from __future__ import annotations

from collections.abc import Mapping

from qbench.frontier.pareto import frontier_of
from qbench.report.grid import num, short
from qbench.results.schema import EMULATED, SweepResults
from qbench.validate.catalogue import METRICS
from qbench.validate.contention import contended


def frontier_text(results: SweepResults, fp32_differs: Mapping[str, str] | None = None) -> str:
    """Per backend and batch size, the frontier variants from fastest to most accurate. Neighbours with the same
    metric are joined by '=': on a frontier they are as fast within the timing noise (either would otherwise leave
    the other off it), so listing one first says nothing about its speed. `fp32_differs`: backend -> the gate's line
    saying its FP32 breaches against the first backend's (GateReport.fp32_differs), printed under its frontier: its
    figures are measured against a reference that is itself wrong."""
    metric = results.gate_metric
    direction = "higher" if METRICS[metric].higher_is_better else "lower"
    lines = [f"Frontier (p50 latency vs {metric}, {direction} is better):"]
    frontier = frontier_of(results)
    machines: dict[str, set[str]] = {}  # a backend timed on several kinds of machine: one frontier per kind, named
    for p in frontier:
        machines.setdefault(p.backend, set()).add(p.machine)
    groups: dict[tuple[str, int, str], str] = {}
    last: dict[tuple[str, int, str], float] = {}
    emulated = tied = loaded = False
    for p in frontier:
        variant = results.find(p.variant, p.backend)
        marker = "*" if variant is not None and variant.fidelity.latency == EMULATED else ""
        emulated = emulated or bool(marker)
        if variant is not None and variant.latency is not None and contended(variant.latency.at(p.batch_size)):
            marker += "~"
            loaded = True
        entry = f"{p.variant}{marker} ({short(p.p50_ms)} ms, {num(p.metric)})"
        where = f", timed on {p.machine or 'an unrecorded machine'}" if len(machines[p.backend]) > 1 else ""
        key = (p.backend, p.batch_size, where)
        if key in groups:
            same = last[key] == p.metric
            tied = tied or same
            entry = (" = " if same else " → ") + entry
        groups[key] = groups.get(key, "") + entry
        last[key] = p.metric
    lines += [f"  {backend}, batch {bs}{where}: {entries}" for (backend, bs, where), entries in groups.items()]
    if not groups:
        lines.append(f"  no variant has both a latency and a finite {metric}")
    lines += [f"  ! {line}" for line in (fp32_differs or {}).values()]
    if tied:
        lines.append("  =: the same metric, as fast within the timing noise")
    if emulated:
        lines.append("  * emulated latency: this runtime does not compute that precision natively")
    if loaded:
        lines.append("  ~ timed while other processes kept CPUs busy: on the frontier by its metric, its speed not "
                     "compared")
    return "\n".join(lines)
