"""The trials that tell a harmless clamp or overflow of an out-of-range tensor from a harmful one."""

from __future__ import annotations

import numpy as np

from qbench.variants.fp16_trials import (
    HARMLESS_SPACINGS,
    MAX_SINGLE_TRIALS,
    Verdict,
    clamped_as_converted,
    fp16_spacing,
    harmless_by_halves,
    harmless_subset,
    output_change,
    spacing_floor,
)


def test_output_change_counts_fp16_spacings_at_each_reference_value():
    reference = np.array([1.0, 1000.0, 0.0], np.float32)
    assert fp16_spacing(reference).tolist() == [2.0**-10, 0.5, 2.0**-24]
    assert output_change([reference], [reference + np.array([2.0**-12, 0.0, 0.0], np.float32)]) == 0.25
    assert output_change([reference], [reference + np.array([0.0, 0.0625, 0.0], np.float32)]) == 0.125
    assert output_change([np.array([np.nan, np.inf])], [np.array([np.nan, np.inf])]) == 0.0
    assert output_change([reference], [np.array([np.inf, 1000.0, 0.0])]) == np.inf  # a new inf is a change
    assert output_change([np.array([1, 2])], [np.array([1, 3])]) == np.inf  # labels must be equal


def test_an_output_below_fp16s_normals_is_measured_at_its_own_scale():
    assert spacing_floor(np.array([1.0, 1e-9])) == 2.0**-24  # a normal output keeps FP16's smallest subnormal
    assert spacing_floor(np.zeros(3)) == 2.0**-24
    tiny = np.array([3e-9, -1e-9, 0.0])  # 3e-9 lies in [2**-29, 2**-28): FP16's 10 bits would space it 2**-39
    assert spacing_floor(tiny) == 2.0**-39
    assert output_change([tiny], [np.zeros(3)]) == 3e-9 / 2.0**-39  # before: 3e-9 / 2**-24, 0.05 of a subnormal


def test_the_converters_clamp_touches_only_values_beyond_fp16s_range():
    values = np.array([-3.4e38, 1e10, 1.000001, 1e-9, -1e-6, 0.0], np.float32)
    got = clamped_as_converted(values, 5.96e-8, 65504.0)
    assert got[:3].tolist() == [-65504.0, 65504.0, np.float32(1.000001)]  # a normal value keeps its float32 bits
    assert got[3] == np.float32(np.float16(5.96e-8)) and got[4] == np.float32(np.float16(-1e-6)) and got[5] == 0.0


def test_a_failed_group_is_tried_one_by_one_then_the_harmless_together():
    runs = []

    def change(subset):
        runs.append(tuple(subset))
        return 1e3 if "bad" in subset else 0.0

    verdict = harmless_subset(["mask", "bad", "eps"], change)
    assert verdict.harmless == {"mask": 0.0, "eps": 0.0} and verdict.harmful == {"bad": 1e3}
    assert runs == [("mask", "bad", "eps"), ("mask",), ("bad",), ("eps",), ("mask", "eps")]
    runs.clear()
    assert harmless_subset(["a", "b"], lambda subset: 0.1).harmful == {} and HARMLESS_SPACINGS > 0.1


def test_harmless_alone_is_not_harmless_together_and_the_trials_are_bounded():
    together = harmless_subset(["a", "b", "c"], lambda subset: 1.0 if len(subset) > 1 else 0.0)
    assert together.harmless == {} and set(together.harmful) == {"a", "b", "c"}
    names = [f"t{i}" for i in range(MAX_SINGLE_TRIALS + 3)]
    runs = []
    bounded = harmless_subset(names, lambda subset: runs.append(subset) or 1.0)
    assert len(runs) == 1 + MAX_SINGLE_TRIALS and bounded.harmful[names[-1]] is None and not bounded.harmless


def test_halving_finds_one_harmful_tensor_among_many_and_tries_every_one():
    """Forty softmax-like tensors with values FP16 flushes to 0 beside one log input: halving the failed group finds
    the log input in about two runs per level, where trying one by one leaves all but MAX_SINGLE_TRIALS untried."""
    names = [f"softmax{i}" for i in range(40)]
    names.insert(33, "log_input")
    runs = []

    def change(subset):
        runs.append(tuple(subset))
        return float("inf") if "log_input" in subset else 0.0

    verdict = harmless_by_halves(names, change)
    assert verdict.harmful == {"log_input": float("inf")}
    assert set(verdict.harmless) == set(names) - {"log_input"}
    assert len(runs) <= 2 * 6 + 2  # 41 names: 6 levels of halving, two runs each, the first, the harmless together
    assert set(runs[-1]) == set(names) - {"log_input"}  # the harmless ones together again, last
    assert harmless_by_halves([], change) == Verdict({}, {})


def test_halving_takes_none_whose_harmless_halves_move_the_outputs_together():
    verdict = harmless_by_halves(["a", "b", "bad"], lambda subset: 1e3 if "bad" in subset or len(subset) == 2 else 0.0)
    assert verdict.harmless == {} and set(verdict.harmful) == {"a", "b", "bad"}
