"""What a sweep logs to MLflow: values within MLflow's limits, a cut one marked as cut."""

from __future__ import annotations

import json

from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from qbench.track_content import param_value, tag_value


def test_a_value_past_mlflows_limit_is_cut_with_a_mark_and_a_short_one_is_kept() -> None:
    nodes = [f"/encoder/layer.{i}/attention/self/MatMul" for i in range(400)]  # a long nodes_to_exclude list
    whole = json.dumps(nodes, sort_keys=True)
    cut = param_value(nodes)
    assert len(whole) > MAX_PARAM_VAL_LENGTH and len(cut) == MAX_PARAM_VAL_LENGTH
    assert cut.endswith("…") and whole.startswith(cut[:-1])  # never read as the whole list
    note = "x" * (MAX_TAG_VAL_LENGTH + 5)
    assert tag_value(note) == "x" * (MAX_TAG_VAL_LENGTH - 1) + "…"
    assert param_value(nodes[:2]) == json.dumps(nodes[:2]) and tag_value("pass") == "pass"
