"""`python -m latlab.cli ...`: the `latlab` command."""

import sys

from latlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
