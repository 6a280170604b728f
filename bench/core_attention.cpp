// Times the torch-free decode attention (mtp/attention.h) as a SmolLM2 decoder pass runs it:
// B = 1, 9 query / 3 KV heads of 64, bf16, a cache of capacity 512 holding n keys, 30 layers'
// caches in turn, 96 MB streamed past the caches before each pass (the layers' weights evict
// them in decoding), on the C API's thread pool (mtp/parallel.h; the torch ops use torch's
// parallel_for). Prints the mean and best microseconds per layer over `passes` passes.
// bench/ab_core.sh A B attention ... builds it against two commits and alternates them.
//   core_attention n T threads passes
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "mtp/attention.h"
#include "mtp/parallel.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s n T threads passes\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), T = std::atoll(argv[2]), passes = std::atoll(argv[4]);
  const int threads = std::atoi(argv[3]);
  constexpr int64_t Hq = 9, Hkv = 3, D = 64, L = 512, kLayers = 30;
  if (n < T || n > L || T < 1 || threads < 1 || passes < 1) {
    std::fprintf(stderr, "need 1 <= T <= n <= %lld, threads >= 1, passes >= 1\n", (long long)L);
    return 2;
  }
  std::mt19937 rng(0);
  std::vector<uint16_t> k(size_t(kLayers * Hkv * L * D)), v(k.size()), q(size_t(T * Hq * D)), out(q.size());
  for (auto* a : {&k, &v, &q})
    for (auto& x : *a) x = uint16_t(0x3c00 + rng() % 0x400);  // bf16 in [2^-7, 2^-5)
  std::vector<char> stream(size_t(96) << 20, 1);
  const int64_t lens[1] = {n};
  const mtp::ThreadParallelFor pf{threads};
  volatile long sink = 0;
  double total = 0, best = 1e30;
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < stream.size(); i += 64) sink = sink + stream[i];
    const auto start = std::chrono::steady_clock::now();
    for (int64_t l = 0; l < kLayers; ++l) {
      mtp::AttentionArgs a;
      a.B = 1, a.T = T, a.Hq = Hq, a.Hkv = Hkv, a.D = D, a.dtype = mtp::DType::BF16;
      a.q = q.data();
      a.q_stride[0] = T * Hq * D, a.q_stride[1] = Hq * D, a.q_stride[2] = D, a.q_stride[3] = 1;
      a.k = k.data() + l * Hkv * L * D, a.v = v.data() + l * Hkv * L * D;
      for (int64_t* s : {a.k_stride, a.v_stride}) s[0] = Hkv * L * D, s[1] = L * D, s[2] = D, s[3] = 1;
      a.cache_lens = lens, a.causal = true, a.scale = 0.125f, a.out = out.data();
      mtp::attention(a, threads, mtp::current_isa(), pf);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kLayers;
    total += s, best = std::min(best, s);
  }
  std::printf("n=%lld T=%lld threads=%d: %.1f us per layer (best %.1f)\n", (long long)n, (long long)T, threads,
              total / passes * 1e6, best * 1e6);
}
