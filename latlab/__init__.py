"""latlab: an ONNX Runtime inference serving latency lab (export, serve, load-test, report)."""

__version__ = "0.1.0"
