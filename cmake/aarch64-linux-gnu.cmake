# Cross-compiling the torch-free core (-DMTP_CORE_ONLY=ON) for aarch64 Linux with Debian's
# g++-aarch64-linux-gnu; ctest then runs the test binaries under qemu-user:
#   cmake -S . -B build/aarch64 -DMTP_CORE_ONLY=ON -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   QEMU_CPU=cortex-a53 ctest --test-dir build/aarch64     # or -DMTP_QEMU_CPU=cortex-a53
# Only armv8.0-a is assumed at compile time; the fp16 path is chosen at run time.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(MTP_AARCH64_PREFIX "aarch64-linux-gnu-" CACHE STRING "Cross tool prefix")
set(CMAKE_C_COMPILER ${MTP_AARCH64_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${MTP_AARCH64_PREFIX}g++)

# Where the target's libc and libstdc++ live (Debian's cross packages install them here).
set(MTP_AARCH64_SYSROOT "/usr/aarch64-linux-gnu" CACHE PATH "Target runtime libraries for qemu -L")
set(CMAKE_FIND_ROOT_PATH ${MTP_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The CPU model qemu emulates: empty leaves it to the QEMU_CPU environment variable (or
# qemu's default, which has every feature). cortex-a53 lacks fp16 arithmetic; max has it.
set(MTP_QEMU_CPU "" CACHE STRING "qemu-aarch64 -cpu model for running tests")
if(MTP_QEMU_CPU)
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${MTP_AARCH64_SYSROOT} -cpu ${MTP_QEMU_CPU})
else()
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${MTP_AARCH64_SYSROOT})
endif()
