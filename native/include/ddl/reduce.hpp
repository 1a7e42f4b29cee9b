// Element types and reduction kernels. float16 and bfloat16 travel as raw 16-bit words and are reduced
// in float32, rounded back to nearest-even (what numpy and ml_dtypes do for a single operation).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ddl {

// uint8 is for collectives that only move bytes (broadcast, allgather); it has no reductions.
enum class DType : int32_t { float16 = 0, bfloat16 = 1, float32 = 2, float64 = 3, int32 = 4, int64 = 5, uint8 = 6 };
enum class ReduceOp : int32_t { sum = 0, prod = 1, min = 2, max = 3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

// dst[i] = dst[i] (op) src[i] for i < count.
void reduce_into(void* dst, const void* src, int64_t count, DType t, ReduceOp op);
// buf[i] *= factor, floating types only (average = sum, then scale).
void scale(void* buf, int64_t count, DType t, double factor);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace ddl
