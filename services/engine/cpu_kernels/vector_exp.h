/* Shared by the kernel files: an expf whose loops vectorize. */
#ifndef SEAWALL_VECTOR_EXP_H
#define SEAWALL_VECTOR_EXP_H

#include <math.h>
#include <stdint.h>

/* exp(x), written so loops over it vectorize: Cephes' expf polynomial after a range reduction by ln 2, about
 * 1 ulp from libm's expf, for x clamped to [-87, 88] (beyond, the result is ~0 or ~FLT_MAX). libm's own
 * expf has no vector variant unless the whole library is built with -ffast-math, which would also change
 * the process's floating-point state. */
static inline float clamp_exp_arg(float x) { return x < -87.f ? -87.f : x > 88.f ? 88.f : x; }

/* exp(x) for x already in [-87, 88]. */
static inline float exp_in_range(float x) {
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    x -= n * 0.693359375f;
    x -= n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * x * x + x + 1.f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return y * scale.f;
}

static inline float exp_clamped(float x) { return exp_in_range(clamp_exp_arg(x)); }

#endif
