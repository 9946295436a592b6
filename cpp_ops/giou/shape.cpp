// Shape functions of the GIoU ops (run on the host while tracing: sizes and dtype only).
#include <torch/torch.h>
#include "torchneuron/register.h"

static void check_float(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat, "the C++ GIoU ops take float32 ", name, ", got ", t.scalar_type());
}

torch::Tensor giou_shape(const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  check_float(boxes1, "boxes1");
  check_float(boxes2, "boxes2");
  TORCH_CHECK(boxes1.dim() == 3 && boxes1.size(2) == 4 && boxes1.sizes() == boxes2.sizes(),
              "giou expects boxes1 and boxes2 of the same shape [B, N, 4], got ", boxes1.sizes(), " and ", boxes2.sizes());
  return torch::zeros({boxes1.size(0), boxes1.size(1)}, torch::kFloat);
}

torch::Tensor giou_backward_shape(const torch::Tensor& grad, const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  check_float(grad, "grad");
  check_float(boxes1, "boxes1");
  check_float(boxes2, "boxes2");
  TORCH_CHECK(boxes1.dim() == 3 && boxes1.size(2) == 4 && boxes1.sizes() == boxes2.sizes() &&
                  grad.sizes() == boxes1.sizes().slice(0, 2),
              "giou_backward expects grad [B, N] and boxes [B, N, 4], got ", grad.sizes(), ", ", boxes1.sizes(),
              " and ", boxes2.sizes());
  return torch::zeros({boxes1.size(0), boxes1.size(1), 8}, torch::kFloat);
}

NEURON_LIBRARY(nki_ops_giou, m) {
  m.def("giou", &giou_shape, "giou");
  m.def("giou_backward", &giou_backward_shape, "giou_backward");
}
