# sandboxd: `make run` serves with embedded defaults, `make test` runs every test.
# Both bring up what a fresh machine needs: virtualenv, helper binary, Docker engine, runtime image.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
IMAGE ?= sandboxd-runtime:busybox
PROTOS := $(wildcard proto/sandboxd/v1/*.proto)

.PHONY: all run test proto lint bench engine image helper venv clean

all: venv helper

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

helper: build/sbx

build/sbx: helper/sbx.c scripts/ensure-build-tools.sh
	bash scripts/ensure-build-tools.sh
	mkdir -p build
	gcc -static -O2 -Wall -Wextra -Werror -o $@ helper/sbx.c

engine:
	bash scripts/ensure-docker.sh

image: engine
	bash scripts/build-runtime-image.sh $(IMAGE)

proto: venv
	$(PY) -m sandboxd.tools.genproto

run: venv helper image
	$(PY) -m sandboxd

test: venv helper image
	$(PY) -m pytest

lint: venv
	$(VENV)/bin/ruff check service tests bench
	$(VENV)/bin/ruff format --check service tests bench
	$(VENV)/bin/mypy service

bench: venv helper image
	$(PY) bench/run.py

clean:
	rm -rf build $(VENV)
