# rmqha: every target creates and uses .venv itself; nothing is assumed installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rmqha-installed
PYTEST_ARGS ?=
POWER_LOSS_SHIM := rmqha/testing/_power_loss_shim.so

.PHONY: all venv build libssl browser lint docs-map test test-proxy test-interop interop-build test-pure demo demo-grpc bench bench-quick bench-spark-source bench-proxy bench-peers peers-jars test-peers-smoke trends chaos soak wheel-check clean bench-trends

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel "Cython>=3.1,<4"

# Reinstall when the build or dependency files change; compile the extensions in place so
# the editable install always imports the compiled twins that match the sources.
$(STAMP): $(PY) pyproject.toml setup.py | libssl
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

build: $(STAMP) $(POWER_LOSS_SHIM) | libssl
	$(PY) setup.py --quiet build_ext --inplace

# The power-loss tests' LD_PRELOAD library (its header says what it models), built with the
# system cc as the extensions are.
$(POWER_LOSS_SHIM): rmqha/testing/power_loss_shim.c
	$${CC:-cc} -O2 -Wall -Wno-format-truncation -shared -fPIC -o $@ $< -ldl -lpthread

# The HA slave's compiled lane (rmqha/_core/slave_lane.pyx) computes the HA frame MAC with
# OpenSSL's libcrypto: Debian's libssl-dev, installed when its headers are missing
# (non-interactive; CI runs as root, elsewhere sudo -n is tried).  Without it setup.py
# leaves that one module out and the slave keeps its Python receive path.
libssl:
	@test -f /usr/include/openssl/evp.h || { \
		echo "installing libssl-dev (OpenSSL headers for rmqha/_core/slave_lane.pyx)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			libssl-dev </dev/null; }

# The status page test drives a real headless browser: Debian's chromium, installed when
# missing (non-interactive; CI runs as root, elsewhere sudo -n is tried).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing chromium (headless browser for tests/integration/test_status_page.py)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			chromium </dev/null; }

# The habits every change keeps (config in pyproject.toml): ruff; mypy over rmqha/ (strict on
# the layers under the rest: _core's API, protocol, net, security, store, ha); the compiled twins' stubs against the built extensions (stubtest);
# the import rules of ARCHITECTURE.md's map (import-linter).  tests/unit/test_lint_controls.py
# shows each of the last three failing on the fault it is there for.
TWIN_MODULES := rmqha._core.records rmqha._core.epoch_map rmqha._core.frames \
	rmqha._core.ha_offsets rmqha._core.message_index rmqha._core.queue_scan \
	rmqha._core.send_codec \
	rmqha._core.pull_answer \
	rmqha._core.send_frames \
	rmqha._core.ack_table \
	rmqha._core.slave_lane
lint: build
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m mypy.stubtest --mypy-config-file pyproject.toml --allowlist rmqha/_core/stubtest_allowlist.txt $(TWIN_MODULES)
	$(VENV)/bin/lint-imports --no-logo

# ARCHITECTURE.md's layer line and import graph, rewritten from pyproject.toml and the code,
# and docs/configuration.md's tables from `rmqha config-keys --markdown` (tests/unit/
# test_doc_map.py and test_config_keys_doc.py fail while they are stale).
docs-map: venv
	$(PY) tests/support/doc_map.py --write

# Two workers: most cluster tests wait on processes and sockets, so two streams finish in
# little more than half the time of one on two cores (tests/conftest.py's scheduler keeps a
# module on one worker and all of Spark on one).  TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
test: build browser lint
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)
	$(MAKE) test-proxy

# `rmqha proxy` and its tests run in a venv of their own: the proxy extra's
# rocketmq-python-client installs a top-level `rocketmq`, as does the dev extra's
# rocketmq 0.4.4.  tests/proxy has its own conftest (the suite's root one needs the dev extra).
PROXY_VENV  := .venv-rmq5
PROXY_PY    := $(PROXY_VENV)/bin/python
PROXY_STAMP := $(PROXY_VENV)/.rmqha-installed

$(PROXY_PY):
	$(PYTHON) -m venv $(PROXY_VENV)
	$(PROXY_PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel "Cython>=3.1,<4"

$(PROXY_STAMP): $(PROXY_PY) pyproject.toml setup.py
	$(PROXY_PY) -m pip install --quiet -e '.[proxy]' "pytest>=8" "pytest-timeout>=2.3"
	touch $(PROXY_STAMP)

test-proxy: $(PROXY_STAMP)
	$(PROXY_PY) setup.py --quiet build_ext --inplace
	$(PROXY_PY) -m pytest --confcutdir=tests/proxy tests/proxy $(PYTEST_ARGS)

# `make demo` with the load through `rmqha proxy` and RocketMQ 5's official Python client
# (Producer and SimpleConsumer over gRPC), in the proxy's venv.
demo-grpc: $(PROXY_STAMP)
	$(PROXY_PY) setup.py --quiet build_ext --inplace
	$(PROXY_PY) -m rmqha demo --grpc $(DEMO_ARGS)

# RocketMQ 5's Java and Python clients through the proxy beside rmqha's client over remoting,
# an idle consumer's request rate at the proxy, and the server CPU one unary call costs
# (grpcio alone, the proxy) (benches/bench_proxy.py), in the proxy's venv; the Java rows run
# interop/'s GrpcBench.  RMQHA_BENCH_QUICK=1 and RMQHA_BENCH_PROXY_SCALE shrink it.  Not
# part of `make bench`.
bench-proxy: $(PROXY_STAMP) interop-build
	$(PROXY_PY) setup.py --quiet build_ext --inplace
	$(PROXY_PY) -m pip install --quiet "pytest-benchmark>=5"
	$(PROXY_PY) -m pytest benches/bench_proxy.py --benchmark-only --benchmark-autosave \
		--benchmark-storage=file://.benchmarks --benchmark-disable-gc -s $(BENCH_ARGS)

# RocketMQ's own Java clients and mqadmin against rmqha (tests/interop): Maven resolves the
# versions pinned in interop/pom.xml into ~/.m2 and writes interop/target/classpath.txt; the
# Python tests start real clusters and run the Java drivers as processes.  Needs Java 17 and
# Maven (on the machines this project runs on); .ci/run runs it after `make test`.  The gRPC
# client's tests start `rmqha proxy` with the proxy venv's Python (the proxy extra cannot share .venv).
MVN ?= mvn
interop-build:
	cd interop && $(MVN) -B -q package

test-interop: build interop-build peers-jars $(PROXY_STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/interop $(PYTEST_ARGS)

# The same suite with the pure-Python twins forced.
test-pure: build browser
	RMQHA_NO_EXTENSIONS=1 $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Every chaos scenario and negative control on a real cluster, with the table at the end
# (also written to reports/chaos.md); a reduced schedule runs in `make test`.  Here the
# cluster runs with security on (mutual TLS on every port, certificates from `rmqha certs`,
# ACL on the brokers: tests/chaos/secure_mode.py); `make chaos CHAOS_SECURITY=` runs it without.
CHAOS_SECURITY ?= tls-acl
chaos: build
	RMQHA_CHAOS_SECURITY=$(CHAOS_SECURITY) $(PY) -m pytest tests/chaos -p no:cacheprovider $(PYTEST_ARGS); \
		status=$$?; cat reports/chaos.md 2>/dev/null; exit $$status

# The other slow runs: the controller commit soak with leader kills, long failover cycles.
soak: build
	$(PY) -m pytest -m slow --ignore=tests/chaos $(PYTEST_ARGS)

demo: build
	$(PY) -m rmqha demo $(DEMO_ARGS)

# BENCH_PUBLISH=rmqha://NAMESRV/TOPIC also sends the run's results to that topic, which
# `rmqha-trends trends --history rmqha://NAMESRV/TOPIC` reads (docs/spark.md).
BENCH_RUN_JSON = .benchmarks/last-run.json
bench: build
	$(PY) -m pytest benches --benchmark-only --benchmark-autosave \
		--benchmark-storage=file://.benchmarks --benchmark-disable-gc \
		$(if $(BENCH_PUBLISH),--benchmark-json=$(BENCH_RUN_JSON)) $(BENCH_ARGS)
	$(if $(BENCH_PUBLISH),$(PY) -m spark_bench publish --to '$(BENCH_PUBLISH)' $(BENCH_RUN_JSON))

# The rmqha Spark source alone: a batch read of 1 M 1 KiB messages on local[2] and a
# stream's send-to-sink latency (benches/bench_spark_source.py).
bench-spark-source: build
	$(PY) -m pytest benches/bench_spark_source.py --benchmark-only --benchmark-disable-gc -s $(BENCH_ARGS)

bench-quick: build
	RMQHA_BENCH_QUICK=1 $(MAKE) bench

# rmqha side by side with NATS JetStream, Redis and RabbitMQ, each a real 3-node group on
# loopback (benches/bench_peers.py); installs the Debian packages and the Python clients
# (the `peers` extra) when missing and writes the table into docs/benchmarks.md.  Then
# rmqha beside real RocketMQ 5 and Kafka 4 (--jvm-peers; their servers' jars and the Java
# load driver from benches/peers/maven, `make peers-jars`), logs kept in reports/bench-peers.
# PEERS_ARGS="--quick" runs it all at a few hundred messages (proves the harness, no figures).
# Not part of test.
PEER_PACKAGES := nats-server redis-server rabbitmq-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The JVM peers' jars (RocketMQ 5.5.0's servers, Kafka 4.1.1) and the Java load driver:
# Maven resolves the pinned versions into ~/.m2 and writes <module>/target/classpath.txt.
peers-jars:
	cd benches/peers/maven && $(MVN) -B -q package

# The JVM peers' harness at tiny size (tests/peers_smoke): RocketMQ 5 in controller mode and
# Kafka in KRaft, 100 messages per workload through the benchmark's drivers, one leader kill
# each.  Needs Java 17, Maven, rocketmq 0.4.4 (dev extra) and confluent-kafka (peers extra).
test-peers-smoke: build peers-jars
	$(PY) -m pip install --quiet -e '.[dev,spark,peers]'
	$(PY) -m pytest -p no:cacheprovider tests/peers_smoke $(PYTEST_ARGS)

bench-peers: build peers-jars
	@missing=""; for p in $(PEER_PACKAGES); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive \
		$(SUDO) apt-get install -y --no-install-recommends $$missing; fi
	$(PY) -m pip install --quiet -e '.[dev,spark,peers]'
	$(PY) benches/bench_peers.py --write-into docs/benchmarks.md --flush-sync --security \
		--jvm-peers --keep-logs reports/bench-peers $(PEERS_ARGS)

# Ingest new pytest-benchmark runs from .benchmarks, analyse, write reports/trends/report.html.
# Gate a CI run with TRENDS_ARGS="--fail-on-regression" (exit codes: see docs/benchmarks.md).
trends: build
	$(PY) -m spark_bench trends --history .benchmarks --out reports/trends $(TRENDS_ARGS)

# The trends command at 2,000 and 20,000 runs x 200 benchmarks: wall, CPU and the peak summed
# RSS of its process tree, first run / rerun / one more run (docs/benchmarks.md, "Trends at
# scale").  Histories (0.56 and 5.6 GB of JSON) are kept in reports/bench-trends.
# BENCH_TRENDS_ARGS="--runs 2000" for one size, "--master spark://host:7077" for a cluster.
bench-trends: build
	$(PY) benches/trends_scale.py $(BENCH_TRENDS_ARGS)

# Build a wheel and prove it installs and imports in a fresh venv.
wheel-check: $(PY)
	rm -rf dist/wheelcheck && mkdir -p dist/wheelcheck
	$(PY) -m pip wheel --quiet --no-deps -w dist/wheelcheck .
	$(PYTHON) -m venv dist/wheelcheck/venv
	dist/wheelcheck/venv/bin/pip install --quiet dist/wheelcheck/rmqha-*.whl
	cd dist/wheelcheck && venv/bin/python -c "import rmqha, zipfile, glob; \
		impl = rmqha.core_implementation(); print('wheel imports, core:', impl); \
		assert impl == 'cython', impl; \
		names = zipfile.ZipFile(glob.glob('rmqha-*.whl')[0]).namelist(); \
		assert not [n for n in names if n.endswith('.c')], 'generated C in wheel'; \
		assert 'spark_bench/cli.py' in names and 'spark_bench/log4j2.properties' in names, \
		'spark_bench missing from the wheel'"
	cd dist/wheelcheck && venv/bin/rmqha-trends --help > /dev/null && echo "rmqha-trends --help runs"

clean:
	rm -rf build dist *.egg-info rmqha/_core/*.c rmqha/_core/*.so rmqha/_core/*.html $(POWER_LOSS_SHIM)
