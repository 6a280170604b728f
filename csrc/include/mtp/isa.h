// Run-time instruction-set selection: one table of the sets (MTP_ISA_TABLE) and one dispatch
// (dispatch() below). The best set the CPU supports is used unless MTP_ISA (a name of the
// table) asks for another, or set_isa() does (tests run every path on one machine that way).
// Never compiled for the build machine's CPU: a set's kernels carry its target attribute.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#define MTP_X86 1
#include <cpuid.h>  // cpuid_bit
// The integer dot products of quantize_x (VPDPBUSD): chosen inside Avx512 / Avx2 when the CPU
// has them (has_avx512_vnni / has_avx_vnni); without them the same integers come from
// VPMADDUBSW + VPMADDWD, so the bits do not depend on it.
#define MTP_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))
#define MTP_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#endif
#if defined(__aarch64__)
#define MTP_ARM64 1
// armv8.2-a half-precision vector arithmetic for one function, the rest of the build stays
// armv8.0-a. GCC declares the fp16 intrinsics under a target pragma; clang only guards them
// by target attribute from clang 16 on, older clang gets the fp16 path only when the whole
// build targets armv8.2-a+fp16 (MTP_NEON_FP16 0 otherwise: neon_fp16 is never supported).
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
#define MTP_NEON_FP16 1
#define MTP_NEON_FP16_TARGET
#elif defined(__clang__) && __clang_major__ >= 16
#define MTP_NEON_FP16 1
#define MTP_NEON_FP16_TARGET __attribute__((target("fullfp16")))
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9
#define MTP_NEON_FP16 1
#define MTP_NEON_FP16_TARGET __attribute__((target("arch=armv8.2-a+fp16")))
#else
#define MTP_NEON_FP16 0
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
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

// MTP_ONLY_<arch>(code): the code in a build for that architecture, nothing elsewhere, so an
// aarch64 build (the NDK's included) never sees x86 code and an x86 build no NEON code.
#define MTP_ONLY_generic(...) __VA_ARGS__
#if defined(MTP_X86)
#define MTP_ONLY_x86(...) __VA_ARGS__
#else
#define MTP_ONLY_x86(...)
#endif
#if defined(MTP_ARM64)
#define MTP_ONLY_neon(...) __VA_ARGS__
#else
#define MTP_ONLY_neon(...)
#endif

// The instruction sets, one row each: X(enum, name, arch, runs_as, target, detection).
//   enum       the Isa value and the set's tag type, arch::enum (see dispatch);
//   name       what MTP_ISA, set_isa and mtp_set_isa take and isa_name() returns;
//   arch       the namespace of its kernels (generic, x86, neon): the row's code is compiled
//              only for that architecture (MTP_ONLY_<arch>);
//   runs_as    the set whose kernel an op runs where this set has none of its own (the tag
//              derives from it): Avx512Bf16 is Avx512 but for the linear layer's bf16 path;
//   target     the attribute of a function compiled for the set, MTP_TARGET(enum) (the build
//              stays at the baseline, x86-64 or armv8.0-a: never -march);
//   detection  whether this CPU has it (isa_supported).
// Rows in enum order: lists, parsing and messages follow it; best_isa takes the last
// supported row. Features chosen inside a set (VNNI, AVX-VNNI, dotprod) are not rows: each
// has a has_*() and an MTP_TARGET_* of its own.
#define MTP_ISA_Generic(X) X(Generic, "generic", generic, IsaRoot, , true)
#define MTP_ISA_Avx2(X)                                                            \
  X(Avx2, "avx2", x86, generic::Generic, __attribute__((target("avx2,fma,f16c"))), \
    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_bit(1, 0, 2, 29)) /* F16C */
#define MTP_ISA_Avx512(X)                                                                                            \
  X(Avx512, "avx512", x86, generic::Generic, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), \
    __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && \
        __builtin_cpu_supports("avx512dq"))
#define MTP_ISA_Avx512Bf16(X)                                                          \
  X(Avx512Bf16, "avx512_bf16", x86, Avx512,                                            \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16"))), \
    isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512bf16"))
#define MTP_ISA_Neon(X) X(Neon, "neon", neon, generic::Generic, , true)
#define MTP_ISA_NeonFp16(X) \
  X(NeonFp16, "neon_fp16", neon, Neon, MTP_NEON_FP16_TARGET, hwcap(HWCAP_ASIMDHP) && MTP_NEON_FP16)
#define MTP_ISA_TABLE(X) \
  MTP_ISA_Generic(X) MTP_ISA_Avx2(X) MTP_ISA_Avx512(X) MTP_ISA_Avx512Bf16(X) MTP_ISA_Neon(X) MTP_ISA_NeonFp16(X)

// The target attribute of set E (a row's target column), e.g. MTP_TARGET(Avx2).
#define MTP_TARGET(E) MTP_ISA_##E(MTP_ISA_TARGET_OF)
#define MTP_ISA_TARGET_OF(E, name, arch, runs_as, target, detection) target

namespace mtp {

#define MTP_ISA_X(E, ...) E,
enum class Isa : int32_t { MTP_ISA_TABLE(MTP_ISA_X) };
#undef MTP_ISA_X
// Every value, in enum order (lists, parsing, tests).
#define MTP_ISA_X(E, ...) Isa::E,
constexpr Isa kAllIsas[] = {MTP_ISA_TABLE(MTP_ISA_X)};
#undef MTP_ISA_X

// The tag types: arch::E derives from its runs_as (generic::Generic from IsaRoot).
struct IsaRoot {};
#define MTP_ISA_X(E, name, arch, runs_as, ...) \
  MTP_ONLY_##arch(namespace arch {             \
    struct E : runs_as {};                     \
  })
MTP_ISA_TABLE(MTP_ISA_X)
#undef MTP_ISA_X

inline const char* isa_name(Isa isa) {
  switch (isa) {
#define MTP_ISA_X(E, name, ...) \
  case Isa::E: return name;
    MTP_ISA_TABLE(MTP_ISA_X)
#undef MTP_ISA_X
  }
  return "generic";
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
#if defined(MTP_ARM64)
inline bool hwcap(unsigned long bit) {
#if defined(MTP_ARM64_HWCAPS)
  return (getauxval(AT_HWCAP) & bit) != 0;
#else
  return (void)bit, false;
#endif
}
#endif

// The detection column, for this architecture's rows (false for the others'). A build with
// MTP_PORTABLE_ONLY (CMake option of that name) has the generic kernels alone.
inline bool isa_supported(Isa isa) {
#if defined(MTP_PORTABLE_ONLY)
  return isa == Isa::Generic;
#else
  switch (isa) {
#define MTP_ISA_X(E, name, arch, runs_as, target, detection) \
  case Isa::E: return MTP_ONLY_##arch((detection) ||) false;
    MTP_ISA_TABLE(MTP_ISA_X)
#undef MTP_ISA_X
  }
  return false;
#endif
}

// The one dispatch: f(tag) with the tag of `isa` (a value of the table's enum column, of a set
// of this architecture; any other runs as generic::Generic). An op's kernels are overloads of
// one function on the tags, beside the kernels (generic/, x86/, neon/), found by argument-
// dependent lookup: op(isa, ...) { return dispatch(isa, [&](auto set) { return kernel(set, ...); }); }.
// A set without its own overload gets the nearest base's (the runs_as column), then Generic's.
template <class F>
decltype(auto) dispatch(Isa isa, F&& f) {
#if defined(MTP_PORTABLE_ONLY)
  return (void)isa, f(generic::Generic{});
#else
  switch (isa) {
#define MTP_ISA_X(E, name, arch, ...) MTP_ONLY_##arch(case Isa::E : return f(arch::E{});)
    MTP_ISA_TABLE(MTP_ISA_X)
#undef MTP_ISA_X
    default: return f(generic::Generic{});
  }
#endif
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
#if defined(MTP_NEON_DOTPROD)
  static const bool yes = hwcap(HWCAP_ASIMDDP);
  return yes;
#else
  return false;
#endif
}
#endif

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

// Whether the GGUF x8 kernel's two-group AVX-512 VNNI tile (x86/gguf.h: x8_tile16) pays from
// one row: on Intel (the Xeon measured: faster at every row count, no slower from DRAM), not
// on AMD (Zen 4 reads its two weight streams from DRAM at half the one-group tile's speed).
inline bool wide_tile_pays() {
#if defined(MTP_X86)
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

// The last supported row; Avx512Bf16 only where VDPBF16PS pays.
inline Isa best_isa() {
  for (auto i = std::size(kAllIsas); i-- > 1;)
    if (isa_supported(kAllIsas[i]) && (kAllIsas[i] != Isa::Avx512Bf16 || prefers_vdpbf16ps())) return kAllIsas[i];
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
