"""Which quantized nodes cost the accuracy: per-node sensitivity, its ranking and report."""
