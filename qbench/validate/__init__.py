"""Measure a variant against the FP32 reference: accuracy and agreement (per slice) and latency."""
