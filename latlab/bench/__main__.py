"""`python -m latlab.bench PLAN.json`: a bench started from a plan file (plan.run_child writes it into the run
folder and starts this); the same run as `latlab bench`, a mistake one line on stderr and status 2 as there."""

import sys
from pathlib import Path

from latlab.bench.experiments import BenchError
from latlab.bench.plan import BenchOptions, run


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m latlab.bench PLAN.json (as latlab.bench.plan.run_child writes it)", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        run(BenchOptions.from_json(path.read_text()), path.parent)
    except (BenchError, FileNotFoundError) as exc:
        print(f"latlab: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
