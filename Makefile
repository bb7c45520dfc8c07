# o41-training-data: `make demo` sets everything up and runs the demo; `make test` sets everything
# up and runs every test and lint. `make help` lists the rest.

.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
# One Rust target directory and one uv cache outside the clone, so fresh clones reuse builds.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/o41/target
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
UV = $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")

.PHONY: help bootstrap sync demo test test-rust test-python lint fmt bench docs wheel wheel-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

bootstrap: ## install uv from PyPI when it is missing
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 \
	  || $(PYTHON) -m pip install --quiet uv \
	  || $(PYTHON) -m pip install --quiet --break-system-packages uv

sync: bootstrap ## build the Rust engine and install every package and dev tool into .venv
	$(UV) sync --all-packages --group dev

demo: sync ## write a synthetic corpus and stream it
	$(UV) run o41 demo

test: sync lint docs test-rust test-python wheel-test ## run every lint, the docs build, the Rust tests, the Python tests and the wheel test

test-rust: ## Rust unit and property tests
	cd rust && cargo test --release -p o41-engine

test-python: sync ## Python tests
	$(UV) run pytest

lint: sync ## clippy, rustfmt, ruff, mypy
	cd rust && cargo fmt --all -- --check
	cd rust && cargo clippy --release --workspace --all-targets -- -D warnings
	$(UV) run ruff check .
	$(UV) run ruff format --check .
	$(UV) run mypy

docs: sync ## build the docs site into site/ (mkdocs, warnings are errors; tests/test_docs.py runs its examples)
	NO_MKDOCS_2_WARNING=1 $(UV) run mkdocs build --strict --quiet

# The core's tests that need nothing beyond the package, PyArrow, NumPy and the test runner.
WHEEL_TESTS = test_stream.py test_checkpoint.py test_position.py test_projection.py test_golden_order.py \
	test_open_errors.py test_order_properties.py test_rank_reads.py
WHEEL_VENV = $(CURDIR)/.wheel-venv

wheel: sync ## build the core's abi3 wheel for this machine into dist/ (reuses CARGO_TARGET_DIR's build)
	rm -f dist/o41_training_data-*.whl
	cd packages/core && $(UV) run maturin build --release --out ../../dist

wheel-test: wheel ## install the wheel into a fresh venv with only PyArrow and NumPy; run the core tests on it
	rm -rf $(WHEEL_VENV)
	$(UV) venv --quiet --python "$$($(UV) run python -c 'import sys; print(sys.executable)')" $(WHEEL_VENV)
	$(UV) pip install --quiet --python $(WHEEL_VENV)/bin/python dist/o41_training_data-*.whl pytest hypothesis msgpack
	$(WHEEL_VENV)/bin/python tests/wheel_check.py
	cd tests && $(WHEEL_VENV)/bin/python -m pytest -q -p no:cacheprovider $(WHEEL_TESTS)

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
	$(UV) run --group bench python benchmarks/tokenize_bench.py
