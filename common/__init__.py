"""What every stage may use and none owns: the machine a figure came from (machine.py), child processes and
free ports (procs.py), a real Prometheus for a run (prometheus.py), the rates and SLO bounds a user writes and
the one-line error for a mistake in them (user_input.py), a deployment's batcher and provider settings
(settings.py). It imports no stage of latlab."""
