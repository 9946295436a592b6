// Shape function of the NMS op: room for every box's index after the count.
#include <torch/torch.h>
#include "torchneuron/register.h"

torch::Tensor nms_shape(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_threshold) {
  TORCH_CHECK(boxes.scalar_type() == torch::kFloat && scores.scalar_type() == torch::kFloat,
              "the C++ NMS op takes float32 boxes and scores, got ", boxes.scalar_type(), " and ", scores.scalar_type());
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4 && scores.dim() == 1 && scores.size(0) == boxes.size(0),
              "nms expects boxes [N, 4] and scores [N], got ", boxes.sizes(), " and ", scores.sizes());
  return torch::zeros({boxes.size(0) + 1}, torch::kInt);
}

NEURON_LIBRARY(nki_ops_nms, m) {
  m.def("nms", &nms_shape, "nms");
}
