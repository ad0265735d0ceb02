"""A custom metric that reads the model's inputs (a parameter named `inputs`): an autoencoder judged by its
reconstruction error, the scored rows' inputs per scope, the parameters checked when the recipe is loaded."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import pandas as pd
import pytest
from task_projects import plain_ort, project, run_all, said

from qbench.cli.app import main
from qbench.tasks import CustomMetric
from qbench.tasks.custom import parameters_taken
from qbench.validate.accuracy import evaluate_accuracy

FEATURES = 20
AUTOENCODER_METRICS = textwrap.dedent(
    """
    import numpy as np

    def _errors(reconstruction, features):
        return np.mean((reconstruction - features) ** 2, axis=1)

    def flag_agreement(outputs, labels, reference_outputs, inputs):
        # rows flagged as anomalies (error above FP32's own 95th percentile on the scope) as FP32 flags them
        features = inputs["features"]
        own, fp32 = _errors(outputs, features), _errors(reference_outputs, features)
        threshold = np.percentile(fp32, 95)
        return float(np.mean((own > threshold) == (fp32 > threshold)))

    def reconstruction_mse(outputs, labels, *, inputs):
        return float(np.mean(_errors(outputs["reconstruction"], inputs["features"])))
    """
)


def _autoencoder(path):
    """20 standardised breast-cancer features -> 4 -> 20, fitted a little: an anomaly detector's reconstruction."""
    torch = pytest.importorskip("torch")
    from sklearn.datasets import load_breast_cancer

    features = load_breast_cancer().data[:, :FEATURES]
    features = ((features - features.mean(axis=0)) / features.std(axis=0)).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4), torch.nn.ReLU(),
                                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, FEATURES))  # fmt: skip
    optimiser, rows = torch.optim.Adam(model.parameters(), lr=0.01), torch.from_numpy(features)
    for _ in range(300):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(rows), rows)
        loss.backward()
        optimiser.step()
    torch.onnx.export(model.eval(), (rows[:2],), str(path), input_names=["features"], output_names=["reconstruction"],
                      dynamic_axes={"features": {0: "batch"}, "reconstruction": {0: "batch"}}, opset_version=17,
                      dynamo=False)  # fmt: skip
    return onnx.load(str(path)), features


def _errors(reconstruction: np.ndarray, features: np.ndarray) -> np.ndarray:
    return np.mean((reconstruction.astype(np.float64) - features) ** 2, axis=1)


def _flag_agreement(own: np.ndarray, fp32: np.ndarray, features: np.ndarray) -> float:
    own_errors, fp32_errors = _errors(own, features), _errors(fp32, features)
    threshold = np.percentile(fp32_errors, 95)
    return float(np.mean((own_errors > threshold) == (fp32_errors > threshold)))


@pytest.mark.slow
def test_an_autoencoder_is_gated_on_anomaly_flags_from_its_reconstruction_of_the_inputs(tmp_path, monkeypatch, capsys):
    """Before, a metric got outputs and labels only: a trial copied the 20 features into the label column and
    hard-coded a threshold. A metric declaring `inputs` gets the scored rows' features, in the outputs' order, and
    derives its threshold from FP32's own errors on each scope (its 95th percentile)."""
    model, features = _autoencoder(tmp_path / "exported.onnx")
    (tmp_path / "anomaly_metrics.py").write_text(AUTOENCODER_METRICS)
    table = pd.DataFrame({"x": list(features), "half": np.where(np.arange(len(features)) % 2 == 0, "even", "odd")})
    metrics = [{"name": "flag_agreement", "function": "anomaly_metrics:flag_agreement", "higher_is_better": True},
               {"name": "reconstruction_mse", "function": "anomaly_metrics:reconstruction_mse",
                "higher_is_better": False, "data_units": True, "outputs": ["reconstruction"]}]  # fmt: skip
    recipe = project(tmp_path, model, table, task="structured", metrics=metrics,
                     model={"path": "model.onnx", "output": "reconstruction"},
                     gate={"metric": "flag_agreement", "max_drop": 0.05, "max_slice_drop": 0.1})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    results, shown = run_all(recipe, capsys)
    assert results.gate_metric == "flag_agreement" and said("Gate on flag_agreement", shown)
    fp32_outputs = plain_ort(tmp_path / "model.onnx", {"features": features})["reconstruction"]
    int8 = results.find("int8", "onnxruntime-cpu")
    int8_outputs = plain_ort(int8.model_path, {"features": features})["reconstruction"]
    even = np.arange(len(features)) % 2 == 0
    expected = {"overall": np.ones(len(features), dtype=bool), "half=even": even, "half=odd": ~even}
    fp32 = results.find("fp32", "onnxruntime-cpu").accuracy
    for scope, rows in expected.items():
        own = fp32.slice(scope) if scope != "overall" else fp32.overall
        variant = int8.accuracy.slice(scope) if scope != "overall" else int8.accuracy.overall
        assert own.metrics["flag_agreement"] == 1.0  # FP32 against itself
        assert own.metrics["reconstruction_mse"] == pytest.approx(
            _errors(fp32_outputs[rows], features[rows]).mean(), rel=1e-6)
        hand = _flag_agreement(int8_outputs[rows], fp32_outputs[rows], features[rows])
        assert variant.metrics["flag_agreement"] == pytest.approx(hand, abs=1e-12), scope
        assert variant.metrics["reconstruction_mse"] == pytest.approx(
            _errors(int8_outputs[rows], features[rows]).mean(), rel=1e-6)
    assert int8.accuracy.overall.metrics["flag_agreement"] < 1.0  # INT8 moves some rows across FP32's threshold


def _recording(seen: list, *, reference: bool = True):
    def metric(outputs, labels, *rest, inputs):
        seen.append((outputs.copy() if isinstance(outputs, np.ndarray) else dict(outputs), dict(inputs)))
        return 0.0

    def plain(outputs, labels, inputs):
        return metric(outputs, labels, inputs=inputs)

    return metric if reference else plain


def test_a_metric_taking_inputs_gets_the_scored_rows_of_each_scope_in_the_outputs_order() -> None:
    """Row 1 is NaN in FP32: it is left out of the outputs a custom metric is given, and of its inputs; each slice's
    inputs are that slice's scored rows, in the same order as its outputs (for a metric of one output and one of
    several outputs alike)."""
    reference = np.array([[0.0], [np.nan], [2.0], [3.0], [4.0]], np.float32)
    feeds = {"ids": np.array([[10, 11], [12, 13], [14, 15], [16, 17], [18, 19]], np.int64),
             "mask": np.array([[1, 1], [1, 0], [1, 1], [0, 1], [1, 1]], np.int64)}  # fmt: skip
    slices = {"even": np.array([True, False, True, False, True]), "odd": np.array([False, True, False, True, False])}
    single, joint = [], []
    metrics = [CustomMetric("single", _recording(single, reference=False), True, wants_reference=False,
                            wants_inputs=True),
               CustomMetric("joint", _recording(joint), True, wants_reference=True, outputs=("a", "b"),
                            wants_inputs=True)]  # fmt: skip
    outputs = {"a": reference, "b": reference.copy()}  # row r holds r: its ids are 10 + 2r
    evaluate_accuracy("structured", outputs, outputs, None, slices, metrics, feeds=feeds)
    scored = {"overall": [0, 2, 3, 4], "even": [0, 2, 4], "odd": [3]}
    assert len(single) == 2 * len(scored) and len(joint) == len(scored)  # once per output per scope; once per scope
    for (values, inputs), rows in zip(single, [r for r in scored.values() for _ in range(2)], strict=True):
        assert set(inputs) == {"ids", "mask"}
        np.testing.assert_array_equal(inputs["ids"], feeds["ids"][rows])
        np.testing.assert_array_equal(inputs["mask"], feeds["mask"][rows])
        np.testing.assert_array_equal(values[:, 0] * 2 + 10, inputs["ids"][:, 0])
    for (values, inputs), rows in zip(joint, scored.values(), strict=True):
        np.testing.assert_array_equal(values["a"][:, 0] * 2 + 10, inputs["ids"][:, 0])
        np.testing.assert_array_equal(inputs["ids"], feeds["ids"][rows])


def test_a_metric_taking_inputs_without_model_inputs_given_is_an_error() -> None:
    from qbench.errors import QbenchError

    metric = CustomMetric("m", _recording([], reference=False), True, wants_reference=False, wants_inputs=True)
    values = np.zeros((3, 1), np.float32)
    with pytest.raises(QbenchError, match="custom metric 'm' takes the model's inputs, and none were given"):
        evaluate_accuracy("structured", values, values, None, {}, [metric])
    with pytest.raises(QbenchError, match="input 'x' has 2 rows, the outputs 3"):
        evaluate_accuracy("structured", values, values, None, {}, [metric], feeds={"x": np.zeros((2, 1))})


def _f2(outputs, labels): ...
def _f3(outputs, labels, reference_outputs): ...
def _f3_default(outputs, labels, reference_outputs=None): ...
def _f_args(outputs, labels, *rest): ...
def _f_inputs(outputs, labels, inputs): ...
def _f_reference_inputs(outputs, labels, reference_outputs, inputs=None): ...
def _f_keyword_inputs(outputs, labels, *, inputs): ...
def _f_args_inputs(outputs, labels, *rest, inputs): ...
def _f_kwargs(outputs, labels, reference_outputs, **options): ...
def _f_inputs_first(inputs, labels): ...  # the old contract: its first parameter is the outputs, whatever its name


@pytest.mark.parametrize(
    ("function", "taken"),
    [(_f2, (False, False)), (_f3, (True, False)), (_f3_default, (True, False)), (_f_args, (True, False)),
     (_f_inputs, (False, True)), (_f_reference_inputs, (True, True)), (_f_keyword_inputs, (False, True)),
     (_f_args_inputs, (True, True)), (_f_kwargs, (True, False)), (_f_inputs_first, (False, False))],
)  # fmt: skip
def test_every_signature_qbench_can_call_is_read_from_its_parameters(function, taken) -> None:
    assert parameters_taken(function) == (None, *taken)


def _typo(outputs, labels, reference_outputs, inptus=None): ...
def _keyword_typo(outputs, labels, *, inptus): ...
def _fourth(outputs, labels, reference_outputs, threshold): ...
def _inputs_before_reference(outputs, labels, inputs, reference_outputs): ...
def _one(outputs): ...


@pytest.mark.parametrize(
    ("function", "problem"),
    [(_typo, "takes a parameter 'inptus' qbench does not pass (did you mean 'inputs'?)"),
     (_keyword_typo, "takes a parameter 'inptus' qbench does not pass (did you mean 'inputs'?)"),
     (_fourth, "takes a parameter 'threshold' qbench does not pass"),
     (_inputs_before_reference, "takes 'inputs' before 'reference_outputs': it comes after the positional ones"),
     (_one, "takes 1 positional parameter")],
)  # fmt: skip
def test_a_parameter_qbench_does_not_pass_is_named(function, problem) -> None:
    assert parameters_taken(function) == (problem, False, False)


def test_a_misspelt_inputs_parameter_is_one_line_naming_the_metric_at_recipe_load(tmp_path, capsys) -> None:
    """`inptus=None` would never be given the inputs: before, a fourth parameter was refused as 'takes 4
    parameters; expected (outputs, labels[, reference_outputs])', and a keyword-only one failed every call."""
    from task_projects import argmax_first_model, iris, table

    features, labels = iris()
    (tmp_path / "typo_metrics.py").write_text("def shift(outputs, labels, *, inptus=None):\n    return 0.0\n")
    recipe = project(tmp_path, argmax_first_model(), table(features, labels), model={"path": "model.onnx",
                     "output": "logits"}, metrics=[{"name": "shift", "function": "typo_metrics:shift",
                                                    "higher_is_better": False}])  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("recipe.yaml: metrics[0].function: typo_metrics:shift takes a parameter 'inptus' qbench does not pass "
                "(did you mean 'inputs'?); expected (outputs, labels[, reference_outputs][, inputs])", err), err


@pytest.mark.slow
def test_text_inputs_reach_the_metric_as_the_model_was_fed_token_ids(tmp_path, monkeypatch, capsys) -> None:
    """A text column is given as the token ids, attention mask and token types the tokenizer made and the model
    was fed (padded as the recipe pads), not as text."""
    from test_span import _qa_project

    (tmp_path / "fed_metrics.py").write_text(
        "import numpy as np\n\n\ndef attended(outputs, labels, *, inputs):\n"
        "    if sorted(inputs) != ['attention_mask', 'input_ids', 'token_type_ids']:\n"
        "        raise ValueError(sorted(inputs))\n"
        "    ids = inputs['input_ids']\n"
        "    return float(np.sum(ids * inputs['attention_mask']) + 1000 * ids.shape[1])\n"
    )  # fmt: skip
    metric = {"name": "attended", "function": "fed_metrics:attended", "higher_is_better": True,
              "outputs": ["start_logits", "end_logits"]}  # fmt: skip
    recipe, feeds, *_ = _qa_project(tmp_path, metrics=[metric], model={"path": "model.onnx",
                                                                       "outputs": ["start_logits", "end_logits"]})
    monkeypatch.chdir(tmp_path)
    results, _ = run_all(recipe, capsys)
    fed = feeds["input_ids"] * feeds["attention_mask"]
    even = np.arange(len(fed)) % 2 == 0
    for variant in ("fp32", "int8"):
        accuracy = results.find(variant, "onnxruntime-cpu").accuracy
        assert accuracy.overall.metrics["attended"] == float(fed.sum() + 1000 * fed.shape[1])
        assert accuracy.slice("half=even").metrics["attended"] == float(fed[even].sum() + 1000 * fed.shape[1])
