// What the test files share: the EXPECT macro and failure count, the random source, dtype
// names, the error-status check, and the test cases of every test_*.cpp (main: test_core.cpp).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "mtp/mtp.h"

inline int g_failures = 0;

#define EXPECT(cond, ...)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      if (++g_failures <= 20) {                                                        \
        std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                             \
        std::fprintf(stderr, "\n");                                                    \
      }                                                                                \
    }                                                                                  \
  } while (0)

inline std::mt19937_64 rng(20240607);
inline int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

inline constexpr mtp_dtype kFloatTypes[] = {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16};
inline const char* name_of(mtp_dtype t) { return t == MTP_FLOAT32 ? "f32" : t == MTP_BFLOAT16 ? "bf16" : "f16"; }

// The call failed with `want` and a message containing `needle`.
inline void expect_error(mtp_status got, mtp_status want, const char* needle, const char* what) {
  EXPECT(got == want, "%s: status %s, want %s (%s)", what, mtp_status_name(got), mtp_status_name(want),
         mtp_last_error());
  EXPECT(std::strstr(mtp_last_error(), needle) != nullptr, "%s: message '%s' lacks '%s'", what, mtp_last_error(),
         needle);
}

// A call struct's `run()` after one mutation of a valid call: fails with `status` and a
// message containing `needle`, and writes nothing.
#define BAD_CALL(Call, mutation, status, needle)                       \
  do {                                                                 \
    Call c;                                                            \
    mutation;                                                          \
    expect_error(c.run(), status, needle, #mutation);                  \
    EXPECT(c.untouched(), "%s: output written on failure", #mutation); \
  } while (0)

// test_verify.cpp
void test_argmax();
void test_verify();
void test_verify_ragged();
void test_accept_prefix();
void test_errors();
void test_verify_ragged_errors();

// test_head_attention.cpp
void test_attention();
void test_cache_append();
void test_head_attention_errors();

// test_linear.cpp
void test_linear();
void test_linear_q8();
void test_linear_q8dot();
void test_linear_errors();

// test_gguf.cpp
void test_gguf();

// test_gguf_capi.cpp
void test_gguf_capi();
void test_gguf_capi_errors();

// test_rowwise.cpp
void test_rowwise();

// test_decoder.cpp
void test_decoder();

// test_verify_sampled.cpp
void test_sampling();
void test_sampling_capi();
void test_sampling_errors();
void test_sampling_ragged_capi();
void test_sampling_ragged_errors();
void test_exp_fixed();
void test_sparse_ordered_sum();
void test_top_p_key();
