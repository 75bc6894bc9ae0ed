"""The inference server: Open Inference Protocol over Flask, ONNX Runtime behind a dynamic batcher.

Its subpackages import one way: processes/ (Granian, front ends, the engine) uses http/ (the app and its routes),
which uses runtime/ (deployments, ONNX Runtime sessions), which uses batching/ (the queue and its workers). Below
them all, at this level: the settings (config), the error kinds (errors), the Open Inference Protocol's tensors
(protocol, bytes_tensors) and the Prometheus metrics (metrics, gpu). Above them all: `python -m latlab.server`
(__main__), the server's entry for child processes, and its options, which `latlab serve` shares (command).

Nothing in this package imports torch: a serving box needs only onnxruntime.
"""
