// Splitting work over the GpSimd cores of a multicore op.
#pragma once

#include <neuron/neuron-utils.hpp>

#include <algorithm>
#include <cstdint>

namespace nki_ops {

struct Span {
  int64_t begin;
  int64_t end;
};

// This core's share of `total` items: contiguous, as even as possible (the first total % cores
// cores take one more), correct for any total and any core count.
inline Span core_span(int64_t total) {
  const int64_t cores = get_cpu_count(), id = get_cpu_id();
  const int64_t base = total / cores, extra = total % cores;
  const int64_t begin = id * base + std::min(id, extra);
  return Span{begin, begin + base + (id < extra ? 1 : 0)};
}

}  // namespace nki_ops
