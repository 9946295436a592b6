// The factory functions and elementwise ops of the device's tensor library, each also as
// op_out(result, ...). No broadcasting and no type promotion: operands must have equal sizes
// and (tensor-tensor) equal dtypes. Anything else in ATen is deliberately absent.
#pragma once

#include "tensor.hpp"

namespace neuron_emulation {

inline ScalarType required_dtype(const torch::TensorOptions& options, const char* factory) {
  if (!options.has_dtype())
    fail(concat("torch::", factory, " needs an explicit dtype in its TensorOptions (the device has no default dtype)"));
  return options.dtype();
}

inline torch::Tensor new_tensor(torch::IntArrayRef sizes, ScalarType dtype) {
  auto impl = make_local(sizes.vec(), dtype);
  CoreState* core = current_core_slot();
  if (core != nullptr && core->call->checks) fill_poison(impl->data, dtype, impl->numel);
  return torch::Tensor(impl);
}

inline void check_same_shape(const char* op, const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes())
    fail(concat("torch::", op, " on tensors of different sizes: the device tensor library does not broadcast"));
}

inline void check_same_dtype(const char* op, const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type())
    fail(concat("torch::", op, " on ", dtype_name(a.scalar_type()), " and ", dtype_name(b.scalar_type()),
                " tensors: the emulation does not model type promotion, convert explicitly"));
}

template <typename T>
double load(const void* data, int64_t i) {
  return static_cast<double>(static_cast<const T*>(data)[i]);
}

// result[i] = fn(a[i], b[i]) in double (exact for the integer dtypes and correctly rounded for the float ones).
template <typename Fn>
void map_elements(const torch::Tensor& result, const torch::Tensor& a, const torch::Tensor* b, Fn fn) {
  auto& out = impl_of(result);
  if (out.role == Role::Input) fail("an op writes into an input");
  auto& x = impl_of(a);
  dispatch_dtype(out.dtype, [&](auto out_zero) {
    using Out = decltype(out_zero);
    auto* dst = static_cast<Out*>(out.data);
    dispatch_dtype(x.dtype, [&](auto in_zero) {
      using In = decltype(in_zero);
      for (int64_t i = 0; i < out.numel; ++i) {
        double rhs = b != nullptr ? load<In>(impl_of(*b).data, i) : 0.0;
        dst[i] = static_cast<Out>(fn(load<In>(x.data, i), rhs));
      }
      return 0;
    });
    return 0;
  });
}

inline void check_out(const char* op, const torch::Tensor& result, const torch::Tensor& a) {
  check_same_shape(op, result, a);
  check_same_dtype(op, result, a);
}

inline void check_integral(const char* op, const torch::Tensor& a) {
  if (!is_integral(a.scalar_type()))
    fail(concat("torch::", op, " needs an integer tensor, got ", dtype_name(a.scalar_type())));
}

// Integer division's result type on the device is not documented, so the emulation does not guess.
inline void check_floating(const char* op, const torch::Tensor& a) {
  if (is_integral(a.scalar_type()))
    fail(concat("torch::", op, " on an ", dtype_name(a.scalar_type()),
                " tensor: the emulation does not model integer division, convert to a float dtype"));
}

}  // namespace neuron_emulation

namespace torch {

inline Tensor empty(IntArrayRef size, TensorOptions options) {
  return neuron_emulation::new_tensor(size, neuron_emulation::required_dtype(options, "empty"));
}
inline Tensor full(IntArrayRef size, const Scalar& fill_value, TensorOptions options) {
  Tensor t = neuron_emulation::new_tensor(size, neuron_emulation::required_dtype(options, "full"));
  t.fill_(fill_value);
  return t;
}
inline Tensor zeros(IntArrayRef size, TensorOptions options) {
  return full(size, 0, options.has_dtype() ? options : TensorOptions(neuron_emulation::required_dtype(options, "zeros")));
}
inline Tensor ones(IntArrayRef size, TensorOptions options) {
  return full(size, 1, options.has_dtype() ? options : TensorOptions(neuron_emulation::required_dtype(options, "ones")));
}
inline Tensor eye(int64_t n, int64_t m, TensorOptions options) {
  Tensor t = full({n, m}, 0, TensorOptions(neuron_emulation::required_dtype(options, "eye")));
  neuron_emulation::dispatch_dtype(t.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    auto* data = static_cast<T*>(neuron_emulation::impl_of(t).data);
    for (int64_t i = 0; i < std::min(n, m); ++i) data[i * m + i] = static_cast<T>(1.0f);
    return 0;
  });
  return t;
}

#define NEURON_EMULATION_UNARY(name, expr)                                          \
  inline Tensor& name##_out(Tensor& result, const Tensor& self) {                  \
    neuron_emulation::check_out(#name, result, self);                              \
    neuron_emulation::map_elements(result, self, nullptr, [](double x, double) { return (expr); }); \
    return result;                                                                 \
  }                                                                                \
  inline Tensor name(const Tensor& self) {                                         \
    Tensor result = empty(self.sizes(), self.scalar_type());                       \
    return name##_out(result, self);                                               \
  }

NEURON_EMULATION_UNARY(abs, std::fabs(x))
NEURON_EMULATION_UNARY(ceil, std::ceil(x))
NEURON_EMULATION_UNARY(floor, std::floor(x))
NEURON_EMULATION_UNARY(sin, std::sin(x))
NEURON_EMULATION_UNARY(cos, std::cos(x))
NEURON_EMULATION_UNARY(tan, std::tan(x))
NEURON_EMULATION_UNARY(log, std::log(x))
NEURON_EMULATION_UNARY(log2, std::log2(x))
NEURON_EMULATION_UNARY(log10, std::log10(x))
NEURON_EMULATION_UNARY(exp, std::exp(x))
#undef NEURON_EMULATION_UNARY

// Tensor-tensor and tensor-scalar forms of a binary op; `expr` combines x and y, `check` vets self.
#define NEURON_EMULATION_BINARY(name, expr, check)                                                \
  inline Tensor& name##_out(Tensor& result, const Tensor& self, const Tensor& other) {           \
    neuron_emulation::check_out(#name, result, self);                                            \
    check(#name, self);                                                                          \
    neuron_emulation::check_same_shape(#name, self, other);                                      \
    neuron_emulation::check_same_dtype(#name, self, other);                                      \
    neuron_emulation::map_elements(result, self, &other, [](double x, double y) { return (expr); }); \
    return result;                                                                               \
  }                                                                                              \
  inline Tensor& name##_out(Tensor& result, const Tensor& self, const Scalar& other) {           \
    neuron_emulation::check_out(#name, result, self);                                            \
    check(#name, self);                                                                          \
    const double y = other.toDouble();                                                           \
    neuron_emulation::map_elements(result, self, nullptr, [y](double x, double) { return (expr); }); \
    return result;                                                                               \
  }                                                                                              \
  inline Tensor name(const Tensor& self, const Tensor& other) {                                  \
    Tensor result = empty(self.sizes(), self.scalar_type());                                     \
    return name##_out(result, self, other);                                                      \
  }                                                                                              \
  inline Tensor name(const Tensor& self, const Scalar& other) {                                  \
    Tensor result = empty(self.sizes(), self.scalar_type());                                     \
    return name##_out(result, self, other);                                                      \
  }

inline void any_dtype(const char*, const Tensor&) {}

NEURON_EMULATION_BINARY(mul, x * y, any_dtype)
NEURON_EMULATION_BINARY(div, x / y, neuron_emulation::check_floating)
NEURON_EMULATION_BINARY(pow, std::pow(x, y), any_dtype)
NEURON_EMULATION_BINARY(bitwise_and, static_cast<double>(static_cast<int64_t>(x) & static_cast<int64_t>(y)),
                        neuron_emulation::check_integral)
NEURON_EMULATION_BINARY(bitwise_or, static_cast<double>(static_cast<int64_t>(x) | static_cast<int64_t>(y)),
                        neuron_emulation::check_integral)
#undef NEURON_EMULATION_BINARY

inline Tensor pow(const Scalar& self, const Tensor& exponent) {
  Tensor result = empty(exponent.sizes(), exponent.scalar_type());
  const double base = self.toDouble();
  neuron_emulation::map_elements(result, exponent, nullptr, [base](double x, double) { return std::pow(base, x); });
  return result;
}

#define NEURON_EMULATION_ADD_SUB(name, sign)                                                                       \
  inline Tensor& name##_out(Tensor& result, const Tensor& self, const Tensor& other, const Scalar& alpha = 1) {    \
    neuron_emulation::check_out(#name, result, self);                                                              \
    neuron_emulation::check_same_shape(#name, self, other);                                                        \
    neuron_emulation::check_same_dtype(#name, self, other);                                                        \
    const double a = alpha.toDouble();                                                                             \
    neuron_emulation::map_elements(result, self, &other, [a](double x, double y) { return x sign a * y; });        \
    return result;                                                                                                 \
  }                                                                                                                \
  inline Tensor& name##_out(Tensor& result, const Tensor& self, const Scalar& other, const Scalar& alpha = 1) {    \
    neuron_emulation::check_out(#name, result, self);                                                              \
    const double y = other.toDouble() * alpha.toDouble();                                                          \
    neuron_emulation::map_elements(result, self, nullptr, [y](double x, double) { return x sign y; });             \
    return result;                                                                                                 \
  }                                                                                                                \
  inline Tensor name(const Tensor& self, const Tensor& other, const Scalar& alpha = 1) {                           \
    Tensor result = empty(self.sizes(), self.scalar_type());                                                       \
    return name##_out(result, self, other, alpha);                                                                 \
  }                                                                                                                \
  inline Tensor name(const Tensor& self, const Scalar& other, const Scalar& alpha = 1) {                           \
    Tensor result = empty(self.sizes(), self.scalar_type());                                                       \
    return name##_out(result, self, other, alpha);                                                                 \
  }

NEURON_EMULATION_ADD_SUB(add, +)
NEURON_EMULATION_ADD_SUB(sub, -)
#undef NEURON_EMULATION_ADD_SUB

inline Tensor& clamp_out(Tensor& result, const Tensor& self, const Scalar& min, const Scalar& max) {
  neuron_emulation::check_out("clamp", result, self);
  const double lo = min.toDouble(), hi = max.toDouble();
  neuron_emulation::map_elements(result, self, nullptr,
                                 [lo, hi](double x, double) { return std::isnan(x) ? x : std::min(std::max(x, lo), hi); });
  return result;
}
inline Tensor clamp(const Tensor& self, const Scalar& min, const Scalar& max) {
  Tensor result = empty(self.sizes(), self.scalar_type());
  return clamp_out(result, self, min, max);
}

inline Tensor& bitwise_not_out(Tensor& result, const Tensor& self) {
  neuron_emulation::check_out("bitwise_not", result, self);
  neuron_emulation::check_integral("bitwise_not", self);
  neuron_emulation::map_elements(result, self, nullptr,
                                 [](double x, double) { return static_cast<double>(~static_cast<int64_t>(x)); });
  return result;
}
inline Tensor bitwise_not(const Tensor& self) {
  Tensor result = empty(self.sizes(), self.scalar_type());
  return bitwise_not_out(result, self);
}

inline Tensor bitwise_and(const Scalar& self, const Tensor& other) { return bitwise_and(other, self); }
inline Tensor bitwise_or(const Scalar& self, const Tensor& other) { return bitwise_or(other, self); }

}  // namespace torch
