"""Model export: PyTorch modules of the zoo to ONNX with a dynamic batch axis, checked and described."""
