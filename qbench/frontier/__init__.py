"""The latency-accuracy frontier: which variants no other beats on both, and its plot."""
