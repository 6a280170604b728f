// Vector linear, written once over a vector-traits class V (x86: V512 / V256; aarch64: V128)
// and a dot-product step D (how one chunk of the reduction enters an accumulator).
//
// Each output element y[m, n] has ONE accumulator vector: chunk c of the reduction (D::kChunk
// elements) enters it by D::step, chunks in order; the W lanes are then summed by the tree of
// V::sum_each, the K % kChunk leftover elements are added one by one, then the bias. That
// sequence is the same whatever M, the row or column grouping or the thread split, so every
// row has the bits of a one-row call. Speed comes from register tiles of kRows x kCols
// elements: one weight chunk feeds kRows activation rows, one activation chunk kCols weight
// rows, and kRows * kCols independent FMA chains hide the FMA latency. Each instruction set
// (and each D) is shape-invariant on its own and agrees with the others to rounding.
#pragma once

namespace mtp::simd {

// The plain step: kChunk = W elements widened to fp32 lanes, one FMA (lane l takes k + l).
// A step type D names: Col (what locates weight row n: D::col(args, n); D::address(col, k) its
// byte address of element k, D::row_bytes(args) the distance between rows), X and Wt (a loaded
// chunk of activations / weights), kChunk, step(acc, X, Wt), and leftover(sum, x row, col,
// k0, K): the elements past the last whole chunk added one by one.
template <class V, DType XT, DType WT>
struct LaneDot {
  using F = typename V::F;
  using Col = const char*;
  using X = F;
  using Wt = F;
  static constexpr int kChunk = V::W;
  static int64_t row_bytes(const LinearArgs& a) { return a.w_stride * dtype_size(WT); }
  static Col col(const LinearArgs& a, int64_t n) { return static_cast<const char*>(a.w) + n * row_bytes(a); }
  static const char* address(Col w, int64_t k) { return w + k * dtype_size(WT); }
  static X load_x(const void* x, int64_t k) { return V::template load<XT>(x, k); }
  static Wt load_w(Col w, int64_t k) { return V::template load<WT>(w, k); }
  static F step(F acc, const X& x, const Wt& w) { return V::fmadd(x, w, acc); }
  static float leftover(float acc, const void* x, Col w, int64_t k0, int64_t K) {
    for (int64_t k = k0; k < K; ++k) acc += load_f32(x, XT, k) * load_f32(w, WT, k);
    return acc;
  }
};

template <class V, class D, DType XT, DType WT>
struct VecLinear {
  using F = typename V::F;
  static constexpr int W = V::W, kRows = V::kLinearRows, kCols = V::kLinearCols;
  // Rows handled per pass over a column group (bounds the accumulators kept on the stack).
  static constexpr int kRowBlock = 16;
  static_assert(W % kCols == 0 && kRowBlock % kRows == 0, "tiles must divide the groups");

  using Col = typename D::Col;

  // acc[r][c0 + c] = the accumulators of rows x[0..R) and weight rows w[0..kCols) over [0, kv).
  // prefetch_ahead (bytes, 0 = none): the weights that far past each chunk are prefetched
  // (the next tile's rows): the hardware prefetchers alone leave a core's stream half idle.
  template <int R>
  static void tile(const char* const* x, const Col* w, int64_t kv, F (*acc)[W], int c0, int64_t prefetch_ahead) {
    F t[R][kCols];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kCols; ++c) t[r][c] = V::zero();
    for (int64_t k = 0; k < kv; k += D::kChunk) {
      typename D::X xs[R];
      for (int r = 0; r < R; ++r) xs[r] = D::load_x(x[r], k);
      for (int c = 0; c < kCols; ++c) {
        if (prefetch_ahead) V::prefetch(D::address(w[c], k) + prefetch_ahead);
        const typename D::Wt wc = D::load_w(w[c], k);
        for (int r = 0; r < R; ++r) t[r][c] = D::step(t[r][c], xs[r], wc);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c0 + c] = t[r][c];
  }

  template <int R>
  static void tile_rows(int rows, const char* const* x, const Col* w, int64_t kv, F (*acc)[W], int c0, int64_t ahead) {
    if constexpr (R > 1) {
      if (rows < R) return tile_rows<R - 1>(rows, x, w, kv, acc, c0, ahead);
    }
    tile<R>(x, w, kv, acc, c0, ahead);
  }

  // Columns [n0, n1) of every row: row blocks of kRowBlock, column groups of W (one
  // sum_each per row and group), register tiles of kRows x kCols inside.
  static void run(const LinearArgs& a, int64_t n0, int64_t n1) {
    const int64_t kv = a.K / D::kChunk * D::kChunk;
    const int64_t xb = a.x_stride * dtype_size(XT);
    const char* x0 = static_cast<const char*>(a.x);
    F acc[kRowBlock][W];
    alignas(64) float sums[W];
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowBlock) {
      const int rows = int(std::min<int64_t>(kRowBlock, a.M - m0));
      const char* xr[kRowBlock];
      for (int r = 0; r < rows; ++r) xr[r] = x0 + (m0 + r) * xb;
      for (int64_t g = n0; g < n1; g += W) {
        const int cols = int(std::min<int64_t>(W, n1 - g));
        if (cols < W)  // the lanes past the end get zeros, not stale values
          for (int r = 0; r < rows; ++r)
            for (int c = (cols + kCols - 1) / kCols * kCols; c < W; ++c) acc[r][c] = V::zero();
        for (int c0 = 0; c0 < cols; c0 += kCols) {
          Col wc[kCols];  // columns past the group's end repeat its last one (discarded)
          for (int c = 0; c < kCols; ++c) wc[c] = D::col(a, g + std::min(c0 + c, cols - 1));
          for (int r = 0; r < rows; r += kRows)  // the first row group brings the weights in
            tile_rows<kRows>(rows - r, xr + r, wc, kv, acc + r, c0, r == 0 ? 4 * kCols * D::row_bytes(a) : 0);
        }
        for (int r = 0; r < rows; ++r) {
          V::storeu(sums, V::sum_each(acc[r]));
          float* y = a.y + (m0 + r) * a.y_stride + g;
          for (int c = 0; c < cols; ++c) {
            const float v = D::leftover(sums[c], xr[r], D::col(a, g + c), kv, a.K);
            y[c] = a.bias ? v + a.bias[g + c] : v;
          }
        }
      }
    }
  }
};

}  // namespace mtp::simd

// Defines NAME(args, n0, n1): activations and weights fp32, bf16 or fp16 each, every
// combination one flatten function of the target (TARGET may be empty: the baseline set).
// DOT(V, XT, WT) names the step type of a combination.
#define MTP_LINEAR_ENTRY_POINT_WITH(TARGET, V, NAME, DOT)                                                 \
  template <DType XT, DType WT>                                                                           \
  TARGET __attribute__((flatten)) inline void NAME##_typed(const LinearArgs& a, int64_t n0, int64_t n1) { \
    simd::VecLinear<V, DOT<V, XT, WT>, XT, WT>::run(a, n0, n1);                                          \
  }                                                                                                       \
  inline void NAME(const LinearArgs& a, int64_t n0, int64_t n1) {                                         \
    with_dtype(a.x_dtype, [&](auto xt) {                                                                  \
      with_dtype(a.w_dtype, [&](auto wt) { NAME##_typed<decltype(xt)::value, decltype(wt)::value>(a, n0, n1); }); \
    });                                                                                                   \
  }
#define MTP_LINEAR_ENTRY_POINT(TARGET, V, NAME) MTP_LINEAR_ENTRY_POINT_WITH(TARGET, V, NAME, simd::LaneDot)
