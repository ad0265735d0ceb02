"""A torch result's model size and digest are the module's own state: every parameter and buffer in its dtype."""

from __future__ import annotations

import copy

import torch
from torch import nn

from qbench.backends.torch_state import module_state
from qbench.variants.torch_forms import _int8_dynamic


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(32, 64)
        self.head = nn.Linear(64, 4)
        self.register_buffer("scale", torch.ones(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(x * self.scale)))


def _fp32_bytes(module: nn.Module) -> int:
    return 4 * sum(t.numel() for t in (*module.parameters(), *module.buffers()))


def test_size_is_each_tensor_in_the_dtype_it_is_held_in():
    module = Small()
    assert module_state(module).bytes == _fp32_bytes(module)
    assert module_state(copy.deepcopy(module).to(torch.bfloat16)).bytes == _fp32_bytes(module) // 2
    assert module_state(copy.deepcopy(module).half()).bytes == _fp32_bytes(module) // 2


def test_torchao_weights_count_their_int8_data_and_scales_not_their_float_shape():
    module = Small()
    quantized = _int8_dynamic(copy.deepcopy(module))
    weights = 32 * 64 + 64 * 4  # one byte each
    biases_and_buffer = 4 * (64 + 4 + 32)
    size = module_state(quantized).bytes
    assert weights + biases_and_buffer < size < weights + biases_and_buffer + 4 * 2 * (64 + 4) + 64  # + scales
    assert size < _fp32_bytes(module) / 3


def test_a_tied_weight_is_counted_once():
    module = Small()
    tied = copy.deepcopy(module)
    tied.head2 = nn.Linear(64, 4)
    tied.head2.weight = tied.head.weight
    assert module_state(tied).bytes == _fp32_bytes(module) + 4 * 4  # only head2's own bias is new


def test_the_digest_follows_the_values_dtypes_and_names():
    module = Small()
    same, changed = copy.deepcopy(module), copy.deepcopy(module)
    with torch.no_grad():
        changed.fc.weight[0, 0] += 1e-3
    assert module_state(same).sha256 == module_state(module).sha256
    assert module_state(changed).sha256 != module_state(module).sha256
    assert module_state(copy.deepcopy(module).half()).sha256 != module_state(module).sha256


def test_a_module_without_values_has_no_digest_and_says_why():
    with torch.device("meta"):
        module = Small()
    state = module_state(module)
    assert state.sha256 is None and "hold no values" in state.why_no_digest and state.bytes == _fp32_bytes(module)
