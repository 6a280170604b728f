// Times the torch-free linear kernel (mtp/linear.h) on one thread, no dispatch around it, for
// M = 1..9 bf16 rows: bf16 weights ("bf16"), Q8 weights ("int8") or Q8 weights with the rows
// quantized too ("int8dot"), either
// hot in L2 (one matrix called again and again) or streamed (`copies` matrices in turn, more
// than the L3 holds when copies x N x K is large). Prints "M=<m> <best us>" per M: the best of
// 5 timings of `reps` calls. bench/ab_linear.sh builds it against two commits and alternates them.
//   core_linear bf16|int8|int8dot N K reps [copies]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mtp/linear.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s bf16|int8|int8dot N K reps [copies]\n", argv[0]);
    return 2;
  }
  const bool int8dot = std::strcmp(argv[1], "int8dot") == 0, int8 = int8dot || std::strcmp(argv[1], "int8") == 0;
  const int64_t N = std::atoll(argv[2]), K = std::atoll(argv[3]), reps = std::atoll(argv[4]);
  const int64_t copies = argc > 5 ? std::atoll(argv[5]) : 1, blocks = (K + 31) / 32;
  std::mt19937 rng(0);
  std::vector<uint16_t> w16(int8 ? 0 : size_t(copies * N * K)), x(size_t(9 * K));
  std::vector<int8_t> w8(int8 ? size_t(copies * N * K) : 0);
  std::vector<float> scales(int8 ? size_t(copies * N * blocks) : 0, 0.01f), y(size_t(9 * N));
  for (auto& v : w16) v = uint16_t(0x3c00 + rng() % 0x400);  // bf16 in [2^-7, 2^-5): no subnormals
  for (auto& v : w8) v = int8_t(int(rng() % 255) - 127);
  for (auto& v : x) v = uint16_t(0x3f80 + rng() % 0x80);
  auto one_thread = [](int64_t n, auto&& fn) { fn(int64_t(0), n); };
  for (int64_t M = 1; M <= 9; ++M) {
    mtp::LinearArgs a;
    a.M = M, a.N = N, a.K = K, a.x = x.data(), a.x_dtype = mtp::DType::BF16, a.x_stride = K;
    a.w_dtype = int8 ? mtp::DType::I8 : mtp::DType::BF16, a.w_stride = K, a.w_scale_stride = blocks;
    a.quantize_x = int8dot, a.y = y.data(), a.y_stride = N;
    double best = 1e30;
    for (int t = 0; t < 5; ++t) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < reps; ++i) {
        const int64_t c = i % copies;
        if (int8)
          a.w = w8.data() + c * N * K, a.w_scale = scales.data() + c * N * blocks;
        else
          a.w = w16.data() + c * N * K;
        mtp::linear(a, mtp::current_isa(), one_thread);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps);
    }
    std::printf("M=%lld %.1f\n", (long long)M, best * 1e6);
  }
}
