"""Closed-loop load (Locust's native model) for Locust's own CLI: N users, each sending the next
request when the last one returned.

    locust -f loadtest/locustfile_closed.py --host http://127.0.0.1:8000 --latlab-deployment ffn --users 8
"""

from latlab.loadtest.users import ClosedLoopUser  # noqa: F401  (Locust collects the user class from here)
