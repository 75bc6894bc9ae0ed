"""Batching, without Flask or ONNX Runtime: the bounded priority queue and Triton's dispatch rule as pure functions
(batch_queue), the worker threads that drive it (batcher), adaptive waiting's latency model (latency_model),
merging, splitting and padding requests' tensors (tensors), and admission at the door (admission). Everything here
is given plain settings, a clock and a `run_batch` callable."""
