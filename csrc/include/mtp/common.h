// Torch-free basics shared by every kernel: element types, their conversion to fp32,
// and the run-time choice of instruction set.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

// Checked int64 arithmetic for the argument checks (the one place they are written): true and
// *out = the exact result when it fits in int64, false otherwise. Sizes and counts come from
// the caller, so a product or sum of them is checked before anything relies on it.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
// a * b * c ...: false as soon as one step overflows.
inline bool checked_product(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (!checked_mul(p, f, &p)) return false;
  *out = p;
  return true;
}

// Functions shared by host code and CUDA kernels.
#if defined(__CUDACC__)
#define MTP_HOST_DEVICE __host__ __device__
#else
#define MTP_HOST_DEVICE
#endif

namespace mtp {

// I8: int8, the weights of the linear layer only (Q8 blocks, see linear_args.h); with_dtype and
// load_f32 cover the three float types, which every other kernel takes. Q4_0 .. Q6_K: GGUF
// block-quantized weights as stored in the file (gguf.h), 100 + their GGML type number; their
// strides count bytes (dtype_size 1). Q4_0_X8 .. Q6_K_X8: the same blocks, 8 rows interleaved
// (gguf.h's x8 layout), 200 + the GGML type number.
enum class DType : int32_t {
  F32 = 0,
  BF16 = 1,
  F16 = 2,
  I8 = 5,
  Q4_0 = 102,
  Q4_1 = 103,
  Q5_0 = 106,
  Q8_0 = 108,
  Q4_K = 112,
  Q6_K = 114,
  Q4_0_X8 = 202,
  Q4_1_X8 = 203,
  Q8_0_X8 = 208,
  Q4_K_X8 = 212,
  Q6_K_X8 = 214
};

MTP_HOST_DEVICE inline int64_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : (t == DType::BF16 || t == DType::F16) ? 2 : 1;
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN payloads).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400));
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Calls fn(std::integral_constant<DType, dt>{}): a run-time dtype to a template argument.
template <class Fn>
inline decltype(auto) with_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::F32: return fn(std::integral_constant<DType, DType::F32>{});
    case DType::BF16: return fn(std::integral_constant<DType, DType::BF16>{});
    default: return fn(std::integral_constant<DType, DType::F16>{});
  }
}

// Element i of a strided fp32/bf16/fp16 array, widened to fp32 (exact).
inline float load_f32(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
}

// fp32 -> bf16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN.
// A select, not a branch: loops of it vectorise.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t nan = (u >> 16) | 0x40, rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// fp32 -> IEEE binary16, round to nearest even; overflow to inf, subnormals kept.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00 | ((u >> 13) & 0x3ff));  // NaN
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00);                       // >= 65520: inf
  if (u < 0x38800000u) {  // below 2^-14: a binary16 subnormal (or zero); scaling by 2^24 is exact
    float a;
    std::memcpy(&a, &u, 4);
    return uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)));
  }
  u += 0xfffu + ((u >> 13) & 1);
  return uint16_t(sign | ((u - 0x38000000u) >> 13));
}

// Stores v at element i of a fp32/bf16/fp16 array (rounded to nearest even).
inline void store_f32(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(base)[i] = f32_to_f16(v);
  }
}

// Copies n elements of es bytes between strided arrays (bit-exact). n == 0 touches nothing
// (memcpy must not see a NULL pointer, even for 0 bytes).
inline void copy_elems(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n, int64_t es) {
  if (n <= 0) return;
  if (dst_stride == 1 && src_stride == 1) {
    std::memcpy(dst, src, size_t(n * es));
    return;
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * dst_stride * es, src + i * src_stride * es, size_t(es));
}

}  // namespace mtp
