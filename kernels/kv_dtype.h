/*
 * kv_dtype.h -- element encodings shared by the CPU code and the CUDA kernels (one
 * definition, so both round identically): fp16 (IEEE binary16), bf16 and fp8-e4m3 (OCP
 * E4M3FN) to and from float, all round-to-nearest-even and written with integer operations
 * only (no dependence on the floating-point environment). Valid C11 and CUDA C++.
 */
#ifndef TANDEM_KV_DTYPE_H
#define TANDEM_KV_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "kv_plan.h"   /* TDM_HD */

TDM_HD uint32_t tdm__f2u(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

TDM_HD float tdm__u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Round M >> shift to nearest even (shift in 1..31). */
TDM_HD uint32_t tdm__rne_shift(uint32_t m, uint32_t shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return q + (rem > half || (rem == half && (q & 1u)));
}

/* float -> fp8 e4m3: RNE, saturating to +-448 (inf included), NaN -> 0x7F | sign. */
TDM_HD uint8_t tdm__fp8_from_f32(float x)
{
    uint32_t u = tdm__f2u(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);          /* NaN */
    if (a >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu);         /* >= 448 (and inf) */
    int32_t e = (int32_t)(a >> 23) - 127;
    uint32_t mant = a & 0x7FFFFFu;
    if (e >= -6) {                                                /* normal */
        uint32_t v = ((uint32_t)(e + 7) << 23 | mant);           /* exp field in bits 23.. */
        v = tdm__rne_shift(v, 20);                                /* -> eeee.mmm */
        if (v > 0x7Eu) v = 0x7Eu;
        return (uint8_t)(sign | v);
    }
    if (e < -11) return sign;                                     /* < 2^-11: rounds to 0 */
    /* subnormal: m = RNE(a * 2^9), a = (mant | 2^23) * 2^(e - 23) */
    uint32_t m = tdm__rne_shift(mant | 0x800000u, (uint32_t)(14 - e));
    return (uint8_t)(sign | m);                                   /* m == 8 is the min normal */
}

TDM_HD float tdm__fp8_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t e = (v >> 3) & 0xFu, m = v & 7u;
    if (e == 15u && m == 7u) return tdm__u2f(sign | 0x7FC00000u);
    if (e == 0u) return tdm__u2f(tdm__f2u((float)m * 0.001953125f) | sign);
    return tdm__u2f(sign | ((e + 120u) << 23) | (m << 20));
}

/* float -> IEEE half: RNE, overflow to inf, NaN stays NaN (quiet). */
TDM_HD uint16_t tdm__f16_from_f32(float x)
{
    uint32_t u = tdm__f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);      /* >= 65520: inf */
    int32_t e = (int32_t)(a >> 23) - 127;
    uint32_t mant = a & 0x7FFFFFu;
    if (e >= -14) {
        uint32_t v = ((uint32_t)(e + 15) << 23) | mant;
        return (uint16_t)(sign | tdm__rne_shift(v, 13));
    }
    if (e < -25) return sign;
    return (uint16_t)(sign | tdm__rne_shift(mant | 0x800000u, (uint32_t)(-e - 1)));
}

TDM_HD float tdm__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0u) return tdm__u2f(tdm__f2u((float)m * 5.9604644775390625e-8f) | sign);
    if (e == 31u) return tdm__u2f(sign | 0x7F800000u | (m << 13));
    return tdm__u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* float -> bf16: RNE; NaN stays NaN (quiet). */
TDM_HD uint16_t tdm__bf16_from_f32(float x)
{
    uint32_t u = tdm__f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

TDM_HD float tdm__bf16_to_f32(uint16_t v) { return tdm__u2f((uint32_t)v << 16); }

/* Element i of an array of dtype dt, as float. dt: 1 fp16, 2 bf16, 3 fp32, 4 fp8. */
TDM_HD float tdm__load_elem(const void *p, uint32_t dt, uint64_t i)
{
    switch (dt) {
    case 1: return tdm__f16_to_f32(((const uint16_t *)p)[i]);
    case 2: return tdm__bf16_to_f32(((const uint16_t *)p)[i]);
    case 3: return ((const float *)p)[i];
    default: return tdm__fp8_to_f32(((const uint8_t *)p)[i]);
    }
}

TDM_HD void tdm__store_elem(void *p, uint32_t dt, uint64_t i, float x)
{
    switch (dt) {
    case 1: ((uint16_t *)p)[i] = tdm__f16_from_f32(x); break;
    case 2: ((uint16_t *)p)[i] = tdm__bf16_from_f32(x); break;
    case 3: ((float *)p)[i] = x; break;
    default: ((uint8_t *)p)[i] = tdm__fp8_from_f32(x); break;
    }
}

#endif /* TANDEM_KV_DTYPE_H */
