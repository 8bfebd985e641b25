// Which vector path the CPU kernels take (gemv.cpp, attention.cpp): chosen at run time from what the CPU
// supports, lowered by ``nonstop_cpu::limit_isa`` so tests run every path the CPU has. One level for all
// kernels of the process (inline functions: one instance across the extension's sources).
#pragma once
#include <algorithm>
#include <cstdint>

namespace nonstop_cpu_isa {

inline int supported() {  // 2: AVX-512, 1: AVX2+FMA, 0: scalar
  static int level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 2
                     : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
  return level;
}

inline int& level() {
  static int current = supported();
  return current;
}

// Use at most ``wanted`` (tests run every path the CPU has); returns the level in effect.
inline int64_t limit(int64_t wanted) {
  level() = int(std::min<int64_t>(std::max<int64_t>(wanted, 0), supported()));
  return level();
}

}  // namespace nonstop_cpu_isa
