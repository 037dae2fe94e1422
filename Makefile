# The two commands a newcomer needs (README):
#   make run    set everything up, start a local kcp, bootstrap a demo, start vwserver
#   (make run-sync: the same for the syncer's story: a database synced to a downstream operator)
#   make test   set everything up and run every test (lint, unit, integration, kcp e2e)
# Everything else here is a building block of those two.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup kcp go-clients image e2e-container pytest-one run run-sync test check lint typecheck pytest unit integration e2e chaos bench soak lock clean

setup: $(STAMP) kcp

# The virtualenv is rebuilt when the dependency lock or pyproject changes.
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	@touch $@

# Builds kcp (and the pieces of a sharded kcp: cache-server, kcp-front-proxy; tests/shards) once
# per version into ~/.cache/vwserver (see scripts/kcp/build.sh).
kcp:
	@scripts/kcp/build.sh --sharded >/dev/null

# Builds the Go test clients (clients/go) and the example provider (clients/go/provider) into
# ~/.cache/vwserver (see scripts/go/build.sh).
go-clients:
	@scripts/go/build.sh vwclient >/dev/null
	@scripts/go/build.sh vwprovider >/dev/null

# vwserver's container image, built from the Dockerfile with podman (installed from Debian's
# packages when missing); prints its reference. Where the Dockerfile's pinned base cannot be
# pulled, the base is assembled from Debian packages and cached (scripts/image/base.sh).
image:
	@scripts/image/build.sh

run: setup
	$(BIN)/python -m devenv.demo $(if $(SHARDS),--shards=$(SHARDS))

run-sync: setup
	$(BIN)/python -m devenv.seed_story

test: setup check pytest e2e-container

check: lint typecheck

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected no tests: that must fail, never pass silently.
PYTEST = $(BIN)/python -m pytest
define run_pytest
	$(PYTEST) $(1); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc
endef

pytest: $(STAMP) kcp go-clients
	@$(call run_pytest,-q tests)

unit: $(STAMP)
	@$(call run_pytest,-q tests/unit)

integration: $(STAMP)
	@$(call run_pytest,-q tests/integration)

e2e: $(STAMP) kcp go-clients
	@$(call run_pytest,-q tests/e2e)

# One e2e module with kcp in a container started by testcontainers (the KCP_IMAGE path of
# tests/conftest.py) through podman's Docker-compatible API, from an image of the cached kcp
# binary (scripts/image/with-podman-api.sh; KCP_IMAGE=... to use another image).
e2e-container: $(STAMP) kcp
	@scripts/image/with-podman-api.sh $(MAKE) --no-print-directory pytest-one \
		PYTEST_ARGS='-q tests/e2e/test_proxy_kcp.py'

pytest-one: $(STAMP)
	@$(call run_pytest,$(PYTEST_ARGS))

# The chaos tests alone (make test runs them too). Longer, e.g.:
#   VWSERVER_CHAOS_KCP_KILLS=20 VWSERVER_CHAOS_WRITES=5000 make chaos
chaos: $(STAMP) kcp go-clients
	@$(call run_pytest,-q tests/chaos)

# The soak test at full length: 1,000 TLS watches, 10 minutes of changes (CI runs 75 s).
soak: $(STAMP) kcp
	@VWSERVER_SOAK_SECONDS=$${VWSERVER_SOAK_SECONDS:-600} $(call run_pytest,-q tests/soak)

# Benchmarks (scripts/bench): a full run takes about 1.5 h on 2 cores, most of it creating and
# listing 100,000 objects in kcp; BENCH_ARGS='--quick --skip kcp,writes,consistent' takes about a
# minute; BENCH_ARGS='--only writes,consistent --quick' runs issue 23's arms against kcp (31 min
# at load 12-17). Writes docs/bench/ (--quick: a temporary directory) and prints every ratio
# more than 20 % worse than the committed docs/bench/results.json.
bench: $(STAMP) kcp
	$(BIN)/python scripts/bench/run.py $(BENCH_ARGS)

# Refresh the locks from a fresh resolve (commit the result): requirements.lock (everything, for
# development) and requirements-runtime.lock (its runtime subset, for the container image).
lock:
	rm -rf /tmp/vwserver-lock && $(PYTHON) -m venv /tmp/vwserver-lock
	/tmp/vwserver-lock/bin/pip install --quiet '.[dev]'
	/tmp/vwserver-lock/bin/pip freeze --exclude-editable | grep -v '^vwserver' > requirements.lock
	rm -rf /tmp/vwserver-lock && $(PYTHON) -m venv /tmp/vwserver-lock
	/tmp/vwserver-lock/bin/pip install --quiet -c requirements.lock .
	/tmp/vwserver-lock/bin/pip freeze | grep -v '^vwserver' > requirements-runtime.lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
