// GIoU backward on the GpSimd cores: grad[B, N], boxes1[B, N, 4], boxes2[B, N, 4] -> [B, N, 8],
// the gradient for boxes1 in [..., :4] and for boxes2 in [..., 4:] (one tensor: an op returns one).
// Same partition and tiling as the forward, with kTile pairs per tile (about 8.5 KiB of TCM).
#include <torch/torch.h>
#include <neuron/neuron-utils.hpp>

#include <algorithm>

#include "../common/partition.hpp"
#include "giou_math.hpp"

namespace {
constexpr int64_t kTile = 128;
}

torch::Tensor giou_backward(const torch::Tensor& grad, const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  torch::Tensor out = get_dst_tensor();
  const nki_ops::Span mine = nki_ops::core_span(grad.numel());
  auto* grad_tile = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * kTile));
  auto* tile1 = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kTile));
  auto* tile2 = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kTile));
  auto* result = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 8 * kTile));
  if (grad_tile != nullptr && tile1 != nullptr && tile2 != nullptr && result != nullptr) {
    auto grad_in = grad.tcm_accessor();
    auto in1 = boxes1.tcm_accessor();
    auto in2 = boxes2.tcm_accessor();
    auto dst = out.tcm_accessor();
    for (int64_t start = mine.begin; start < mine.end; start += kTile) {
      const int64_t count = std::min(kTile, mine.end - start);
      grad_in.tensor_to_tcm<float>(grad_tile, start, count);
      in1.tensor_to_tcm<float>(tile1, 4 * start, 4 * count);
      in2.tensor_to_tcm<float>(tile2, 4 * start, 4 * count);
      std::fill(result, result + 8 * count, 0.0f);
      for (int64_t i = 0; i < count; ++i)
        nki_ops::giou_pair_backward(tile1 + 4 * i, tile2 + 4 * i, grad_tile[i], result + 8 * i, result + 8 * i + 4);
      dst.tcm_to_tensor<float>(result, 8 * start, 8 * count);
    }
  }
  torch::neuron::tcm_free(result);
  torch::neuron::tcm_free(tile2);
  torch::neuron::tcm_free(tile1);
  torch::neuron::tcm_free(grad_tile);
  return out;
}
