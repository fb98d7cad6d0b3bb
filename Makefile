# `make demo` and `make test` work on a fresh machine that only has python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test test-tf test-jax dist docs figures clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# Our distribution was called keras-attention before 0.2 (the name of an
	# unrelated package that imports as keras_attention too): drop either.
	$(BIN)/python -m pip uninstall -y keras-attention
	$(BIN)/python -m pip install -e ".[dev,text,widgets,jax]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python examples/date_translation.py

# The whole suite on the TensorFlow backend, then the layers, ops and the ported
# Keras attention tests on JAX.
test: test-tf test-jax

test-tf: install
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -n 2 --dist loadfile tests

test-jax: install
	KERAS_BACKEND=jax $(BIN)/python -m pytest -n 2 --dist loadfile -m "not tf_only" tests/layers tests/ops tests/keras_ported

# sdist and wheel into dist/ (tests/packaging/wheel_test.py installs them in a fresh venv).
dist: install
	$(BIN)/python -m build --outdir dist .

# API reference and guides into site/ (offline; warnings are errors, as in tests/docs/api_site_test.py).
docs: install
	KERAS_BACKEND=tensorflow KERAS_ATTENTION_QUIET_STARTUP=1 $(BIN)/python -m mkdocs build --strict

# README figures: widget screenshots (headless chromium) and the long-sequence plot.
figures: install
	$(BIN)/python docs/make_figures.py

clean:
	rm -rf $(VENV) build dist site *.egg-info
