"""Latency timed with more intra-op threads than usable CPUs (qbench.validate.contention.oversubscribed): named in
words with the figures, on the variant's notes and beside the threads in the report's latency table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sweep_factory import make_latency, make_sweep

from qbench.report.tables import write_markdown_report
from qbench.validate.contention import oversubscribed, oversubscription_note

POD = {"host": "n1", "cpu": "Intel Xeon", "cpus": 2, "arch": "x86_64", "affinity_cpus": 2, "cpu_quota": None}
QUOTA = {**POD, "cpus": 1, "affinity_cpus": 8, "cpu_quota": 1.5}  # a pod limited to 1.5 CPUs on an 8-CPU node


def test_threads_beyond_the_usable_cpus_are_named_with_the_figures():
    latency = replace(make_latency({1: 1.0}, threads=4), machine=POD)
    assert oversubscribed(latency) == "4 threads on 2 usable CPUs (affinity 2)"
    assert oversubscription_note(latency).startswith(
        "latency timed with 4 threads on 2 usable CPUs (affinity 2): the threads took turns")
    assert "set latency.threads to at most 2" in oversubscription_note(latency)
    taskset = {**POD, "cpus": 1, "affinity_cpus": 1}
    assert oversubscribed(replace(latency, threads=2, machine=taskset)) == "2 threads on 1 usable CPU (affinity 1)"
    assert oversubscribed(replace(latency, threads=2)) == ""  # as many threads as CPUs
    assert oversubscribed(replace(latency, machine={})) == ""  # results from before machines were recorded
    assert oversubscription_note(None) == ""


def test_threads_beyond_a_fractional_cgroup_quota_are_named_as_throttled():
    """2 threads under 1.5 CPUs of quota run 75 ms of each 100 ms period and wait out the rest: named, with the
    threads that fit (1), also for a record from a qbench that counted 1.5 CPUs as 2 usable; 1 thread under it is not
    crowded, 1 under half a CPU is, and no thread count fits there."""
    latency = replace(make_latency({1: 1.0}, threads=2), machine=QUOTA)
    assert oversubscribed(latency) == "2 threads under a cgroup quota of 1.50 CPUs (affinity 8)"
    note = oversubscription_note(latency)
    assert note.startswith("latency timed with 2 threads under a cgroup quota of 1.50 CPUs (affinity 8): the threads "
                           "used up each period's quota")  # fmt: skip
    assert "(CFS throttling)" in note and note.endswith("set latency.threads to at most 1, or time it where 2 CPUs "
                                                       "are allowed")  # fmt: skip
    rounded_up = {**QUOTA, "cpus": 2}  # written when a 1.5-CPU quota counted as 2 usable CPUs
    assert oversubscribed(replace(latency, machine=rounded_up)) == oversubscribed(latency)
    assert oversubscribed(replace(latency, threads=1)) == ""
    half = replace(latency, threads=1, machine={**QUOTA, "cpu_quota": 0.5})
    assert oversubscribed(half) == "1 thread under a cgroup quota of 0.50 CPUs (affinity 8)"
    assert oversubscription_note(half).endswith("; time it where 1 CPU is allowed")
    assert oversubscribed(replace(latency, threads=4, machine={**POD, "cpu_quota": 8.0})) == (
        "4 threads on 2 usable CPUs (affinity 2, cgroup quota 8.00 CPUs)")  # the affinity binds, not the quota


def test_the_report_marks_the_threads_of_a_crowded_timing_and_states_the_allowance(tmp_path: Path):
    fp32, *others = make_sweep().variants
    crowded = replace(fp32, latency=replace(fp32.latency, threads=4, machine=QUOTA))
    results = make_sweep([crowded, *others])
    results = replace(results, environment={**results.environment, "usable_cpus": 1, "affinity_cpus": 8,
                                            "cpu_quota": 1.5})  # fmt: skip
    text = write_markdown_report(results, None, None, tmp_path / "report.md").read_text()
    assert "**usable CPUs:** 1 (affinity 8, cgroup quota 1.50 CPUs)" in text
    latency = text[text.index("## Latency") :]
    row = next(line for line in latency.splitlines() if line.startswith("| fp32 | onnxruntime-cpu | 1 |"))
    assert row.endswith("| 4 [1] |")
    assert "- [1] latency timed with 4 threads under a cgroup quota of 1.50 CPUs (affinity 8)" in latency
    others_rows = [line for line in latency.splitlines() if line.startswith("| int8") and line.endswith("| 2 |")]
    assert others_rows  # threads within the CPUs: no mark


def test_a_quota_above_the_affinity_cpus_is_not_what_the_threads_outnumbered():
    """A quota of 4 CPUs over 2 affinity CPUs caps nothing (machine_kind leaves it out): 5 threads take turns on the 2
    CPUs, not 'under a cgroup quota of 4.00 CPUs' waiting out CFS throttling."""
    wide = {**POD, "cpus": 2, "affinity_cpus": 2, "cpu_quota": 4.0}
    latency = replace(make_latency({1: 1.0}, threads=5), machine=wide)
    assert oversubscribed(latency) == "5 threads on 2 usable CPUs (affinity 2, cgroup quota 4.00 CPUs)"
    assert "the threads took turns on the CPUs" in oversubscription_note(latency)
    assert oversubscription_note(latency).endswith("set latency.threads to at most 2, "
                                                   "or time it where 5 CPUs are allowed")
