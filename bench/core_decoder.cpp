// Times mtp_decoder_layers (the C API, no torch) on a made-up model of SmolLM2-135M's shapes
// (30 layers, H 576, 9 query / 3 KV heads of 64, I 1536; bf16, random weights), cache of 200
// positions: a pass over T = 1, 5, 9 tokens with 1 and 2 threads, best and median of `calls`
// passes. What an on-device integrator's decoding step costs without the LM head.
//   g++ -O3 -std=c++17 -Icsrc/include bench/core_decoder.cpp csrc/core/*.cpp -pthread -o /tmp/core_decoder
//   /tmp/core_decoder [calls]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "mtp/common.h"
#include "mtp/mtp.h"

namespace {
constexpr int64_t kLayers = 30, H = 576, Hq = 9, Hkv = 3, D = 64, I = 1536, L = 256, kCache = 200;

struct Model {
  std::vector<std::vector<uint16_t>> tensors;  // per layer the 6 parts, then the final norm
  std::vector<std::vector<int64_t>> sizes;
  std::vector<mtp_tensor> views;
  std::vector<const mtp_tensor*> ptrs;
  std::vector<uint16_t> k_cache, v_cache;
  std::vector<float> cos, sin;

  Model() : k_cache(size_t(kLayers * Hkv * L * D)), v_cache(k_cache.size()), cos(size_t(L * D)), sin(cos.size()) {
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto add = [&](std::vector<int64_t> shape, float scale, bool norm) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<uint16_t> t(static_cast<size_t>(n));
      for (auto& v : t) v = mtp::f32_to_bf16(norm ? 1.f + 0.1f * normal(rng) : scale * normal(rng));
      tensors.push_back(std::move(t));
      sizes.push_back(std::move(shape));
    };
    for (int64_t l = 0; l < kLayers; ++l) {
      add({H}, 0, true);
      add({(Hq + 2 * Hkv) * D, H}, 1.f / std::sqrt(float(H)), false);
      add({H, Hq * D}, 1.f / std::sqrt(float(Hq * D)), false);
      add({H}, 0, true);
      add({2 * I, H}, 1.f / std::sqrt(float(H)), false);
      add({H, I}, 1.f / std::sqrt(float(I)), false);
    }
    add({H}, 0, true);
    for (size_t i = 0; i < tensors.size(); ++i)
      views.push_back(mtp_contiguous(tensors[i].data(), MTP_BFLOAT16, int32_t(sizes[i].size()), sizes[i].data()));
    for (auto& v : views) ptrs.push_back(&v);
    for (int64_t p = 0; p < L; ++p)
      for (int64_t j = 0; j < D / 2; ++j) {
        const double a = double(p) * std::pow(10000.0, -2.0 * double(j) / double(D));
        cos[size_t(p * D + j)] = cos[size_t(p * D + j + D / 2)] = float(std::cos(a));
        sin[size_t(p * D + j)] = sin[size_t(p * D + j + D / 2)] = float(std::sin(a));
      }
  }

  // One pass over T tokens at positions len.. (random embeddings); returns its seconds.
  double pass(int64_t T, int64_t len, int threads) {
    std::vector<uint16_t> x(size_t(T * H)), out(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = mtp::f32_to_bf16(float(int(i * 7919 % 1000) - 500) / 500.f);
    const int64_t xs[3] = {1, T, H}, cs[5] = {kLayers, 1, Hkv, L, D}, one = 1, ts[2] = {L, D};
    const mtp_tensor xv = mtp_contiguous(x.data(), MTP_BFLOAT16, 3, xs),
                     ov = mtp_contiguous(out.data(), MTP_BFLOAT16, 3, xs);
    const mtp_tensor kc = mtp_contiguous(k_cache.data(), MTP_BFLOAT16, 5, cs);
    const mtp_tensor vc = mtp_contiguous(v_cache.data(), MTP_BFLOAT16, 5, cs);
    const mtp_tensor lens = mtp_contiguous(&len, MTP_INT64, 1, &one);
    const mtp_tensor cv = mtp_contiguous(cos.data(), MTP_FLOAT32, 2, ts),
                     sv = mtp_contiguous(sin.data(), MTP_FLOAT32, 2, ts);
    const auto start = std::chrono::steady_clock::now();
    const mtp_status st = mtp_decoder_layers(&xv, &kc, &vc, &lens, &cv, &sv, ptrs.data(), int32_t(ptrs.size()), nullptr,
                                             0, Hq, 1e-5f, 0, &ov, threads);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (st != MTP_OK) {
      std::fprintf(stderr, "mtp_decoder_layers: %s\n", mtp_last_error());
      std::exit(1);
    }
    return s;
  }
};
}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 30;
  Model m;
  m.pass(kCache, 0, 2);  // fills the cache's first 200 positions
  std::printf("ISA %s, cache %lld positions\n", mtp_get_isa(), (long long)kCache);
  for (int threads : {1, 2})
    for (int64_t T : {1, 5, 9}) {
      std::vector<double> t;
      for (int i = 0; i < calls; ++i) t.push_back(m.pass(T, kCache, threads));
      std::sort(t.begin(), t.end());
      std::printf("threads=%d T=%lld best %.2f ms median %.2f ms\n", threads, (long long)T, t[0] * 1e3,
                  t[t.size() / 2] * 1e3);
    }
}
