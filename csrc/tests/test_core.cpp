// The case dispatcher of mtp_core_tests (every test_*.cpp's cases, one per run, on one
// instruction set), and the tests of the core's runtime: the thread pool and ISA detection.
//   mtp_core_tests <case> [isa]     case: see usage below; isa: set_isa's names
// Exit 0 = pass, 1 = fail, 77 = the CPU lacks the requested isa (ctest reports it skipped).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mtp/isa.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_util.h"

namespace {

// ---------------------------------------------------------------- parallel_for
void test_threads() {
  for (int threads : {0, 1, 2, 3, 8})
    for (int64_t n : {0, 1, 2, 7, 100}) {
      std::vector<int> hits(size_t(n), 0);
      mtp::ThreadParallelFor{mtp::resolve_threads(threads)}(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];  // disjoint ranges: no race
      });
      for (int64_t i = 0; i < n; ++i)
        EXPECT(hits[size_t(i)] == 1, "threads=%d n=%lld: item %lld run %d times", threads, (long long)n, (long long)i,
               hits[size_t(i)]);
    }
  // The pool: regions back to back (its workers parked and woken, grown from 2 to 8 threads),
  // a region started inside a region, and two callers at once (one finds the pool busy and
  // starts threads of its own). Every item exactly once each time.
  auto count_items = [](int threads, int64_t n, std::vector<std::atomic<int>>& hits) {
    mtp::ThreadParallelFor{threads}(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
    });
  };
  constexpr int64_t n = 64;
  std::vector<std::atomic<int>> hits(n);
  for (int round = 0; round < 200; ++round) count_items(2 + round % 7, n, hits);
  for (int64_t i = 0; i < n; ++i)
    EXPECT(hits[size_t(i)] == 200, "back to back: item %lld run %d times of 200", (long long)i, hits[size_t(i)].load());
  std::vector<std::atomic<int>> nested(n * n);
  mtp::ThreadParallelFor{2}(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      mtp::ThreadParallelFor{2}(n, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) nested[size_t(i * n + j)].fetch_add(1);
      });
  });
  for (int64_t i = 0; i < n * n; ++i)
    EXPECT(nested[size_t(i)] == 1, "nested: item %lld run %d times", (long long)i, nested[size_t(i)].load());
  std::vector<std::atomic<int>> a(n), b(n);
  std::thread other([&] {
    for (int r = 0; r < 300; ++r) count_items(3, n, a);
  });
  for (int r = 0; r < 300; ++r) count_items(2, n, b);
  other.join();
  for (int64_t i = 0; i < n; ++i)
    EXPECT(a[size_t(i)] == 300 && b[size_t(i)] == 300, "two callers: item %lld run %d / %d times of 300", (long long)i,
           a[size_t(i)].load(), b[size_t(i)].load());
  std::printf("threads: checked\n");
}

// ---------------------------------------------------------------- ISA detection
// MTP_EXPECT_NEON_FP16=0|1 (set by the aarch64 runs per qemu CPU model) pins what the
// detection must find; native runs check the architecture's own sets.
void test_isa() {
  std::printf("isa: default %s; supported:", mtp_get_isa());
  for (mtp::Isa isa : mtp::kAllIsas)
    if (mtp::isa_supported(isa)) std::printf(" %s", mtp::isa_name(isa));
  std::printf("\n");
  EXPECT(std::strcmp(mtp_get_isa(), mtp::isa_name(mtp::best_isa())) == 0 || std::getenv("MTP_ISA"),
         "default %s is not the best %s", mtp_get_isa(), mtp::isa_name(mtp::best_isa()));
#if defined(MTP_ARM64)
  EXPECT(mtp_isa_supported("neon") && !mtp_isa_supported("avx2"), "aarch64 sets");
  if (const char* e = std::getenv("MTP_EXPECT_NEON_FP16")) {
    const bool want = std::strcmp(e, "1") == 0;
    EXPECT(mtp_isa_supported("neon_fp16") == int(want), "neon_fp16 detected %d, expected %d",
           mtp_isa_supported("neon_fp16"), int(want));
    EXPECT(mtp::best_isa() == (want ? mtp::Isa::NeonFp16 : mtp::Isa::Neon), "best isa %s",
           mtp::isa_name(mtp::best_isa()));
  }
  std::printf("isa: neon dotprod (quantize_x SDOT) %s\n", mtp::has_neon_dotprod() ? "yes" : "no");
  if (const char* e = std::getenv("MTP_EXPECT_NEON_DOTPROD")) {
    const bool want = std::strcmp(e, "1") == 0;
    EXPECT(mtp::has_neon_dotprod() == want, "neon dotprod detected %d, expected %d", int(mtp::has_neon_dotprod()),
           int(want));
  }
#elif defined(MTP_X86)
  EXPECT(!mtp_isa_supported("neon") && !mtp_isa_supported("neon_fp16"), "x86 claims neon");
  EXPECT(!mtp_isa_supported("avx512_bf16") || mtp_isa_supported("avx512"), "avx512_bf16 without avx512");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s "
                 "argmax|verify|verify_ragged|verify_ragged_errors|accept_prefix|errors|threads|isa|attention|cache_"
                 "append|linear|linear_q8|linear_q8dot|gguf|gguf_capi|gguf_capi_errors|ops_errors|rowwise|decoder|"
                 "sampling|sampling_capi|sampling_errors|sampling_ragged_capi|sampling_ragged_errors|exp_fixed|sparse_"
                 "ordered_sum|top_p_key [isa]\n",
                 argv[0]);
    return 2;
  }
  const std::string which = argv[1];
  if (argc >= 3) {
    mtp_status st = mtp_set_isa(argv[2]);
    if (st == MTP_ERROR_UNSUPPORTED) {
      std::printf("SKIP: %s\n", mtp_last_error());
      return 77;
    }
    if (st != MTP_OK) {
      std::fprintf(stderr, "%s\n", mtp_last_error());
      return 2;
    }
    EXPECT(std::strcmp(mtp::isa_name(mtp::current_isa()), argv[2]) == 0, "kernels run %s, not %s",
           mtp::isa_name(mtp::current_isa()), argv[2]);
  }
  if (which == "argmax")
    test_argmax();
  else if (which == "verify")
    test_verify();
  else if (which == "verify_ragged")
    test_verify_ragged();
  else if (which == "verify_ragged_errors")
    test_verify_ragged_errors();
  else if (which == "accept_prefix")
    test_accept_prefix();
  else if (which == "errors")
    test_errors();
  else if (which == "threads")
    test_threads();
  else if (which == "sampling")
    test_sampling();
  else if (which == "sampling_capi")
    test_sampling_capi();
  else if (which == "sampling_errors")
    test_sampling_errors();
  else if (which == "sampling_ragged_capi")
    test_sampling_ragged_capi();
  else if (which == "sampling_ragged_errors")
    test_sampling_ragged_errors();
  else if (which == "exp_fixed")
    test_exp_fixed();
  else if (which == "sparse_ordered_sum")
    test_sparse_ordered_sum();
  else if (which == "top_p_key")
    test_top_p_key();
  else if (which == "isa")
    test_isa();
  else if (which == "attention")
    test_attention();
  else if (which == "cache_append")
    test_cache_append();
  else if (which == "linear")
    test_linear();
  else if (which == "linear_q8")
    test_linear_q8();
  else if (which == "linear_q8dot")
    test_linear_q8dot();
  else if (which == "ops_errors")
    test_head_attention_errors(), test_linear_errors();
  else if (which == "rowwise")
    test_rowwise();
  else if (which == "decoder")
    test_decoder();
  else if (which == "gguf")
    test_gguf();
  else if (which == "gguf_capi")
    test_gguf_capi();
  else if (which == "gguf_capi_errors")
    test_gguf_capi_errors();
  else {
    std::fprintf(stderr, "unknown test case '%s'\n", which.c_str());
    return 2;
  }
  if (g_failures) std::fprintf(stderr, "%d failure(s)\n", g_failures);
  return g_failures ? 1 : 0;
}
