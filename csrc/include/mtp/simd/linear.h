// Vector linear, written once over a vector-traits class V (x86: V512 / V256; aarch64: V128)
// and a dot-product step D (how one chunk of the reduction enters an accumulator).
//
// Each output element y[m, n] has ONE accumulator vector: chunk c of the reduction (D::kChunk
// elements) enters it by D::step, chunks in order; the W lanes are then summed by the tree of
// V::sum_each, the K % kChunk leftover elements are added one by one, then the bias. That
// sequence is the same whatever M, the row or column grouping or the thread split, so every
// row has the bits of a one-row call. Speed comes from register tiles of R rows x C weight
// rows (R <= V::kLinearRows, C = V::linear_cols(R, D::kWideTiles)): one weight chunk feeds R
// activation rows, one activation chunk C weight rows, and R * C independent FMA chains hide
// the FMA latency.
// Each instruction set (and each D) is shape-invariant on its own and agrees with the others
// to rounding.
#pragma once
#include <vector>

#include "mtp/common.h"
#include "mtp/linear_args.h"

namespace mtp::simd {

// The plain step: kChunk = W elements widened to fp32 lanes, one FMA (lane l takes k + l).
// A step type D names: Col (what locates weight row n: D::col(args, n); D::address(col, k) its
// byte address of element k, D::row_bytes(args) the distance between rows), X and Wt (a loaded
// chunk of activations / weights: load_x(X&, ...), load_w(Wt&, ...)), kChunk, step(acc&, X, Wt),
// and leftover(sum, x row, col, k0, K): the elements past the last whole chunk one by one
// (none when kPadsTail: then a partial last chunk is one more step, its missing elements zero).
// kPreparesX: load_x reads the row as prepare_x(float* out, x row, kv) wrote it, once per
// call (kPreparedFloats floats per chunk), instead of converting it again for every weight tile.
// kWideTiles: x is read from memory and a weight chunk takes at most two vectors, so wider
// tiles fit the registers (V::linear_cols). kPrefetchL1: the weights ahead are prefetched into
// L1 as well as L2 (see VecLinear::prefetch).
// Vectors travel by reference: these functions have no target attribute of their own (they
// are inlined into the flatten entry points), and returning a vector by value would change
// the ABI between targets (-Wpsabi).
template <class V, DType XT, DType WT>
struct LaneDot {
  using F = typename V::F;
  using Col = const char*;
  using X = F;
  using Wt = F;
  static constexpr int kChunk = V::W;
  static constexpr bool kPadsTail = false, kPreparesX = false, kWideTiles = false, kPrefetchL1 = true;
  static int64_t row_bytes(const LinearArgs& a) { return a.w_stride * dtype_size(WT); }
  static Col col(const LinearArgs& a, int64_t n) {
    return static_cast<const char*>(a.w) + weight_row(a, n) * row_bytes(a);
  }
  static const char* address(Col w, int64_t k) { return w + k * dtype_size(WT); }
  static void load_x(X& out, const void* x, int64_t k) { out = V::template load<XT>(x, k); }
  static void load_w(Wt& out, Col w, int64_t k) { out = V::template load<WT>(w, k); }
  static void step(F& acc, const X& x, const Wt& w) { acc = V::fmadd(x, w, acc); }
  static float leftover(float acc, const void* x, Col w, int64_t k0, int64_t K) {
    for (int64_t k = k0; k < K; ++k) acc += load_f32(x, XT, k) * load_f32(w, WT, k);
    return acc;
  }
};

// The Q8 step (int8 weights, fp32 scales per block of kQ8Block = 32 along K): kChunk = one
// block. Its 32 products are summed into a fresh vector t (lane l: x[l] * q[l], then fma with
// the elements l + W, l + 2W, ...; int8 widened to fp32 exactly by V::load_i8), then the block
// enters the accumulator as acc = fma(t, scale, acc). A partial last block (K % 32 elements)
// is the leftover: its products summed one by one in fp32, then acc + scale * sum.
template <class V, DType XT>
struct Q8Dot {
  using F = typename V::F;
  static constexpr int kChunk = int(kQ8Block), kVecs = kChunk / V::W, kPreparedFloats = kChunk;
  // bf16 / fp16 rows are widened to fp32 once per call, not once per weight tile.
  static constexpr bool kPadsTail = false, kPreparesX = XT != DType::F32, kWideTiles = false, kPrefetchL1 = true;
  static_assert(kChunk % V::W == 0, "a Q8 block is whole vectors");
  struct Col {
    const int8_t* q;  // weight row n
    const float* s;   // its scales
  };
  struct X {
    F v[kVecs];
  };
  struct Wt {
    F v[kVecs];
    F scale;
  };
  static int64_t row_bytes(const LinearArgs& a) { return a.w_stride; }
  static Col col(const LinearArgs& a, int64_t n) {
    const int64_t row = weight_row(a, n);
    return {static_cast<const int8_t*>(a.w) + row * a.w_stride, a.w_scale + row * a.w_scale_stride};
  }
  static const char* address(Col w, int64_t k) { return reinterpret_cast<const char*>(w.q + k); }
  static void prepare_x(float* out, const void* x, int64_t kv) {
    for (int64_t k = 0; k < kv; k += V::W) V::storeu(out + k, V::template load<XT>(x, k));
  }
  static void load_x(X& out, const void* x, int64_t k) {
    for (int i = 0; i < kVecs; ++i) out.v[i] = V::template load<kPreparesX ? DType::F32 : XT>(x, k + i * V::W);
  }
  static void load_w(Wt& out, Col w, int64_t k) {
    for (int i = 0; i < kVecs; ++i) out.v[i] = V::load_i8(w.q + k + i * V::W);
    out.scale = V::set1(w.s[k / kChunk]);
  }
  static void step(F& acc, const X& x, const Wt& w) {
    F t = V::mul(x.v[0], w.v[0]);
    for (int i = 1; i < kVecs; ++i) t = V::fmadd(x.v[i], w.v[i], t);
    acc = V::fmadd(t, w.scale, acc);
  }
  static float leftover(float acc, const void* x, Col w, int64_t k0, int64_t K) {
    if (k0 >= K) return acc;
    float t = 0.f;
    for (int64_t k = k0; k < K; ++k) t += load_f32(x, XT, k) * float(w.q[k]);
    return acc + w.s[k0 / kChunk] * t;
  }
};

// The integer-dot steps' common part (quantize_x: x rows quantized to int8 blocks, the
// kXqGroup layout of linear_args.h; int8 weights with fp32 block scales). Each ISA's step
// (x86/linear.h, neon/linear.h) adds X, Wt, load_x, load_w and step: a chunk of one or two
// blocks gives exact int32 lanes (x86, lane l: the 4 products of elements 4l..4l+3 of its
// block; NEON: those and the 4 of elements 16+4l..16+4l+3; each instruction variant the same
// integers), converted to fp32 (exact: |sum| < 2^24) and
// entering the accumulator as acc = fma(lanes, x_scale * w_scale, acc). The x rows are
// padded to whole groups and the weight's last chunk is loaded masked (zeros past K, zero
// scales past its last block), so there is no leftover.
struct Int8DotBase {
  static constexpr bool kPadsTail = true, kPreparesX = false, kWideTiles = false, kPrefetchL1 = true;
  struct Col {
    const int8_t* q;  // weight row n
    const float* s;   // its scales
    int64_t K;        // its length: a chunk past it is loaded masked
  };
  static int64_t row_bytes(const LinearArgs& a) { return a.w_stride; }
  static Col col(const LinearArgs& a, int64_t n) {
    const int64_t row = weight_row(a, n);
    return {static_cast<const int8_t*>(a.w) + row * a.w_stride, a.w_scale + row * a.w_scale_stride, a.K};
  }
  static const char* address(Col w, int64_t k) { return reinterpret_cast<const char*>(w.q + k); }
  static const int8_t* xq(const void* row, int64_t k) { return xq_value(row, k); }
  static const float* xs(const void* row, int64_t k) { return xq_scale(row, k); }
  static float leftover(float acc, const void*, Col, int64_t, int64_t) { return acc; }
};

// The step of a (activation, weight) dtype pair: DOT's for float weights, Q8Dot for int8.
template <template <class, DType, DType> class DOT, class V, DType XT, DType WT>
struct StepOf {
  using type = DOT<V, XT, WT>;
};
template <template <class, DType, DType> class DOT, class V, DType XT>
struct StepOf<DOT, V, XT, DType::I8> {
  using type = Q8Dot<V, XT>;
};

template <class V, class D, DType XT, DType WT>
struct VecLinear {
  using F = typename V::F;
  using Col = typename D::Col;
  static constexpr int W = V::W, kRows = V::kLinearRows;
  // Rows handled per pass over a column group (bounds the accumulators kept on the stack).
  static constexpr int kRowBlock = 16;
  static_assert(kRowBlock % kRows == 0, "row groups must divide the row block");

  // acc[r][c0 + c] = the accumulators of rows x[0..R) and weight rows w[0..C) over [0, kv).
  // In a chunk step the smaller side stays in registers and the other is loaded where used:
  // the C weight chunks when R > C (8 rows' chunks held beside 16 accumulators spilled them to
  // the stack), else the R activation chunks. prefetch_ahead (bytes, 0 = none): the weights
  // that far past each chunk are prefetched (the tiles ahead): the hardware prefetchers alone
  // leave a core's stream half idle. Four times as far they are prefetched into L2 only: each
  // matrix of a pass is a new stream, which the hardware prefetchers pick up late
  // (bench/history/2026-11.md, "Weights also prefetched into L2"). A step without kPrefetchL1 takes the L2 prefetch
  // only.
  static void prefetch(const char* p, int64_t ahead) {
    if (!ahead) return;
    if constexpr (D::kPrefetchL1) V::prefetch(p + ahead);
    V::prefetch_l2(p + 4 * ahead);
  }
  // The tile of row group `part` of `parts` over the same weights prefetches every parts-th
  // chunk from the part-th on: each line ahead is asked for once, and the requests are spread
  // over all the groups' passes instead of coming in bursts during the first one.
  template <int R, int C>
  static void tile(const char* const* x, const Col* w, int64_t kv, F (*acc)[W], int c0, int64_t prefetch_ahead,
                   int part, int parts) {
    F t[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) t[r][c] = V::zero();
    for (int64_t k = 0, i = 0, next = part; k < kv; k += D::kChunk, ++i) {
      const bool mine = i == next;  // a counter, not i % parts: no division per chunk
      if (mine) next += parts;
      const int64_t ahead = mine ? prefetch_ahead : 0;
      if constexpr (R > C) {
        typename D::Wt ws[C];
        for (int c = 0; c < C; ++c) {
          prefetch(D::address(w[c], k), ahead);
          D::load_w(ws[c], w[c], k);
        }
        for (int r = 0; r < R; ++r) {
          typename D::X xr;
          D::load_x(xr, x[r], k);
          for (int c = 0; c < C; ++c) D::step(t[r][c], xr, ws[c]);
        }
      } else {
        typename D::X xs[R];
        for (int r = 0; r < R; ++r) D::load_x(xs[r], x[r], k);
        for (int c = 0; c < C; ++c) {
          prefetch(D::address(w[c], k), ahead);
          typename D::Wt wc;
          D::load_w(wc, w[c], k);
          for (int r = 0; r < R; ++r) D::step(t[r][c], xs[r], wc);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c0 + c] = t[r][c];
  }

  // R rows x the `cols` columns from g: tiles of R x V::linear_cols(R, ...) (about as many
  // independent chains whatever R). This is row group `part` of `parts` over the column
  // group: its share of the prefetches (see tile; none for rows read through w_rows: the
  // rows ahead are elsewhere).
  template <int R>
  static void row_group(const LinearArgs& a, const char* const* x, int64_t g, int cols, int64_t kv, F (*acc)[W],
                        int part, int parts) {
    constexpr int C = V::linear_cols(R, D::kWideTiles);
    static_assert(W % C == 0, "tiles must divide the column group");
    const int64_t ahead = !a.w_rows ? 2 * C * D::row_bytes(a) : 0;
    for (int c0 = 0; c0 < cols; c0 += C) {
      Col wc[C];  // columns past the group's end repeat its last one (discarded)
      for (int c = 0; c < C; ++c) wc[c] = D::col(a, g + std::min(c0 + c, cols - 1));
      tile<R, C>(x, wc, kv, acc, c0, ahead, part, parts);
    }
  }

  template <int R>
  static void row_group_of(int rows, const LinearArgs& a, const char* const* x, int64_t g, int cols, int64_t kv,
                           F (*acc)[W], int part, int parts) {
    if constexpr (R > 1) {
      if (rows < R) return row_group_of<R - 1>(rows, a, x, g, cols, kv, acc, part, parts);
    }
    row_group<R>(a, x, g, cols, kv, acc, part, parts);
  }

  // Rows handled per pass over the columns: a span's rows (prepared, for kPreparesX) stay in
  // L2 while each column group's weights, brought in from DRAM once, serve all of its row
  // blocks from L1/L2. The weights are streamed once per call up to kRowSpan rows (a prefill:
  // once per kRowSpan rows, not per kRowBlock).
  static constexpr int kRowSpan = 4 * kRowBlock;
  static int groups_of(int rows) { return (rows + kRows - 1) / kRows; }

  // Columns [n0, n1) of every row: spans of kRowSpan rows; in a span, column groups of W (one
  // sum_each per row and group), each over the span's row blocks of kRowBlock, rows in equal
  // groups of at most kRows inside a block (9 = 4 + 5, not 8 + 1: a thin group has too few
  // FMA chains to hide their latency). The row groups over one column group share its
  // prefetches (tile). Any of these groupings gives every row the same bits.
  static void run(const LinearArgs& a, int64_t n0, int64_t n1) {
    const int64_t kv = D::kPadsTail ? (a.K + D::kChunk - 1) / D::kChunk * D::kChunk : a.K / D::kChunk * D::kChunk;
    const int64_t xb = a.x_stride * dtype_size(XT);
    const char* x0 = static_cast<const char*>(a.x);
    F acc[kRowBlock][W];
    alignas(64) float sums[W];
    thread_local std::vector<float> prepared;  // kPreparesX: the span's rows in the step's layout
    int64_t prepared_row = 0;                  // floats per prepared row
    if constexpr (D::kPreparesX) {
      prepared_row = kv / D::kChunk * D::kPreparedFloats;
      prepared.resize(size_t(std::min<int64_t>(kRowSpan, a.M) * prepared_row));
    }
    for (int64_t s0 = 0; s0 < a.M; s0 += kRowSpan) {
      const int span = int(std::min<int64_t>(kRowSpan, a.M - s0));
      const char* xr[kRowSpan];  // the rows as given (leftovers) ...
      const char* xt[kRowSpan];  // ... and as the tiles read them
      for (int r = 0; r < span; ++r) {
        xt[r] = xr[r] = x0 + (s0 + r) * xb;
        if constexpr (D::kPreparesX) {
          D::prepare_x(prepared.data() + r * prepared_row, xr[r], kv);
          xt[r] = reinterpret_cast<const char*>(prepared.data() + r * prepared_row);
        }
      }
      const int parts = span / kRowBlock * groups_of(kRowBlock) + groups_of(span % kRowBlock);
      for (int64_t g = n0; g < n1; g += W) {
        const int cols = int(std::min<int64_t>(W, n1 - g));
        for (int b0 = 0, part = 0; b0 < span; b0 += kRowBlock) {
          const int rows = std::min(kRowBlock, span - b0), groups = groups_of(rows);
          if (cols < W)  // lanes past the end: zeros, not stale values
            for (int r = 0; r < rows; ++r)
              for (int c = cols; c < W; ++c) acc[r][c] = V::zero();
          for (int i = 0, r = 0; i < groups; ++i, ++part) {
            const int n = (rows - r) / (groups - i);
            row_group_of<kRows>(n, a, xt + b0 + r, g, cols, kv, acc + r, part, parts);
            r += n;
          }
          for (int r = 0; r < rows; ++r) {
            const F sum = V::sum_each(acc[r]);
            float* y = a.y + (s0 + b0 + r) * a.y_stride + g;
            if (kv >= a.K && cols == W) {  // no leftover elements (the usual K): one vector store
              V::storeu(y, a.bias ? V::add(sum, V::loadu(a.bias + g)) : sum);
              continue;
            }
            V::storeu(sums, sum);
            for (int c = 0; c < cols; ++c) {
              const float v = D::leftover(sums[c], xr[b0 + r], D::col(a, g + c), kv, a.K);
              y[c] = a.bias ? v + a.bias[g + c] : v;
            }
          }
        }
      }
    }
  }
};

}  // namespace mtp::simd

// Defines linear(SET, args, n0, n1), the float path of the instruction set SET (its tag,
// isa.h): activations fp32, bf16 or fp16, weights those or int8 (Q8 blocks), every
// combination one flatten function of the set's target. DOT(V, XT, WT) names the step type
// of a float combination.
#define MTP_LINEAR_ENTRY_POINT_WITH(SET, V, DOT)                                                                     \
  template <DType XT, DType WT>                                                                                      \
  MTP_TARGET(SET)                                                                                                    \
  __attribute__((flatten)) inline void linear_typed(SET, const LinearArgs& a, int64_t n0, int64_t n1) {              \
    simd::VecLinear<V, typename simd::StepOf<DOT, V, XT, WT>::type, XT, WT>::run(a, n0, n1);                         \
  }                                                                                                                  \
  inline void linear(SET, const LinearArgs& a, int64_t n0, int64_t n1) {                                             \
    with_dtype(a.x_dtype, [&](auto xt) {                                                                             \
      with_weight_dtype(a.w_dtype,                                                                                   \
                        [&](auto wt) { linear_typed<decltype(xt)::value, decltype(wt)::value>(SET{}, a, n0, n1); }); \
    });                                                                                                              \
  }
#define MTP_LINEAR_ENTRY_POINT(SET, V) MTP_LINEAR_ENTRY_POINT_WITH(SET, V, simd::LaneDot)

// Defines NAME(args, n0, n1) for quantize_x (x: quantized rows, see linear_args.h) with the
// integer-dot step STEP.
#define MTP_LINEAR_Q8DOT_ENTRY_POINT(TARGET, V, NAME, STEP)                                       \
  TARGET __attribute__((flatten)) inline void NAME(const LinearArgs& a, int64_t n0, int64_t n1) { \
    simd::VecLinear<V, STEP, DType::I8, DType::I8>::run(a, n0, n1);                               \
  }
