"""A model built to show where INT8 PTQ loses a slice and what QAT wins back: the digits CNN with a massive activation.

On the plain digits CNN, INT8 PTQ loses nothing measurable on any slice (every calibrator,
per-tensor or per-channel, calibration drawn from clean rows only: drops within +-1 row).
Real networks are less forgiving: large language models and vision transformers carry a few
activations hundreds of times larger than the rest ("massive activations", Sun et al., 2024),
which act as fixed biases. A per-tensor INT8 grid must span them, which leaves the ordinary
activations of that tensor a handful of levels.

`massive_activation_cnn()` is `qbench.demo.digits.digits_cnn` with one more channel in its last
convolution: zero weights and a bias of MASSIVE_VALUE, so after the ReLU it is a constant
MASSIVE_VALUE (about 75x the largest ordinary activation) at every position; the head gives it
zero weight. Built from the digits CNN's weights (`massive_activation_weights`), its FP32
outputs are the digits CNN's: only the quantization grid of the head's input changes.

Run ``python -m qbench.demo.qat_case --out .`` after ``python -m qbench.demo.digits --out .``:
it writes `models/digits-massive.pt`, which `recipes/digits-qat.yaml` loads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.demo.digits import WEIGHTS_FILE, _import_torch, digits_cnn
from qbench.errors import QbenchError
from qbench.sources.torch_model import single_torch_thread

if TYPE_CHECKING:  # pragma: no cover
    import torch

MASSIVE_WEIGHTS_FILE = Path("models/digits-massive.pt")
MASSIVE_VALUE = 2000.0
LAST_CONV = "4"  # digits_cnn's layer names (an nn.Sequential): 0, 2, 4 are convolutions, 7 the head
HEAD = "7"
POSITIONS = 4  # the last convolution's output is 2x2 per channel
MATCH_TOLERANCE = 1e-3  # |digits CNN - massive-activation CNN| logits, float rounding only


def massive_activation_cnn() -> torch.nn.Module:
    """The digits CNN's layers, with a 65th channel in the last convolution and a head over 65 x 2 x 2 features."""
    nn = _import_torch().nn
    layers = list(digits_cnn())
    last_conv, head = layers[int(LAST_CONV)], layers[int(HEAD)]
    layers[int(LAST_CONV)] = nn.Conv2d(last_conv.in_channels, last_conv.out_channels + 1, kernel_size=3, stride=2,
                                       padding=1)  # fmt: skip
    layers[int(HEAD)] = nn.Linear(head.in_features + POSITIONS, head.out_features)
    return nn.Sequential(*layers)


def massive_activation_weights(digits_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The massive-activation CNN's state_dict from the digits CNN's: same weights, plus the constant channel.

    The new channel's filters are zero and its bias MASSIVE_VALUE; the head's weights on its
    four features are zero (the flattened features are channel-major, so they come last).
    """
    torch = _import_torch()
    state = {name: tensor.clone() for name, tensor in digits_state.items()}
    conv_weight, conv_bias = state[f"{LAST_CONV}.weight"], state[f"{LAST_CONV}.bias"]
    state[f"{LAST_CONV}.weight"] = torch.cat([conv_weight, torch.zeros_like(conv_weight[:1])])
    state[f"{LAST_CONV}.bias"] = torch.cat([conv_bias, torch.tensor([MASSIVE_VALUE])])
    head_weight = state[f"{HEAD}.weight"]
    state[f"{HEAD}.weight"] = torch.cat([head_weight, torch.zeros(head_weight.shape[0], POSITIONS)], dim=1)
    return state


def make_qat_case(out_dir: Path) -> Path:
    """Write `models/digits-massive.pt` under `out_dir` from the digits demo's `models/digits.pt` there."""
    torch = _import_torch()
    source = Path(out_dir) / WEIGHTS_FILE
    if not source.is_file():
        raise QbenchError(f"{source} not found: run `python -m qbench.demo.digits --out {out_dir}` first")
    digits_state = torch.load(source, map_location="cpu", weights_only=True)
    with single_torch_thread():
        digits = digits_cnn()
        digits.load_state_dict(digits_state)
        massive = massive_activation_cnn()
        massive.load_state_dict(massive_activation_weights(digits_state))
        check_same_outputs(digits.eval(), massive.eval())
    target = Path(out_dir) / MASSIVE_WEIGHTS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(massive.state_dict(), target)
    return target


def check_same_outputs(digits: torch.nn.Module, massive: torch.nn.Module, rows: int = 256) -> float:
    """Largest logit difference on seeded random images; above MATCH_TOLERANCE is a bug (RuntimeError)."""
    torch = _import_torch()
    images = torch.rand(rows, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = float((digits(images) - massive(images)).abs().max())
    if difference > MATCH_TOLERANCE:
        raise RuntimeError(f"the massive-activation CNN's logits differ from the digits CNN's by {difference:.2e}")
    return difference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qbench.demo.qat_case",
        description="Write models/digits-massive.pt (for recipes/digits-qat.yaml) from the digits demo's weights.",
    )
    parser.add_argument("--out", type=Path, default=Path("."), help="folder holding models/digits.pt")
    args = parser.parse_args(argv)
    try:
        path = make_qat_case(args.out)
    except QbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"weights: {path}\nnext: qbench sweep recipes/digits-qat.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
