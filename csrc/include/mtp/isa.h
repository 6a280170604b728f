// Run-time instruction-set selection. The best set the CPU supports is used unless
// MTP_ISA (generic|avx2|avx512|avx512_bf16|neon|neon_fp16) asks for another, or set_isa() does
// (tests run every path on one machine that way). Never compiled for the build machine's CPU.
// Avx512Bf16 is Avx512 plus AVX512_BF16 (VDPBF16PS); only the linear layer uses it, and it
// is the default only where VDPBF16PS is as fast as an FMA (see prefers_vdpbf16ps).
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mtp/common.h"

#if defined(__x86_64__) || defined(_M_X64)
#define MTP_X86 1
#define MTP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MTP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define MTP_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")))
// The integer dot products of quantize_x (VPDPBUSD): chosen inside Avx512 / Avx2 when the CPU
// has them (has_avx512_vnni / has_avx_vnni); without them the same integers come from
// VPMADDUBSW + VPMADDWD, so the bits do not depend on it.
#define MTP_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))
#define MTP_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#include <cpuid.h>  // cpuid_bit
#endif
#if defined(__aarch64__)
#define MTP_ARM64 1
// armv8.2-a half-precision vector arithmetic for one function, the rest of the build stays
// armv8.0-a. GCC declares the fp16 intrinsics under a target pragma; clang only guards them
// by target attribute from clang 16 on, older clang gets the fp16 path only when the whole
// build targets armv8.2-a+fp16.
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
#define MTP_NEON_FP16 1
#define MTP_TARGET_NEON_FP16
#elif defined(__clang__) && __clang_major__ >= 16
#define MTP_NEON_FP16 1
#define MTP_TARGET_NEON_FP16 __attribute__((target("fullfp16")))
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9
#define MTP_NEON_FP16 1
#define MTP_TARGET_NEON_FP16 __attribute__((target("arch=armv8.2-a+fp16")))
#endif
// armv8.2-a dot products (SDOT, FEAT_DotProd) for the integer-dot linear step: the same
// scheme. GCC's arm_neon.h declares vdotq_s32 under target("arch=armv8.2-a+dotprod"), and its
// intrinsics only inline into a function whose target includes all of that ("+dotprod" alone
// is refused by GCC 12), so the attribute names the same architecture.
#if defined(__ARM_FEATURE_DOTPROD)
#define MTP_NEON_DOTPROD 1
#define MTP_TARGET_NEON_DOTPROD
#elif defined(__clang__) && __clang_major__ >= 16
#define MTP_NEON_DOTPROD 1
#define MTP_TARGET_NEON_DOTPROD __attribute__((target("dotprod")))
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9
#define MTP_NEON_DOTPROD 1
#define MTP_TARGET_NEON_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
// Run-time detection reads the kernel's hwcaps (Linux and Android: getauxval is in Bionic
// since API 18); elsewhere neither the fp16 nor the dotprod path is chosen automatically.
#if defined(__linux__) || defined(__ANDROID__)
#define MTP_ARM64_HWCAPS 1
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif
#endif

namespace mtp {

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512_bf16";
    case Isa::Neon: return "neon";
    case Isa::NeonFp16: return "neon_fp16";
    default: return "generic";
  }
}

#if defined(MTP_X86)
// A CPUID feature bit (reg: 0 EAX, 1 EBX, 2 ECX, 3 EDX), for the features that
// __builtin_cpu_supports does not name in every compiler (clang 14: "f16c", "avxvnni").
inline bool cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4];
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
#endif

inline bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Generic: return true;
#if defined(MTP_X86)
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_bit(1, 0, 2, 29);  // F16C
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::Avx512Bf16: return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
#endif
#if defined(MTP_ARM64)
    case Isa::Neon: return true;
#endif
#if defined(MTP_NEON_FP16) && defined(MTP_ARM64_HWCAPS)
    case Isa::NeonFp16: return (getauxval(AT_HWCAP) & HWCAP_ASIMDHP) != 0;
#endif
    default: return false;
  }
}

#if defined(MTP_X86)
inline bool has_avx512_vnni() {
  static const bool yes = isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512vnni");
  return yes;
}
inline bool has_avx_vnni() {
  static const bool yes = isa_supported(Isa::Avx2) && cpuid_bit(7, 1, 0, 4);  // AVX-VNNI
  return yes;
}
#endif

#if defined(MTP_ARM64)
// SDOT for quantize_x, chosen inside Neon / NeonFp16 when the CPU has it (FEAT_DotProd, an
// armv8.2-a option: Cortex-A55/A75 on; not the A53/A57/A72); without it the same int32 lanes
// come from SMULL + ADDP + SADALP, so the bits do not depend on it.
inline bool has_neon_dotprod() {
#if defined(MTP_NEON_DOTPROD) && defined(MTP_ARM64_HWCAPS)
  static const bool yes = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return yes;
#else
  return false;
#endif
}
#endif

// Every value, in enum order (lists, parsing, tests).
constexpr Isa kAllIsas[] = {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Neon, Isa::NeonFp16};

// Avx512Bf16 runs every kernel but the linear layer's bf16 path as Avx512.
inline bool is_avx512(Isa isa) { return isa == Isa::Avx512 || isa == Isa::Avx512Bf16; }

// Whether VDPBF16PS pays here: on AMD (Zen 4 measured: it issues one 512-bit instruction per
// cycle, as the FMA does, so 32 products cost what 16 do with FMAs; bench/fma_peak.c,
// bench/history/2026-11.md "VDPBF16PS on AMD") but not on the Intel Xeon measured before (half the
// FMA rate: no faster than two FMAs).
inline bool prefers_vdpbf16ps() {
#if defined(MTP_X86)
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

inline Isa best_isa() {
  if (prefers_vdpbf16ps() && isa_supported(Isa::Avx512Bf16)) return Isa::Avx512Bf16;
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::NeonFp16, Isa::Neon})
    if (isa_supported(isa)) return isa;
  return Isa::Generic;
}

// Parses a name; returns false for an unknown one.
inline bool parse_isa(const char* name, Isa* out) {
  for (Isa isa : kAllIsas)
    if (std::strcmp(name, isa_name(isa)) == 0) {
      *out = isa;
      return true;
    }
  return false;
}

// What parse_isa accepts, for error messages: written from kAllIsas, so it cannot miss one.
inline std::string isa_names() {
  std::string s;
  for (Isa isa : kAllIsas) s += std::string(s.empty() ? "" : ", ") + isa_name(isa);
  return s;
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
