/* emu_device.h — owns the device side of CUDA for the CPU emulator (C++ only): the vector
 * and 16/8-bit float types with their round-to-nearest-even conversions, the intrinsics
 * kernels/ uses, and (emu_block.h) blocks, warps and launches. */
#pragma once
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <atomic>
#include <vector>
#include <functional>
#include <mutex>
#include <map>
#include <tuple>
#include <type_traits>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
struct dim3 { unsigned x, y, z; constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {} };
struct uint3 { unsigned x, y, z; };
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
/* 16-bit floats: bit containers, RNE conversions */
struct __half_raw { unsigned short x; };
struct __half { unsigned short x; __half() = default; __half(__half_raw r) : x(r.x) {} };
struct __nv_bfloat16 { unsigned short x; };
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef unsigned char __nv_fp8_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
static inline uint32_t emu_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float emu_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_u2f((uint32_t)h.x << 16); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { __nv_bfloat16 h; h.x = s; return h; }
static inline __half __ushort_as_half(unsigned short s) { __half h; h.x = s; return h; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = emu_f2u(f); __nv_bfloat16 h;
    if ((u & 0x7fffffff) > 0x7f800000) { h.x = (unsigned short)((u >> 16) | 0x40); return h; }
    u += 0x7fff + ((u >> 16) & 1); h.x = (unsigned short)(u >> 16); return h;
}
static inline float __half2float(__half h) {
    uint32_t s = (uint32_t)(h.x & 0x8000) << 16, e = (h.x >> 10) & 31, m = h.x & 1023;
    if (e == 31) return emu_u2f(s | 0x7f800000 | (m << 13));
    if (e == 0) { float v = ldexpf((float)m, -24); return s ? -v : v; }
    return emu_u2f(s | ((e + 112) << 23) | (m << 13));
}
static inline __half __float2half_rn(float f) {
    /* exact: via double arithmetic with nearbyint (RNE) on the scaled mantissa */
    __half h; uint32_t u = emu_f2u(f); unsigned short s = (unsigned short)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (a != a) { h.x = s | 0x7e00; return h; }
    if (a >= 65520.0f) { h.x = s | 0x7c00; return h; }
    if (a == 0.0f) { h.x = s; return h; }
    int e; frexpf(a, &e);   /* a = m * 2^e, m in [0.5, 1) */
    int ex = e - 1; if (ex < -14) ex = -14;
    double q = nearbyint((double)a * ldexp(1.0, 10 - ex));   /* units of 2^(ex-10) */
    uint32_t bits;
    if (ex == -14 && q < 1024) bits = (uint32_t)q;             /* subnormal (or rounds up to min normal: q==1024 handled below) */
    else { if (q >= 2048) { q /= 2; ex++; } bits = ((uint32_t)(ex + 15) << 10) | ((uint32_t)q - 1024); if (ex + 15 >= 31) bits = 0x7c00; }
    h.x = s | (unsigned short)bits; return h;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)}; }
static inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half_rn(lo), __float2half_rn(hi)}; }
static inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t b, __nv_fp8_interpretation_t) {
    /* e4m3: bias 7, no inf, 0x7f/0xff NaN; exact in f16 */
    __half_raw r; unsigned s = (b & 0x80) << 8, e = (b >> 3) & 15, m = b & 7;
    if ((b & 0x7f) == 0x7f) { r.x = (unsigned short)(s | 0x7e00); return r; }
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, (int)e - 7);
    __half h = __float2half_rn(v); r.x = (unsigned short)(h.x | s); return r;
}

static inline float __bfloat162float_(unsigned short x) { return emu_u2f((uint32_t)x << 16); }
/* bf16x2 subtraction, each half rounded once to nearest even (through double: exact for the
 * small integers int4_gemm.cu makes, and double rounding of the rest is not what it tests) */
static inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return {__float2bfloat16_rn((float)((double)__bfloat162float(a.x) - (double)__bfloat162float(b.x))),
            __float2bfloat16_rn((float)((double)__bfloat162float(a.y) - (double)__bfloat162float(b.y)))};
}
/* PRMT's default mode: byte i of the result is byte (s >> 4i) & 7 of y:x (x the low word);
 * the sign-replicate mode (bit 3 of a selector) is not emulated */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
/* __expf is ex2.approx(x * log2 e) on the device (a few ulp; exact for -inf): its rounding
 * of the product, then exp2 */
static inline float emu_expf(float x) { return exp2f(x * 1.44269504088896340736f); }
#define __expf emu_expf   /* (glibc declares a __expf of its own) */
static inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* e4m3 store: RNE, saturating to +-448 (SATFINITE), NaN -> 0x7f */
static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float v, __nv_saturation_t sat, __nv_fp8_interpretation_t) {
    unsigned char s = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    if (a != a) return 0x7f;
    if (a >= 464.0f) return sat == __NV_SATFINITE ? (unsigned char)(s | 0x7e) : (unsigned char)(s | 0x7f);
    if (a > 448.0f) return (unsigned char)(s | 0x7e);   /* (448, 464): rounds to 448 */
    int e; frexpf(a, &e);
    int ex = e - 1; if (ex < -6) ex = -6;
    double q = nearbyint((double)a * ldexp(1.0, 3 - ex));   /* units of 2^(ex-3) */
    if (a == 0.0f) return s;
    if (ex == -6 && q < 8) return (unsigned char)(s | (unsigned)q);
    if (q >= 16) { q /= 2; ex++; }
    return (unsigned char)(s | ((ex + 7) << 3) | ((unsigned)q - 8));
}
#include "emu_block.h"
