// CPU emulation of the GpSimd device's <neuron/neuron-utils.hpp>: which core runs, how many run,
// and the op's output tensor.
#pragma once

#include <cstdint>

#include "../torch/torch.h"

// The simulated core running this call; only meaningful in multicore mode.
inline uint32_t get_cpu_id() {
  auto& core = neuron_emulation::current_core();
  if (!core.call->multicore)
    neuron_emulation::fail("get_cpu_id() in single-core mode: the device does not specify its value; build with multicore=True");
  return static_cast<uint32_t>(core.id);
}

inline uint32_t get_cpu_count() {
  auto& core = neuron_emulation::current_core();
  if (!core.call->multicore)
    neuron_emulation::fail("get_cpu_count() in single-core mode: the device does not specify its value; build with multicore=True");
  return static_cast<uint32_t>(core.call->core_count);
}

// The op's output, allocated from the shape function's sizes and dtype and shared by every core.
inline torch::Tensor get_dst_tensor() {
  auto& core = neuron_emulation::current_core();
  core.dst_claimed = true;
  // A non-owning handle: the driver owns the output for the whole call.
  return torch::Tensor(std::shared_ptr<neuron_emulation::TensorImpl>(core.call->dst, [](neuron_emulation::TensorImpl*) {}));
}
