#!/usr/bin/env bash
# The device check, one command on a machine with a CUDA GPU (sized for one H200, < 9 min):
#   1. builds the extension with its C++ CUDA kernels (MTP_WITH_CUDA=ON) against the
#      machine's own CUDA torch (no download: that machine is offline; pins do not apply);
#   2. runs the tests, the CUDA variants included (C++ CUDA through torch.ops.mtp, and the
#      Triton launchers on the GPU; a decode step captured in a CUDA graph), then the rest of
#      the suite;
#   3. runs the GPU microbenchmarks (ours vs torch, GB/s vs the measured bandwidth; attention
#      vs torch SDPA with enable_gqa; host overhead per op call; a decode step's graph replay);
#   4. profiles the C++ head_attention and linear kernels under Nsight Compute (ncu.txt).
# Results go to $1 (default: $OUT when set, else build/gpu-check): summary.txt, build.log,
# tests.log, suite.log, bench.log, results.md, ncu.txt and gpu_results.json (the same figures as JSON,
# committed as bench/gpu_results.json). Exit status: non-zero if the CUDA build or a test of
# test_triton.py / test_cuda_graph.py / test_cuda_checks.py failed. Every step has a timeout; together at most 520 s (the build alone took ~4 min on the H200 machine, 2026-12-04).
#   bash bench/gpu_check.sh [results-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
RES="${1:-${OUT:-build/gpu-check}}"
mkdir -p "$RES"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary() { echo "$*" | tee -a "$RES/summary.txt"; }
# Every step's timeout: its own cap, or what is left of the 520 s budget less the time kept for
# the steps after it (cap CAP KEEP), whichever is less. A step that ends early leaves its time to
# the next ones, up to their caps.
END=$((SECONDS + 520))
cap() { local left=$((END - SECONDS - ${2:-0})); (( left < $1 )) && echo $((left > 1 ? left : 1)) || echo "$1"; }
: > "$RES/summary.txt"
summary "gpu_check: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
summary "python: $($PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"
summary "triton: $($PY -c 'import triton; print(triton.__version__)' 2>&1 | tail -1)"

# 1. Build: CMake directly (no pip, nothing fetched), the module copied next to the package.
ARCHS="${MTP_CUDA_ARCHS:-90}"   # the GPU at hand; CMake's default is 80;90
# CMake >= 3.26 (Python's limited API): the Python environment's own (pip's cmake) before the system's.
CMAKE="$(dirname "$(command -v "$PY")")/cmake"
[ -x "$CMAKE" ] || CMAKE=cmake
summary "cmake: $("$CMAKE" --version | head -n 1) ($CMAKE)"
rm -f mtp_kernels/_C*.so
JOBS="$(nproc)"
if timeout "$(cap 270 190)" bash -c "
    '$CMAKE' -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMTP_WITH_CUDA=ON -DMTP_PORTABLE_ONLY=ON \
      -DCMAKE_CUDA_ARCHITECTURES='$ARCHS' -DPython_EXECUTABLE='$(command -v "$PY")' &&
    '$CMAKE' --build build/gpu -j $JOBS" > "$RES/build.log" 2>&1 \
   && cp build/gpu/_C*.so mtp_kernels/; then
  summary "build: MTP_WITH_CUDA=ON ok (sm_$ARCHS)"
  export MTP_EXPECT_CUDA_KERNELS=1
  build_rc=0
else
  build_rc=1
  summary "build: MTP_WITH_CUDA=ON FAILED (tail of build.log below); falling back to the CPU build + Triton for CUDA"
  tail -n 30 "$RES/build.log" | tee -a "$RES/summary.txt"
  timeout "$(cap 120 190)" bash -c "
    '$CMAKE' -S . -B build/gpu-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMTP_PORTABLE_ONLY=ON -DPython_EXECUTABLE='$(command -v "$PY")' &&
    '$CMAKE' --build build/gpu-cpu -j $JOBS" >> "$RES/build.log" 2>&1 && cp build/gpu-cpu/_C*.so mtp_kernels/ \
    || { summary "build: the CPU build failed too"; exit 1; }
  export MTP_EXPECT_CUDA_KERNELS=0
fi

# 2. Tests. First the GPU kernels' own files (their cuda variants: C++ CUDA through torch.ops.mtp,
#    the Triton launchers on the GPU, against the reference and each other; one decode step
#    captured in a CUDA graph and replayed, against eager runs): these decide the exit status.
#    Then the other files' GPU tests (-k "cuda or gpu": the CUDA fallbacks of decoder_layers,
#    trees, the row-local ops; in parallel when pytest-xdist is there), reported: their files
#    may need packages (gguf, the model wheel) that an offline GPU image lacks.
#    -v and faulthandler: a crash ends pytest before its summary, so the log names each test as it runs.
GPU_TESTS="python_tests/test_triton.py python_tests/test_cuda_graph.py python_tests/test_cuda_checks.py"
timeout "$(cap 150 50)" "$PY" -X faulthandler -m pytest -v -p no:cacheprovider $GPU_TESTS -rfEs --tb=short \
  > "$RES/tests.log" 2>&1
test_rc=$?
summary "test_triton.py + test_cuda_graph.py + test_cuda_checks.py: $(tail -n 1 "$RES/tests.log") (rc $test_rc)"
grep -E "^(FAILED|ERROR)|Fatal Python error" "$RES/tests.log" | head -n 20 | tee -a "$RES/summary.txt"
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 8"
timeout "$(cap 40 45)" "$PY" -X faulthandler -m pytest -q -p no:cacheprovider $XDIST python_tests -k "cuda or gpu" \
  --ignore=python_tests/test_triton.py --ignore=python_tests/test_cuda_graph.py --ignore=python_tests/test_cuda_checks.py \
  -rfEs > "$RES/suite.log" 2>&1
suite_rc=$?
summary "the suite's other GPU tests (-k \"cuda or gpu\"): $(tail -n 1 "$RES/suite.log") (rc $suite_rc)"
grep -E "^(FAILED|ERROR)" "$RES/suite.log" | head -n 20 | tee -a "$RES/summary.txt"

# 3. Microbenchmarks (about 40-70 s on an H200). Both files are rewritten after each section: a
#    timeout leaves what was measured ("complete": false in the JSON).
timeout "$(cap 100 25)" "$PY" bench/gpu_bench.py "$RES/results.md" "$RES/gpu_results.json" > "$RES/bench.log" 2>&1
summary "bench: rc $? -> $RES/results.md, JSON $RES/gpu_results.json (commit it as bench/gpu_results.json)"
"$PY" - "$RES/gpu_results.json" <<'EOF' 2>&1 | tee -a "$RES/summary.txt"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"bench JSON: unreadable ({type(e).__name__}: {e})")
us = ", ".join(f"{op} {v:.1f}" for op, v in d.get("host_overhead", {}).items())
print(f"bench JSON: complete {d.get('complete')}, {len(d.get('records', []))} records, {len(d.get('errors', []))} errors")
print(f"host overhead (us per call, goal <= 8): {us or 'not measured'}")
g = d.get("graph_replay", {})
t = {k: f"{g[k]:.1f}" if isinstance(g.get(k), float) else g.get(k) for k in ("eager_us", "replay_us")}
print(f"graph replay: bitwise_equal {g.get('bitwise_equal')}, eager {t['eager_us']} us, replay {t['replay_us']} us")
for e in d.get("errors", [])[:10]:
    print(f"bench error: {e.get('where')}: {e.get('error', '')[:200]}")
EOF
cat "$RES/results.md" 2>/dev/null

# 4. Where the time goes (Nsight Compute, when the machine has it and time is left): the C++
#    head_attention's chunk and merge kernels and linear, one call each (bench/gpu_profile.py):
#    duration, DRAM throughput, occupancy, registers, warp stalls -> ncu.txt.
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)"
if [ "$build_rc" = 0 ] && [ -n "$NCU" ] && (( $(cap 60) > 20 )); then
  timeout "$(cap 60)" "$NCU" --nvtx --nvtx-include "profile/" --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    "$PY" bench/gpu_profile.py > "$RES/ncu.txt" 2>&1
  summary "ncu: rc $? -> $RES/ncu.txt ($(grep -c "Duration" "$RES/ncu.txt") kernels profiled)"
else
  summary "ncu: skipped (build_rc $build_rc, ncu '${NCU:-none}', $(cap 60) s left)"
fi
exit $(( build_rc || test_rc ))
