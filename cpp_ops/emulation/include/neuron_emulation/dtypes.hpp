// The seven dtypes a GpSimd kernel may use, with the 16-bit float types implemented in software
// (round to nearest even, as torch's own conversions do).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace c10 {

enum class ScalarType : int32_t { Float = 0, BFloat16 = 1, Half = 2, Int = 3, Char = 4, Short = 5, Byte = 6 };

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value) : bits(from_float(value)) {}  // NOLINT: implicit, like c10::Half
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float value) {
    uint32_t x;
    std::memcpy(&x, &value, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exponent = (x >> 23) & 0xffu;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
    int32_t e = static_cast<int32_t>(exponent) - 127 + 15;
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (e <= 0) {  // subnormal half (or zero)
      if (e < -10) return static_cast<uint16_t>(sign);
      mantissa |= 0x800000u;
      uint32_t shift = static_cast<uint32_t>(14 - e);
      uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
      if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
      return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13), rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry rounds up into the exponent
    return static_cast<uint16_t>(sign | half);
  }

  static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) {
      float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -magnitude : magnitude;
    }
    uint32_t x = exponent == 31 ? (sign | 0x7f800000u | (mantissa << 13)) : (sign | ((exponent + 112) << 23) | (mantissa << 13));
    float value;
    std::memcpy(&value, &x, 4);
    return value;
  }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value) : bits(from_float(value)) {}  // NOLINT: implicit, like c10::BFloat16
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float value) {
    if (std::isnan(value)) return 0x7fc0;
    uint32_t x;
    std::memcpy(&x, &value, 4);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float value;
    std::memcpy(&value, &x, 4);
    return value;
  }
};

}  // namespace c10

namespace neuron_emulation {

using c10::ScalarType;

inline const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float: return "float32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Int: return "int32";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Byte: return "uint8";
  }
  return "an unknown dtype";
}

inline size_t element_size(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float: case ScalarType::Int: return 4;
    case ScalarType::BFloat16: case ScalarType::Half: case ScalarType::Short: return 2;
    case ScalarType::Char: case ScalarType::Byte: return 1;
  }
  return 0;
}

inline bool is_integral(ScalarType dtype) {
  return dtype == ScalarType::Int || dtype == ScalarType::Char || dtype == ScalarType::Short || dtype == ScalarType::Byte;
}

template <typename T> struct DtypeOf;
template <> struct DtypeOf<float> { static constexpr ScalarType value = ScalarType::Float; };
template <> struct DtypeOf<c10::BFloat16> { static constexpr ScalarType value = ScalarType::BFloat16; };
template <> struct DtypeOf<c10::Half> { static constexpr ScalarType value = ScalarType::Half; };
template <> struct DtypeOf<int32_t> { static constexpr ScalarType value = ScalarType::Int; };
template <> struct DtypeOf<int8_t> { static constexpr ScalarType value = ScalarType::Char; };
template <> struct DtypeOf<int16_t> { static constexpr ScalarType value = ScalarType::Short; };
template <> struct DtypeOf<uint8_t> { static constexpr ScalarType value = ScalarType::Byte; };

// Calls fn(T{}) with T the C++ element type of dtype.
template <typename Fn>
auto dispatch_dtype(ScalarType dtype, Fn&& fn) -> decltype(fn(float{})) {
  switch (dtype) {
    case ScalarType::Float: return fn(float{});
    case ScalarType::BFloat16: return fn(c10::BFloat16{});
    case ScalarType::Half: return fn(c10::Half{});
    case ScalarType::Int: return fn(int32_t{});
    case ScalarType::Char: return fn(int8_t{});
    case ScalarType::Short: return fn(int16_t{});
    case ScalarType::Byte: return fn(uint8_t{});
  }
  return fn(float{});
}

// A recognisable "never written" pattern: a NaN for float types, 0xA5 bytes for integers.
inline void fill_poison(void* data, ScalarType dtype, int64_t numel) {
  auto* bytes = static_cast<unsigned char*>(data);
  switch (dtype) {
    case ScalarType::Float: {
      const uint32_t pattern = 0x7fa5a5a5u;
      for (int64_t i = 0; i < numel; ++i) std::memcpy(bytes + 4 * i, &pattern, 4);
      return;
    }
    case ScalarType::BFloat16: case ScalarType::Half: {
      const uint16_t pattern = dtype == ScalarType::Half ? 0x7e5a : 0x7fa5;
      for (int64_t i = 0; i < numel; ++i) std::memcpy(bytes + 2 * i, &pattern, 2);
      return;
    }
    default:
      std::memset(bytes, 0xA5, static_cast<size_t>(numel) * element_size(dtype));
  }
}

}  // namespace neuron_emulation
