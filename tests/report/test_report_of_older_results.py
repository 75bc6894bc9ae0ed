"""A run of the first results format gives the same report whether it is read as it was written or rewritten in
the current format: the typed results change how the report reads a run, not what it says."""

from __future__ import annotations

import shutil

from latlab.loadtest.results import RESULTS_FILE, SCHEMA, read_results, write_results
from latlab.report.write import write_report
from tests.lab_v1 import MODELS, unpack_lab_v1

SLOS = [0.01, 0.025, 0.05, 0.1]


def test_the_report_of_a_first_format_run_is_the_same_page_after_a_rewrite(tmp_path):
    old = unpack_lab_v1(tmp_path / "old" / "lab")  # one folder name: the page's title names it
    new = tmp_path / "new" / "lab"
    for model in MODELS:
        (run,) = read_results(old / model)
        write_results(new / model / RESULTS_FILE, run)
        assert f'"schema": "{SCHEMA}"' in (new / model / RESULTS_FILE).read_text()
    shutil.copytree(old / "bench", new / "bench")
    pages = [write_report([folder], SLOS, out=folder.parent / "report").read_bytes() for folder in (old, new)]
    assert b"mlp" in pages[0] and b"minilm" in pages[0] and len(pages[0]) > 100_000
    assert pages[0] == pages[1]
