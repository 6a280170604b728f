// The one schema file of the `mtp` op namespace, and the entry point of mtp_kernels._C.
// Kernels register per dispatch key elsewhere (cpu/, cuda/); fake kernels live in
// mtp_kernels/ops.py. Registered through torch's stable C ABI and built on Python's limited
// API (3.10): one build serves later torch and Python releases (docs/torch-versions.md).
#include <Python.h>
#include <string>
#include <torch/csrc/stable/library.h>

#include "mtp/isa.h"

STABLE_TORCH_LIBRARY(mtp, m) {
  m.def(
      "verify(Tensor draft_tokens, Tensor target_logits, Tensor? num_drafts=None, int pad_id=-1)"
      " -> (Tensor accepted, Tensor out_tokens)");
  // The flattened ragged layout (continuous batching): draft_token_ids [N], inclusive
  // cumulative counts cu_num_draft_tokens [B], target_logits [N + B, V]; out_tokens [B, W].
  m.def(
      "verify_ragged(Tensor draft_token_ids, Tensor cu_num_draft_tokens, Tensor target_logits, int pad_id=-1,"
      " int? max_num_drafts=None) -> (Tensor accepted, Tensor out_tokens)");
  m.def(
      "verify_sampled(Tensor draft_tokens, Tensor? draft_probs, Tensor target_logits, Tensor temperature,"
      " Tensor seeds, Tensor? offsets=None, Tensor? num_drafts=None, int pad_id=-1, Tensor? top_k=None,"
      " Tensor? top_p=None, Tensor? min_p=None) -> (Tensor accepted, Tensor out_tokens)");
  // verify_sampled in verify_ragged's flattened layout: draft_probs [N, V] (row cu[b-1] + j),
  // target_logits [N + B, V], per-request values [B]; out_tokens [B, W].
  m.def(
      "verify_sampled_ragged(Tensor draft_token_ids, Tensor? draft_probs, Tensor cu_num_draft_tokens,"
      " Tensor target_logits, Tensor temperature, Tensor seeds, Tensor? offsets=None, int pad_id=-1,"
      " Tensor? top_k=None, Tensor? top_p=None, Tensor? min_p=None, int? max_num_drafts=None)"
      " -> (Tensor accepted, Tensor out_tokens)");
  m.def(
      "verify_lenient(Tensor draft_tokens, Tensor target_logits, Tensor? num_drafts=None, int top_k=1,"
      " float min_ratio=1.0, int pad_id=-1) -> (Tensor accepted, Tensor out_tokens)");
  m.def("accept_prefix(Tensor draft_tokens, Tensor target_tokens, Tensor? num_drafts=None) -> Tensor accepted");
  // gguf_type (linear), weight_types (decoder_layers), embedding_type / lm_head_type (head_draft):
  // GGML type numbers of uint8 weights stored as in a .gguf file (mtp/gguf.h); -1 / None: a
  // float (or Q8 int8) weight.
  m.def(
      "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? weight_scale=None, *, bool quantize_x=False,"
      " int? gguf_type=None) -> Tensor");
  m.def(
      "head_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_lens, Tensor? k_local=None,"
      " Tensor? v_local=None, float? scale=None, bool causal=False, *, int? window=None) -> Tensor");
  m.def("cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, Tensor cache_lens) -> ()");
  // The row-local layer ops between the projections (rowwise.h): each row alone, the same
  // bits on every instruction set.
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor sum, Tensor normed)");
  m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("gelu_tanh_mul(Tensor gate_up) -> Tensor");
  // A whole decoder pass (decoder_layers.h): the ops above, every layer, in one call.
  // taps (layer indices, strictly increasing, each in [0, layers)) with tap_out [len(taps), B, T,
  // H] (x's dtype and device, contiguous; both or neither, an empty list taps nothing): after
  // layer taps[j], tap_out[j] receives the residual stream (the sum after that layer's MLP add,
  // before the next input norm or the final norm: HF's hidden_states[taps[j] + 1]), the bits
  // the pass carries on.
  m.def(
      "decoder_layers(Tensor x, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_lens, Tensor rope_cos,"
      " Tensor rope_sin, Tensor[] weights, Tensor[] weight_scales, int num_heads, float eps, *,"
      " bool quantize_x=False, Tensor? tree_parents=None, int[]? weight_types=None, str layer=\"llama\","
      " int[]? windows=None, Tensor? rope_cos_local=None, Tensor? rope_sin_local=None,"
      " float? attention_scale=None, int[]? taps=None, Tensor(c!)? tap_out=None) -> Tensor");
  // The MTP head's k draft steps (head_draft.h): its blocks read one layer's cache in place.
  // probs_out [B, k] float32 (any strides) receives each draft's probability under the head
  // (its softmax over the draft vocabulary): how many drafts a caller verifies.
  m.def(
      "head_draft(Tensor hidden, Tensor token, Tensor k_cache, Tensor v_cache, Tensor cache_lens, Tensor rope_cos,"
      " Tensor rope_sin, Tensor embedding, Tensor? embedding_scale, Tensor[] weights, Tensor lm_head,"
      " Tensor? lm_head_scale, Tensor? draft_vocab, int k, int num_heads, float eps, *, int alternatives=0,"
      " int embedding_type=-1, int lm_head_type=-1, int[]? weight_types=None, Tensor(a!)? probs_out=None) -> Tensor");
  // Rows `tokens` (any shape, int32/int64) of an embedding table [V, H] of any weight kind above
  // (float; int8 with weight_scale; gguf_type: GGUF bytes), dequantized in fp32 and rounded once
  // to dtype (None: a float table's own, else float32): [*tokens.shape, H] (embedding.h).
  m.def(
      "embedding(Tensor tokens, Tensor weight, Tensor? weight_scale=None, *, int? gguf_type=None,"
      " ScalarType? dtype=None) -> Tensor");
}

// Module-level helpers: which vector path the CPU kernels take (tests run them all).
static PyObject* get_isa(PyObject*, PyObject*) { return PyUnicode_FromString(mtp::isa_name(mtp::current_isa())); }

static PyObject* set_isa(PyObject*, PyObject* arg) {
  const char* name = PyUnicode_AsUTF8AndSize(arg, nullptr);  // PyUnicode_AsUTF8 is not in the 3.10 limited API
  if (!name) return nullptr;
  mtp::Isa isa;
  if (!mtp::parse_isa(name, &isa)) {
    PyErr_Format(PyExc_ValueError, "unknown instruction set '%s' (expected one of %s)", name, mtp::isa_names().c_str());
    return nullptr;
  }
  if (!mtp::set_isa(isa)) {
    PyErr_Format(PyExc_RuntimeError, "this CPU does not support the '%s' instruction set", name);
    return nullptr;
  }
  Py_RETURN_NONE;
}

static PyObject* supported_isas(PyObject*, PyObject*) {
  PyObject* list = PyList_New(0);
  for (mtp::Isa isa : mtp::kAllIsas)
    if (mtp::isa_supported(isa)) {
      PyObject* s = PyUnicode_FromString(mtp::isa_name(isa));
      PyList_Append(list, s);
      Py_DECREF(s);
    }
  return list;
}

#ifndef MTP_WITH_CUDA
#define MTP_WITH_CUDA 0
#endif

#if MTP_WITH_CUDA
namespace mtp::cuda {
std::string recorded_error(int index);  // csrc/cuda/ops.cpp
}

// The bad value an earlier call recorded on CUDA device `index` (and clears it): RuntimeError.
static PyObject* device_check(PyObject*, PyObject* arg) {
  const long index = PyLong_AsLong(arg);
  if (index == -1 && PyErr_Occurred()) return nullptr;
  std::string msg;
  try {
    msg = mtp::cuda::recorded_error(int(index));
  } catch (const std::exception& e) {
    msg = e.what();
  }
  if (!msg.empty()) {
    PyErr_SetString(PyExc_RuntimeError, msg.c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}
#endif

static PyMethodDef kMethods[] = {
    {"get_isa", get_isa, METH_NOARGS, "The instruction set the CPU kernels use now."},
    {"set_isa", set_isa, METH_O,
     "Select the CPU kernels' instruction set (generic, avx2, avx512, avx512_bf16, neon, neon_fp16)."},
    {"supported_isas", supported_isas, METH_NOARGS, "Instruction sets this CPU supports."},
#if MTP_WITH_CUDA
    {"device_check", device_check, METH_O,
     "Raise what the CUDA kernels recorded on device `index` since the last look (no sync)."},
#endif
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_C", "mtp_kernels native ops", -1, kMethods, nullptr, nullptr, nullptr, nullptr};

// _C.with_cuda: whether the C++ CUDA kernels are compiled in (else Triton serves CUDA).
PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&kModule);
  if (m && PyModule_AddIntConstant(m, "with_cuda", MTP_WITH_CUDA) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
