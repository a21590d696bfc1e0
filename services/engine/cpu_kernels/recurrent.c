/* Fused CPU kernels for linear-attention layers (the short convolutions of Gated DeltaNet, KDA, Mamba and LFM2,
 * Gated DeltaNet's delta rule and Kimi Delta Attention's, Mamba-2's scan and the first Mamba's), fp32, loaded
 * with kernels.c's.
 *
 * Why C: eager torch runs these layers as dozens of small ops per group of sequences, each a pass over memory:
 * the states are gathered out of the slot pool and scattered back (index_select / index_copy_), the short
 * convolution's windows are concatenated before a grouped conv1d, and a prompt's delta rule takes the chunked
 * form (triangular solves per 64-token block) because that form suits a GPU. Here each state is updated in
 * place in its slot, once per token, while it sits in L1/L2 (a Gated DeltaNet head's state is Dk x Dv floats:
 * 4 KB at 32 x 32, 64 KB at 128 x 128), and the convolution keeps its window in registers.
 *
 * A prompt chunk runs the delta rule (or the scan) token by token, as a decode does (the recurrent form). It
 * computes the same recurrence as transformers' chunked form, in another order of float operations: the two
 * agree to fp32 rounding (tests/engine/test_recurrent_kernels.py), as the fused attention kernels agree with
 * SDPA.
 *
 * Layouts (float32, innermost dimension contiguous, rows at any stride):
 *   x / out rows of one group: sequence s's token t at base + (s * length + t) * row_stride
 *   convolution windows: [slots, channels, kernel - 1], the oldest input first
 *   Gated DeltaNet states: [slots, value heads, key dim, value dim]; KDA's [slots, heads, d, d]; Mamba-2
 *   states: [slots, heads, head dim, state size]
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "vector_exp.h"

#ifndef PARALLEL_FLOATS
#define PARALLEL_FLOATS 16384
#endif

#define CONV_BLOCK 64   /* channels one job carries through a sequence's tokens */
#define MAX_CONV_KEPT 7 /* kernel sizes up to 8 (models use 3 or 4) */
#define MAX_HEAD_DIM 256
#define MAX_STATE_SIZE 512

/* The depthwise causal convolution of `count` sequences of `length` tokens each, after the last kernel - 1
 * inputs each one's window holds (conv_rows[slots[s]]), which it then holds the last kernel - 1 of:
 * out[t][c] = bias[c] + sum_j weight[c][j] * in[t + j][c] over the window followed by the tokens (torch's
 * conv1d is a cross-correlation), then SiLU when `silu`. weight is conv1d's, [channels, kernel]; each job
 * copies its block transposed, so that a token's channels load as vectors. */
void seawall_causal_conv(float *out, int64_t out_stride, const float *x, int64_t x_stride, float *conv_rows,
                         const int64_t *slots, int count, int length, const float *weight, const float *bias,
                         int channels, int kernel, int silu) {
    const int kept = kernel - 1, blocks = (channels + CONV_BLOCK - 1) / CONV_BLOCK;
    const int64_t jobs = (int64_t)count * blocks;
#pragma omp parallel for schedule(static) if (jobs > 1 && (int64_t)count * length * channels >= PARALLEL_FLOATS)
    for (int64_t job = 0; job < jobs; job++) {
        const int s = (int)(job / blocks), c0 = (int)(job % blocks) * CONV_BLOCK;
        const int n = channels - c0 < CONV_BLOCK ? channels - c0 : CONV_BLOCK;
        float *window = conv_rows + (slots[s] * channels + c0) * (int64_t)kept;
        /* in[0..kept) the window, in[kept] the token's input; rolled by one after each token. */
        float in[MAX_CONV_KEPT + 1][CONV_BLOCK], w[MAX_CONV_KEPT + 1][CONV_BLOCK], acc[CONV_BLOCK], arg[CONV_BLOCK];
        for (int c = 0; c < n; c++) {
            for (int j = 0; j < kept; j++) in[j][c] = window[c * kept + j];
            for (int j = 0; j <= kept; j++) w[j][c] = weight[(int64_t)(c0 + c) * kernel + j];
        }
        for (int t = 0; t < length; t++) {
            const int64_t row = (int64_t)s * length + t;
            const float *xt = x + row * x_stride + c0;
            float *o = out + row * out_stride + c0;
#pragma omp simd
            for (int c = 0; c < n; c++) in[kept][c] = xt[c], acc[c] = 0.f;
            for (int j = 0; j <= kept; j++) {
#pragma omp simd
                for (int c = 0; c < n; c++) acc[c] += w[j][c] * in[j][c];
            }
            if (bias) {
#pragma omp simd
                for (int c = 0; c < n; c++) acc[c] += bias[c0 + c];
            }
            for (int j = 0; j < kept; j++) {
#pragma omp simd
                for (int c = 0; c < n; c++) in[j][c] = in[j + 1][c];
            }
            if (silu) { /* as seawall_silu_mul: the clamped arguments go through memory (see there) */
#pragma omp simd
                for (int c = 0; c < n; c++) arg[c] = clamp_exp_arg(-acc[c]);
#pragma omp simd
                for (int c = 0; c < n; c++) o[c] = acc[c] / (1.f + exp_in_range(arg[c]));
            } else {
#pragma omp simd
                for (int c = 0; c < n; c++) o[c] = acc[c];
            }
        }
        for (int c = 0; c < n; c++)
            for (int j = 0; j < kept; j++) window[c * kept + j] = in[j][c];
    }
}

/* x / sqrt(sum x^2 + eps) * scale into y (transformers' l2norm, then its query scaling). */
static inline void l2_normalize(float *y, const float *x, int n, float eps, float scale) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.f / sqrtf(ss + eps);
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * scale;
}

/* 16 floats as one value (as in kernels.c); the "u" type may sit at any float-aligned address. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define TILE 32 /* value columns a job carries through the tokens: 32 x key dim floats, 16 KB at 128 */

/* S^T k on columns [0, w) of a tile (rows dv apart) into mem. */
static inline void state_times(float *mem, const float *state, int64_t dv, const float *kn, int dk, int w) {
    memset(mem, 0, sizeof(float) * TILE);
    for (int i = 0; i < dk; i++) {
        const float *si = state + i * dv;
#pragma omp simd
        for (int j = 0; j < w; j++) mem[j] += si[j] * kn[i];
    }
}

/* One token on a tile of nv vectors of 16 columns (a constant where it is inlined, so that the sums live in
 * registers; rows dv apart, `vt` / `ot` at the tile's first column), given mem = S^T k of the state before
 * the token. One pass over the tile: S = S * decay + k (x) delta, out = S^T q, and with `k_next` (the next
 * token's k) the next token's mem = S^T k_next, each sum split over even and odd key rows so that no FMA waits
 * on the one before it. (S * decay)^T k is computed as decay * (S^T k): the same up to rounding, and the pass
 * that decays S is then the one that updates it. */
static inline __attribute__((always_inline)) void delta_tile(float *state, int64_t dv, float *mem, const float *kn,
                                                             const float *qn, const float *k_next,
                                                             const float *vt, float decay, float b, float *ot,
                                                             int dk, const int nv) {
    v16 delta[2], o0[2] = {0}, o1[2] = {0}, m0[2] = {0}, m1[2] = {0};
    for (int j = 0; j < nv; j++)
        delta[j] = (*(const v16u *)(vt + 16 * j) - *(const v16u *)(mem + 16 * j) * decay) * b;
    for (int i = 0; i < dk; i += 2) { /* dk is even (checked by the caller) */
        v16u *r0 = (v16u *)(state + i * dv), *r1 = (v16u *)(state + (i + 1) * dv);
        for (int j = 0; j < nv; j++) {
            const v16 a = r0[j] * decay + kn[i] * delta[j], c = r1[j] * decay + kn[i + 1] * delta[j];
            r0[j] = a, r1[j] = c;
            o0[j] += a * qn[i], o1[j] += c * qn[i + 1];
            if (k_next)
                m0[j] += a * k_next[i], m1[j] += c * k_next[i + 1];
        }
    }
    for (int j = 0; j < nv; j++) {
        *(v16u *)(ot + 16 * j) = o0[j] + o1[j];
        *(v16u *)(mem + 16 * j) = m0[j] + m1[j];
    }
}

/* delta_tile for any width w <= TILE and any key dim, in plain loops. */
static void delta_tile_any(float *state, int64_t dv, float *mem, const float *kn, const float *qn,
                           const float *k_next, const float *vt, float decay, float b, float *ot, int dk, int w) {
    float delta[TILE], o[TILE] = {0};
#pragma omp simd
    for (int j = 0; j < w; j++) delta[j] = (vt[j] - mem[j] * decay) * b;
    for (int i = 0; i < dk; i++) {
        float *si = state + i * dv;
#pragma omp simd
        for (int j = 0; j < w; j++) {
            si[j] = si[j] * decay + kn[i] * delta[j];
            o[j] += si[j] * qn[i];
        }
    }
    memcpy(ot, o, sizeof(float) * w);
    if (k_next)
        state_times(mem, state, dv, k_next, dk, w);
}

/* Gated DeltaNet's delta rule for `count` sequences of `length` tokens each, from and into their states
 * (states[slots[s]], in place), one token at a time. Per value head h (key head h / (value_heads /
 * key_heads)) and token, on l2-normed q (over sqrt(dk)) and k:
 *   S = S * exp(g);  mem = S^T k;  S = S + k (x) beta (v - mem);  out = S^T q
 * as transformers' recurrent kernel, up to the order of the float operations. A job is one sequence's head's
 * tile of TILE value columns through all its tokens; each token's q / k / v rows are asked for one token
 * ahead (rows of the flat batch are kilobytes apart: the hardware prefetcher does not follow them). g and
 * beta rows are [value heads] at gb_stride; q and k rows [key heads, dk] at qk_stride; v and out rows
 * [value heads, dv]. */
void seawall_gated_delta(float *out, int64_t out_stride, const float *q, const float *k, int64_t qk_stride,
                         const float *v, int64_t v_stride, const float *g, const float *beta, int64_t gb_stride,
                         float *states, const int64_t *slots, int count, int length, int key_heads,
                         int value_heads, int dk, int dv, float eps) {
    const int group = value_heads / key_heads, tiles = (dv + TILE - 1) / TILE;
    const float scale = 1.f / sqrtf((float)dk);
    const int64_t jobs = (int64_t)count * value_heads * tiles;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1 && (int64_t)count * length * value_heads * dk * dv >= PARALLEL_FLOATS)
    for (int64_t job = 0; job < jobs; job++) {
        const int s = (int)(job / (value_heads * tiles)), h = (int)(job / tiles % value_heads);
        const int c0 = (int)(job % tiles) * TILE, w = dv - c0 < TILE ? dv - c0 : TILE, kh = h / group;
        float *state = states + (slots[s] * value_heads + h) * (int64_t)dk * dv + c0;
        const int64_t first = (int64_t)s * length, qk_at = (int64_t)kh * dk, v_at = (int64_t)h * dv + c0;
        float qn[MAX_HEAD_DIM], kn[2][MAX_HEAD_DIM], mem[TILE];
        l2_normalize(kn[0], k + first * qk_stride + qk_at, dk, eps, 1.f);
        state_times(mem, state, dv, kn[0], dk, w);
        for (int t = 0; t < length; t++) {
            const int64_t row = first + t;
            const float *kt = kn[t & 1];
            float *k_next = NULL;
            if (t + 1 < length) {
                k_next = kn[(t + 1) & 1];
                l2_normalize(k_next, k + (row + 1) * qk_stride + qk_at, dk, eps, 1.f);
                if (t + 2 < length) {
                    __builtin_prefetch(q + (row + 2) * qk_stride + qk_at, 0, 1);
                    __builtin_prefetch(k + (row + 2) * qk_stride + qk_at, 0, 1);
                    __builtin_prefetch(v + (row + 2) * v_stride + v_at, 0, 1);
                }
            }
            l2_normalize(qn, q + row * qk_stride + qk_at, dk, eps, scale);
            const float decay = expf(g[row * gb_stride + h]), b = beta[row * gb_stride + h];
            const float *vt = v + row * v_stride + v_at;
            float *ot = out + row * out_stride + v_at;
            if (w == 32 && dk % 2 == 0)
                delta_tile(state, dv, mem, kt, qn, k_next, vt, decay, b, ot, dk, 2);
            else if (w == 16 && dk % 2 == 0)
                delta_tile(state, dv, mem, kt, qn, k_next, vt, decay, b, ot, dk, 1);
            else
                delta_tile_any(state, dv, mem, kt, qn, k_next, vt, decay, b, ot, dk, w);
        }
    }
}

/* One KDA token on a tile of w <= TILE value columns (rows d apart), given mem = (diag(exp(g)) S)^T k of the
 * state before the token: S = diag(decay) S + k (x) delta, out = S^T q, and with `k_next` (the next token's k
 * times its exp(g)) the next token's mem, in one pass over the tile. */
static void kda_tile(float *state, int64_t d, float *mem, const float *kn, const float *qn, const float *k_next,
                     const float *decay, const float *vt, float b, float *ot, int dk, int w) {
    float delta[TILE], o[TILE] = {0}, m[TILE] = {0};
#pragma omp simd
    for (int j = 0; j < w; j++) delta[j] = (vt[j] - mem[j]) * b;
    for (int i = 0; i < dk; i++) {
        float *si = state + i * d;
        const float di = decay[i], ki = kn[i], qi = qn[i], ni = k_next ? k_next[i] : 0.f;
#pragma omp simd
        for (int j = 0; j < w; j++) {
            const float a = si[j] * di + ki * delta[j];
            si[j] = a;
            o[j] += a * qi;
            m[j] += a * ni;
        }
    }
    memcpy(ot, o, sizeof(float) * w);
    memcpy(mem, m, sizeof(float) * w);
}

/* Kimi Delta Attention for `count` sequences of `length` tokens each, from and into their states
 * (states[slots[s]], [heads, d, d], in place), one token at a time. Per head h and token, on l2-normed q (times
 * d^-1/2) and k, with a decay per key channel:
 *   S = diag(exp(g)) S;  mem = S^T k;  S = S + k (x) beta (v - mem);  out = S^T q
 * as transformers' recurrent KDA, up to the order of the float operations ((diag(e^g) S)^T k is taken as
 * S^T (e^g k), so the next token's mem rides on this token's pass). A job is one sequence's head's tile of TILE
 * value columns through all its tokens. q, k and v rows are [heads, d] at qkv_stride; g rows [heads, d] at
 * g_stride; beta rows [heads] at beta_stride. */
void seawall_kda(float *out, int64_t out_stride, const float *q, const float *k, const float *v, int64_t qkv_stride,
                 const float *g, int64_t g_stride, const float *beta, int64_t beta_stride, float *states,
                 const int64_t *slots, int count, int length, int heads, int d, float eps) {
    const int tiles = (d + TILE - 1) / TILE;
    const float scale = 1.f / sqrtf((float)d);
    const int64_t jobs = (int64_t)count * heads * tiles;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1 && (int64_t)count * length * heads * d * d >= PARALLEL_FLOATS)
    for (int64_t job = 0; job < jobs; job++) {
        const int s = (int)(job / (heads * tiles)), h = (int)(job / tiles % heads);
        const int c0 = (int)(job % tiles) * TILE, w = d - c0 < TILE ? d - c0 : TILE;
        float *state = states + (slots[s] * heads + h) * (int64_t)d * d + c0;
        const int64_t first = (int64_t)s * length, at = (int64_t)h * d;
        float qn[MAX_HEAD_DIM], kn[2][MAX_HEAD_DIM], ke[MAX_HEAD_DIM], decay[2][MAX_HEAD_DIM], mem[TILE];
        /* The first token's mem: S^T (e^g k), as a pass would leave it for the token after. */
        l2_normalize(kn[0], k + first * qkv_stride + at, d, eps, 1.f);
        for (int i = 0; i < d; i++) decay[0][i] = expf(g[first * g_stride + at + i]), ke[i] = kn[0][i] * decay[0][i];
        state_times(mem, state, d, ke, d, w);
        for (int t = 0; t < length; t++) {
            const int64_t row = first + t;
            const int cur = t & 1, nxt = cur ^ 1;
            const float *k_next = NULL;
            if (t + 1 < length) {
                l2_normalize(kn[nxt], k + (row + 1) * qkv_stride + at, d, eps, 1.f);
                for (int i = 0; i < d; i++)
                    decay[nxt][i] = expf(g[(row + 1) * g_stride + at + i]), ke[i] = kn[nxt][i] * decay[nxt][i];
                k_next = ke;
            }
            l2_normalize(qn, q + row * qkv_stride + at, d, eps, scale);
            kda_tile(state, d, mem, kn[cur], qn, k_next, decay[cur], v + row * qkv_stride + at + c0,
                     beta[row * beta_stride + h], out + row * out_stride + at + c0, d, w);
        }
    }
}

#define SSM_ROWS 16 /* head-dim rows of a Mamba-2 state a job carries through the tokens: 8 KB at state size 128 */

/* softplus as torch computes it (its threshold: x above 20 passes). */
static inline float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

/* Mamba-2's scan for `count` sequences of `length` tokens each, from and into their states (states[slots[s]],
 * [heads, head_dim, state_size], in place), one token at a time. Per head h (group h / (heads / groups)) and
 * token, with dt = softplus(dt_raw + dt_bias) (clamped to [dt_min, dt_max] when `clamp`: transformers clamps in
 * its chunked scan, a prompt's, not in its decode step):
 *   S = S * exp(dt A) + (dt B) (x) x;  y = S C + D x
 * Each head-dim row of S evolves on its own, so a job is one sequence's head's SSM_ROWS rows through all its
 * tokens, kept in L1. x and y rows are [heads, head_dim] at their strides; B and C rows [groups, state_size]
 * at bc_stride; dt_raw rows [heads] at dt_stride. */
void seawall_mamba2_scan(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *b,
                         const float *c, int64_t bc_stride, const float *dt_raw, int64_t dt_stride,
                         const float *a, const float *d, const float *dt_bias, float *states, const int64_t *slots,
                         int count, int length, int heads, int groups, int head_dim, int state_size, int clamp,
                         float dt_min, float dt_max) {
    const int per_group = heads / groups, tiles = (head_dim + SSM_ROWS - 1) / SSM_ROWS;
    const int64_t jobs = (int64_t)count * heads * tiles;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1 && (int64_t)count * length * heads * head_dim * state_size >= PARALLEL_FLOATS)
    for (int64_t job = 0; job < jobs; job++) {
        const int s = (int)(job / (heads * tiles)), h = (int)(job / tiles % heads);
        const int p0 = (int)(job % tiles) * SSM_ROWS, rows = head_dim - p0 < SSM_ROWS ? head_dim - p0 : SSM_ROWS;
        const int64_t grp = (int64_t)(h / per_group) * state_size;
        float *state = states + ((slots[s] * heads + h) * (int64_t)head_dim + p0) * state_size;
        float dtb[MAX_STATE_SIZE];
        for (int t = 0; t < length; t++) {
            const int64_t row = (int64_t)s * length + t;
            float dt = softplus(dt_raw[row * dt_stride + h] + dt_bias[h]);
            if (clamp)
                dt = dt < dt_min ? dt_min : dt > dt_max ? dt_max : dt;
            const float decay = expf(dt * a[h]);
            const float *bt = b + row * bc_stride + grp, *ct = c + row * bc_stride + grp;
            const float *xt = x + row * x_stride + (int64_t)h * head_dim + p0;
            float *yt = y + row * y_stride + (int64_t)h * head_dim + p0;
#pragma omp simd
            for (int n = 0; n < state_size; n++) dtb[n] = dt * bt[n];
            for (int p = 0; p < rows; p++) {
                float *sp = state + (int64_t)p * state_size, acc = 0.f;
                const float xp = xt[p];
#pragma omp simd reduction(+ : acc)
                for (int n = 0; n < state_size; n++) {
                    sp[n] = sp[n] * decay + dtb[n] * xp;
                    acc += sp[n] * ct[n];
                }
                yt[p] = acc + xp * d[h];
            }
        }
    }
}

#define MAMBA1_CHANNELS 16 /* channels of a Mamba state a job carries through the tokens */

/* The first Mamba's scan (Jamba) for `count` sequences of `length` tokens each, from and into their states
 * (states[slots[s]], [channels, state_size], in place), one token at a time. Per channel i and token, with
 * dt = softplus(dt_raw + dt_bias):
 *   S = S * exp(dt A) + (dt B) x;  y = ((S C) + D x) * silu(z)
 * with A [channels, state_size] (-exp(A_log)) per state entry. Each channel's row of S evolves on its own: a job
 * is one sequence's MAMBA1_CHANNELS rows through all its tokens. x, dt_raw and z rows are [channels] at their
 * strides; B and C rows [state_size] at bc_stride; y rows [channels]. */
void seawall_mamba1_scan(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *dt_raw,
                         int64_t dt_stride, const float *z, int64_t z_stride, const float *b, const float *c,
                         int64_t bc_stride, const float *a, const float *d, const float *dt_bias, float *states,
                         const int64_t *slots, int count, int length, int channels, int state_size) {
    const int tiles = (channels + MAMBA1_CHANNELS - 1) / MAMBA1_CHANNELS;
    const int64_t jobs = (int64_t)count * tiles;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1 && (int64_t)count * length * channels * state_size >= PARALLEL_FLOATS)
    for (int64_t job = 0; job < jobs; job++) {
        const int s = (int)(job / tiles), i0 = (int)(job % tiles) * MAMBA1_CHANNELS;
        const int rows = channels - i0 < MAMBA1_CHANNELS ? channels - i0 : MAMBA1_CHANNELS;
        float *state = states + (slots[s] * (int64_t)channels + i0) * state_size;
        float arg[MAX_STATE_SIZE];
        for (int t = 0; t < length; t++) {
            const int64_t row = (int64_t)s * length + t;
            const float *bt = b + row * bc_stride, *ct = c + row * bc_stride;
            for (int r = 0; r < rows; r++) {
                const int i = i0 + r;
                const float dt = softplus(dt_raw[row * dt_stride + i] + dt_bias[i]), xi = x[row * x_stride + i];
                const float *ai = a + (int64_t)i * state_size;
                float *si = state + (int64_t)r * state_size, acc = 0.f;
#pragma omp simd
                for (int n = 0; n < state_size; n++) arg[n] = clamp_exp_arg(dt * ai[n]);
#pragma omp simd reduction(+ : acc)
                for (int n = 0; n < state_size; n++) {
                    si[n] = si[n] * exp_in_range(arg[n]) + dt * bt[n] * xi;
                    acc += si[n] * ct[n];
                }
                const float zi = z[row * z_stride + i];
                y[row * y_stride + i] = (acc + xi * d[i]) * (zi / (1.f + expf(-zi)));
            }
        }
    }
}
