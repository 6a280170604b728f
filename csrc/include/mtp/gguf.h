// GGUF block-quantized weights, read exactly as stored in the file (no float copy).
//
// A matrix [N, K] of a block type is N rows of row_bytes(K) bytes (rows `stride` bytes apart);
// a row is K / block_elems blocks laid out as ggml writes them (ggml-common.h):
//   Q4_0 (18 B / 32):  fp16 d, 16 bytes of nibbles            w = d * (q - 8)
//   Q4_1 (20 B / 32):  fp16 d, fp16 m, 16 bytes of nibbles    w = d * q + m
//   Q5_0 (22 B / 32):  fp16 d, 4 bytes qh, 16 bytes of nibbles w = d * (q - 16), q = nibble |
//                      (bit e of the little-endian qh) << 4 (element e < 16: low nibble of byte e)
//   Q8_0 (34 B / 32):  fp16 d, 32 int8                        w = d * q
//   Q4_K (144 B / 256): fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
//                      sub-block j of 32: w = (d * sc_j) * q - dmin * m_j
//   Q6_K (210 B / 256): 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, fp16 d
//                      element e: w = d * sc[e / 16] * (q - 32)
// Every format is read as blocks of 32 elements, each with an fp32 scale d_b, an fp32 offset
// m_b (0 without one), integer values q and an integer multiplier per half-block (Q6_K's
// scales, 1 elsewhere): element = d_b * (mul * q) + m_b. All of these are exact in fp32.
//
// The x8 layout (Q4_0_X8, Q4_1_X8, Q8_0_X8, Q4_K_X8, Q6_K_X8): the same bytes, 8 rows
// interleaved so that one vector of 8 int32 lanes holds 8 columns' block sums (x86 VPDPBUSD,
// NEON SDOT: 4 bytes per lane). N is a multiple of 8; rows 8g..8g+7 form group g (8 *
// row_bytes bytes, groups contiguous); in a group, stored block b (32 elements, K-quants 256)
// is 8 * block_bytes bytes at 8 * block_bytes * b. x8_fields cuts a file block into its fields
// in the file's order, each a run of equal pieces; the x8 block holds field after field, and
// in a field piece k of the 8 rows in turn (row c's at (8k + c) * piece bytes):
//   Q4_0 / Q4_1 / Q8_0: fp16 d[8] (row c at 2c), Q4_1: fp16 m[8], then chunks of 4 value
//     bytes, row c's at 4c of a 32-byte chunk: Q4 chunk j = 0..3 holds bytes 4j..4j+3 of the
//     row's 16 nibble bytes (low nibbles elements 4j.., high 16 + 4j..), Q8_0 chunk j = 0..7
//     its elements 4j..4j+3;
//   Q4_K: d[8], dmin[8], the 12 scale bytes one byte at a time (byte i of the 8 rows at 8i:
//     one 8-byte load holds a sub-block's 8 scales), then the 128 nibble bytes in 32 chunks;
//   Q6_K: the 128 low-nibble bytes in 32 chunks, the 64 high-bit bytes in 16, the 16 int8
//     scales one byte at a time, d[8].
// repack_x8 writes it (the loader does, in place: the same bytes in a new order).
//
// The product (linear.h with a block-type weight) quantizes each activation row to int8 in
// blocks of 32 (quantize_block_q8: scale dx_b = amax / 127, like quantize_x) and computes per
// output element one chain over the blocks b in order, on every instruction set and layout:
//   I    = mul_0 * sum_{i<16} q_i xq_i + mul_1 * sum_{i>=16} q_i xq_i   (exact int32)
//   acc  = fma(float(I), d_b * dx_b, acc)
//   accm = fma(m_b, dx_b * float(sum_i xq_i), accm)                     (formats with an offset)
//   y    = acc + accm (+ bias)
// The integers are exact whatever instructions compute them, and float(I) is exact
// (|I| < 2^24), so every ISA path of both layouts gives the same bits (generic, AVX2,
// AVX-512, NEON with or without SDOT), and a row's bits depend on neither M nor the threads.
// (A NaN output is NaN on every path; its payload is the hardware's.)
// reference.gguf_linear is the executable form of this contract.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mtp/common.h"
#include "mtp/isa.h"

namespace mtp {

constexpr DType kBlockTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q6_K};
constexpr DType kX8Types[] = {DType::Q4_0_X8, DType::Q4_1_X8, DType::Q8_0_X8, DType::Q4_K_X8, DType::Q6_K_X8};

constexpr bool is_x8(DType t) {
  return t == DType::Q4_0_X8 || t == DType::Q4_1_X8 || t == DType::Q8_0_X8 || t == DType::Q4_K_X8 ||
         t == DType::Q6_K_X8;
}
// The file's block type of a layout (x8 -> its blocks' type; any other type itself).
constexpr DType file_type(DType t) { return is_x8(t) ? DType(int32_t(t) - 100) : t; }
// The x8 layout of a file type, or the type itself where it has none (Q5_0: the backbone
// widens it to Q8_0).
constexpr DType x8_of(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q6_K
             ? DType(int32_t(t) + 100)
             : t;
}
constexpr int64_t kX8Rows = 8;

inline const char* block_type_name(DType t) {
  switch (t) {
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_K: return "Q4_K";
    case DType::Q6_K: return "Q6_K";
    case DType::Q4_0_X8: return "Q4_0_X8";
    case DType::Q4_1_X8: return "Q4_1_X8";
    case DType::Q8_0_X8: return "Q8_0_X8";
    case DType::Q4_K_X8: return "Q4_K_X8";
    case DType::Q6_K_X8: return "Q6_K_X8";
    default: return "not a block type";
  }
}

// Bytes and elements of one stored block (per row); 0 for a type that is not a block type.
constexpr int64_t block_bytes(DType t) {
  switch (file_type(t)) {
    case DType::Q4_0: return 18;
    case DType::Q4_1: return 20;
    case DType::Q5_0: return 22;
    case DType::Q8_0: return 34;
    case DType::Q4_K: return 144;
    case DType::Q6_K: return 210;
    default: return 0;
  }
}
constexpr bool is_block_type(DType t) { return block_bytes(t) > 0; }
constexpr int64_t block_elems(DType t) {
  return file_type(t) == DType::Q4_K || file_type(t) == DType::Q6_K ? 256 : is_block_type(t) ? 32 : 0;
}
constexpr int64_t kMaxBlockBytes = 210;  // Q6_K's
constexpr bool block_has_offset(DType t) { return file_type(t) == DType::Q4_1 || file_type(t) == DType::Q4_K; }
// Bytes of a row of K elements (K a multiple of block_elems(t)).
constexpr int64_t block_row_bytes(DType t, int64_t K) { return K / block_elems(t) * block_bytes(t); }

// A stored fp16 scale widened to fp32; a NaN quieted as F16C / NEON conversions do.
inline float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32((h & 0x7c00) == 0x7c00 && (h & 0x3ff) ? uint16_t(h | 0x200) : h);
}

// Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes (ggml's layout).
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Block b (of 32 elements) of a row: its scale, offset and per-half multipliers (the
// canonical form above). The values are decoded by block_values.
struct Block32 {
  float d = 0.f, m = 0.f;
  int32_t mul[2] = {1, 1};
};

inline Block32 block_params(DType t, const uint8_t* row, int64_t b) {
  Block32 p;
  switch (t) {
    case DType::Q4_0: p.d = fp16_at(row + b * 18); break;
    case DType::Q4_1:
      p.d = fp16_at(row + b * 20);
      p.m = fp16_at(row + b * 20 + 2);
      break;
    case DType::Q5_0: p.d = fp16_at(row + b * 22); break;
    case DType::Q8_0: p.d = fp16_at(row + b * 34); break;
    case DType::Q4_K: {
      const uint8_t* s = row + b / 8 * 144;
      int sc, m;
      q4k_scale_min(s + 4, int(b % 8), &sc, &m);
      p.d = fp16_at(s) * float(sc);  // fp16 (11 bits) x 6 bits: exact
      p.m = -(fp16_at(s + 2) * float(m));
      break;
    }
    case DType::Q6_K: {
      const uint8_t* s = row + b / 8 * 210;
      p.d = fp16_at(s + 208);
      p.mul[0] = int8_t(s[192 + 2 * (b % 8)]);
      p.mul[1] = int8_t(s[192 + 2 * (b % 8) + 1]);
      break;
    }
    default: break;
  }
  return p;
}

// The 32 integer values q of block b (offsets applied: Q4_0's -8, Q5_0's -16, Q6_K's -32).
inline void block_values(DType t, const uint8_t* row, int64_t b, int8_t* q) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1: {
      const int64_t bytes = block_bytes(t);
      const uint8_t* qs = row + b * bytes + (bytes - 16);
      const int off = t == DType::Q4_0 ? 8 : 0;
      for (int i = 0; i < 16; ++i) {
        q[i] = int8_t((qs[i] & 0xF) - off);
        q[i + 16] = int8_t((qs[i] >> 4) - off);
      }
      break;
    }
    case DType::Q5_0: {
      const uint8_t* blk = row + b * 22;
      const uint32_t qh = uint32_t(blk[2]) | uint32_t(blk[3]) << 8 | uint32_t(blk[4]) << 16 | uint32_t(blk[5]) << 24;
      for (int i = 0; i < 16; ++i) {
        q[i] = int8_t(((blk[6 + i] & 0xF) | ((qh >> i) & 1) << 4) - 16);
        q[i + 16] = int8_t(((blk[6 + i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - 16);
      }
      break;
    }
    case DType::Q8_0: std::memcpy(q, row + b * 34 + 2, 32); break;
    case DType::Q4_K: {
      const uint8_t* qs = row + b / 8 * 144 + 16 + (b % 8) / 2 * 32;
      const int shift = (b % 2) * 4;
      for (int i = 0; i < 32; ++i) q[i] = int8_t((qs[i] >> shift) & 0xF);
      break;
    }
    case DType::Q6_K: {
      const uint8_t* s = row + b / 8 * 210;
      const int h = int(b % 8) / 4, g = int(b % 4);
      const uint8_t* ql = s + 64 * h + 32 * (g & 1);
      const uint8_t* qh = s + 128 + 32 * h;
      for (int i = 0; i < 32; ++i)
        q[i] = int8_t((((ql[i] >> (g >= 2 ? 4 : 0)) & 0xF) | (((qh[i] >> (2 * g)) & 3) << 4)) - 32);
      break;
    }
    default: break;
  }
}

// ---- the x8 layout (above) ------------------------------------------------------------------

constexpr int64_t kFileBlock = -1;  // copy_block_lane's lane of a file block

// A file block's fields in the file's order, each `count` pieces of `bytes` (the header above).
struct X8Field {
  int64_t bytes, count;
};
struct X8Fields {
  X8Field f[4];
  int n;
};
constexpr X8Fields x8_fields(DType t) {
  switch (file_type(t)) {
    case DType::Q4_0: return {{{2, 1}, {4, 4}}, 2};
    case DType::Q4_1: return {{{2, 1}, {2, 1}, {4, 4}}, 3};
    case DType::Q8_0: return {{{2, 1}, {4, 8}}, 2};
    case DType::Q4_K: return {{{2, 1}, {2, 1}, {1, 12}, {4, 32}}, 4};
    case DType::Q6_K: return {{{4, 32}, {4, 16}, {1, 16}, {2, 1}}, 4};
    default: return {{}, 0};
  }
}
// Where field i starts in an x8 block (8 rows' worth of the fields before it).
constexpr int64_t x8_field_at(DType t, int i) {
  int64_t at = 0;
  for (int j = 0; j < i; ++j) at += kX8Rows * x8_fields(t).f[j].bytes * x8_fields(t).f[j].count;
  return at;
}
// Of the 32-element types: the x8 block's value chunks (after the 8 scales, Q4_1's 8 offsets).
constexpr int64_t x8_head_bytes(DType t) { return x8_field_at(t, x8_fields(t).n - 1); }
constexpr int64_t x8_chunks(DType t) { return x8_fields(t).f[x8_fields(t).n - 1].count; }

// Every piece of one row's block: f(offset in the file block, offset in the x8 block as row c,
// bytes).
template <class F>
inline void for_each_piece(DType t, int64_t c, F&& f) {
  const X8Fields fs = x8_fields(t);
  int64_t at = 0;
  for (int i = 0; i < fs.n; ++i) {
    const X8Field p = fs.f[i];
    for (int64_t k = 0; k < p.count; ++k) f(at + k * p.bytes, kX8Rows * at + (kX8Rows * k + c) * p.bytes, p.bytes);
    at += p.bytes * p.count;
  }
}
// One row's block from lane cs of an x8 block (or, cs = kFileBlock, a file block) to lane cd (or
// a file block): the one copy behind repack_x8, x8_block and x8_gather.
inline void copy_block_lane(DType t, const uint8_t* src, int64_t cs, uint8_t* dst, int64_t cd) {
  for_each_piece(t, 0, [&](int64_t file, int64_t x8, int64_t bytes) {  // x8: row 0's; row c's c * bytes on
    std::memcpy(dst + (cd < 0 ? file : x8 + cd * bytes), src + (cs < 0 ? file : x8 + cs * bytes), size_t(bytes));
  });
}
// Row 8g + c of file type t's rows (rows src_stride bytes apart) into the x8 layout at dst
// (N a multiple of 8, K of 32; dst holds N * row_bytes bytes and does not overlap src).
inline void repack_x8(DType t, const uint8_t* src, int64_t src_stride, int64_t N, int64_t K, uint8_t* dst) {
  const int64_t bb = block_bytes(t), nb = K / block_elems(t);
  for (int64_t n = 0; n < N; ++n) {
    uint8_t* group = dst + n / kX8Rows * kX8Rows * nb * bb;
    for (int64_t b = 0; b < nb; ++b)
      copy_block_lane(t, src + n * src_stride + b * bb, kFileBlock, group + b * kX8Rows * bb, n % kX8Rows);
  }
}

// Stored block b of row c (0..7) of an x8 group, copied back into the file's block layout
// (out: block_bytes bytes); repack_x8's inverse for one block.
inline void x8_block(DType t, const uint8_t* group, int64_t c, int64_t b, uint8_t* out) {
  copy_block_lane(t, group + b * kX8Rows * block_bytes(t), c, out, kFileBlock);
}

// Rows rows[n + c] (c = 0..7; past n1 the last row repeats: computed, then dropped) of an x8
// matrix at w (groups of 8 rows 8 * stride apart, K elements) gathered into one x8 group at dst.
inline void x8_gather(DType t, const uint8_t* w, int64_t stride, int64_t K, const int64_t* rows, int64_t n, int64_t n1,
                      uint8_t* dst) {
  const int64_t bb = block_bytes(t);
  for (int64_t c = 0; c < kX8Rows; ++c) {
    const int64_t row = rows[std::min(n + c, n1 - 1)];
    const uint8_t* group = w + row / kX8Rows * kX8Rows * stride;
    for (int64_t b = 0; b < K / block_elems(t); ++b)
      copy_block_lane(t, group + b * kX8Rows * bb, row % kX8Rows, dst + b * kX8Rows * bb, c);
  }
}

// Output columns [n, n + 8) of an x8 matrix as one x8 group: in place without a row map; with
// one (a.w_rows: each column reads any row), those 8 rows gathered into buf (x8_gather). The
// SIMD kernels read either alike.
template <class Args>
const uint8_t* x8_columns(const Args& a, int64_t n, int64_t n1, std::vector<uint8_t>& buf) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  if (!a.w_rows) return w + n * a.w_stride;
  buf.resize(size_t(kX8Rows * block_row_bytes(a.w_dtype, a.K)));
  x8_gather(a.w_dtype, w, a.w_stride, a.K, a.w_rows, n, n1, buf.data());
  return buf.data();
}

// Block b (of 32 elements) of weight row n of a matrix at w (rows `stride` bytes apart; x8:
// groups of 8 rows 8 * stride apart) in the file's layout: its type, row and block index for
// block_params / block_values; an x8 block (a K-quant's: its superblock) is copied out into buf.
struct RowBlock {
  DType t;
  const uint8_t* row;
  int64_t b;
};
inline RowBlock row_block(DType t, const uint8_t* w, int64_t stride, int64_t n, int64_t b,
                          uint8_t (&buf)[kMaxBlockBytes]) {
  if (!is_x8(t)) return {t, w + n * stride, b};
  const int64_t per = block_elems(t) / 32;  // blocks of 32 per stored block
  x8_block(t, w + n / kX8Rows * kX8Rows * stride, n % kX8Rows, b / per, buf);
  return {file_type(t), buf, b % per};
}

// Weight row n dequantized to fp32 (K elements): d_b * (mul * q) + m_b, the product exact, one
// rounding; bitwise what the `gguf` package's dequantizer gives.
inline void dequantize_row(DType t, const uint8_t* w, int64_t stride, int64_t n, int64_t K, float* out) {
  int8_t q[32];
  uint8_t buf[kMaxBlockBytes];
  for (int64_t b = 0; b < K / 32; ++b) {
    const RowBlock rb = row_block(t, w, stride, n, b, buf);
    const Block32 p = block_params(rb.t, rb.row, rb.b);
    block_values(rb.t, rb.row, rb.b, q);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = p.d * float(p.mul[i / 16] * q[i]) + p.m;
  }
}

// ---- activations: each row quantized to int8 blocks of 32 (row-local) ----------------------

// v rounded to an integer, ties to even, for |v| <= 2^22: adding 1.5 * 2^23 leaves no
// fraction bits (the IEEE add rounds to nearest even), subtracting it back is exact. Inline
// arithmetic where std::nearbyint is a libm call per element on baseline x86-64.
constexpr float kRoundShift = 12582912.f;  // 1.5 * 2^23
inline float round_half_even(float v) { return (v + kRoundShift) - kRoundShift; }

// A block's scale from the largest magnitude's bits: amax / 127, NaN where the block holds a NaN
// or an infinity (bits >= 0x7f800000). The one rule of quantize_block_q8 and x86 quantize_rows_of.
inline float q8_block_scale(uint32_t amax_bits) {
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  return amax_bits < 0x7f800000u ? amax / 127.f : NAN;
}

// One block of 32 fp32 values -> q, returns its scale (quantize_x's rule, linear.h:
// amax / 127, round half to even, clamp to 127; 0 -> all zero; a NaN or infinity -> NaN and 0).
inline float quantize_block_q8(const float* v, int8_t* q) {
  uint32_t amax_bits = 0;
  for (int i = 0; i < 32; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    amax_bits = std::max(amax_bits, u & 0x7fffffffu);
  }
  const float scale = q8_block_scale(amax_bits);
  if (!(scale > 0.f)) {
    std::fill(q, q + 32, int8_t(0));
    return scale;
  }
  for (int i = 0; i < 32; ++i) {
    q[i] = int8_t(std::min(127.f, std::max(-127.f, round_half_even(v[i] / scale))));
  }
  return scale;
}

// The quantized activation rows of one call, laid out for the kernels: per row, K int8
// values, then per block of 32 its scale dx, s = dx * float(sum of its q) (the offset term's
// factor), the sum of its q and its eight 4-element sums (the integer offset corrections of
// the x86 paths: x8 layout, file layout).
struct QuantRows {
  int64_t M = 0, K = 0, nb = 0;
  std::vector<int8_t> q;           // [M, K]
  std::vector<float> dx, s;        // [M, nb]
  std::vector<int32_t> sum, sum4;  // [M, nb], [M, nb, 8]
  const int8_t* qrow(int64_t m) const { return q.data() + m * K; }
  const float* dxrow(int64_t m) const { return dx.data() + m * nb; }
  const float* srow(int64_t m) const { return s.data() + m * nb; }
  const int32_t* sumrow(int64_t m) const { return sum.data() + m * nb; }
  const int32_t* sum4row(int64_t m) const { return sum4.data() + m * nb * 8; }
  void resize(int64_t rows, int64_t k) {
    M = rows, K = k, nb = k / 32;
    q.resize(size_t(M * K));
    dx.resize(size_t(M * nb));
    s.resize(size_t(M * nb));
    sum.resize(size_t(M * nb));
    sum4.resize(size_t(M * nb * 8));
  }
  // Block b of row m, its q and sum4 written: its scale and the sums of its q.
  void set_block(int64_t m, int64_t b, float scale, int32_t total) {
    dx[size_t(m * nb + b)] = scale;
    sum[size_t(m * nb + b)] = total;
    s[size_t(m * nb + b)] = scale * float(total);
  }
};

// Rows [m0, m1) of x [M, K] (fp32, bf16 or fp16, rows x_stride elements apart), K a multiple
// of 32, into out, already sized (out.resize(M, K)): the rule above, per block. Row-local, so
// rows quantized on different threads give the same bits. This is the portable form;
// quantize_row_range(set, ...) is the one a linear call takes (x86/gguf.h: the same bits in
// vectors), below for every other set.
inline void quantize_row_range(const void* x, DType dt, int64_t x_stride, int64_t m0, int64_t m1, QuantRows& out) {
  const int64_t K = out.K;
  float v[32];
  for (int64_t m = m0; m < m1; ++m) {
    const char* xm = static_cast<const char*>(x) + m * x_stride * dtype_size(dt);
    for (int64_t b = 0; b < out.nb; ++b) {
      with_dtype(dt, [&](auto t) {
        for (int i = 0; i < 32; ++i) v[i] = load_f32(xm, decltype(t)::value, b * 32 + i);
      });
      int8_t* q = out.q.data() + m * K + b * 32;
      const float dx = quantize_block_q8(v, q);
      int32_t* s4 = out.sum4.data() + (m * out.nb + b) * 8;
      int32_t total = 0;
      for (int l = 0; l < 8; ++l) {
        s4[l] = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
        total += s4[l];
      }
      out.set_block(m, b, dx, total);
    }
  }
}
// All M rows (out sized here).
inline void quantize_rows(const void* x, DType dt, int64_t x_stride, int64_t M, int64_t K, QuantRows& out) {
  out.resize(M, K);
  quantize_row_range(x, dt, x_stride, 0, M, out);
}

namespace generic {

// The sets without a vector form of quantize_rows (NEON: the compiler vectorises the portable one).
inline void quantize_rows(Generic, const void* x, DType dt, int64_t x_stride, int64_t M, int64_t K, QuantRows& out) {
  mtp::quantize_rows(x, dt, x_stride, M, K, out);
}
inline void quantize_row_range(Generic, const void* x, DType dt, int64_t x_stride, int64_t m0, int64_t m1,
                               QuantRows& out) {
  mtp::quantize_row_range(x, dt, x_stride, m0, m1, out);
}

// y[m, n] for the columns [n0, n1) of a block-type weight (either layout), the canonical
// order (above). w: row n at w + weight_row(n) * w_stride bytes (x8: gguf.h's groups).
template <class Args>
void gguf_linear(const Args& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  const int64_t nb = a.K / 32;
  const bool offset = block_has_offset(a.w_dtype);
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  int8_t q[32];
  uint8_t buf[kMaxBlockBytes];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* x = xq.qrow(m);
      float acc = 0.f, accm = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const RowBlock rb = row_block(a.w_dtype, w, a.w_stride, weight_row(a, n), b, buf);
        const Block32 p = block_params(rb.t, rb.row, rb.b);
        block_values(rb.t, rb.row, rb.b, q);
        int32_t half[2] = {0, 0};
        for (int i = 0; i < 32; ++i) half[i / 16] += int32_t(q[i]) * int32_t(x[b * 32 + i]);
        const int32_t I = p.mul[0] * half[0] + p.mul[1] * half[1];
        acc = std::fma(float(I), p.d * xq.dxrow(m)[b], acc);
        if (offset) accm = std::fma(p.m, xq.srow(m)[b], accm);
      }
      const float y = acc + accm;
      a.y[m * a.y_stride + n] = a.bias ? y + a.bias[n] : y;
    }
  }
}

// Every set without a vector path of its own (linear.h's dispatch).
template <class Args>
void gguf_linear(Generic, const Args& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  gguf_linear(a, xq, n0, n1);
}

}  // namespace generic
}  // namespace mtp
