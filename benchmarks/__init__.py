"""The measurements behind the figures in docs/. The recurring checks sit here, sharing harness.py, each run as its
docstring says (by path, `.venv/bin/python benchmarks/NAME.py`, or as a module from the repository root where it
borrows one of the test suite's stubs); one-off experiments sit in experiments/; gpu_kit.py and gpukit/ take latlab
on a borrowed GPU machine."""
