"""The inference server: Open Inference Protocol over Flask, ONNX Runtime behind a dynamic batcher.

Nothing in this package imports torch: a serving box needs only onnxruntime.
"""
