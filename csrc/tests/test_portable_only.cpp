// A build with MTP_PORTABLE_ONLY (CMake option; bench/gpu_check.sh's build): only the generic
// set is supported, the best set is generic, and dispatch runs the generic kernel whatever
// set is asked for. Compiled with the define, on its own (the core library is built without it).
#include <cstdio>
#include <type_traits>

#include "mtp/isa.h"

int main() {
  using namespace mtp;
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) std::printf("FAIL: %s\n", what);
    failures += !ok;
  };
  expect(best_isa() == Isa::Generic, "best_isa() is generic");
  for (Isa isa : kAllIsas) {
    expect(isa_supported(isa) == (isa == Isa::Generic), isa_name(isa));
    const bool generic = dispatch(isa, [](auto set) { return std::is_same_v<decltype(set), generic::Generic>; });
    expect(generic, "dispatch runs the generic kernel");
  }
  std::printf("%s\n", failures ? "portable_only: FAILED" : "portable_only: ok");
  return failures ? 1 : 0;
}
