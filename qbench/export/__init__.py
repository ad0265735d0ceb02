"""Hand-offs from a gated sweep to the tools that serve a model (Triton Inference Server)."""
