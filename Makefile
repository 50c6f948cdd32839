# sandboxd: `make run` serves with embedded defaults, `make test` runs every test.
# Both bring up what a fresh machine needs: virtualenv, helper binary, Docker engine, runtime image.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
IMAGE ?= sandboxd-runtime:busybox
PROTOS := $(wildcard proto/sandboxd/v1/*.proto)

.PHONY: all run test test-unit gvisor registry proto docs config package image-server lint bench engine image disk-image python-image base-image e2b-sdk helper helper-asan venv clean node-deps buf go-deps

all: venv helper

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]' -e clients/python
	touch $@

# Node client and buf, from the committed lock file; the stamp is the lock it was installed from
# (tests/clients/test_client_node.py checks the same stamp).
NODE_STAMP := clients/node/node_modules/.sandboxd-installed
node-deps: $(NODE_STAMP)

$(NODE_STAMP): clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund
	cp clients/node/package-lock.json $@

BUF := clients/node/node_modules/.bin/buf
# buf.yaml: STANDARD lint; breaking is checked against the main branch's protos.
buf: node-deps
	$(BUF) lint
	$(BUF) breaking --against '.git#branch=main,subdir=proto'

helper: build/sbx

# One static binary from every helper/*.c: sbx.c holds the subcommand table, each subcommand
# and each shared piece has a file of its own (helper/README.md maps them).
HELPER_SRC := $(wildcard helper/*.c)
build/sbx: $(HELPER_SRC) $(wildcard helper/*.h) scripts/ensure-build-tools.sh
	bash scripts/ensure-build-tools.sh
	mkdir -p build
	gcc -static -O2 -Wall -Wextra -Werror -o $@ $(HELPER_SRC) -lzstd

# The same sources under AddressSanitizer and UBSan (dynamic: the sanitizers need their runtime),
# for every unit test of the real agent over pipes (tests/agent_pipes.py runs each against both
# builds). Where the compiler cannot build it, the target says so and those tests skip with that
# reason.
helper-asan: build/sbx-asan

build/sbx-asan: $(HELPER_SRC) $(wildcard helper/*.h) scripts/ensure-build-tools.sh
	bash scripts/ensure-build-tools.sh
	mkdir -p build
	gcc -O1 -Wall -Wextra -Werror -fsanitize=address,undefined -fno-sanitize-recover=undefined \
		-fno-omit-frame-pointer -g -o $@ $(HELPER_SRC) -lzstd \
		|| { rm -f $@; echo "helper-asan: the compiler cannot build with -fsanitize=address,undefined" >&2; }

engine:
	bash scripts/ensure-docker.sh

image: engine
	bash service/sandboxd/runtime_images/busybox.sh $(IMAGE)
	bash scripts/build-disk-image.sh sandboxd-disktool:1

# The disk tool (e2fsprogs, losetup) that makes disk workspaces: built offline, with `image`.
disk-image: engine
	bash scripts/build-disk-image.sh sandboxd-disktool:1

# gVisor's runsc registered with the engine as runtime "runsc" (SIGHUP, never a restart);
# says why and goes on where it cannot be had (not root, remote engine).
gvisor: engine
	bash scripts/ensure-gvisor.sh

# Debian's distribution registry and htpasswd, for the registry tests (tests start and stop it).
registry:
	bash scripts/ensure-registry.sh

# Debian with python3: a real HTTP/TLS client for the egress tests (about a minute, once).
python-image: engine
	bash service/sandboxd/runtime_images/python.sh sandboxd-runtime:python

# The official E2B SDKs, pinned, each in a folder of its own (tests/clients/test_e2b_sdk.py runs
# them unchanged against the E2B door): the current Python SDK and the previous minor release,
# and the npm package.
E2B_PY := 2.63.0
E2B_PY_PREV := 2.61.0
E2B_NPM := 2.51.0
e2b-sdk: build/e2b-venv/.installed-$(E2B_PY) build/e2b-venv-prev/.installed-$(E2B_PY_PREV) build/e2b-node/.installed-$(E2B_NPM)

build/e2b-venv/.installed-$(E2B_PY):
	rm -rf build/e2b-venv && $(PYTHON) -m venv build/e2b-venv
	build/e2b-venv/bin/pip install -q e2b==$(E2B_PY)
	touch $@

build/e2b-venv-prev/.installed-$(E2B_PY_PREV):
	rm -rf build/e2b-venv-prev && $(PYTHON) -m venv build/e2b-venv-prev
	build/e2b-venv-prev/bin/pip install -q e2b==$(E2B_PY_PREV)
	touch $@

build/e2b-node/.installed-$(E2B_NPM):
	rm -rf build/e2b-node && mkdir -p build/e2b-node
	cd build/e2b-node && npm init -y >/dev/null && npm install --no-audit --no-fund e2b@$(E2B_NPM)
	touch $@

# The built-in `base` template (bash, python3, curl, the user `user`), which the E2B door uses.
base-image: engine
	bash service/sandboxd/runtime_images/base.sh sandboxd-runtime:base

# Every stub and table generated from proto/: server and Python client stubs, docs/errors.md's
# error table, the Go stubs and sentinel errors, the Node declarations and reason classes.
proto: venv go-deps node-deps
	$(PY) -m sandboxd.tools.genproto
	bash clients/go/gen.sh
	clients/go/env.sh go run ./tools/genreasons ../../proto/sandboxd/v1/errors.proto sandboxd/reasons.go
	cd clients/node && node scripts/gen-types.mjs

# The API reference docs/api.md from the protos' comments (`make proto` writes it too).
docs: venv
	$(PY) -m sandboxd.tools.gendocs

# packaging/sandboxd.toml, every setting with its default, from the settings model.
config: venv
	$(PY) -m sandboxd.tools.genconfig

# The server's wheel in dist/, carrying the static helper and the runtime images' recipes
# (docs/install.md): built from a copy of the tree, so the checkout never holds the binary twice.
package: venv helper
	bash scripts/package-server.sh dist

# The server's container image, sandboxd-server:latest, from packaging/Dockerfile on a Debian
# base built here with debootstrap (no registry).
image-server: package python-image
	bash scripts/build-server-image.sh sandboxd-server:latest dist

# The Go client builds from Debian's Go packages (no Go module proxy here): vendor/ links to them.
go-deps:
	bash clients/go/ensure-go.sh
	clients/go/env.sh true

run: venv helper image
	$(PY) -m sandboxd

# The Docker-free layer first, on every core (its tests share nothing but the helper builds),
# then the engine layers in two passes: on ENGINE_WORKERS xdist workers at once, a whole module
# per worker (each worker has its own servers, owner ids and temporary folders; the tests mostly
# wait on the engine, not on a core), then the tests marked `serial` alone on the host (their own
# dockerd, host-wide counts, a fixed port, tight wall-clock bounds: tests/conftest.py says which).
# Both passes always run; the target fails if either did. Each pass checks the host after it
# (tests/hostenv.py; on workers, the controller does, after the last worker).
ENGINE_WORKERS ?= 3
# One worker more than cores: a fifth of the unit layer's time is tests waiting (timeouts, the
# helper's processes), which another worker fills (on 2 cores: 46 s against 60 with -n auto).
UNIT_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: venv helper helper-asan image python-image base-image e2b-sdk gvisor node-deps go-deps registry
	DOCKER_HOST=unix:///nonexistent/sandboxd-unit-layer.sock $(PY) -m pytest -n $(UNIT_WORKERS) tests/unit
	status=0; \
	$(PY) -m pytest -n $(ENGINE_WORKERS) --dist loadfile -m "not serial" --durations=40 \
		tests/integration tests/clients || status=$$?; \
	$(PY) -m pytest -m serial --durations=20 tests/integration tests/clients || status=$$?; \
	exit $$status

# The Docker-free layer (tests/unit): parsers, policies, and the domain against the fake engine.
# DOCKER_HOST names a socket nobody serves, so a unit test that reached for an engine fails here
# instead of passing on a developer's machine that happens to run one.
test-unit: venv helper helper-asan
	DOCKER_HOST=unix:///nonexistent/sandboxd-unit-layer.sock $(PY) -m pytest -n $(UNIT_WORKERS) tests/unit

# The workspace fuzzer, the SIGKILL test and the restart model for SANDBOXD_SOAK_SECONDS each
# (default 1200 s: one hour in all), exploring (not derandomized) and shrinking what it finds.
SANDBOXD_SOAK_SECONDS ?= 1200
soak: venv helper image
	SANDBOXD_SOAK_SECONDS=$(SANDBOXD_SOAK_SECONDS) $(PY) -m pytest -x -q \
		tests/integration/test_fuzz_workspace.py tests/integration/test_restarts.py \
		-k "fuzzer or sigkilled or restart_model"

# The last check types the test layer's stand-ins as the protocols they stand in for
# (tests/fakes_typed.py), so a fake cannot drift from its protocol.
lint: venv buf
	$(VENV)/bin/ruff check service tests bench clients/python
	$(VENV)/bin/ruff format --check service tests bench clients/python
	$(VENV)/bin/mypy service
	$(VENV)/bin/mypy tests/fakes.py  # the fakes against the ports they stand in for
	$(VENV)/bin/mypy clients/python/sandboxd_client
	MYPYPATH=service:tests $(VENV)/bin/mypy tests/fakes_typed.py

bench: venv helper image
	$(PY) bench/run.py

clean:
	rm -rf build $(VENV)
