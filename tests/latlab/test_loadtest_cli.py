"""`latlab loadtest`: the sweep plan's parts add its options; its help lists them in the order users know."""

from __future__ import annotations

import argparse
import re

from latlab.cli.loadtest import HELP_ORDER, add_parser


def test_the_help_lists_every_option_in_the_documented_order() -> None:
    sub = argparse.ArgumentParser(prog="latlab").add_subparsers()
    add_parser(sub)
    usage = sub.choices["loadtest"].format_usage()
    assert re.findall(r"\[(--[a-z-]+)", usage) == list(HELP_ORDER)
