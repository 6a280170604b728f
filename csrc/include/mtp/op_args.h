// What both front doors of head_attention, cache_append, linear, verify_sampled, decoder_layers
// and head_draft share (the torch bindings in csrc/cpu and the C API in csrc/core): the checks on values rather than on
// the tensor representation, with one wording, and the filling of the kernels' argument structs from data pointers and
// element strides. Torch-free. Each *_error returns "" when the arguments are fine, else the message; the caller
// prefixes the op's name.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mtp/attention.h"
#include "mtp/cache.h"
#include "mtp/linear.h"
#include "mtp/verify_sampled.h"

namespace mtp {

template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream m;
  (m << ... << parts);
  return m.str();
}

// ---- scalars: validated at the width the kernels use (fp32), after narrowing

// "" when v (a double from the caller) is finite as a float32 and, with positive, > 0; else
// "<name> must be <what>, got <v>" (+ " (inf as float32)" when only the narrowing overflows).
inline std::string float_arg_error(const char* name, double v, const char* what, bool nonnegative) {
  const float f = float(v);  // what the kernel gets (IEEE narrowing: |v| > FLT_MAX -> inf)
  if (std::isfinite(f) && (!nonnegative || f >= 0)) return "";
  return message(name, " must be ", what, ", got ", v, std::isfinite(v) ? " (inf as float32)" : "");
}
inline std::string scale_error(const char* name, double scale) { return float_arg_error(name, scale, "finite", false); }
inline std::string eps_error(double eps) { return float_arg_error("eps", eps, "a finite number >= 0", true); }

// ---- sizes: products and sums in checked arithmetic (common.h), an overflow is an error

// The longest row (K, H, ...) any check accepts: q8_blocks, block_row_bytes and the packed
// activation rows add to and multiply K, which must stay far from int64's end.
constexpr int64_t kMaxRowElems = int64_t(1) << 56;
inline std::string row_length_error(const char* what, int64_t K) {
  if (K <= kMaxRowElems) return "";
  return message(what, " = ", K, " is beyond the ", kMaxRowElems, " (2^56) elements a row may have");
}

// ---- aliasing: an op's outputs share no memory with each other or with any input, and
// no two elements of an output share memory (expanded, stride-0 views are rejected). The
// checks compare byte ranges [first byte, last byte + 1): two views whose ranges intersect
// are rejected even when their elements interleave without touching.

struct View {
  const char* name = "";
  const void* data = nullptr;
  int64_t elem_bytes = 0;
  int64_t ndim = 0;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;  // in elements, >= 0
  int64_t last_bytes = -1;           // >= 0: the bytes of the last row instead of elem_bytes (block dtypes)
};

inline std::string dims_text(int64_t n, const int64_t* v) {
  std::ostringstream s;
  s << "[";
  for (int64_t d = 0; d < n; ++d) s << (d ? ", " : "") << v[d];
  s << "]";
  return s.str();
}

// [lo, hi) of v's bytes (lo == hi: empty). Extents past int64 saturate (such a view cannot
// be memory anyway; it then overlaps everything, which is what a check should say).
inline void byte_range(const View& v, uintptr_t* lo, uintptr_t* hi) {
  *lo = *hi = reinterpret_cast<uintptr_t>(v.data);
  int64_t extent = 0;  // element offset of the last element
  for (int64_t d = 0; d < v.ndim; ++d) {
    if (v.sizes[d] == 0) return;
    int64_t step;
    if (!checked_mul(v.sizes[d] - 1, v.strides[d], &step) || !checked_add(extent, step, &extent)) {
      *hi = UINTPTR_MAX;
      return;
    }
  }
  int64_t bytes, last = v.last_bytes >= 0 ? v.last_bytes : v.elem_bytes;
  if (!checked_mul(extent, v.elem_bytes, &bytes) || !checked_add(bytes, last, &bytes) ||
      uintptr_t(bytes) > UINTPTR_MAX - *lo) {
    *hi = UINTPTR_MAX;
    return;
  }
  *hi = *lo + uintptr_t(bytes);
}

// An output's elements are distinct memory: its dims of size > 1, ordered by stride, each
// step past everything the smaller ones span (what any dense or sliced view satisfies).
inline std::string self_overlap_error(const View& v, const char* why) {
  for (int64_t d = 0; d < v.ndim; ++d)
    if (v.sizes[d] == 0) return "";  // no element at all
  int64_t order[8], n = 0;           // the dims of size > 1 by increasing stride (insertion: a few dims)
  for (int64_t d = 0; d < v.ndim && d < 8; ++d) {
    if (v.sizes[d] <= 1) continue;
    int64_t i = n++;
    for (; i > 0 && v.strides[order[i - 1]] > v.strides[d]; --i) order[i] = order[i - 1];
    order[i] = d;
  }
  int64_t span = 1;  // elements spanned by the dims so far
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = order[i];
    int64_t step;
    if (v.strides[d] < span || !checked_mul(v.sizes[d] - 1, v.strides[d], &step) || !checked_add(span, step, &span))
      return message(v.name, " must not have overlapping elements (", why, "), got strides ",
                     dims_text(v.ndim, v.strides), " for sizes ", dims_text(v.ndim, v.sizes));
  }
  return "";
}

// Whether two byte ranges share a byte (an empty one shares none).
inline bool ranges_meet(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) {
  return a0 != a1 && b0 != b1 && a0 < b1 && b0 < a1;
}

inline std::string overlap_message(const View& out, const View& other) {
  return message(out.name, " and ", other.name, " overlap in memory: ", out.name,
                 " is written in place and must share no memory with another argument");
}

// out (written) and other (read or written) share no byte.
inline std::string overlap_error(const View& out, const View& other) {
  uintptr_t a0, a1, b0, b1;
  byte_range(out, &a0, &a1);
  byte_range(other, &b0, &b1);
  return ranges_meet(a0, a1, b0, b1) ? overlap_message(out, other) : std::string();
}

// Every output free of self-overlap, and disjoint from every other view (outputs first in
// `views`, `outputs` of them). Each range is computed once; a message only on a hit: this runs
// on every call (a few views, no allocation).
constexpr size_t kMaxAliasViews = 16;  // the most views one aliasing check takes (an op passes <= 14)

inline std::string aliasing_error(const View* views, size_t count, size_t outputs, const char* why) {
  for (size_t i = 0; i < outputs; ++i)
    if (std::string e = self_overlap_error(views[i], why); !e.empty()) return e;
  uintptr_t lo[kMaxAliasViews], hi[kMaxAliasViews];
  if (count > kMaxAliasViews)
    return message("internal error: more than ", kMaxAliasViews, " views in one aliasing check");
  for (size_t i = 0; i < count; ++i) byte_range(views[i], &lo[i], &hi[i]);
  for (size_t i = 0; i < outputs; ++i)
    for (size_t j = 0; j < count; ++j)
      if (j != i && (j > i || j >= outputs) && ranges_meet(lo[i], hi[i], lo[j], hi[j]))
        return overlap_message(views[i], views[j]);
  return "";
}

// The outputs against n more inputs (a pass's weights): view_at(i) gives input i's view with
// no name, name(i) its name, built only for an input that meets an output.
template <class ViewAt, class Name>
std::string disjoint_error(const View* outputs, size_t n_out, int64_t n, ViewAt&& view_at, Name&& name) {
  uintptr_t lo[kMaxAliasViews], hi[kMaxAliasViews];
  if (n_out > kMaxAliasViews) return message("internal error: more than ", kMaxAliasViews, " outputs in one check");
  for (size_t o = 0; o < n_out; ++o) byte_range(outputs[o], &lo[o], &hi[o]);
  for (int64_t i = 0; i < n; ++i) {
    View in;
    if (!view_at(i, &in)) continue;  // an absent (NULL) input
    uintptr_t b0, b1;
    byte_range(in, &b0, &b1);
    for (size_t o = 0; o < n_out; ++o)
      if (ranges_meet(lo[o], hi[o], b0, b1)) {
        const std::string nm = name(i);
        in.name = nm.c_str();
        return overlap_message(outputs[o], in);
      }
  }
  return "";
}

// ---- head_attention

inline float default_attention_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

inline std::string gqa_error(int64_t Hq, int64_t Hkv) {
  if (Hkv > 0 && Hq % Hkv == 0) return "";
  return message("q's head count Hq = ", Hq, " must be a multiple of k_cache's head count Hkv = ", Hkv,
                 " (grouped-query attention)");
}

// Causal mode: the T queries are the last T cached positions of every request.
inline std::string causal_error(const std::vector<int64_t>& lens, int64_t T, bool causal) {
  if (!causal || lens.empty() || T == 0) return "";
  const int64_t lo = *std::min_element(lens.begin(), lens.end());
  if (lo >= T) return "";
  return message("causal=True needs cache_lens[b] >= T = ", T,
                 " (the T queries are the last T cached positions), got min(cache_lens) = ", lo);
}

inline std::string local_pair_error(bool has_k_local, bool has_v_local) {
  if (has_k_local == has_v_local) return "";
  return message("k_local and v_local must be given together, got only ", has_k_local ? "k_local" : "v_local");
}

// head_attention's sliding window: 0 (none) or the keys a query sees, itself included; not
// with a local segment (whose positions a window would have to place after the cache's).
inline std::string window_error(int64_t window, bool has_local) {
  if (window < 0)
    return message("window must be >= 0 (0: no window; else how many of the latest keys a query sees), got window = ",
                   window);
  if (window > 0 && has_local)
    return message("window = ", window, " does not combine with a local segment (k_local / v_local)");
  return "";
}
// Checks and sets a.window ("" when fine; a is unchanged otherwise).
inline std::string set_window(AttentionArgs& a, int64_t window, bool has_local) {
  std::string e = window_error(window, has_local);
  if (e.empty()) a.window = window;
  return e;
}

// The cache views of either op's argument struct (same member names), used in place.
template <class Args, class Ptr>
void set_cache_views(Args& a, Ptr k, const int64_t* k_strides, Ptr v, const int64_t* v_strides, const int64_t* lens) {
  a.k = k;
  a.v = v;
  std::copy(k_strides, k_strides + 4, a.k_stride);
  std::copy(v_strides, v_strides + 4, a.v_stride);
  a.cache_lens = lens;
}

inline void set_local_views(AttentionArgs& a, int64_t S, const void* kl, const int64_t* kl_strides, const void* vl,
                            const int64_t* vl_strides) {
  a.S = S;
  a.k_local = kl;
  a.v_local = vl;
  std::copy(kl_strides, kl_strides + 4, a.kl_stride);
  std::copy(vl_strides, vl_strides + 4, a.vl_stride);
}

// ---- cache_append

// Checked before anything is written: one request past the capacity and nothing is.
inline std::string capacity_error(const CacheAppendArgs& a) {
  int64_t bad = -1;  // cache_lens[b] in [0, L] (checked): T > L - cache_lens[b] cannot overflow
  for (int64_t b = 0; b < a.B && bad < 0; ++b)
    if (a.cache_lens[b] < 0 || a.cache_lens[b] > a.L || a.T > a.L - a.cache_lens[b]) bad = b;
  if (bad < 0) return "";
  return message("request ", bad, " would pass the cache capacity: cache_lens[", bad, "] + T = ", a.cache_lens[bad],
                 " + ", a.T, " > L = ", a.L, " (the caches' length); nothing was written");
}

inline void set_new_views(CacheAppendArgs& a, const void* kn, const int64_t* kn_strides, const void* vn,
                          const int64_t* vn_strides) {
  a.k_new = kn;
  a.v_new = vn;
  std::copy(kn_strides, kn_strides + 4, a.kn_stride);
  std::copy(vn_strides, vn_strides + 4, a.vn_stride);
}

// ---- linear

// The weight is read in place, row by row: its rows must be unit-stride.
inline std::string weight_rows_error(int64_t K, int64_t stride0, int64_t stride1) {
  if (stride1 == 1 || K <= 1) return "";
  return message("weight rows must be contiguous (stride 1 along K), got strides [", stride0, ", ", stride1,
                 "]; it is read in place, make it contiguous once when loading");
}

// int8 (Q8) weights: weight_scale [N, ceil(K/32)] is read in place too, row by row.
constexpr const char* kWeightScaleShape = "[N, ceil(K/32)]";
constexpr const char* kWeightScaleBlocks = "ceil(K/32) (blocks of 32 along K)";

inline std::string weight_scale_rows_error(int64_t blocks, int64_t stride0, int64_t stride1) {
  if (stride1 == 1 || blocks <= 1) return "";
  return message("weight_scale rows must be contiguous (stride 1 along the blocks), got strides [", stride0, ", ",
                 stride1, "]; it is read in place, make it contiguous once when loading");
}

// Points the kernel's arguments at an int8 weight and its scales (element strides).
inline void set_q8_weight(LinearArgs& a, const void* w, int64_t w_stride, const float* scale, int64_t scale_stride) {
  a.w = w;
  a.w_dtype = DType::I8;
  a.w_stride = w_stride;
  a.w_scale = scale;
  a.w_scale_stride = scale_stride;
}

// ---- GGUF block-type weights (gguf.h): uint8 [N, row bytes], read in place

// The DType of a GGML type number: 2 Q4_0, 3 Q4_1, 6 Q5_0, 8 Q8_0, 12 Q4_K, 14 Q6_K, and of the x8
// layouts 102 Q4_0_X8, 103 Q4_1_X8, 108 Q8_0_X8, 112 Q4_K_X8, 114 Q6_K_X8 (false otherwise).
inline bool gguf_dtype(int64_t ggml_type, DType* out) {
  for (DType t : kBlockTypes)
    if (int64_t(t) - 100 == ggml_type) return *out = t, true;
  for (DType t : kX8Types)
    if (int64_t(t) - 100 == ggml_type) return *out = t, true;
  return false;
}
constexpr const char* kGgufTypes =
    "2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 8 (Q8_0), 12 (Q4_K), 14 (Q6_K), 102 (Q4_0_X8), 103 (Q4_1_X8), 108 "
    "(Q8_0_X8), 112 (Q4_K_X8) or 114 (Q6_K_X8)";
inline std::string gguf_type_error(int64_t ggml_type) {
  DType t;
  if (gguf_dtype(ggml_type, &t)) return "";
  return message("GGML type ", ggml_type, " is not supported: expected ", kGgufTypes);
}

// A matrix of N rows of K elements stored as bytes [N, row_bytes] with strides [stride0,
// stride1]; an x8 one is whole groups of 8 rows, contiguous (gguf.h).
inline std::string gguf_weight_error(DType t, int64_t N, int64_t K, int64_t row_bytes, int64_t stride0,
                                     int64_t stride1) {
  const int64_t e = block_elems(t);
  if (std::string k = row_length_error("K", K); !k.empty()) return k;
  if (K % e != 0)
    return message("K = ", K, " is not a multiple of ", block_type_name(t), "'s blocks of ", e, " elements");
  if (row_bytes != block_row_bytes(t, K))
    return message("a ", block_type_name(t), " row of K = ", K, " elements is ", block_row_bytes(t, K),
                   " bytes, got weight rows of ", row_bytes, " bytes");
  if (stride1 != 1 && row_bytes > 1)
    return message("weight bytes must be contiguous along a row (stride 1), got strides [", stride0, ", ", stride1,
                   "]");
  if (is_x8(t) && N % kX8Rows != 0)
    return message("a ", block_type_name(t), " matrix interleaves groups of 8 rows: N must be a multiple of 8, got ",
                   N);
  if (is_x8(t) && N > 1 && stride0 != row_bytes)
    return message("a ", block_type_name(t), " matrix must be contiguous (rows ", row_bytes,
                   " bytes apart), got strides [", stride0, ", ", stride1, "]");
  return "";
}

// ---- decoder_layers (and head_draft's blocks)

// A layer's weights are these tensors in this order; decoder_layers's weight_scales hold,
// per layer, the Q8 scales of its four matrices (qkv, o_proj, gate_up, down_proj).
constexpr const char* kLayerParts[] = {"input_norm", "qkv", "o_proj", "post_norm", "gate_up", "down_proj"};
constexpr int64_t kLayerTensors = 6, kLayerMatrices = 4;
// decoder_layers(layer="gemma3"): Gemma 3's layer, its matrices the same four (weight_scales,
// weight_types); pre_feedforward_norm is the Llama layer's post_norm.
constexpr const char* kGemma3LayerParts[] = {"input_norm",
                                             "qkv",
                                             "q_norm",
                                             "k_norm",
                                             "o_proj",
                                             "post_attention_norm",
                                             "pre_feedforward_norm",
                                             "gate_up",
                                             "down_proj",
                                             "post_feedforward_norm"};
constexpr int64_t kGemma3LayerTensors = 10;

// weights[index] named for messages: `first` named tensors, then `count` layers called
// `unit`, then `last` ("weights[7] (layer 1's qkv)").
struct WeightNames {
  std::vector<const char*> first;
  int64_t count;
  const char* unit;
  const char* last;
  const char* const* parts = kLayerParts;  // the names of a layer's tensors, `per` of them
  int64_t per = kLayerTensors;
  std::string operator()(int64_t index) const {
    std::string s = "weights[" + std::to_string(index) + "] (";
    const int64_t n = int64_t(first.size());
    if (index < n) return s + first[size_t(index)] + ")";
    const int64_t i = index - n;
    if (i < per * count) return s + unit + " " + std::to_string(i / per) + "'s " + parts[i % per] + ")";
    return s + last + ")";
  }
};

// The layer count of the caches: its weight lists (6 per layer + 1, 4 scales per layer) must
// be countable (a stride-0 cache may claim any number of layers).
inline std::string layers_error(int64_t layers, const char* what, int64_t per = kLayerTensors) {
  const int64_t most = (int64_t(1) << 31) / per;
  if (layers <= most) return "";
  return message(what, " = ", layers, " layers is more than a weight list can hold (at most ", most, ")");
}

// A norm's weight [H] is read in place: unit stride.
inline std::string norm_stride_error(int64_t H, int64_t stride) {
  if (stride == 1 || H <= 1) return "";
  return message("norm weights must be contiguous (stride 1), got stride ", stride,
                 "; it is read in place, make it contiguous once when loading");
}

// Request b's T new tokens must fit the cache (capacity L) and the RoPE tables (P rows);
// l_what / p_what say where L and P come from.
inline std::string positions_error(const std::vector<int64_t>& lens, int64_t T, int64_t L, const char* l_what,
                                   int64_t P, const char* p_what) {
  // lens[b] in [0, L] (checked) and T, P >= 0: compared by subtraction, which cannot overflow
  for (size_t b = 0; b < lens.size(); ++b) {
    if (T > L - lens[b])
      return message("request ", b, " would pass the cache capacity: cache_lens[", b, "] + T = ", lens[b], " + ", T,
                     " > L = ", L, " (", l_what, "); nothing was written");
    if (T > P - lens[b])
      return message("request ", b, " would pass the RoPE tables: cache_lens[", b, "] + T = ", lens[b], " + ", T,
                     " > P = ", P, " (", p_what, ") positions");
  }
  return "";
}

// The head's k draft steps of request b take positions cache_lens[b] .. + k - 1 of the RoPE tables.
inline std::string draft_positions_error(const std::vector<int64_t>& lens, int64_t k, int64_t P, const char* p_what) {
  for (size_t b = 0; b < lens.size(); ++b)
    if (k > P - lens[b])  // not lens[b] + k: k is the caller's and may be near 2^63
      return message("request ", b, "'s drafts would pass the RoPE tables: cache_lens[", b, "] + k = ", lens[b], " + ",
                     k, " > P = ", P, " (", p_what, ") positions");
  return "";
}

// decoder_layers' layer kind: "llama" or "gemma3"; the Gemma arguments (windows, the local
// RoPE tables, attention_scale) are the gemma3 kind's only.
inline std::string layer_kind_error(const std::string& layer, bool windows, bool local_tables, bool scale) {
  if (layer != "llama" && layer != "gemma3")
    return message("layer must be \"llama\" or \"gemma3\", got \"", layer, "\"");
  if (layer == "gemma3") return "";
  if (windows) return "windows goes with layer=\"gemma3\" only (the llama layer has no window)";
  if (local_tables) return "rope_cos_local / rope_sin_local go with layer=\"gemma3\" only";
  if (scale) return "attention_scale goes with layer=\"gemma3\" only (the llama layer's is 1/sqrt(D))";
  return "";
}

// The gemma3 kind's windows (one per layer, each window_error's rule) and local RoPE tables
// (both or neither; needed when a window is set). *any_window: a window > 0 was given.
inline std::string gemma3_windows_error(const std::vector<int64_t>& windows, bool has_windows, int64_t layers,
                                        bool has_cos_local, bool has_sin_local, bool* any_window = nullptr) {
  bool any = false;
  if (has_windows) {
    if (int64_t(windows.size()) != layers)
      return message("windows must hold one sliding window per layer (0: global) for the ", layers,
                     " layers of k_cache, got ", windows.size(), " values");
    for (size_t i = 0; i < windows.size(); ++i) {
      if (std::string e = window_error(windows[i], false); !e.empty()) return message("windows[", i, "]: ", e);
      any = any || windows[i] > 0;
    }
  }
  if (has_cos_local != has_sin_local)
    return message("rope_cos_local and rope_sin_local go together, got only ",
                   has_cos_local ? "rope_cos_local" : "rope_sin_local");
  if (any && !has_cos_local)
    return "a layer with a window (windows holds values > 0) takes its RoPE angles from rope_cos_local / "
           "rope_sin_local [P, D], got None";
  if (any_window) *any_window = any;
  return "";
}

// tree_parents [B, T] of a decoder pass (row-major values): each request's row 0 the root
// (-1), every other row's parent an earlier row.
inline std::string tree_parents_error(const std::vector<int64_t>& parents, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t p = parents[size_t(b * T + i)];
      if (i == 0 && p != -1) return message("tree_parents[", b, "][0] must be -1 (row 0 is the root), got ", p);
      if (i > 0 && !(p >= 0 && p < i))
        return message("tree_parents[", b, "][", i, "] must be an earlier row in [0, ", i, "), got ", p);
    }
  return "";
}

// decoder_layers' taps (given with tap_out, or neither): layer indices in [0, layers),
// strictly increasing; an empty list taps nothing.
inline std::string taps_error(const std::vector<int64_t>& taps, bool has_taps, bool has_tap_out, int64_t layers) {
  if (has_taps != has_tap_out) return message("taps and tap_out go together, got only ", has_taps ? "taps" : "tap_out");
  for (size_t j = 0; j < taps.size(); ++j) {
    if (taps[j] < 0 || taps[j] >= layers)
      return message("taps must hold layer indices in [0, layers (k_cache.size(0))) = [0, ", layers, "), got taps[", j,
                     "] = ", taps[j]);
    if (j > 0 && taps[j] <= taps[j - 1])
      return message("taps must be strictly increasing, got taps[", j - 1, "] = ", taps[j - 1], " then taps[", j,
                     "] = ", taps[j]);
  }
  return "";
}

// head_draft's alternatives: the first step's next best drafts, fewer than the Vd tokens.
inline std::string alternatives_error(int64_t alternatives, int64_t Vd, int64_t k) {
  if (alternatives < 0 || alternatives >= Vd)
    return message("alternatives must be in [0, ", Vd, ") (fewer than the draft vocabulary's ", Vd, " tokens), got ",
                   alternatives);
  if (alternatives > 0 && k < 1) return "alternatives are first drafts: they need k >= 1, got k = 0";
  int64_t width;
  if (!checked_add(k, alternatives, &width))
    return message("k + alternatives = ", k, " + ", alternatives, " overflows int64");
  return "";
}

// The widths a layer's matrices take from the head counts: qkv has (Hq + 2 Hkv) D rows,
// o_proj Hq D columns. Checked: with num_heads near 2^62 they would wrap to small numbers
// that real weights match.
struct HeadWidths {
  int64_t qkv_rows = 0, q_width = 0;
};

inline std::string decoder_heads_error(int64_t num_heads, int64_t Hkv, int64_t D, double eps,
                                       HeadWidths* widths = nullptr) {
  if (num_heads < 1) return message("num_heads must be >= 1, got ", num_heads);
  if (std::string e = gqa_error(num_heads, Hkv); !e.empty()) return e;
  if (D % 2 != 0) return message("the head dim D must be even (RoPE rotates two halves), got ", D);
  HeadWidths w;
  int64_t heads;
  if (!checked_add(num_heads, Hkv, &heads) || !checked_add(heads, Hkv, &heads) || !checked_mul(heads, D, &w.qkv_rows) ||
      !checked_mul(num_heads, D, &w.q_width))
    return message("num_heads = ", num_heads, " is too large: the qkv rows (Hq + 2 Hkv) D with Hkv = ", Hkv,
                   " and D = ", D, " overflow int64");
  if (std::string e = eps_error(eps); !e.empty()) return e;
  if (widths) *widths = w;
  return "";
}

// ---- verify_ragged: the flattened layout of continuous batching. draft_token_ids [N],
// cu_num_draft_tokens [B] inclusive cumulative counts, target_logits [N + B, V]: request b
// has K_b = cu[b] - cu[b-1] drafts (cu[-1] = 0), draft_token_ids[cu[b-1] : cu[b]], and its
// K_b + 1 logits rows start at row cu[b-1] + b.

// The per-request layout, from cu's values (read on the host).
struct RaggedLayout {
  int64_t max_drafts = 0;            // max_b K_b (0 when B = 0)
  int64_t width = 1;                 // W: the out_tokens columns (max_num_drafts + 1, or max_drafts + 1)
  std::vector<int64_t> num_drafts;   // K_b
  std::vector<int64_t> draft_start;  // cu[b-1]: request b's first draft
  std::vector<int64_t> first_row;    // cu[b-1] + b: its first logits row
};

// target_logits' rows (rows_what: "target_logits.size(0)") against N + B, in checked arithmetic.
inline std::string ragged_rows_error(int64_t N, int64_t B, int64_t rows, const char* rows_what) {
  int64_t want;
  if (!checked_add(N, B, &want))
    return message("N + B (draft_token_ids' N = ", N, " drafts plus B = ", B, " requests) overflows int64");
  if (rows == want) return "";
  return message(rows_what, " must equal N + B (N = ", N, " drafts plus one bonus row per request, B = ", B,
                 ") = ", want, ", got ", rows);
}

// cu's B values checked (non-decreasing from 0, ending at N; n_what: where N comes from) and
// turned into *out (its width left to ragged_cap_error).
inline std::string ragged_layout_error(const int64_t* cu, int64_t B, int64_t N, const char* n_what, RaggedLayout* out) {
  out->max_drafts = 0;
  out->num_drafts.resize(size_t(B));
  out->draft_start.resize(size_t(B));
  out->first_row.resize(size_t(B));
  int64_t prev = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (cu[b] < prev)
      return b == 0 ? message(
                          "cu_num_draft_tokens must hold non-decreasing inclusive cumulative counts, got "
                          "cu_num_draft_tokens[0] = ",
                          cu[0], " < 0: request 0 would have ", cu[0], " drafts")
                    : message(
                          "cu_num_draft_tokens must hold non-decreasing inclusive cumulative counts, got "
                          "cu_num_draft_tokens[",
                          b, "] = ", cu[b], " < cu_num_draft_tokens[", b - 1, "] = ", prev, ": request ", b,
                          " would have ", cu[b] - prev, " drafts");
    if (cu[b] > N)
      return message("cu_num_draft_tokens must end at N (", n_what, ") = ", N, ", got cu_num_draft_tokens[", b,
                     "] = ", cu[b], " > N (request ", b, ")");
    const size_t i = size_t(b);
    out->num_drafts[i] = cu[b] - prev;  // no overflow: 0 <= prev <= cu[b] <= N
    out->draft_start[i] = prev;
    out->first_row[i] = prev + b;  // < N + B, checked by ragged_rows_error
    out->max_drafts = std::max(out->max_drafts, cu[b] - prev);
    prev = cu[b];
  }
  if (prev != N)
    return B ? message("cu_num_draft_tokens must end at N (", n_what, ") = ", N, ", got cu_num_draft_tokens[", B - 1,
                       "] = ", prev)
             : message("cu_num_draft_tokens must end at N (", n_what, ") = ", N,
                       ", got no requests (B = 0 holds no drafts)");
  return "";
}

// The column cap (cap_name: "max_num_drafts"; the C API: out_tokens' width - 1): >= 0, its
// + 1 in int64, and, given the layout, >= every K_b.
inline std::string ragged_cap_error(const char* cap_name, int64_t cap, const RaggedLayout* l) {
  if (cap < 0) return message(cap_name, " must be >= 0, got ", cap);
  if (cap == INT64_MAX) return message(cap_name, " = ", cap, " is too large (", cap_name, " + 1 overflows int64)");
  if (l)
    for (size_t b = 0; b < l->num_drafts.size(); ++b)
      if (l->num_drafts[b] > cap)
        return message(cap_name, " = ", cap, " is smaller than request ", b, "'s ", l->num_drafts[b],
                       " drafts (cu_num_draft_tokens[", b, "] - ",
                       b ? message("cu_num_draft_tokens[", b - 1, "]") : std::string("0"), ")");
  return "";
}

// pad_id is written into the outputs: it must fit the id dtype (int32 or int64).
inline std::string pad_id_error(int64_t pad, bool int32_ids) {
  if (!int32_ids || (pad >= INT32_MIN && pad <= INT32_MAX)) return "";
  return message("pad_id must fit draft_token_ids' dtype int32, [", INT32_MIN, ", ", INT32_MAX, "], got ", pad);
}

// ---- verify_sampled

inline std::string temperature_error(int64_t b, double t) {
  if (std::isfinite(t) && t >= 0) return "";
  return message("temperature must be finite and >= 0, got temperature[", b, "] = ", t);
}

// One request's filters (verify_sampled.h Filters): top_k >= 0, top_p in (0, 1], min_p in [0, 1)
// (top_p and min_p as fp32 values; off: 0, 1, 0).
inline std::string filter_error(int64_t b, int64_t top_k, double top_p, double min_p) {
  if (top_k < 0) return message("top_k must be >= 0 (0: off), got top_k[", b, "] = ", top_k);
  if (!(top_p > 0 && top_p <= 1)) return message("top_p must lie in (0, 1] (1: off), got top_p[", b, "] = ", top_p);
  if (!(min_p >= 0 && min_p < 1)) return message("min_p must lie in [0, 1) (0: off), got min_p[", b, "] = ", min_p);
  return "";
}

// draft_probs [B, K, V] (dims 3) or, in the ragged layout, [N, V] (dims 2), sizes and element
// strides per dim: every entry finite and >= 0.
inline std::string draft_probs_error(const void* q, DType dt, const int64_t* sizes, const int64_t* strides,
                                     int dims = 3) {
  const int64_t nb = dims == 3 ? sizes[0] : 1, sb = dims == 3 ? strides[0] : 0;
  const int64_t* s = sizes + (dims - 2);
  const int64_t* st = strides + (dims - 2);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < s[0]; ++t)
      for (int64_t i = 0; i < s[1]; ++i) {
        const float v = load_f32(q, dt, b * sb + t * st[0] + i * st[1]);
        if (!(v >= 0) || std::isinf(v))
          return dims == 3 ? message("draft_probs must be probabilities (finite, >= 0), got draft_probs[", b, ", ", t,
                                     ", ", i, "] = ", v)
                           : message("draft_probs must be probabilities (finite, >= 0), got draft_probs[", t, ", ", i,
                                     "] = ", v);
      }
  return "";
}

}  // namespace mtp
