# Everything installs into .venv; `make test` and `make demo` work on a fresh machine with
# Python 3.11 and Java 17.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast test-not-slow demo bench bench-full clean browser browser-deps testbed testbed-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP) browser testbed
	$(BIN)/pip check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tree (tests/unit/, one module each, no Spark): under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q $(PYTEST_ARGS)

# Every test not marked slow, scenario suites included.
test-not-slow: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Chromium for the UI page test in tests/test_plugin.py. `make test` installs it with apt when it
# is missing and it can (root on Debian/Ubuntu); elsewhere that one test is skipped with the reason.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory browser-deps; \
	else echo "note: no Chromium and no root apt: the UI page test will be skipped"; fi

browser-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

# Postgres, Redis and libfaketime for the distributed test bed (tests/support/distributed.py) and the skewed-clock
# test (tests/test_lifecycle.py), the same way; without them those tests are skipped with the reason.
testbed:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ -x /usr/bin/redis-server ] && [ -x /usr/bin/faketime ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory testbed-deps; \
	else echo "note: no Postgres/Redis/faketime and no root apt: the distributed tests will be skipped"; fi

testbed-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 postgresql redis-server faketime

demo: $(STAMP)
	$(BIN)/python -m airflow_savepoints.demo $(DEMO_ARGS)

# Benchmarks are never part of `make test`. xxhash/blake3 are only measured as checksum candidates,
# matplotlib draws docs/performance.png; the suite runs without them.
bench: $(STAMP)
	-$(BIN)/pip install --quiet xxhash blake3
	$(BIN)/python benchmarks/run.py --quick $(BENCH_ARGS)

bench-full: $(STAMP)
	-$(BIN)/pip install --quiet xxhash blake3 matplotlib
	$(BIN)/python benchmarks/run.py --json-file docs/performance.json --plot docs/performance.png $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info demo-run test-artifacts
