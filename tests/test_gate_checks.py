"""The rules the gate re-derives instead of trusting results.json (see tests/adversarial for whole files)."""

from __future__ import annotations

import pytest

from qbench.gate_checks import skip_possible
from qbench.recipe import QatSpec, VariantSpec


@pytest.mark.parametrize(
    ("backend", "spec", "possible"),
    [
        ("onnxruntime-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax"), False),
        ("onnxruntime-cuda", VariantSpec(name="h", precision="fp16"), False),
        ("torch-cpu", VariantSpec(name="fp32", precision="fp32"), False),  # the module as it is
        ("torch-cpu", VariantSpec(name="h", precision="bf16"), False),
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax"), True),  # static: no torch form
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax", qat=QatSpec()), True),
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="dynamic"), True),  # model-dependent
        ("torch-cuda", VariantSpec(name="f", precision="fp8", calibrator="minmax"), True),  # GPU-dependent
        ("tensorrt", VariantSpec(name="fp32", precision="fp32"), True),  # the model's ops decide
    ],
)
def test_skipped_only_where_the_backends_rule_can_decline(backend, spec, possible):
    assert skip_possible(backend, spec) is possible
