"""grafana/prometheus.yml, its rules and target files, checked by Debian's promtool (fails, not skips, without it)."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
from pathlib import Path

import yaml

from latlab.common import prometheus
from tests.grafana import shipped

PROMTOOL_MISSING = "promtool not found: install Debian's `prometheus` package (apt-get install prometheus)"


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    assert binary, PROMTOOL_MISSING
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_shipped_config_and_finds_its_rule_files():
    result = promtool("check", "config", str(shipped.GRAFANA / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(shipped.RULE_FILES)} rule files found" in result.stdout + result.stderr


def test_promtool_accepts_the_shipped_rules():
    assert shipped.RULE_FILES, "no grafana/rules/*.yml"
    result = promtool("check", "rules", *map(str, shipped.RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def file_sd_patterns() -> dict[str, list[str]]:
    config = yaml.safe_load((shipped.GRAFANA / "prometheus.yml").read_text())
    return {
        job["job_name"]: [f for sd in job["file_sd_configs"] for f in sd["files"]] for job in config["scrape_configs"]
    }


def test_servers_and_load_generators_are_discovered_from_target_files():
    """Adding a replica or a Locust process is an edit of a target file, never of prometheus.yml."""
    patterns = file_sd_patterns()
    assert set(patterns) == {"latlab-server", "latlab-loadgen"}
    # the server's observer port (its port + 1): scrapes never wait behind infer requests
    expected = {"latlab-server": "127.0.0.1:8001", "latlab-loadgen": "127.0.0.1:9646"}
    for job, globs in patterns.items():
        files = [
            path
            for path in (shipped.GRAFANA / "targets").iterdir()
            if any(fnmatch.fnmatch(str(path.relative_to(shipped.GRAFANA)), g) for g in globs)
        ]
        assert files, f"no shipped target file matches {globs} for {job}"
        groups = [group for path in files for group in json.loads(path.read_text())]
        assert all(set(group) <= {"targets", "labels"} for group in groups)
        assert expected[job] in [t for group in groups for t in group["targets"]]


def test_a_written_config_can_load_the_shipped_rules(tmp_path: Path):
    """What the lab writes for its own Prometheus (write_config) loads grafana/rules as they ship."""
    config = prometheus.write_config(
        tmp_path / "prometheus.yml", {"latlab-server": ["127.0.0.1:8000"]}, rule_files=shipped.RULE_FILES
    )
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(shipped.RULE_FILES)} rule files found" in result.stdout + result.stderr
    empty = prometheus.write_config(tmp_path / "plain.yml", {})
    assert "rule_files: []" in empty.read_text()  # without rule files: as before
