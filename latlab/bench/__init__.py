"""`latlab bench`: seed 003's in-process experiments (experiments.py) on ORT and PyTorch, CPU and CUDA
(backends.py)."""
