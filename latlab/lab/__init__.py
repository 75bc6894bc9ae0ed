"""`latlab lab`: a plan (plan.py; the user's own model: user.py, inputs.py) run end to end (run.py), the child
processes it starts (children.py) and the INT8/FP16 variants its search may serve (variants.py)."""
