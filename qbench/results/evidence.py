"""Which kinds of evidence a results file records: one registry the sweep writes from and the gate's checks read.

qbench adds checks that rest on figures the sweep records (an output's spread, what a variant kept of each class, the
CPUs timings ran beside). A results file written before a figure was recorded lacks it, and so does one where there
was nothing to record (FP32 decides no class on 5 rows): in the file the two look the same. So the sweep writes
`evidence`, the name of every kind it recorded (all of EVIDENCE), and the gate applies a check only to results whose
`evidence` names what the check needs; results lacking one cannot be judged on it
(qbench.gate.evaluate.missing_evidence: exit 2, fail closed). Add a kind here when the sweep starts recording a figure
a check reads, and have the check's module name it as its need.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.errors import QbenchError, did_you_mean, short_repr


@dataclass(frozen=True)
class Evidence:
    name: str  # as results.json's `evidence` lists it
    recorded: str  # where the sweep records it
    checks: str  # what the gate judges with it (named in its refusal)
    slo: bool = False  # needed only where the gate judges a latency budget (the recipe's slo:)
    task: str | None = None  # needed only for results of this task (None: every task's)
    several_backends: bool = False  # needed only for results of more than one backend
    code: bool = False  # needed only for results of a recipe naming code (model.torch, a metric's function)


EVIDENCE: dict[str, Evidence] = {e.name: e for e in (
    Evidence("output_spread", "each scope's spread", "output_spread (collapsed outputs)"),
    Evidence("spread_of_values_read", "each scope's spread over the values its task reads (scored tokens, a span's "
             "context)", "output_spread of per-token scores and answer spans"),
    Evidence("kept", "each scope's kept", "decisions_kept, tail_kept, spread_kept (lost classes, tails, dimensions)"),
    Evidence("rows_kept", "each embedding scope's kept, judged on rows too", "rows_kept (embedding rows moved off "
             "FP32's)", task="embedding"),
    Evidence("fit_kept", "each regression scope's kept, judged on each target's fit too", "fit_kept (a target "
             "predicted no better than its mean)", task="regression"),
    Evidence("drop_intervals", "each regression scope's drop_intervals", "the resolution of a pass on mae, rmse or "
             "r2 (the paired interval of its drop)", task="regression"),
    Evidence("target_drop_intervals",
             "each regression scope's drop_intervals of r2_min, and of rmse over several targets",
             "the resolution of a pass on r2_min, or on rmse over several targets (the paired interval of its drop)",
             task="regression"),
    Evidence("changed_together", "each token scope's changed_together (changed tokens a changed token shares its row "
             "with)", "the resolution of a pass on token accuracy (a row's tokens change together)",
             task="classification"),
    Evidence("stored_weights", "the reference's params.stored_weights", "the note on a reference stored rounded"),
    Evidence("random_ops", "a reference with random nodes refused by the sweep",
             "results of a deterministic reference"),
    Evidence("model_sha256", "each variant's model_sha256", "the measured model file is the one measured"),
    Evidence("project_modules", "inputs: each module of the user's project the recipe's code imported",
             "staleness of the code the PyTorch factory or a custom metric imports (a model class in another file)",
             code=True),
    Evidence("factory_files", "inputs: each file of the user's project the PyTorch factory opened to read",
             "staleness of a checkpoint or config the factory loads itself (not through model.weights)", code=True),
    Evidence("fp32_drops", "each later backend's FP32 drops, taken against the first backend's FP32", "each later "
             "backend's FP32 against the first backend's (its drops, as the report and MLflow show them)",
             several_backends=True),
    Evidence("others_cpus", "each latency point's others_cpus", "the SLO's contended timings", slo=True),
    Evidence("usable_cpus", "each latency's machine.cpus", "the SLO's timings with more threads than CPUs", slo=True),
    Evidence("keep_up_bound", "each real serving run's keep_up_undecided (kept up as the capacity its batches bound "
             "shows, not as completions within 5 % of the arrivals' span)", "the SLO's real runs at the budget's rate "
             "and at the highest rate served (a run that cannot tell whether one instance keeps up)", slo=True),
    Evidence("at_rate_bound", "each serving's at_rate_undecided (the simulated p99 at the budget's rate shown within "
             "it by the share over it up to its confidence bound, confirmed on 4x the requests, not by one replay's "
             "p99)", "the SLO's simulated p99 at the budget's rate", slo=True),
    Evidence("at_rate_breach_bound", "each serving's at_rate_undecided where the simulated p99 at the budget's rate is "
             "over it (a breach shown by the share over it down to its confidence bound, on replays independent of "
             "each other, not by one replay's p99)", "a breach of the SLO's simulated p99 at the budget's rate",
             slo=True),
    Evidence("at_rate_pooled", "each serving's at_rate and at_rate_undecided (the simulated verdict at the budget's "
             "rate over the pooled cycles of independent replays, a pass only on a pool spanning 512 relaxation times: "
             "a rate over its budget passed 2 of 40 seeds near capacity before)", "the SLO's simulated p99 at the "
             "budget's rate", slo=True),
)}  # fmt: skip

RECORDED: tuple[str, ...] = tuple(EVIDENCE)
"""What a sweep of this qbench records: every kind."""


def unrecorded(recorded: tuple[str, ...], *, slo: bool, task: str | None = None,
               several_backends: bool = True, names_code: bool = True) -> list[Evidence]:  # fmt: skip
    """The kinds the gate needs (those of an SLO only where it judges one, those of one task only for its results;
    every task's where `task` is None; those of several backends only for results of several; those of a recipe's
    code only where it names some) that `recorded` lacks."""
    return [e for e in EVIDENCE.values()
            if e.name not in recorded and (slo or not e.slo) and (task is None or e.task in (None, task))
            and (several_backends or not e.several_backends) and (names_code or not e.code)]


def names_code(recipe: object) -> bool:
    """Whether a results file's embedded recipe names code (model.torch, a metric's function): what `code` kinds
    need; one that cannot be read as a recipe counts as naming code (fail closed)."""
    model = recipe.get("model") if isinstance(recipe, dict) else None
    metrics = recipe.get("metrics") if isinstance(recipe, dict) else None
    if not isinstance(model, dict) or not isinstance(metrics, list | None):
        return True
    return bool(model.get("torch")) or any(not isinstance(m, dict) or m.get("function") for m in metrics or ())


def evidence_from_dict(raw: object) -> tuple[str, ...]:
    """results.json's `evidence`: absent (results from before qbench recorded it) reads as none. A name this qbench
    does not know was written by another qbench, for a check this one cannot apply: refused, as unknown fields are."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise QbenchError(f"evidence: got {short_repr(raw)}, expected a list of names")
    unknown = [name for name in raw if name not in EVIDENCE]
    if unknown:
        raise QbenchError(f"evidence: unknown {short_repr(unknown[0])}{did_you_mean(unknown[0], list(EVIDENCE))}: this "
                          "qbench does not know it, and judges no results it would read without it")  # fmt: skip
    return tuple(raw)
