# `make demo` and `make test` work on a fresh machine that only has python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The test targets run with TensorFlow's INFO and WARNING lines off; the demo sets
# nothing: it asks for our quiet start, which sets TF_CPP_MIN_LOG_LEVEL=3 before
# TensorFlow loads (a global 2 here let ERROR-level notes such as "oneDNN
# supports DT_INT64 only on platforms with AVX-512" through mid-training).
TEST_ENV := TF_CPP_MIN_LOG_LEVEL=2
# `make test` compiles thousands of small XLA programs (jax.jit, jit_compile=True,
# the JAX workers), most run once: LLVM's optimisation passes were a third of the
# JAX run's time and 40% of the XLA-heavy TensorFlow tests' (measured 2026-12-03:
# ops+ported Keras tests on JAX 146 s -> 97 s, fuzz + JAX distribution on
# TensorFlow 225 s -> 128 s). They compile at backend (LLVM) level 0; XLA's HLO
# passes -- fusion, simplification, what decides the numerics -- run as usual, and
# `make test-compat` runs the kernels and Keras' ported tests at XLA's defaults.
# XLA:CPU's newer fusion emitters cost more to compile than the classic elemental
# emitter they replace (600 small programs: 21.6 s -> 12.9 s; wrapped_call_test +
# kernel_contract_test on JAX 123 s -> 96 s, measured 2026-12-05); both are XLA's
# own code generators, and test-compat keeps the default one. XLA:CPU also splits
# each program's LLVM module into parts compiled in parallel, which on
# these small programs costs more than it gains: one part (how the code is
# partitioned for codegen, not what it computes) took kernel_contract_test +
# wrapped_call_test on JAX from 76.8 s to 68.8 s of CPU (2 alternated pairs,
# 2026-12-06), JAX's fuzz test 53.6 -> 50.5 s.
FAST_XLA := XLA_FLAGS="$(XLA_FLAGS) --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"

.PHONY: install demo lint format test test-tf test-browsers test-jax test-jax-layers test-benchmarks test-compat test-compat-full dist docs figures clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# Our distribution was called keras-attention before 0.2 (the name of an
	# unrelated package that imports as keras_attention too): drop either.
	$(BIN)/python -m pip uninstall -y keras-attention
	# No --no-compile: where PYTHONDONTWRITEBYTECODE is set (here, maybe CI) every
	# test process would recompile TensorFlow's modules on import (tried: the
	# TensorFlow run took 21 minutes instead of 17.5 to 19).
	$(BIN)/python -m pip install -e ".[dev,text,widgets,jax]"
	touch $(STAMP)

install: $(STAMP)

# The demo needs only the `text` extra (tensorflow-text): no test or docs
# toolchain (CONTRIBUTING.md has the measured install sizes and times).
$(DEMO_STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip uninstall -y keras-attention
	$(BIN)/python -m pip install -e ".[text]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/date_translation.py

# ruff's lint and format checks (configuration: pyproject.toml's [tool.ruff]);
# `make format` applies the formatter and the safe fixes.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Lint first (seconds), then the whole suite on the TensorFlow backend, then the
# layers, ops, analysis and the ported Keras attention tests on JAX.
test: lint test-tf test-jax

# Of the widgets' browser pages (tests/widgets/frontends_test.py), one per test: every
# widget, JupyterLab 4, Notebook 7 and Voila, light and Dark each covered by some page
# (8 pages). The other 15 (`front_end_matrix`: the same checks in the other front ends
# and themes) run in `make test-browsers`: they were 500 of the 3245 s of test time of
# this run (2026-12-06, 2 cores), and CI has 25 minutes.
test-tf: install
	$(TEST_ENV) $(FAST_XLA) KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not benchmark and not front_end_matrix" tests

# Every widget in every front end and theme (23 browser pages, about 7 minutes on 2
# cores): run it when a change touches keras_attention/widgets or their pages.
test-browsers: install
	$(TEST_ENV) KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -n 2 --dist load tests/widgets/frontends_test.py

# On JAX: the kernels, every layer's contract (build, call, masks, Sequential.add,
# .keras round trip, compiled), the family checks, the tests/layers tests marked
# `both_backends` (jax.jit's own paths, every layer compiled: the fuzz and combinations
# tests), Keras' own attention tests, KerasHub's classes and the analysis. The other
# tests/layers tests (`layer_detail`) run on TensorFlow here and on JAX in
# `make test-jax-layers`: on JAX they were 589 s of the 1125 s of test time of this
# run (2026-12-06, 2 cores; 414 s without the `both_backends` ones), and CI has 25 minutes.
JAX_TESTS := tests/layers tests/ops tests/keras_ported tests/keras_hub tests/analysis_test.py

test-jax: install
	$(TEST_ENV) $(FAST_XLA) KERAS_BACKEND=jax $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not tf_only and not layer_detail" $(JAX_TESTS)

# The `layer_detail` tests on JAX (about 5 minutes): run it when a change touches
# keras_attention/layers or what the layers call on JAX.
test-jax-layers: install
	$(TEST_ENV) $(FAST_XLA) KERAS_BACKEND=jax $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not tf_only and layer_detail" tests/layers

# The smoke runs of the benchmark scripts (benchmarks/: serving, the GPU check's CPU
# configuration, mha_benchmark, blockwise_profile, dropout_training, tile_plan, bounded_cache):
# developer tools that no user runs, so they stay out of `make test` (about 4 minutes of its
# TensorFlow run);
# run this when a change touches benchmarks/ or what a script calls.
test-benchmarks: install
	$(TEST_ENV) $(FAST_XLA) KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -n 2 --dist loadfile -m benchmark tests/benchmarks

# The lowest supported releases (tests/compat/lowest.txt, setup.cfg's floors) in
# their own venv: installing our package there with those pins proves the ranges
# admit them. Then, on both backends, the kernels (tests/ops) and Keras' own
# attention tests against our layers (tests/keras_ported); on TensorFlow also every
# layer's contract (build, call, masks, Sequential.add, .keras round trip, XLA) and
# the family checks, and the TensorFlow-only translator/export checks. About 5
# minutes on 2 cores after a ~1 minute install. Left out for CI time: `slow` tests,
# the other tests/layers tests (`layer_detail`: ~1 more minute on TensorFlow, ~9 on
# JAX, where the JAX run would also add the layer contracts' ~1.3 minutes), the
# `both_backends` ones (every layer compiled, the fuzz and combinations tests: 115 s
# of the TensorFlow run's 356 s of test time, 2026-12-07) and, on JAX, the block-sparse
# kernel's own file (138 s of that run's 391 s; the kernel contract checks it there);
# `make test` runs all of them on the newest releases, `make test-compat-full` here.
COMPAT := .venv-compat
COMPAT_STAMP := $(COMPAT)/.installed
COMPAT_TESTS := tests/ops tests/keras_ported
COMPAT_TF_TESTS := tests/layers tests/models/translate_progress_test.py \
	tests/export/check_progress_test.py tests/packaging/version_range_test.py

$(COMPAT_STAMP): setup.cfg pyproject.toml tests/compat/lowest.txt
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --upgrade pip
	$(COMPAT)/bin/python -m pip install -c tests/compat/lowest.txt -e ".[text,jax]" \
		"pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100"
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	$(TEST_ENV) KERAS_BACKEND=tensorflow $(COMPAT)/bin/python -m pytest -n 2 --dist loadfile \
		-m "not slow and not layer_detail and not both_backends" $(COMPAT_TESTS) $(COMPAT_TF_TESTS)
	$(TEST_ENV) KERAS_BACKEND=jax $(COMPAT)/bin/python -m pytest -n 2 --dist loadfile -m "not slow and not tf_only" \
		$(COMPAT_TESTS) --ignore=tests/ops/block_sparse_test.py

# Everything but `slow` on the lowest releases, both backends (~12 minutes): what
# test-compat leaves out for CI time, for a change that touches version-sensitive code.
test-compat-full: $(COMPAT_STAMP)
	$(TEST_ENV) KERAS_BACKEND=tensorflow $(COMPAT)/bin/python -m pytest -n 2 --dist loadfile -m "not slow" \
		$(COMPAT_TESTS) $(COMPAT_TF_TESTS)
	$(TEST_ENV) KERAS_BACKEND=jax $(COMPAT)/bin/python -m pytest -n 2 --dist loadfile -m "not slow and not tf_only" \
		$(COMPAT_TESTS) tests/layers

# sdist and wheel into dist/ (tests/packaging/wheel_test.py installs them in a fresh venv).
dist: install
	$(BIN)/python -m build --outdir dist .

# API reference and guides into site/ (offline; warnings are errors, as in tests/docs/api_site_test.py).
docs: install
	KERAS_BACKEND=tensorflow KERAS_ATTENTION_QUIET_STARTUP=1 $(BIN)/python -m mkdocs build --strict

# Every published figure: the widgets as Voila shows them (headless chromium, light and
# dark, each page passing the painted-text check) and the long-sequence plot.
figures: install
	$(BIN)/python docs/make_figures.py

clean:
	rm -rf $(VENV) $(COMPAT) build dist site *.egg-info
