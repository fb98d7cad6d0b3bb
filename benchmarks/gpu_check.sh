#!/usr/bin/env bash
# The GPU check of issue 15, as run on the lent GPU machine (one H200,
# Python 3.12, JAX with the CUDA plugin, PyTorch; no Keras, no TensorFlow,
# no network). Run from the repository root; results go to $OUT.
#
# Before the run, on a machine with network access, fetch the wheels the GPU
# machine lacks into .whl/ (gitignored; never commit them). Keras 3.15.1 and
# the dependencies from its METADATA that are not there: absl-py, namex, rich
# (with markdown-it-py, mdurl, pygments), optree and h5py (binary wheels),
# packaging. ml-dtypes and numpy come with JAX, typing-extensions with PyTorch.
# About 9.3 MB in all, well inside the 64 MiB a device call may carry:
#
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#      --platform manylinux2014_x86_64 -d .whl"
#   pip download $P keras==3.15.1
#   pip download $P absl-py==2.5.1
#   pip download $P namex==0.1.0
#   pip download $P rich==15.0.0
#   pip download $P markdown-it-py==4.3.0
#   pip download $P mdurl==0.1.2
#   pip download $P pygments==2.21.0
#   pip download $P optree==0.20.0
#   pip download $P h5py==3.14.0
#   pip download $P packaging==26.4
#
# The device image read on 2026-11-17 (the device tool's KINDS.md) has JAX
# 0.11.2, absl-py, h5py, rich (and its parts), ml-dtypes, numpy and
# packaging: only keras, namex and optree need carrying (2.9 MB).
#
# Then, from a session that has the device, one call that carries .whl:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
# The script keeps itself inside ~8 minutes (per-section deadlines); extra
# arguments go to gpu_check.py (e.g. --sections correctness).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export KERAS_BACKEND=jax
export OUT="${OUT:-$PWD/gpu_check_out}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -c "import jax, keras; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__)"
python3 benchmarks/gpu_check.py --out "$OUT" "$@"
