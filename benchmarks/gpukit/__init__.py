"""The GPU kit: carry latlab to a borrowed GPU machine in few calls, run ranked legs there, keep what they measured.

`benchmarks/gpu_kit.py` is its command line. The device side (legs, device) uses the standard library only:
nothing else is installed there before the kit's own install step.
"""
