"""A deployment and what runs it: ONNX Runtime sessions and their providers (providers), the model's signature,
input checks and runs on the host or through I/O binding (model), batch buckets and one captured CUDA graph per
bucket (buckets, graphs), the tokenizer for text in (text), the checks `latlab serve` makes before any session
starts (preflight), and the deployment that puts a model behind its batcher, admission and metrics (deployment)."""
