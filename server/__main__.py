"""`python -m latlab.server --config FILE [options]`: a server child process (command.serve_command builds its
command line); the same server as `latlab serve`, a mistake one line on stderr and status 2 as there."""

import argparse
import sys

from latlab.common.user_input import UserError
from latlab.server.command import HELP, add_arguments, serve_from_args
from latlab.server.errors import ConfigError

USER_ERRORS = (UserError, ConfigError, FileNotFoundError, LookupError)
"""What `latlab` prints as one line (its _is_user_error, less the export's and the HTTP client's errors, which
serving never raises)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m latlab.server", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        serve_from_args(args)
    except USER_ERRORS as exc:
        print(f"latlab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("latlab: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
