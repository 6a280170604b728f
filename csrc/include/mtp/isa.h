// Run-time instruction-set selection. The best set the CPU supports is used unless
// MTP_ISA (generic|avx2|avx512|neon) asks for a lower one, or set_isa() does (tests run
// every path on one machine that way). Never compiled for the build machine's CPU.
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "mtp/common.h"

#if defined(__x86_64__) || defined(_M_X64)
#define MTP_X86 1
#define MTP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MTP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#endif
#if defined(__aarch64__)
#define MTP_ARM64 1
#endif

namespace mtp {

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    default: return "generic";
  }
}

inline bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Generic: return true;
#if defined(MTP_X86)
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
#if defined(MTP_ARM64)
    case Isa::Neon: return true;
#endif
    default: return false;
  }
}

inline Isa best_isa() {
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Neon})
    if (isa_supported(isa)) return isa;
  return Isa::Generic;
}

// Parses a name; returns false for an unknown one.
inline bool parse_isa(const char* name, Isa* out) {
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Neon})
    if (std::strcmp(name, isa_name(isa)) == 0) { *out = isa; return true; }
  return false;
}

namespace detail {
inline std::atomic<int32_t>& isa_slot() {
  static std::atomic<int32_t> slot([] {
    Isa isa = best_isa();
    const char* env = std::getenv("MTP_ISA");
    Isa wanted;
    if (env && parse_isa(env, &wanted) && isa_supported(wanted)) isa = wanted;
    return int32_t(isa);
  }());
  return slot;
}
}  // namespace detail

inline Isa current_isa() { return Isa(detail::isa_slot().load(std::memory_order_relaxed)); }

// Returns false (and changes nothing) when the CPU lacks the set.
inline bool set_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  detail::isa_slot().store(int32_t(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace mtp
