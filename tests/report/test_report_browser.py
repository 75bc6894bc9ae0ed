"""The report in a real browser: Debian's chromium, headless, shows the verdict table in the first viewport
and loads every image. Needs the `chromium` package (the Makefile installs it); these tests fail, not skip,
without it."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from latlab.report.write import write_report

from .report_fixtures import cpu_run, gpu_run

WIDTH, HEIGHT = 1280, 800
SLOS = [0.010, 0.025, 0.050, 0.100]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WIDTH},{HEIGHT}",
]
# Runs at the page's load event: where the answer table is, and every image's decoded width.
PROBE = """<script>addEventListener('load', () => {
  const table = document.querySelector('table.answer');
  const box = table ? table.getBoundingClientRect() : null;
  const facts = {innerHeight: innerHeight, table: box && {top: box.top, bottom: box.bottom},
                 images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))};
  const out = document.createElement('pre'); out.id = 'probe'; out.textContent = JSON.stringify(facts);
  document.body.appendChild(out);
});</script>"""


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium not found: install Debian's `chromium` package (make lab/test does)"
    return binary


def probe(page: Path, profile: Path) -> dict:
    """Open a copy of `page` with the probe script in headless chromium; the facts the probe recorded."""
    probed = page.with_name("probed-" + page.name)
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", probed.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"<pre id=\"probe\">(.*?)</pre>", result.stdout, re.S)
    assert found, f"chromium printed no probe (rc {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def first_screen_problems(facts: dict) -> list[str]:
    """What keeps the page from answering on its first screen; empty when it does."""
    problems = []
    if facts["table"] is None:
        problems.append("no verdict table")
    elif facts["table"]["bottom"] > facts["innerHeight"]:
        problems.append(
            f"verdict table ends at {facts['table']['bottom']:.0f} px, below the first {facts['innerHeight']} px"
        )
    problems += [f"image '{i['alt']}' did not load" for i in facts["images"] if not i["complete"] or i["width"] <= 0]
    return problems


def merged(tmp_path: Path) -> Path:
    return write_report(
        [cpu_run(tmp_path), gpu_run(tmp_path)], SLOS, prices={"cpu": 0.80, "cuda": 2.50}, out=tmp_path / "report"
    )


def cpu_only(tmp_path: Path) -> Path:
    """What `make lab` gives on a CPU box: no GPU data, so the first screen also says how to add it."""
    return write_report([cpu_run(tmp_path)], SLOS, out=tmp_path / "report")


def searched(tmp_path: Path) -> Path:
    """A run whose lab searched configurations: the tried section follows the answer, never pushes it down."""
    from .test_tried import searched_run

    return write_report([searched_run(tmp_path)], SLOS, out=tmp_path / "report")


def planned(tmp_path: Path) -> Path:
    """A CPU run with the fleet plan asked for (--plan-traffic): its figure loads, the answer stays first."""
    from latlab.report.fleetplan.fleet import Slo
    from latlab.report.fleetplan.plan import PlanRequest
    from latlab.report.fleetplan.traffic import parse_profile

    request = PlanRequest(parse_profile("diurnal:200:20"), Slo.parse("p99:100ms"), use_off=True, budget_s=0.2)
    return write_report([cpu_run(tmp_path)], SLOS, out=tmp_path / "report", plan=request)


@pytest.fixture
def merged_report(tmp_path: Path) -> Path:
    return merged(tmp_path)


@pytest.mark.parametrize("build, images", [(merged, 3), (cpu_only, 3), (searched, 2), (planned, 4)])
def test_verdict_table_is_in_the_first_viewport_and_every_image_loads(build, images: int, tmp_path: Path) -> None:
    facts = probe(build(tmp_path), tmp_path / "profile")
    # Headless chromium keeps room for a browser's toolbars out of the window: ~660 px of an 800 px window,
    # about what a laptop's browser shows.
    assert 600 <= facts["innerHeight"] <= HEIGHT
    assert len(facts["images"]) == images  # the cost picture, where the time goes, the latency curve (, the fleets)
    assert first_screen_problems(facts) == []


def test_the_check_fails_for_a_page_that_hides_the_answer_or_breaks_an_image(
    merged_report: Path, tmp_path: Path
) -> None:
    page = merged_report.read_text()
    pushed = page.replace(
        "<section id='answer'>", f"<div style='height:{HEIGHT}px'>methodology</div><section id='answer'>", 1
    )
    broken_png = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    broken = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", f"data:image/png;base64,{broken_png}", pushed, count=1)
    bad = merged_report.with_name("bad.html")
    bad.write_text(broken)
    problems = first_screen_problems(probe(bad, tmp_path / "profile"))
    assert any("below the first" in p for p in problems)
    assert any("did not load" in p for p in problems)
