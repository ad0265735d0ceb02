"""What an ONNX model takes and returns, read with onnx alone."""
