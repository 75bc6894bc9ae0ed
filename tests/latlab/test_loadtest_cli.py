"""`latlab loadtest`: the sweep plan's parts add its options; its help lists them in the order users know."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from latlab.cli.loadtest import HELP_ORDER, add_parser


def test_the_help_lists_every_option_in_the_documented_order() -> None:
    sub = argparse.ArgumentParser(prog="latlab").add_subparsers()
    add_parser(sub)
    usage = sub.choices["loadtest"].format_usage()
    assert re.findall(r"\[(--[a-z-]+)", usage) == list(HELP_ORDER)


def test_the_cli_imports_no_ssl_before_locust_patches_it() -> None:
    """`latlab` imports every command's module before `latlab loadtest` imports Locust, whose gevent patches ssl:
    an ssl imported earlier (by requests, urllib.request) broke every load test once."""
    code = "import sys, latlab.cli.__main__; print(sorted({'ssl', 'requests', 'urllib3'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
