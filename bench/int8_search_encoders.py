"""Encoders of other sizes for bench/int8_search.py, derived from all-MiniLM-L6-v2 (offline: its weights package)."""

from __future__ import annotations

from torch import nn

from qbench.demo.minilm import minilm_encoder


def minilm_l3() -> nn.Module:
    """all-MiniLM-L6-v2 cut to its first 3 transformer layers (mean pooling and normalisation kept)."""
    encoder = minilm_encoder()
    encoder.bert.encoder.layer = encoder.bert.encoder.layer[:3]
    encoder.bert.config.num_hidden_layers = 3
    return encoder
