#include "ddl/reduce.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ddl {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::uint8: return 1;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::float32:
    case DType::int32: return 4;
    case DType::float64:
    case DType::int64: return 8;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  static const char* names[] = {"float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8"};
  return names[static_cast<int>(t)];
}

static uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (man << 13));        // inf / nan
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (man << 13));   // normal: rebias 15 -> 127
  if (man == 0) return float_of(sign);                                       // signed zero
  float sub = std::ldexp(static_cast<float>(man), -24);                      // subnormal
  return sign ? -sub : sub;
}

uint16_t float_to_half(float f) {
  uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000, abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u)                                                    // inf / nan (keep nan quiet)
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);       // rounds past 65504: inf
  if (abs < 0x38800000u) {                                                   // below the smallest normal half
    // value = abs_float; half subnormal unit is 2^-24: round(value * 2^24) to nearest-even
    float v = float_of(abs) * 16777216.0f;                                   // exact: power-of-two scale
    float r = std::nearbyint(v);                                             // default rounding: nearest-even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant_rounded = abs + 0xfffu + ((abs >> 13) & 1u);                 // nearest-even on 13 dropped bits
  return static_cast<uint16_t>(sign | ((mant_rounded - 0x38000000u) >> 13));
}

float bfloat16_to_float(uint16_t b) { return float_of(uint32_t(b) << 16); }

uint16_t float_to_bfloat16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet nan
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

namespace {

struct Sum { template <class T> static T apply(T a, T b) { return a + b; } };
struct Prod { template <class T> static T apply(T a, T b) { return a * b; } };
struct Min { template <class T> static T apply(T a, T b) { return b < a ? b : a; } };
struct Max { template <class T> static T apply(T a, T b) { return a < b ? b : a; } };

template <class Op, class T>
void native_loop(void* dst, const void* src, int64_t n) {
  T* __restrict d = static_cast<T*>(dst);
  const T* __restrict s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], s[i]);
}

template <class Op, float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void half_loop(void* dst, const void* src, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = FromF(Op::apply(ToF(d[i]), ToF(s[i])));
}

template <class Op>
void reduce_typed(void* dst, const void* src, int64_t n, DType t) {
  switch (t) {
    case DType::float16: return half_loop<Op, half_to_float, float_to_half>(dst, src, n);
    case DType::bfloat16: return half_loop<Op, bfloat16_to_float, float_to_bfloat16>(dst, src, n);
    case DType::float32: return native_loop<Op, float>(dst, src, n);
    case DType::float64: return native_loop<Op, double>(dst, src, n);
    case DType::int32: return native_loop<Op, int32_t>(dst, src, n);
    case DType::int64: return native_loop<Op, int64_t>(dst, src, n);
    case DType::uint8: break;
  }
  throw std::invalid_argument(std::string("no reductions for ") + dtype_name(t));
}

}  // namespace

void reduce_into(void* dst, const void* src, int64_t count, DType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_typed<Sum>(dst, src, count, t);
    case ReduceOp::prod: return reduce_typed<Prod>(dst, src, count, t);
    case ReduceOp::min: return reduce_typed<Min>(dst, src, count, t);
    case ReduceOp::max: return reduce_typed<Max>(dst, src, count, t);
  }
  throw std::invalid_argument("unknown reduce op code " + std::to_string(static_cast<int>(op)));
}

void scale(void* buf, int64_t count, DType t, double factor) {
  switch (t) {
    case DType::float16:
    case DType::bfloat16: {
      bool bf = t == DType::bfloat16;
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < count; ++i) {
        float v = (bf ? bfloat16_to_float(p[i]) : half_to_float(p[i])) * static_cast<float>(factor);
        p[i] = bf ? float_to_bfloat16(v) : float_to_half(v);
      }
      return;
    }
    case DType::float32: {  // in double: an average by 1/n rounds once, as the sum divided by n does
      float* p = static_cast<float*>(buf);
      for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(static_cast<double>(p[i]) * factor);
      return;
    }
    case DType::float64: {
      double* p = static_cast<double*>(buf);
      for (int64_t i = 0; i < count; ++i) p[i] *= factor;
      return;
    }
    default:
      throw std::invalid_argument(std::string("scale is defined for floating types only, not ") + dtype_name(t));
  }
}

}  // namespace ddl
