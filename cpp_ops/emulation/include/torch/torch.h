// CPU emulation of the GpSimd device's <torch/torch.h>: the device-subset tensor library only.
// Kernels (compute sources) compile against this header instead of PyTorch's; any API the device
// lacks is missing here too, so such code fails to compile on CPU as it would for the device.
#pragma once

#include "../neuron_emulation/ops.hpp"
#include "../neuron_emulation/tensor.hpp"
