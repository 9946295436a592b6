// GIoU forward on the GpSimd cores: boxes1[B, N, 4] x boxes2[B, N, 4] -> [B, N] (float32, xyxy).
// The B*N pairs are split evenly over the cores; each core streams its share through TCM in
// tiles of kTile pairs (2 x 4 KiB of boxes and 1 KiB of results, well inside the 16 KiB pool).
#include <torch/torch.h>
#include <neuron/neuron-utils.hpp>

#include <algorithm>

#include "../common/partition.hpp"
#include "giou_math.hpp"

namespace {
constexpr int64_t kTile = 256;
}

torch::Tensor giou(const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  torch::Tensor out = get_dst_tensor();
  const nki_ops::Span mine = nki_ops::core_span(out.numel());
  auto* tile1 = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kTile));
  auto* tile2 = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * 4 * kTile));
  auto* result = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * kTile));
  if (tile1 != nullptr && tile2 != nullptr && result != nullptr) {
    auto in1 = boxes1.tcm_accessor();
    auto in2 = boxes2.tcm_accessor();
    auto dst = out.tcm_accessor();
    for (int64_t start = mine.begin; start < mine.end; start += kTile) {
      const int64_t count = std::min(kTile, mine.end - start);
      in1.tensor_to_tcm<float>(tile1, 4 * start, 4 * count);
      in2.tensor_to_tcm<float>(tile2, 4 * start, 4 * count);
      for (int64_t i = 0; i < count; ++i) result[i] = nki_ops::giou_pair(tile1 + 4 * i, tile2 + 4 * i);
      dst.tcm_to_tensor<float>(result, start, count);
    }
  }
  torch::neuron::tcm_free(result);
  torch::neuron::tcm_free(tile2);
  torch::neuron::tcm_free(tile1);
  return out;
}
