"""`python -m latlab.loadtest PLAN.json`: a child load test, started from a plan file (child.py writes it and starts
this); the same run as `latlab loadtest` (run.py), a mistake one line on stderr and status 2 as there."""

from latlab.loadtest.run import run_plan  # first: Locust patches sockets

import sys
from pathlib import Path

import requests

from latlab.common.procs import Terminated
from latlab.common.user_input import UserError
from latlab.loadtest.child import read_job

USER_ERRORS = (UserError, FileNotFoundError, LookupError, requests.ConnectionError)
"""What `latlab` prints as one line (its _is_user_error, less the server's config errors a load test never raises)."""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m latlab.loadtest PLAN.json (as latlab.loadtest.child writes it)", file=sys.stderr)
        return 2
    try:
        plan, out, run_id = read_job(Path(argv[0]))
        run_plan(plan, out, run_id)
    except USER_ERRORS as exc:
        print(f"latlab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("latlab: terminated" if isinstance(exc, Terminated) else "latlab: interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
