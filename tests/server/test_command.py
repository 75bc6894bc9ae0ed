"""`python -m latlab.server`, the server's entry for child processes: the command line serve_command builds, the
same options as `latlab serve`, the same one-line refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from latlab.server.command import serve_command

LATLAB = [sys.executable, "-m", "latlab.cli", "serve"]


def options_section(help_text: str) -> str:
    """The help's option list, without the usage line (which names the program) and the description."""
    return help_text[help_text.index("options:") :]


def test_serve_command_runs_the_server_module_on_the_config(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    assert serve_command(config) == [sys.executable, "-m", "latlab.server", "--config", str(config)]
    assert serve_command(config, 9001)[-2:] == ["--metrics-port", "9001"]


def test_the_entry_takes_the_options_of_latlab_serve() -> None:
    entry = subprocess.run([*serve_command(Path("x")), "--help"], capture_output=True, text=True, timeout=60)
    cli = subprocess.run([*LATLAB, "--help"], capture_output=True, text=True, timeout=60)
    assert entry.returncode == cli.returncode == 0
    assert options_section(entry.stdout) == options_section(cli.stdout)


def test_a_bad_config_is_refused_in_one_line_as_latlab_serve_refuses_it(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(f'[[deployments]]\nname = "m"\nmodel_path = "{tmp_path / "missing.onnx"}"\n')
    entry = subprocess.run(serve_command(config), capture_output=True, text=True, timeout=60)
    cli = subprocess.run([*LATLAB, "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert entry.returncode == cli.returncode == 2
    said = entry.stderr.strip().splitlines()[-1]
    assert said.startswith("latlab: error: ") and said == cli.stderr.strip().splitlines()[-1]
