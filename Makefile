# The README's two commands: `make lab` (the main job) and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: lab test check bench-wsgi clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "latlab needs Python >= 3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: on our machines 2.13.0 is a local CPU build; anything else pulls GBs of CUDA.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	# Debian's prometheus lets a run's curves be rebuilt from its metrics; optional, so this line never fails.
	@command -v prometheus >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus)) >/dev/null 2>&1 || echo "note: could not install Debian's prometheus; the lab runs without it"
	# Debian's chromium renders the report in the browser test (tests/report/test_report_browser.py); optional for the lab.
	@command -v chromium >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)) >/dev/null 2>&1 || echo "note: could not install Debian's chromium; the report's browser test will fail, the lab runs without it"
	# Debian's haproxy is the load balancer of `latlab fleet` and its tests (tests/fleet); optional for the lab.
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy)) >/dev/null 2>&1 || echo "note: could not install Debian's haproxy; latlab fleet and its tests need it, the lab runs without it"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

lab: $(STAMP)
	$(BIN)/latlab lab

test: $(STAMP)
	# lint and format check first (config: [tool.ruff] in pyproject.toml); a violation fails the target before the tests run
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

# The fast lane: lint and every test that starts no process and opens no socket (tests/conftest.py skips the
# rest where they would start one), to check a change before the full suite; CI runs `make test`.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	LATLAB_FAST_LANE=1 $(BIN)/python -m pytest -q -n auto

bench-wsgi: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	command -v wrk >/dev/null || apt-get install -y -qq wrk || echo "wrk not installed: using the slower Python client"
	$(BIN)/python benchmarks/wsgi_servers.py

clean:
	rm -rf $(VENV) runs models
