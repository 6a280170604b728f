// Times the torch-free linear kernel (mtp/linear.h) on a GGUF block-type weight in its x8 layout
// (what the loader gives the decoder layers), on one thread, no dispatch around it: random
// blocks (their fp16 scales fixed at 2^-7, no subnormals) times bf16 rows, either hot in the
// caches (copies 1: one matrix called again and again, the compute of a prefill) or streamed
// (`copies` matrices in turn, more than the L3 holds when copies x the matrix is large: a
// decode step's reading). Prints "M=<m> <best us> <GMAC/s>" per M: the best of 5 timings of
// `reps` calls. bench/ab_core.sh builds it against two commits and alternates them.
//   core_gguf q4_0|q4_1|q8_0|q4_k|q6_k N K reps copies M...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mtp/linear.h"

int main(int argc, char** argv) {
  const char* names[] = {"q4_0", "q4_1", "q8_0", "q4_k", "q6_k"};
  const mtp::DType types[] = {mtp::DType::Q4_0, mtp::DType::Q4_1, mtp::DType::Q8_0, mtp::DType::Q4_K, mtp::DType::Q6_K};
  int ti = -1;
  for (int i = 0; i < 5 && argc > 1; ++i)
    if (std::strcmp(argv[1], names[i]) == 0) ti = i;
  if (argc < 7 || ti < 0) {
    std::fprintf(stderr, "usage: %s q4_0|q4_1|q8_0|q4_k|q6_k N K reps copies M...\n", argv[0]);
    return 2;
  }
  const mtp::DType t = types[ti];
  const int64_t N = std::atoll(argv[2]), K = std::atoll(argv[3]), reps = std::atoll(argv[4]);
  const int64_t copies = std::atoll(argv[5]);
  if (N <= 0 || N % mtp::kX8Rows || K <= 0 || K % mtp::block_elems(t) || reps <= 0 || copies <= 0) {
    std::fprintf(stderr, "N must be a multiple of 8, K of the block, reps and copies positive\n");
    return 2;
  }
  const int64_t rb = mtp::block_row_bytes(t, K), bb = mtp::block_bytes(t);
  std::mt19937 rng(0);
  std::vector<uint8_t> file(size_t(N * rb)), w(size_t(copies) * file.size());
  for (auto& v : file) v = uint8_t(rng());
  const mtp::X8Fields fs = mtp::x8_fields(t);
  for (int64_t blk = 0; blk < N * rb / bb; ++blk)  // every fp16 field (a piece of 2 bytes, once) = 2^-7
    for (int i = 0, at = 0; i < fs.n; at += int(fs.f[i].bytes * fs.f[i].count), ++i)
      if (fs.f[i].bytes == 2 && fs.f[i].count == 1)
        file[size_t(blk * bb + at)] = 0, file[size_t(blk * bb + at + 1)] = 0x20;
  for (int64_t c = 0; c < copies; ++c) mtp::repack_x8(t, file.data(), rb, N, K, w.data() + c * N * rb);
  auto one_thread = [](int64_t n, auto&& fn) { fn(int64_t(0), n); };
  for (int i = 6; i < argc; ++i) {
    const int64_t M = std::atoll(argv[i]);
    std::vector<uint16_t> x(size_t(M * K));
    std::vector<float> y(size_t(M * N));
    for (auto& v : x) v = uint16_t(0x3f80 + rng() % 0x80);
    mtp::LinearArgs a;
    a.M = M, a.N = N, a.K = K, a.x = x.data(), a.x_dtype = mtp::DType::BF16, a.x_stride = K;
    a.w_dtype = mtp::x8_of(t), a.w_stride = rb, a.y = y.data(), a.y_stride = N;
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t j = 0; j < reps; ++j) {
        a.w = w.data() + j % copies * N * rb;
        mtp::linear(a, mtp::current_isa(), one_thread);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps);
    }
    std::printf("M=%lld %.1f %.1f\n", (long long)M, best * 1e6, double(M) * N * K / best / 1e9);
  }
}
