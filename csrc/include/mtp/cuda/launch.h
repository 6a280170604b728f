// Host entry points of the CUDA kernels (csrc/cuda/*.cu), torch-free: raw device pointers,
// element strides and a stream. The torch binding (csrc/cuda/ops.cpp) and any other host
// code call these; only the .cu files see kernel code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mtp/argmax_rule.h"
#include "mtp/attention_args.h"
#include "mtp/cache.h"
#include "mtp/linear_args.h"
#include "mtp/verify_args.h"

namespace mtp::cuda {

// How many vocabulary slices each reachable row is cut into: enough blocks to fill the GPU
// (about 4 per SM), slices of at least 2048 elements. The exact merge makes it invisible.
int verify_splits(int64_t rows, int64_t V, int sm_count);

// Workspace of verify, in device memory, sized by the caller.
struct VerifyWork {
  int splits = 1;
  ArgmaxResult* partials = nullptr;  // [B*(K+1)*splits]
  int64_t* targets = nullptr;        // [B*(K+1)]
};

// a.num_drafts: device pointer (int64, clamped to [0, K] in the kernels) or nullptr.
// out: [B, K+1]; the outputs are written only through `accepted` and `out`.
template <class I>
cudaError_t verify(const VerifyArgs& a, IdView<const I> draft, int64_t pad, I* accepted, IdView<I> out,
                   const VerifyWork& work, cudaStream_t stream);

template <class I, class J>
cudaError_t accept_prefix(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                          const int64_t* num_drafts, I* accepted, cudaStream_t stream);

// x and w rows with unit inner stride; y fp32. K is summed in fixed chunks (mtp/cuda/linear.cuh);
// when they run as blocks of their own, their partial sums go through `workspace`:
// linear_workspace(a) floats of device memory (0: none needed, nullptr is fine).
int64_t linear_workspace(const LinearArgs& a);
cudaError_t linear(const LinearArgs& a, float* workspace, cudaStream_t stream);

constexpr int kAttnMaxD = 256;  // head dims the attention kernels take

// The split of head_attention (fixed kAttnChunk-key chunks) and its workspace in device
// memory: attention_work() fills the counts, the caller allocates ml and acc.
struct AttentionWork {
  int64_t cache_chunks = 0;  // chunks of the longest cache (its capacity L when lengths are unknown)
  int64_t chunks = 0;        // + the local segment's
  int64_t block_rows = 0;    // query rows (t * G + g) per block: 4 or 8 (never in a row's arithmetic)
  int64_t row_blocks = 0;    // ceil(G * T / block_rows)
  int64_t partials = 0;      // partial rows: B * Hkv * chunks * row_blocks * block_rows
  int64_t chunk_blocks = 0;  // blocks along the chunks (each takes chunks y, y + chunk_blocks, ...)
  float* ml = nullptr;       // [partials][2]: (max, sum)
  float* acc = nullptr;      // [partials][D]
};
AttentionWork attention_work(const AttentionArgs& a, int64_t longest_cache, int sm_count);

// a.cache_lens: device int64 values in [0, L]; a.D <= kAttnMaxD; a.out contiguous.
cudaError_t head_attention(const AttentionArgs& a, const AttentionWork& w, cudaStream_t stream);

// a.cache_lens: device int64; nothing is written if a request would pass a.L.
cudaError_t cache_append(const CacheAppendArgs& a, cudaStream_t stream);

// Value checks without a host sync. A kernel that meets a count or length outside its valid
// range records (index + 1) << 32 | the value saturated to int32 in its op's slot of a small
// array (mapped pinned host memory), and the op computes on the value clamped; the binding
// raises at its next call on that device (csrc/cuda/ops.cpp, docs/gpu.md).
enum FlagSlot : int { kFlagVerify, kFlagAccept, kFlagRagged, kFlagAttention, kFlagAppend, kFlagSlots };
struct ValueCheck {
  int64_t lo = 0, hi = 0;              // the valid range
  unsigned long long* flag = nullptr;  // the op's slot (device pointer); nullptr: no check
};

// The index arithmetic the bindings do on the device (no host sync, so also under CUDA graph
// capture), csrc/cuda/layout.cu. I: int32_t or int64_t; src and cu are read with an element stride.
// dst[i] = src[i] clamped to [lo, hi], as int64 (n values); values outside check's range are recorded.
template <class I>
cudaError_t clamp_to_int64(const I* src, int64_t stride, int64_t n, int64_t lo, int64_t hi, int64_t* dst,
                           ValueCheck check, cudaStream_t stream);

// verify_ragged's layout from cu_num_draft_tokens [B] (inclusive cumulative counts) over N
// drafts and W = max drafts + 1: with c_b = cu[b] clamped to [0, N] and prev = c_{b-1} (0 for
// b = 0), counts[b] = c_b - prev clamped to [0, W - 1], first_row[b] = prev + b (its first
// target_logits row), draft_first[b] = prev (its first draft). A cu that is not a valid
// layout (decreasing, past N, not ending at N, a request over W - 1 drafts) is recorded in flag.
template <class I>
cudaError_t ragged_layout(const I* cu, int64_t stride, int64_t B, int64_t N, int64_t W, int64_t* counts,
                          int64_t* first_row, int64_t* draft_first, unsigned long long* flag, cudaStream_t stream);

}  // namespace mtp::cuda
