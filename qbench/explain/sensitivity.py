"""Which quantized nodes cost the accuracy? Per-node (or per-group) sensitivity of an INT8 variant, measured.

    outcome = run_explain(recipe, "int8-minmax", method="leave_one_out")   # `qbench explain`

The variant is built once; each candidate keeps some nodes in float and runs on the recipe's evaluation rows
against FP32, scored with the gate metric overall and per slice. Groups rank by the gate first (`Score.breach`: how
far past its tolerances a group takes the variant, or keeps it), then by the overall drop: a node breaking one slice
is the one to keep float, not one costing more overall within it.

- leave_one_out: all quantized but one group; cost = the drop recovered when that group stays float.
  Groups that only matter together (either one ruins the output) each recover little: when the recovered drops
  sum to under half the variant's drop, the result says so (`explained_share`, a note, the table's title).
- one_at_a_time: only that group quantized; cost = the drop it causes alone.
- sqnr: no rebuilt candidates; cost = the noise a group's quantization causes at the model's outputs (their
  noise-to-signal ratio vs FP32, less that with the group's Q/DQ bypassed: one run per group,
  qbench.explain.output), as the INT8 search ranks its keep-float nodes; a group no graph edit can bypass (a
  dynamic build's integer kernels) keeps its place by the noise it adds where it computes (its output's ratio minus
  its inputs', from intermediate tensors of both models). A note says which ranking was used.

The graph side (which nodes are quantized, candidates that keep a group float, SQNR) is
`qbench.explain.graph`; the scores, groups and their order `qbench.explain.rank` (which `qbench.fallback` reuses to
choose which nodes to keep in FP32); this module measures the candidates and writes the report.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from qbench.backends import Backend, get_backend
from qbench.backends.base import RunOptions
from qbench.console import print_wide
from qbench.errors import QbenchError, expected_one_of, plain_name
from qbench.explain.graph import float_keeper, quantized_nodes, sqnr_costs
from qbench.explain.output import output_effects
from qbench.explain.rank import (
    NodeCost,
    Score,
    explained_share,
    group_nodes,
    interaction_note,
    rank_by_output,
    rank_by_sqnr,
    rank_groups,
    score_accuracy,
)
from qbench.explain.spec import explained_spec, swept_calibrator
from qbench.files import replace_atomically, write_atomically
from qbench.gate.evaluate import GateReport, judge
from qbench.gate.resolution import JudgedTry, passing
from qbench.gate.tolerance import reference_tolerances
from qbench.preflight.prepare import Prepared, prepare
from qbench.recipe.spec import GateSpec, Recipe, VariantSpec
from qbench.report.grid import NONE, figure, finite, percent, signed
from qbench.techniques.calibrators import AUTO_CALIBRATORS
from qbench.validate.measure import measure
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.base import unranged_reason
from qbench.variants.float_rules import default_notes
from qbench.variants.onnx_utils import discard_built, load_model

logger = logging.getLogger(__name__)

METHODS = ("leave_one_out", "one_at_a_time", "sqnr")
EXPLAINED_FLOOR = 0.5  # leave-one-out recovering less of the drop than this: the groups interact
# the techniques that quantize the FP32 graph node by node (a QAT or ModelOpt variant is a model exported anew)
GROUPINGS = ("node", "op_type", "layer", "pattern")


@dataclass(frozen=True)
class ExplainResult:
    recipe: str
    variant: str
    calibrator: str
    method: str
    group_by: str
    metric: str
    backend: str
    rows: int
    drop: float  # the whole variant's gate-metric drop, overall
    worst_slice: str | None
    worst_slice_drop: float
    quantized_nodes: int
    costs: tuple[NodeCost, ...]  # costliest first
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    explained_share: float = math.nan  # leave_one_out: the groups' recovered drops summed, of the whole drop
    breach: float = math.nan  # the whole variant's gate breach (Score.breach): 0 when it passes

    @property
    def explains_little(self) -> bool:
        return self.explained_share < EXPLAINED_FLOOR  # False when NaN (another method, or no drop)

    def to_dict(self) -> dict[str, Any]:
        return _json_ready(dataclasses.asdict(self) | {"explains_little": self.explains_little})


@dataclass(frozen=True)
class ExplainOutcome:
    result: ExplainResult
    directory: Path
    mlflow_run_id: str | None


Judged = Callable[[BuiltVariant], tuple[Score, GateReport]]


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


# -- the explain run ---------------------------------------------------------------------------------------


class _Evaluator:
    """Runs variants on the recipe's evaluation rows and scores them against FP32 with the gate metric."""

    def __init__(self, prepared: Prepared, backend: Backend) -> None:
        self.prepared, self.backend = prepared, backend
        fp32 = measure(backend, BuiltVariant("fp32", "fp32", prepared.source.onnx_path), prepared)
        self.reference, self.fp32 = fp32.reference, fp32.result
        if self.reference is None:
            raise QbenchError("explain: the FP32 model could not be run on the evaluation rows")
        self.tolerances = reference_tolerances(fp32.result, prepared.recipe.gate)  # what the gate judges with

    def score(self, built: BuiltVariant) -> Score:
        return self.judged(built)[0]

    def judged(self, built: BuiltVariant) -> tuple[Score, GateReport]:
        """Its score, and the gate's verdict on it (qbench.gate.evaluate.judge: an unresolved pass is a pass, with its
        reasons)."""
        measured = measure(self.backend, built, self.prepared, reference=self.reference, quiet=True)
        if measured.result.accuracy is None:
            raise QbenchError(f"explain: {built.name} could not be measured: {measured.result.error}")
        gate = self.prepared.recipe.gate
        verdict = judge(self.fp32, measured.result, gate, self.tolerances, self.prepared.distinct_inputs)
        return score_accuracy(measured.result.accuracy, gate, measured.nsr), verdict


def explain_variant(
    recipe: Recipe, variant_name: str, *, method: str = "leave_one_out", group_by: str = "node",
    max_nodes: int | None = None, workdir: Path | None = None, track: bool = True,
) -> ExplainResult:  # fmt: skip
    """Rank the quantized nodes (or groups) of an ONNX Runtime INT8 variant by what they cost the gate metric.

    Evaluates on the recipe's evaluation rows (data.evaluation.limit applies) on its first ONNX Runtime
    backend. max_nodes: measure only this many groups, the noisiest by SQNR. The built variant is kept
    under `workdir` (a temporary folder when None). `track`: check the tracking store (not for `--no-track`).
    """
    started = time.perf_counter()
    for value, allowed, what in ((method, METHODS, "method"), (group_by, GROUPINGS, "group")):
        if value not in allowed:
            raise QbenchError(f"explain: {what} {expected_one_of(value, allowed)}")
    if max_nodes is not None and max_nodes <= 0:
        raise QbenchError(f"explain: max_nodes must be positive, got {max_nodes}")
    spec, notes = explained_spec(recipe, variant_name)
    from qbench.execute.snapshot import take_snapshot
    from qbench.execute.store import build_store
    from qbench.provenance import input_digests

    # builds and measures read one copy of the model: an edit during the ranking cannot mix two models
    inputs, sources = input_digests(recipe), build_store(recipe).sources_root
    prepared = prepare(recipe, track=track, snapshot=lambda: take_snapshot(inputs, sources))
    backend_name = next((b for b in recipe.backends if b.startswith("onnxruntime-")), "onnxruntime-cpu")
    backend, options = get_backend(backend_name), RunOptions(threads=recipe.latency.threads)
    with tempfile.TemporaryDirectory(prefix="qbench-explain-") as tmp:
        ctx = BuildContext(prepared.source.onnx_path, (workdir or Path(tmp)) / "models", prepared.calibration_batches,
                           fixed_batch=prepared.batch)
        logger.info("%s: building, then measuring each candidate (%s, by %s)", spec.name, method, group_by)
        evaluator = _Evaluator(prepared, backend)
        notes += [f"tolerances: {evaluator.tolerances.basis}"] if evaluator.tolerances.basis else []
        swept, source = swept_calibrator(recipe, spec.name) if spec.calibrator == "auto" else (None, "")
        if swept is not None:
            spec = spec.model_copy(update={"calibrator": swept})
            notes.insert(0, f"calibrator auto: explained with {swept}, the calibrator the sweep kept ({source})")
        if spec.calibrator == "auto":
            spec, built, baseline, note = _auto_calibrated(spec, ctx, evaluator.judged, recipe.gate)
            notes.insert(0, f"{note}; {source}")
        else:
            built = build_variant(spec, ctx)
            baseline = evaluator.score(built)
        notes += default_notes(built.params)  # mask nodes kept float by default are not ranked: they are not quantized
        nodes = quantized_nodes(load_model(ctx.reference_path), built)
        if not nodes:
            why = f": {reason}" if (reason := built.params.get("unchanged") or unranged_reason(built.params)) else ""
            raise QbenchError(f"explain: variant {spec.name!r} quantizes no node, so nothing to explain{why}")
        groups = group_nodes(nodes, group_by)
        scratch = dataclasses.replace(ctx, workdir=Path(tmp) / "candidates")
        scratch.workdir.mkdir(parents=True)
        capped = max_nodes is not None and len(groups) > max_nodes
        if method == "sqnr" or capped:
            _require_fp32_tensors(built, "--method sqnr" if method == "sqnr" else "--max-nodes")
            noise = sqnr_costs(ctx.reference_path, built, nodes, [prepared.evaluation_feeds], backend, options,
                               scratch.workdir, prepared.batch)  # fmt: skip
            by_noise = rank_by_sqnr(groups, noise)
        if method == "sqnr":  # no budget to hold it to: one run per group is what leave_one_out spends anyway
            effects = output_effects(ctx.reference_path, built, groups, prepared.evaluation_feeds, backend, options,
                                     scratch.workdir, prepared.batch, math.inf)  # fmt: skip
            costs = rank_by_output(by_noise, effects)
            notes.append("ranked " + effects.describe(len(groups), "nodes" if group_by == "node" else "groups"))
            notes.append("SQNR read from intermediate tensors; exposing them can keep ORT from fusing Q/DQ")
        else:
            if capped:
                notes.append(f"measured the {max_nodes} noisiest of {len(groups)} groups (by SQNR)")
                groups = {c.group: groups[c.group] for c in by_noise[:max_nodes]}
            keeper = float_keeper(spec, scratch, built)
            costs = rank_groups(keeper, groups, evaluator.score, baseline, method, evaluator.tolerances)
    worst = max(baseline.slices, key=lambda s: baseline.slices[s], default=None)
    explained = explained_share(costs, baseline.overall) if method == "leave_one_out" else math.nan
    if explained < EXPLAINED_FLOOR:
        notes.append(interaction_note(explained, group_by))
    return ExplainResult(
        recipe=recipe.name, variant=spec.name, calibrator=str(built.params.get("calibrator")), method=method,
        group_by=group_by, metric=recipe.gate.metric, backend=backend_name, rows=len(prepared.evaluation_rows),
        drop=baseline.overall, worst_slice=worst, worst_slice_drop=baseline.slices[worst] if worst else math.nan,
        quantized_nodes=len(nodes), costs=tuple(costs), notes=tuple(notes), seconds=time.perf_counter() - started,
        explained_share=explained, breach=baseline.breach(evaluator.tolerances),
    )  # fmt: skip


@dataclass(frozen=True)
class _CalibratorTry(JudgedTry):
    """One calibrator of `calibrator: auto`, built, scored and judged by the gate on the evaluation rows."""

    spec: VariantSpec
    built: BuiltVariant
    score: Score
    verdict: GateReport

    @property
    def lowered(self) -> bool:
        return not self.built.lowered_nothing

    def label(self) -> str:
        return f"{self.spec.calibrator} {signed(self.score.overall)}{self.mark}"


def _auto_calibrated(
    spec: VariantSpec, ctx: BuildContext, judged: Judged, gate: GateSpec
) -> tuple[VariantSpec, BuiltVariant, Score, str]:
    """`calibrator: auto` without a sweep to follow: each calibrator built, scored and judged, and one kept by the
    sweep's resolution rule (qbench.gate.resolution.passing: a pass the rows resolve before one resting on too few of
    them, which is kept only when no calibrator's pass is resolved; among those, the smallest overall drop: the sweep
    keeps the fastest, and explain does not time, so with several passing it may explain another); when none passes,
    the smallest overall drop, as the sweep keeps it. The others' models are deleted."""
    tries = []
    for calibrator in AUTO_CALIBRATORS:
        candidate = spec.model_copy(update={"calibrator": calibrator})
        built = build_variant(candidate, dataclasses.replace(ctx, workdir=ctx.workdir / calibrator))
        tries.append(_CalibratorTry(candidate, built, *judged(built)))
    among = [tries[i] for i in passing(tries)] or tries
    chosen = min(among, key=lambda t: t.score.overall if math.isfinite(t.score.overall) else math.inf)
    for tried in tries:
        if tried is not chosen:
            discard_built(tried.built, ctx.workdir, with_folder=True)
    why = (f"the smallest {gate.metric} drop of those whose pass the rows resolve" if chosen.resolved_pass else
           f"the smallest {gate.metric} drop of those passing, none on enough rows to resolve the tolerance and "
           "judged on every scope: "
           f"{chosen.unresolved}" if chosen.passed else f"the smallest {gate.metric} drop, none passing")
    tried = ", ".join(t.label() for t in tries)
    note = f"calibrator auto: explained with {chosen.spec.calibrator}, {why} ({tried})"
    return chosen.spec, chosen.built, chosen.score, note


def _require_fp32_tensors(built: BuiltVariant, option: str) -> None:
    """SQNR compares the variant's intermediate tensors with FP32's: meaningless where the build rescaled them
    (SmoothQuant divides a Linear's input per channel and folds that into its producer, so the tensors between
    Linears are FP32's divided by the smoothing scales: a 'noise' of 24 % on a tensor computed exactly)."""
    if built.params.get("weights_rewritten"):
        raise QbenchError(f"explain: {option} cannot rank {built.name!r}: its build rescaled the tensors between "
                          "Linears (SmoothQuant), so they cannot be compared with FP32's; use --method leave_one_out "
                          "or one_at_a_time, without --max-nodes")  # fmt: skip


def explain_table(result: ExplainResult, top: int) -> Table:
    """Rank, group, op types, the gate breach (when the variant breaches the gate: what ranks first), then the cost
    overall and on the variant's worst slice (sqnr: the added noise)."""
    what = {"leave_one_out": "recovered", "one_at_a_time": "drop", "sqnr": "added noise"}[result.method]
    worst = plain_name(result.worst_slice) if result.worst_slice else ""  # a slice is the data's: 'a\nb' quoted
    on_worst = f" and {signed(result.worst_slice_drop)} on {worst}" if worst else ""
    explained = f"{result.variant} ({result.calibrator})" if result.calibrator not in ("", "None") else result.variant
    caveat = f"; the ranking explains only {percent(result.explained_share)} of it: see the note"
    caveat = caveat if result.explains_little else ""
    shown_breach = result.method != "sqnr" and finite(result.breach) and result.breach > 0
    past = f"; {figure(result.breach)} past the gate's tolerances, summed, ranked first" if shown_breach else ""
    # Text, never markup: a node or slice name is the model's or the data's ('dup[/tf]' stopped the command once
    # every candidate was measured, '[unknown]' printed as nothing), and a newline in one is shown escaped
    table = Table(title=Text(f"{explained}: {result.method} by {result.group_by}, {result.metric} "
                             f"(the variant drops {signed(result.drop)} overall{on_worst}{past}{caveat})"),
                  title_justify="left")  # fmt: skip
    shown_worst = result.method != "sqnr" and result.worst_slice is not None
    columns = ["rank", result.group_by, "op type"]
    breach_column = {"leave_one_out": "breach recovered", "one_at_a_time": "breach alone"}
    columns += [breach_column[result.method]] if shown_breach else []
    columns += [f"{what} overall" if result.method != "sqnr" else what]
    columns += [f"{what} on {worst}"] if shown_worst else []
    for column in [*columns, "share"]:
        table.add_column(escape(column), justify="left" if column in (result.group_by, "op type") else "right")
    for rank, cost in enumerate(result.costs[:top], 1):
        values = [signed(cost.breach)] if shown_breach else []
        nsr = f"{cost.nsr:.2e}" if finite(cost.nsr) else NONE
        values += [nsr] if result.method == "sqnr" else [signed(cost.overall)]
        values += [signed(cost.worst_slice)] if shown_worst else []
        share = percent(cost.share) if math.isfinite(cost.share) else "—"
        cells = [str(rank), plain_name(cost.group), ",".join(cost.op_types), *values, share]
        table.add_row(*(Text(cell) for cell in cells))
    return table


def plot_costs(result: ExplainResult, path: Path, top: int) -> Path:
    """Horizontal bars, costliest on top: the metric overall and on the worst slice (sqnr: added noise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(result.costs[:top])[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(shown)))
    positions = np.arange(len(shown))
    if result.method == "sqnr":
        ax.barh(positions, [c.nsr for c in shown], color="tab:purple")
        ax.set_xlabel("noise-to-signal ratio the node adds")
    else:
        ax.barh(positions + 0.2, [c.overall for c in shown], height=0.4, label="overall")
        if result.worst_slice is not None:
            ax.barh(positions - 0.2, [c.worst_slice for c in shown], height=0.4, label=f"slice {result.worst_slice}")
        ax.set_xlabel(f"{result.metric} {'recovered when kept float' if result.method == 'leave_one_out' else 'drop'}")
        ax.legend(loc="lower right")
    ax.set_yticks(positions, [c.group[-60:] for c in shown], fontsize=8)
    ax.set_title(f"{result.recipe} / {result.variant}: {result.method}")
    fig.tight_layout()
    try:
        return replace_atomically(path, lambda temporary: fig.savefig(temporary, dpi=110, format="png"),
                                  what="the sensitivity plot", suffix=".png")  # fmt: skip
    finally:
        plt.close(fig)


def _new_explain_dir(root: Path, variant_name: str) -> Path:
    """explain-<variant>-<UTC time>-<random suffix>, created exclusively: two explains started in the same second
    (a CI matrix) each write their own folder."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    directory = root / f"explain-{variant_name}-{stamp}-{secrets.token_hex(3)}"
    try:
        directory.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise QbenchError(f"cannot create the explain folder {directory}: {exc.strerror or exc}") from exc
    return directory


def run_explain(
    recipe: Recipe, variant_name: str, *, method: str = "leave_one_out", group_by: str = "node",
    max_nodes: int | None = None, top: int = 20, track: bool = True,
) -> ExplainOutcome:  # fmt: skip
    """`qbench explain`: rank, then write explain.json / explain.png / table.txt under
    <output_dir>/<name>/explain-<variant>-<timestamp>/, and log them to MLflow as run `explain <variant>`."""
    if track:
        from qbench.track.uri import check_reachable, resolve_tracking_uri

        check_reachable(resolve_tracking_uri(recipe))
    directory = _new_explain_dir(recipe.output_path / recipe.name, variant_name)
    result = explain_variant(recipe, variant_name, method=method, group_by=group_by, max_nodes=max_nodes,
                             workdir=directory, track=track)  # fmt: skip
    write_atomically(directory / "explain.json", json.dumps(result.to_dict(), indent=2, allow_nan=False),
                     what="explain.json")  # fmt: skip
    plot_costs(result, directory / "explain.png", top)
    table = Console(file=io.StringIO(), width=200)
    print_wide(explain_table(result, top), table)
    write_atomically(directory / "table.txt", table.file.getvalue(), what="the explain table")
    run_id = None
    if track:
        from qbench.track.tracker import log_run

        params = {"variant": result.variant, "method": method, "group_by": group_by, "metric": result.metric,
                  "calibrator": result.calibrator, "backend": result.backend, "rows": result.rows}  # fmt: skip
        metrics = {"drop": result.drop, "worst_slice_drop": result.worst_slice_drop, "seconds": result.seconds}
        artifacts = [directory / name for name in ("explain.json", "explain.png", "table.txt")]
        run_id = log_run(recipe, f"explain {result.variant}", params=params, metrics=metrics, artifacts=artifacts)
    return ExplainOutcome(result, directory, run_id)
