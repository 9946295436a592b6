// Greedy NMS on one GpSimd core: boxes[N, 4] (float32, xyxy), scores[N] -> int32 [N + 1] holding
// the number of kept boxes, then their indices in decreasing score order, then -1 padding
// (the output shape is fixed at trace time, so it has room for every box).
//
// Boxes are visited in decreasing score order (a stable sort: equal scores keep input order);
// a box is removed when its IoU with a kept box exceeds iou_threshold. Each kept box scans the
// later candidates in TCM tiles of kTile boxes and their "removed" flags.
#include <torch/torch.h>
#include <neuron/neuron-utils.hpp>

#include <algorithm>
#include <cmath>

namespace {

constexpr int64_t kTile = 256;  // 4 KiB of boxes and 256 bytes of flags in TCM
constexpr float kIouEps = 1e-12f;

// Descending score order with NaN first, as torch.sort(descending=True) orders it.
bool ranks_before(float a, float b) {
  if (std::isnan(a)) return !std::isnan(b);
  return !std::isnan(b) && a > b;
}

// Stable bottom-up merge sort of the indices in `order` (scratch: same size) by descending score.
void sort_by_score(const torch::TensorAccessor<float, 1, true>& score, torch::TensorAccessor<int32_t, 1, false> order,
                   torch::TensorAccessor<int32_t, 1, false> scratch, int64_t n) {
  bool in_order = true;  // whether the current run boundaries live in `order` (else in `scratch`)
  for (int64_t width = 1; width < n; width *= 2) {
    auto from = in_order ? order : scratch;
    auto to = in_order ? scratch : order;
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      const int64_t mid = std::min(lo + width, n), hi = std::min(lo + 2 * width, n);
      int64_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) to[k++] = ranks_before(score[from[j]], score[from[i]]) ? from[j++] : from[i++];
      while (i < mid) to[k++] = from[i++];
      while (j < hi) to[k++] = from[j++];
    }
    in_order = !in_order;
  }
  if (!in_order)
    for (int64_t i = 0; i < n; ++i) order[i] = scratch[i];
}

// IoU as nki_ops' box_iou reference computes it in float32.
float iou(const float* a, const float* b) {
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]);
  const float area_b = (b[2] - b[0]) * (b[3] - b[1]);
  const float w = std::max(std::min(a[2], b[2]) - std::max(a[0], b[0]), 0.0f);
  const float h = std::max(std::min(a[3], b[3]) - std::max(a[1], b[1]), 0.0f);
  const float inter = w * h;
  const float area_union = area_a + area_b - inter;
  return inter / (area_union < kIouEps ? kIouEps : area_union);
}

}  // namespace

torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_threshold) {
  const int64_t n = boxes.size(0);
  const float threshold = static_cast<float>(iou_threshold);

  torch::Tensor order = torch::empty({n}, torch::kInt);
  torch::Tensor scratch = torch::empty({n}, torch::kInt);
  auto order_at = order.accessor<int32_t, 1>();
  for (int64_t i = 0; i < n; ++i) order_at[i] = static_cast<int32_t>(i);
  sort_by_score(scores.accessor<float, 1>(), order_at, scratch.accessor<int32_t, 1>(), n);

  // Boxes in visiting order, and whether each is removed.
  torch::Tensor sorted = torch::empty({n, 4}, torch::kFloat);
  torch::Tensor removed = torch::zeros({n}, torch::kByte);
  {
    auto box_at = boxes.accessor<float, 2>();
    auto sorted_at = sorted.accessor<float, 2>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < 4; ++c) sorted_at[i][c] = box_at[order_at[i]][c];
  }

  torch::Tensor out = get_dst_tensor();
  auto out_at = out.accessor<int32_t, 1>();
  auto* kept_box = static_cast<float*>(torch::neuron::tcm_malloc(4 * sizeof(float)));
  auto* tile = static_cast<float*>(torch::neuron::tcm_malloc(4 * sizeof(float) * kTile));
  auto* flags = static_cast<uint8_t*>(torch::neuron::tcm_malloc(kTile));
  int32_t kept = 0;
  if (kept_box != nullptr && tile != nullptr && flags != nullptr) {
    auto sorted_tcm = sorted.tcm_accessor();
    auto removed_tcm = removed.tcm_accessor();
    for (int64_t i = 0; i < n; ++i) {
      removed_tcm.tensor_to_tcm<uint8_t>(flags, i, 1);
      if (flags[0]) continue;
      out_at[1 + kept++] = order_at[i];
      sorted_tcm.tensor_to_tcm<float>(kept_box, 4 * i, 4);
      for (int64_t start = i + 1; start < n; start += kTile) {
        const int64_t count = std::min(kTile, n - start);
        sorted_tcm.tensor_to_tcm<float>(tile, 4 * start, 4 * count);
        removed_tcm.tensor_to_tcm<uint8_t>(flags, start, count);
        for (int64_t j = 0; j < count; ++j)
          if (!(iou(kept_box, tile + 4 * j) <= threshold)) flags[j] = 1;  // NaN IoU removes, as in torch
        removed_tcm.tcm_to_tensor<uint8_t>(flags, start, count);
      }
    }
  }
  out_at[0] = kept;
  for (int64_t i = 1 + kept; i <= n; ++i) out_at[i] = -1;
  torch::neuron::tcm_free(flags);
  torch::neuron::tcm_free(tile);
  torch::neuron::tcm_free(kept_box);
  return out;
}
