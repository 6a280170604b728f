// Embedding rows gathered and dequantized, torch-free: mtp.embedding, mtp_embedding and each
// draft step of head_draft.h. Row `id` of a table of any weight kind the kernels read (float,
// Q8 int8 with its scales, a GGUF block type in the file's or the x8 layout), in fp32, rounded
// once to the activations' dtype: the bits reference.embedding gives.
#pragma once
#include <vector>

#include "mtp/decoder_layers.h"

namespace mtp {

// Row `id` of the embedding e ([V, H]) into out (H values of dt): a Q8 row q * scale in fp32,
// a GGUF block-type row (e.stride bytes apart) dequantize_row in fp32, each rounded once.
inline void embedding_row(const DecoderMatrix& e, int64_t H, int64_t id, DType dt, void* out) {
  if (is_block_type(e.dtype)) {
    thread_local std::vector<float> row;
    row.resize(size_t(H));
    dequantize_row(e.dtype, static_cast<const uint8_t*>(e.w), e.stride, id, H, row.data());
    for (int64_t k = 0; k < H; ++k) store_f32(out, dt, k, row[size_t(k)]);
    return;
  }
  for (int64_t k = 0; k < H; ++k) {
    const float v = e.dtype == DType::I8 ? float(static_cast<const int8_t*>(e.w)[id * e.stride + k]) *
                                               e.scale[id * e.scale_stride + k / kQ8Block]
                                         : load_f32(e.w, e.dtype, id * e.stride + k);
    store_f32(out, dt, k, v);
  }
}

struct EmbeddingArgs {
  DecoderMatrix table;           // [V, H]
  int64_t H = 0;                 // row length in elements
  int64_t n = 0;                 // rows to gather
  const int64_t* ids = nullptr;  // [n], each in [0, V): the caller checks them
  DType dtype = DType::F32;      // out's (F32 or BF16)
  void* out = nullptr;           // [n, H], rows out_stride elements apart
  int64_t out_stride = 0;
};

// out[i] = row ids[i] of the table. One thread: a decode pass gathers a few rows (a whole
// prefill's are microseconds beside its matrices).
inline void embedding(const EmbeddingArgs& a) {
  const int64_t es = dtype_size(a.dtype);
  for (int64_t i = 0; i < a.n; ++i)
    embedding_row(a.table, a.H, a.ids[i], a.dtype, static_cast<char*>(a.out) + i * a.out_stride * es);
}

}  // namespace mtp
