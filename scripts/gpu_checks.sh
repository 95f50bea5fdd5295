#!/bin/bash
# The GPU checks on a lent machine that has CUDA 13 but none of the pipeline's own tools (the H200 of docs/testing.md):
# `pytest -m gpu tests/gpu` and the mining tests with faiss-gpu-cu12 installed, so FAISS's GPU index runs too.
# Carried (git-ignored): .whl/ = wheels for Python 3.12 of pydantic, pydantic_core, annotated-types, typing-inspection,
# ruamel.yaml, ruamel.yaml.clib, faiss-gpu-cu12 and nvidia-cuda-runtime-cu12; .devshim/ = libcublas.so.12 and
# libcublasLt.so.12, built here by `bash scripts/gpu_checks.sh --build-shim` (see scripts/cublas12_shim.c for why).
# usage: bash scripts/gpu_checks.sh [--build-shim]; logs go to $OUT.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --build-shim ]; then
  mkdir -p .devshim
  symbols=$(grep -o 'X(cublas[A-Za-z0-9_]*)' scripts/cublas12_shim.c | sed 's/X(\(.*\))/\1;/' | tr '\n' ' ')
  echo "libcublas.so.12 { global: $symbols local: *; };" > /tmp/cublas12.map
  gcc -O2 -shared -fPIC -o .devshim/libcublas.so.12 -Wl,-soname,libcublas.so.12 -Wl,--version-script=/tmp/cublas12.map \
    scripts/cublas12_shim.c -ldl || exit 1
  echo 'void tqc_cublaslt12_stub(void) {}' | gcc -shared -fPIC -x c -o .devshim/libcublasLt.so.12 -Wl,-soname,libcublasLt.so.12 - || exit 1
  exit 0
fi
export OUT=${OUT:-/tmp/gpu-checks-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v nvidia_cuda_runtime) || exit 1
python3 -c "import zipfile, glob; zipfile.ZipFile(glob.glob('.whl/nvidia_cuda_runtime_cu12*.whl')[0]).extract('nvidia/cuda_runtime/lib/libcudart.so.12', '/tmp/cu12')" || exit 1
CUBLAS13_PATH=$(python3 -c "import glob, site; print(sorted(p for d in site.getsitepackages() for p in glob.glob(d + '/nvidia/**/libcublas.so.13', recursive=True))[0])")
# faiss's loader preloads CUDA from the nvidia-*-cu12 distributions, absent here; its own switch turns that off
export _FAISS_WHEEL_DISABLE_CUDA_PRELOAD=1 CUBLAS13_PATH LD_LIBRARY_PATH=/tmp/cu12/nvidia/cuda_runtime/lib:$PWD/.devshim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
log=$OUT/gpu_checks.log
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "cuBLAS 13 under the shim: $CUBLAS13_PATH"
  python3 -c "
import numpy, torch, transformers, faiss
from tqc.mining import build_index
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), 'transformers', transformers.__version__,
      'faiss', faiss.__version__, 'GPUs for faiss', faiss.get_num_gpus(), 'index', type(build_index(numpy.eye(4))).__name__)"
  python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rA --durations=5; gpu=$?
  python3 -m pytest tests/code/test_mining.py -q -p no:cacheprovider; mining=$?
  exit $((gpu || mining)); } 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"  # a failed test fails the script, not only tee's status
