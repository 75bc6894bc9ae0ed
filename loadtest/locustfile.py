"""Open-loop load for Locust's own CLI, web UI and distributed mode:

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --latlab-deployment ffn --latlab-rate 200

`--latlab-rate` is the arrivals per second of this process (of each worker, in distributed mode),
split over its users. Latency counts from each request's intended send time.
"""

from latlab.loadtest.users import OpenLoopUser  # noqa: F401  (Locust collects the user class from here)
