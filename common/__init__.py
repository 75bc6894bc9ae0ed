"""What every stage may use and none owns: the machine a figure came from (machine.py), child processes and
free ports (procs.py), a real Prometheus for a run (prometheus.py). It imports no stage of latlab."""
