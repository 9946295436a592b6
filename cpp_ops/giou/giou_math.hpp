// GIoU of one pair of xyxy boxes and its gradient, in the operation order of the torch reference
// (nki_ops/ops/giou/reference.py) so fp32 results agree with it, ties included.
#pragma once

#include <algorithm>

namespace nki_ops {

constexpr float kGiouEps = 1e-12f;  // GIOU_EPS: union and enclosing area are clamped below at it

// max/min that return (and route the gradient to) the first argument at a tie.
inline float max_first(float a, float b) { return a >= b ? a : b; }
inline float min_first(float a, float b) { return a <= b ? a : b; }
// clamp(x, min=lo) as torch computes it: NaN stays NaN.
inline float clamp_min(float x, float lo) { return x < lo ? lo : x; }

inline float giou_pair(const float* a, const float* b) {
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]);
  const float area_b = (b[2] - b[0]) * (b[3] - b[1]);
  const float inter_w = clamp_min(min_first(a[2], b[2]) - max_first(a[0], b[0]), 0.0f);
  const float inter_h = clamp_min(min_first(a[3], b[3]) - max_first(a[1], b[1]), 0.0f);
  const float inter = inter_w * inter_h;
  const float area_union = area_a + area_b - inter;
  const float enclose_w = clamp_min(max_first(a[2], b[2]) - min_first(a[0], b[0]), 0.0f);
  const float enclose_h = clamp_min(max_first(a[3], b[3]) - min_first(a[1], b[1]), 0.0f);
  const float enclose = enclose_w * enclose_h;
  const float iou = inter / clamp_min(area_union, kGiouEps);
  return iou - (enclose - area_union) / clamp_min(enclose, kGiouEps);
}

// Adds d(giou)/d(box) * g to grad_a[4] and grad_b[4] (both zeroed by the caller).
inline void giou_pair_backward(const float* a, const float* b, float g, float* grad_a, float* grad_b) {
  const float width_a = a[2] - a[0], height_a = a[3] - a[1];
  const float width_b = b[2] - b[0], height_b = b[3] - b[1];
  const float area_a = width_a * height_a, area_b = width_b * height_b;
  const float inter_w_raw = min_first(a[2], b[2]) - max_first(a[0], b[0]);
  const float inter_h_raw = min_first(a[3], b[3]) - max_first(a[1], b[1]);
  const float inter_w = clamp_min(inter_w_raw, 0.0f), inter_h = clamp_min(inter_h_raw, 0.0f);
  const float inter = inter_w * inter_h;
  const float area_union = area_a + area_b - inter;
  const float enclose_w_raw = max_first(a[2], b[2]) - min_first(a[0], b[0]);
  const float enclose_h_raw = max_first(a[3], b[3]) - min_first(a[1], b[1]);
  const float enclose_w = clamp_min(enclose_w_raw, 0.0f), enclose_h = clamp_min(enclose_h_raw, 0.0f);
  const float enclose = enclose_w * enclose_h;
  const float union_c = clamp_min(area_union, kGiouEps), enclose_c = clamp_min(enclose, kGiouEps);

  // giou = inter / union_c - (enclose - union) / enclose_c
  float g_inter = g / union_c;
  float g_union = area_union >= kGiouEps ? -g * inter / (union_c * union_c) : 0.0f;
  const float g_gap = -g / enclose_c;  // gap = enclose - union
  const float g_enclose = g_gap + (enclose >= kGiouEps ? g * (enclose - area_union) / (enclose_c * enclose_c) : 0.0f);
  g_union -= g_gap;
  // union = area_a + area_b - inter
  g_inter -= g_union;
  // inter = inter_w * inter_h, each clamped at 0 (the gradient passes where the raw value is >= 0)
  const float g_inter_w = inter_w_raw >= 0.0f ? g_inter * inter_h : 0.0f;
  const float g_inter_h = inter_h_raw >= 0.0f ? g_inter * inter_w : 0.0f;
  const float g_enclose_w = enclose_w_raw >= 0.0f ? g_enclose * enclose_h : 0.0f;
  const float g_enclose_h = enclose_h_raw >= 0.0f ? g_enclose * enclose_w : 0.0f;

  // Areas.
  grad_a[0] -= g_union * height_a;
  grad_a[2] += g_union * height_a;
  grad_a[1] -= g_union * width_a;
  grad_a[3] += g_union * width_a;
  grad_b[0] -= g_union * height_b;
  grad_b[2] += g_union * height_b;
  grad_b[1] -= g_union * width_b;
  grad_b[3] += g_union * width_b;
  // Intersection corners: max of the low edges, min of the high edges; enclosing box: the opposite.
  for (int axis = 0; axis < 2; ++axis) {
    const float g_inter_side = axis == 0 ? g_inter_w : g_inter_h;
    const float g_enclose_side = axis == 0 ? g_enclose_w : g_enclose_h;
    const int lo = axis, hi = axis + 2;
    (a[lo] >= b[lo] ? grad_a : grad_b)[lo] -= g_inter_side;
    (a[hi] <= b[hi] ? grad_a : grad_b)[hi] += g_inter_side;
    (a[lo] <= b[lo] ? grad_a : grad_b)[lo] -= g_enclose_side;
    (a[hi] >= b[hi] ? grad_a : grad_b)[hi] += g_enclose_side;
  }
}

}  // namespace nki_ops
