"""One-off experiments: each measured something once, to choose a design or compare two versions of the code; the
figures and what they decided are in docs/. Run from the repository root as
`.venv/bin/python -m benchmarks.experiments.NAME`."""
