#!/usr/bin/env bash
# The stable-ABI proof of concept of docs/torch-versions.md, built by hand (not by CMake, not
# by CI): poc.cpp (STABLE_TORCH_LIBRARY, torch's C ABI only, the Python limited API) and
# classic.cpp (the same probe op through TORCH_LIBRARY, for the per-call A/B), against the
# torch of PYTHON (default .venv/bin/python). Then, with any torch >= 2.13:
#   python tools/stable_abi/run_poc.py build/stable_abi   # results, errors, torch.compile
#   python tools/stable_abi/percall.py build/stable_abi   # per-call cost, stable vs C++ API
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-build/stable_abi}
mkdir -p "$OUT"
T=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
g++ -std=c++17 -O2 -fPIC -shared -ffp-contract=off -DPy_LIMITED_API=0x030A0000 -I"$T/include" -Icsrc/include \
  -I"$PYINC" tools/stable_abi/poc.cpp -o "$OUT/_stable_poc.abi3.so" -L"$T/lib" -ltorch_cpu -lc10
g++ -std=c++20 -O2 -fPIC -shared -fopenmp -I"$T/include" -I"$T/include/torch/csrc/api/include" \
  tools/stable_abi/classic.cpp -o "$OUT/classic.so" -L"$T/lib" -ltorch_cpu -lc10 -ltorch
echo "built $OUT/_stable_poc.abi3.so and $OUT/classic.so against torch $("$PY" -c 'import torch; print(torch.__version__)')"
