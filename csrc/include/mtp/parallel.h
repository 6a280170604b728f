// Portable parallel_for for torch-free callers (the C API): n work items split into
// `threads` contiguous ranges, the first run by the calling thread. No pool: a verify
// step is one call per decoding step, and thread start-up (~10 us) is small next to a
// vocabulary scan. The kernels never depend on the split, so any thread count gives the
// same bits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace mtp {

// A thread count of 0 means one per hardware thread.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

struct ThreadParallelFor {
  int threads = 1;

  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    const int64_t parts = std::min<int64_t>(std::max(threads, 1), n);
    if (parts <= 1) {
      if (n > 0) fn(int64_t(0), n);
      return;
    }
    // Range p is [n*p/parts, n*(p+1)/parts).
    std::vector<std::thread> pool;
    pool.reserve(size_t(parts - 1));
    for (int64_t p = 1; p < parts; ++p) {
      const int64_t b = n * p / parts, e = n * (p + 1) / parts;
#if defined(__cpp_exceptions)
      try {
        pool.emplace_back([&fn, b, e] { fn(b, e); });
      } catch (...) {  // no thread to be had (resource limits): run that range here
        fn(b, e);
      }
#else
      pool.emplace_back([&fn, b, e] { fn(b, e); });
#endif
    }
    fn(int64_t(0), n / parts);
    for (auto& t : pool) t.join();
  }
};

}  // namespace mtp
