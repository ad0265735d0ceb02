"""What a sweep logs to MLflow: values within MLflow's limits, a cut one marked as cut."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH
from sweep_factory import make_slice, make_sweep, make_variant

from qbench.results.ranges import ClipRecord, RangeAnalysis
from qbench.track.content import (
    clean_keys,
    param_value,
    sweep_metrics,
    tag_value,
    unique_names,
    uses_calibration,
    variant_metrics,
    variant_params,
)


def test_a_value_past_mlflows_limit_is_cut_with_a_mark_and_a_short_one_is_kept() -> None:
    nodes = [f"/encoder/layer.{i}/attention/self/MatMul" for i in range(400)]  # a long nodes_to_exclude list
    whole = json.dumps(nodes, sort_keys=True)
    cut = param_value(nodes)
    assert len(whole) > MAX_PARAM_VAL_LENGTH and len(cut) == MAX_PARAM_VAL_LENGTH
    assert cut.endswith("…") and whole.startswith(cut[:-1])  # never read as the whole list
    note = "x" * (MAX_TAG_VAL_LENGTH + 5)
    assert tag_value(note) == "x" * (MAX_TAG_VAL_LENGTH - 1) + "…"
    assert param_value(nodes[:2]) == json.dumps(nodes[:2]) and tag_value("pass") == "pass"


def test_only_a_variant_whose_build_counted_calibration_rows_logs_the_calibration_data() -> None:
    static = make_variant("int8", "int8", params={"calibrator": "minmax", "calibration_rows": 96})
    linear_static = make_variant("lin", "int8", params={"activations": "static", "calibration_rows": 96})
    dynamic = make_variant("dyn", "int8", params={"calibrator": "dynamic", "calibration_rows": 0})
    torchao = make_variant("dyn", "int8", backend="torch-cpu", params={"torch.form": "int8 dynamic: torchao"})
    assert uses_calibration(static) and uses_calibration(linear_static)
    assert not uses_calibration(dynamic) and not uses_calibration(torchao)  # torchao's form is calibrated on nothing


def test_names_holding_dots_or_cleaning_alike_keep_a_metric_each() -> None:
    """Variant "a" with slice "b.c" and variant "a.b" with slice "c" were one key (range.a.b.c.clipped_share), and
    columns "a,b" and "a_b" one dropped_nonfinite key: one figure silently overwrote the other."""
    ranges = RangeAnalysis(
        rows=8, seconds=0.1, nodes={"x": "<graph input>"}, abs_max={"b.c": {"x": 1.0}, "c": {"x": 1.0}}, limits=(),
        clipping=(ClipRecord("a", "b.c", 1, 8, 0.125, "x", "<graph input>", 0.1),
                  ClipRecord("a.b", "c", 2, 8, 0.25, "x", "<graph input>", 0.2)),
    )  # fmt: skip
    results = dataclasses.replace(make_sweep([make_variant("fp32", "fp32")]), ranges=ranges,
                                  dropped_nonfinite={"evaluation": {"a,b": 1, "a_b": 2}})  # fmt: skip
    metrics = sweep_metrics(results, None)
    assert metrics["range/a/b.c/clipped_share"] == 0.125 and metrics["range/a.b/c/clipped_share"] == 0.25
    dropped = sorted(v for k, v in metrics.items() if k.startswith("dropped_nonfinite/evaluation/"))
    assert dropped == [1.0, 2.0] and metrics["dropped_nonfinite/evaluation/a_b"] == 2.0


def test_the_sweeps_gate_tag_says_interrupted_where_a_signal_ended_the_command_before_its_verdict():
    """The report files call such an ending 'interrupted' (exit 2); the sweep's MLflow run said 'unusable'."""
    from qbench.gate.evaluate import GateReport
    from qbench.track.content import GATE_TAG, gate_tags

    stopped = "qbench was interrupted by SIGTERM before the gate command finished"
    assert gate_tags(GateReport(metric="accuracy", problems=(stopped,), interrupted=stopped))[GATE_TAG] == "interrupted"
    assert gate_tags(GateReport(metric="accuracy", problems=("results incomplete",)))[GATE_TAG] == "unusable"
    assert gate_tags(GateReport(metric="accuracy"))[GATE_TAG] == "pass"


def test_a_slice_key_that_does_not_spell_its_slice_names_it_in_a_param() -> None:
    """Slices `grp=🙂` and `grp=😀` were logged as slice/grp___<digest>/... and `grp=a/b` as slice/grp_a_b/...
    with nothing in MLflow saying which key stood for which slice; `grp=c:d` (kept as grp_c:d) needs no mapping."""
    from sweep_factory import make_slice

    from qbench.results.schema import AccuracyResult
    from qbench.track.content import variant_metrics, variant_params

    names = ["grp=🙂", "grp=😀", "grp=a/b", "grp=c:d"]
    slices = tuple(make_slice(n, 50, 0.9, 0.9) for n in names)
    accuracy = AccuracyResult(rows=200, nonfinite_outputs=0, overall=make_slice("overall", 200, 0.9, 0.9),
                              slices=slices)  # fmt: skip
    variant = dataclasses.replace(make_variant("int8", "int8"), accuracy=accuracy)
    results = make_sweep([make_variant("fp32", "fp32"), variant])
    params, metrics = variant_params(results, variant), variant_metrics(results, variant)
    mapped = {k.removeprefix("slice_key/"): v for k, v in params.items() if k.startswith("slice_key/")}
    assert sorted(mapped.values()) == ["grp=a/b", "grp=😀", "grp=🙂"]
    assert mapped["grp_a_b"] == "grp=a/b" and "slice/grp_c:d/accuracy" in metrics
    for segment, name in mapped.items():  # each param names the slice whose figures its key holds
        assert metrics[f"slice/{segment}/size"] == 50.0 and segment.startswith("grp__") == (name != "grp=a/b")


def test_slices_differing_only_by_case_keep_a_key_each_without_case() -> None:
    """Slices `Gate=X` and `gate=x` gave keys `slice/Gate_X/accuracy` and `slice/gate_x/accuracy`: one key to a store
    that compares keys without case (MLflow on MySQL), which would file one slice's figures under the other's. Keys
    that differ only by case are now told apart by a digest of each name, whatever the order, and a param names the
    slice each stands for."""
    variant = make_variant("int8", "int8")
    slices = (make_slice("Gate=X", 40, 0.9, 0.95), make_slice("gate=x", 60, 0.5, 0.95))
    variant = dataclasses.replace(variant, accuracy=dataclasses.replace(variant.accuracy, slices=slices))
    metrics = clean_keys(variant_metrics(make_sweep([variant]), variant))
    accuracy = {k: v for k, v in metrics.items() if k.startswith("slice/") and k.endswith("/accuracy")}
    assert sorted(accuracy.values()) == [0.5, 0.9] and len({k.casefold() for k in accuracy}) == 2
    params = variant_params(make_sweep([variant]), variant)
    named = {params[f"slice_key/{k.split('/')[1]}"]: v for k, v in accuracy.items()}
    assert named == {"Gate=X": 0.9, "gate=x": 0.5}
    assert unique_names(["gate=x", "Gate=X"]) == unique_names(["Gate=X", "gate=x"])  # by name, not by order


def test_clean_names_differing_only_by_case_keep_the_first_bare_and_a_lone_clean_name_keeps_its_key() -> None:
    """`Logits` and `logits` both kept their keys before case counted; giving both a digest changed both, and a lone
    `Logits` changed key in a sweep whose data also held `logits`. The first in code-point order keeps its key, in any
    order given, the other gets a digest: still one key each without case."""
    keys = unique_names(["logits/accuracy", "Logits/accuracy", "other"])
    assert keys["other"] == "other" and len({k.casefold() for k in keys.values()}) == 3
    digest = hashlib.sha256(b"logits/accuracy").hexdigest()[:6]
    assert keys == {"Logits/accuracy": "Logits/accuracy", "logits/accuracy": f"logits/accuracy_{digest}",
                    "other": "other"}  # fmt: skip
    assert unique_names(["Logits/accuracy", "logits/accuracy", "other"]) == keys
    assert unique_names(["Logits/accuracy"]) == {"Logits/accuracy": "Logits/accuracy"}
    digest = hashlib.sha256(b"a=b").hexdigest()[:6]
    assert unique_names(["a=b", "A_b"]) == {"a=b": f"a_b_{digest}", "A_b": "A_b"}  # the one clean name keeps its key
