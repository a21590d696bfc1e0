/* Fused CPU kernels for the engine's fp32 path (loaded by cpu_kernels/__init__.py through ctypes).
 *
 * Why C: on the CPU the tiny model's step is dominated by per-op overhead and by memory traffic that eager
 * torch cannot fuse. Decode attention as gather + SDPA copies every context's K/V out of the pool and
 * reads it again; here each sequence (or each (sequence, KV head) when the batch has few rows) walks its
 * block table in place, once, with an online softmax. Norms, RoPE, SwiGLU and the greedy argmax are here
 * too: each is one pass over memory instead of several eager ops. Parallel regions use OpenMP: the library
 * links libgomp.so.1, which resolves to the copy torch already loaded, so these loops run on torch's own
 * thread team (a second team would fight it for cores).
 *
 * Layouts (all float32, innermost dimension contiguous):
 *   q / out rows: token i, head j at base + i * row_stride + j * head_dim
 *   K / V cache of one layer: block b, offset t, KV head h at base + b * block_stride + (t * kv_heads + h) * head_dim
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_exp.h"

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}


/* Asks for `count` floats of one token's K and V rows from `at`. The next block is elsewhere in the pool, so
 * the hardware prefetcher, which follows sequential reads within a page, cannot guess it; asking for its
 * rows one token at a time while this block's tokens are scored hides the wait without flooding the
 * line-fill buffers (all of a block at once stalled on them). */
static inline void prefetch_token(const float *k_cache, const float *v_cache, int64_t at, int count) {
    for (int d = 0; d < count; d += 16) {
        __builtin_prefetch(k_cache + at + d, 0, 2);
        __builtin_prefetch(v_cache + at + d, 0, 2);
    }
}

/* One step of an online softmax: n new scores p of a row whose running max and sum are *m and *l. Turns p
 * into exp(p - new max), updates *m and *l, and returns the factor the row's weighted sum so far must be
 * scaled by (0 on the first step, where *m is -inf). */
static inline __attribute__((always_inline)) float softmax_step(float *p, int n, float *m, float *l) {
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int t = 0; t < n; t++) mx = p[t] > mx ? p[t] : mx;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < n; t++) {
        p[t] = exp_clamped(p[t] - mx);
        sum += p[t];
    }
    const float corr = exp_clamped(*m - mx);
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

/* x rounded to bf16 (to nearest, ties to even), as torch converts a float to bfloat16. */
static inline float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, sizeof(x));
    return x;
}

/* ALiBi's bias on the score of key `key` for a query at `query`: slope * (key - query). With bf16_div > 0,
 * Falcon-RW's as transformers computes it: bf16(slope * bf16(key)) / bf16_div, by the key's absolute position
 * (its slope already bf16; a product of bf16s, rounded as torch rounds it). */
static inline float alibi_bias(float slope, int64_t key, int64_t query, float bf16_div) {
    return bf16_div > 0.f ? bf16_round(slope * bf16_round((float)key)) / bf16_div : slope * (float)(key - query);
}

/* Gemma 2's attention soft-capping: scores become cap * tanh(score / cap) before the softmax. */
static inline void soft_cap(float *p, int n, float cap) {
    for (int t = 0; t < n; t++) p[t] = cap * tanhf(p[t] / cap);
}

/* One query token, KV heads [head, head + heads) and their `group` query heads each:
 * out = softmax(q . K^T * scale) V over tokens [first, context_len) of `table`, in one pass over the
 * blocks with a running max and sum per query head (online softmax). With `sinks` (GPT-OSS; this job's query
 * heads' learned logits), each head's softmax has one more term, exp(sink), that weighs no value: it joins
 * the sum at the end. With `slopes` (ALiBi: BLOOM, MPT, Falcon-RW; this job's query heads' slopes), each score of
 * key j gains alibi_bias(slope, j, the query's position context_len - 1, alibi_div). */
static inline __attribute__((always_inline)) void attend(
    const float *q, float *out, const float *k_cache, const float *v_cache, const int64_t *table,
    int first, int context_len, int64_t block_stride, int block_size, int kv_heads, int head, int heads,
    int head_dim, int group, float scale, float softcap, const float *sinks, const float *slopes, float alibi_div) {
    const int rows = heads * group; /* query heads of this job */
    float m[rows], l[rows], acc[rows * head_dim], s[rows * block_size];
    for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.f;
    memset(acc, 0, sizeof(acc));
    const int64_t token_stride = (int64_t)kv_heads * head_dim, head_offset = (int64_t)head * head_dim;
    /* Keys [first, context_len): the first block may be entered part way (a sliding window's start). */
    for (int b = first / block_size, start = first; start < context_len; start = ++b * block_size) {
        const int skip = start - b * block_size;
        const int n = (context_len - b * block_size < block_size ? context_len - b * block_size : block_size) - skip;
        const float *kb = k_cache + table[b] * block_stride + head_offset + skip * token_stride;
        const float *vb = v_cache + table[b] * block_stride + head_offset + skip * token_stride;
        const int64_t next = (b + 1) * block_size < context_len ? table[b + 1] * block_stride + head_offset : -1;
        for (int t = 0; t < n; t++) {
            if (next >= 0)
                prefetch_token(k_cache, v_cache, next + t * token_stride, heads * head_dim);
            for (int r = 0; r < rows; r++)
                s[r * block_size + t] = dot(q + r * head_dim, kb + t * token_stride + (r / group) * head_dim, head_dim) * scale;
            if (slopes)
                for (int r = 0; r < rows; r++) s[r * block_size + t] += alibi_bias(slopes[r], start + t, context_len - 1, alibi_div);
        }
        for (int r = 0; r < rows; r++) {
            float *p = s + r * block_size;
            if (softcap > 0.f)
                soft_cap(p, n, softcap);
            const float corr = softmax_step(p, n, &m[r], &l[r]);
            float *a = acc + r * head_dim;
            const float *vr = vb + (r / group) * head_dim;
#pragma omp simd
            for (int d = 0; d < head_dim; d++) a[d] *= corr;
            for (int t = 0; t < n; t++) {
                const float *v = vr + t * token_stride, pt = p[t];
#pragma omp simd
                for (int d = 0; d < head_dim; d++) a[d] += pt * v[d];
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const float inv = 1.f / (sinks ? l[r] + exp_clamped(sinks[r] - m[r]) : l[r]);
        for (int d = 0; d < head_dim; d++) out[r * head_dim + d] = acc[r * head_dim + d] * inv;
    }
}

/* The first key a query sees when its keys end (exclusive) at key_end: with window > 0, the last `window`
 * (sliding-window attention); with chunk > 0, those since the start of its chunk of `chunk` positions (Llama
 * 4's chunked attention); else all. */
static inline int64_t first_key_of(int64_t key_end, int window, int chunk) {
    if (window > 0)
        return key_end > window ? key_end - window : 0;
    return chunk > 0 ? (key_end - 1) / chunk * chunk : 0;
}

/* Decode attention: row i (one query token) attends to the first context_lens[i] tokens of its block table
 * (block_tables[i * table_stride ...]), or with window > 0 to the last `window` of them (sliding-window
 * attention), with chunk > 0 to those in its own chunk (first_key_of; the blocks before are never read); with softcap > 0 each score is capped first (Gemma 2);
 * with sinks (one logit per query head, or NULL) each head's softmax has a sink term (GPT-OSS); with slopes
 * (one per query head, or NULL) each score has its ALiBi bias (attend).
 * Queries have kv_heads * group heads of head_dim.
 * A job is one row and all its heads, so each block is read front to back, as one region; with fewer rows
 * than a few per thread, a job is one row and one KV head, so a lone long decode still uses every thread. */
void seawall_paged_decode(float *out, int64_t out_row_stride, const float *q, int64_t q_row_stride,
                          const float *k_cache, const float *v_cache, int64_t block_stride, int block_size,
                          int kv_heads, int head_dim, int group, int num_rows, const int64_t *block_tables,
                          int64_t table_stride, const int64_t *context_lens, int window, int chunk, float scale,
                          float softcap, const float *sinks, const float *slopes, float alibi_div) {
    const int split = num_rows < 4 * omp_get_max_threads();
    const int heads = split ? 1 : kv_heads, per_row = kv_heads / heads, jobs = num_rows * per_row;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1)
    for (int job = 0; job < jobs; job++) {
        const int i = job / per_row, h = (job % per_row) * heads;
        const int64_t head_offset = (int64_t)h * group * head_dim;
        const float *qi = q + i * q_row_stride + head_offset;
        float *oi = out + i * out_row_stride + head_offset;
        const int64_t *table = block_tables + i * table_stride;
        const int ctx = (int)context_lens[i], first = (int)first_key_of(ctx, window, chunk);
        const float *sk = sinks ? sinks + h * group : NULL, *sl = slopes ? slopes + h * group : NULL;
        /* Constant head sizes let the compiler unroll the inner loops into a few vector instructions. */
        switch (head_dim) {
        case 32: attend(qi, oi, k_cache, v_cache, table, first, ctx, block_stride, block_size, kv_heads, h, heads, 32, group, scale, softcap, sk, sl, alibi_div); break;
        case 64: attend(qi, oi, k_cache, v_cache, table, first, ctx, block_stride, block_size, kv_heads, h, heads, 64, group, scale, softcap, sk, sl, alibi_div); break;
        case 128: attend(qi, oi, k_cache, v_cache, table, first, ctx, block_stride, block_size, kv_heads, h, heads, 128, group, scale, softcap, sk, sl, alibi_div); break;
        default: attend(qi, oi, k_cache, v_cache, table, first, ctx, block_stride, block_size, kv_heads, h, heads, head_dim, group, scale, softcap, sk, sl, alibi_div);
        }
    }
}

/* Writes each token's K and V (kv_heads * head_dim floats, rows of k / v at their strides) into its slot. */
void seawall_kv_write(float *k_cache, float *v_cache, int64_t block_stride, const float *k,
                      int64_t k_row_stride, const float *v, int64_t v_row_stride, int row_len,
                      const int64_t *slot_blocks, const int64_t *slot_offsets, int num_tokens) {
    for (int i = 0; i < num_tokens; i++) {
        const int64_t at = slot_blocks[i] * block_stride + slot_offsets[i] * (int64_t)row_len;
        memcpy(k_cache + at, k + i * k_row_stride, sizeof(float) * row_len);
        memcpy(v_cache + at, v + i * v_row_stride, sizeof(float) * row_len);
    }
}

/* Rows big enough to be worth a parallel region (waking the second thread costs a few microseconds). */
#ifndef PARALLEL_FLOATS
#define PARALLEL_FLOATS 16384
#endif

/* Blocks ids[i] of a float8 e4m3 pool's layer view (block_elems bytes each, block_stride bytes apart) widened
 * into consecutive fp32 rows of out, times scale (a checkpoint's calibrated KV scale, else 1: exact), as torch's
 * cast then product: the gather of the torch attention path and the widening in one pass (torch
 * converts e4m3 ~13x slower than a copy here). A byte s eeee mmm is 2^(e-7) * (1 + m/8), m * 2^-9 where e = 0,
 * and NaN as 0x7f / 0xff (never written: kv_quant.py saturates); branch-free, so the loop vectorises. */
void seawall_gather_e4m3(float *out, const uint8_t *cache, int64_t block_stride, int64_t block_elems,
                         const int64_t *ids, int64_t n, float scale) {
#pragma omp parallel for if (n * block_elems >= 4 * PARALLEL_FLOATS)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = cache + ids[i] * block_stride;
        float *dst = out + i * block_elems;
        for (int64_t j = 0; j < block_elems; j++) {
            const uint32_t b = src[j], sign = (b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
            union { float f; uint32_t u; } sub = { .f = (float)m * 0.001953125f };
            union { float f; uint32_t u; } v = { .u = e ? sign | ((e + 120u) << 23) | (m << 20) : sign | sub.u };
            dst[j] = ((b & 0x7fu) == 0x7fu ? NAN : v.f) * scale;
        }
    }
}

/* RMSNorm with the residual add folded in (Llama's pre-norm blocks). With `residual`: residual += x, then
 * out = norm(residual) * weight; without: out = norm(x) * weight. Rows are `dim` floats at their strides. */
void seawall_add_rms_norm(float *out, int64_t out_stride, const float *x, int64_t x_stride, float *residual,
                          int64_t residual_stride, const float *weight, int rows, int dim, float eps) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * dim >= PARALLEL_FLOATS)
    for (int i = 0; i < rows; i++) {
        const float *xi = x + i * x_stride;
        float *o = out + i * out_stride;
        const float *src = xi;
        if (residual) {
            float *r = residual + i * residual_stride;
#pragma omp simd
            for (int d = 0; d < dim; d++) r[d] += xi[d];
            src = r;
        }
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int d = 0; d < dim; d++) ss += src[d] * src[d];
        const float inv = 1.f / sqrtf(ss / dim + eps);
#pragma omp simd
        for (int d = 0; d < dim; d++) o[d] = weight[d] * (src[d] * inv);
    }
}

/* Rotary embedding in place over `heads` heads of head_dim per token (q and k side by side in the fused
 * projection's output), rotate-half form over each head's first rot_dim features (the rest pass: partial
 * rotary): cos/sin rows are [rot_dim] per token, both halves equal. */
void seawall_rope(float *x, int64_t x_stride, const float *cos, const float *sin, int tokens, int heads,
                  int head_dim, int rot_dim) {
    const int half = rot_dim / 2;
#pragma omp parallel for schedule(static) if ((int64_t)tokens * heads * rot_dim >= PARALLEL_FLOATS)
    for (int t = 0; t < tokens; t++) {
        const float *c = cos + (int64_t)t * rot_dim, *s = sin + (int64_t)t * rot_dim;
        for (int h = 0; h < heads; h++) {
            float *a = x + t * x_stride + (int64_t)h * head_dim, *b = a + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float x1 = a[i], x2 = b[i];
                a[i] = x1 * c[i] - x2 * s[i];
                b[i] = x2 * c[half + i] + x1 * s[half + i];
            }
        }
    }
}

/* SwiGLU's gate: out[i] = silu(gate[i]) * up[i], gate and up the two halves of each gate_up row. */
void seawall_silu_mul(float *out, int64_t out_stride, const float *gate_up, int64_t in_stride, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * dim >= PARALLEL_FLOATS)
    for (int i = 0; i < rows; i++) {
        const float *g = gate_up + i * in_stride, *u = g + dim;
        float *o = out + i * out_stride;
        /* The clamped arguments go through memory on purpose: inlined, the clamp let GCC give each clamped
         * case its own copy of the formula, evaluated for every lane and then blended, and g / (1 + e^88) is
         * subnormal for |g| < 2: a microcode assist per vector made this loop ~9x slower. */
        float arg[256];
        for (int d0 = 0; d0 < dim; d0 += 256) {
            const int n = dim - d0 < 256 ? dim - d0 : 256;
#pragma omp simd
            for (int d = 0; d < n; d++) arg[d] = clamp_exp_arg(-g[d0 + d]);
#pragma omp simd
            for (int d = 0; d < n; d++) o[d0 + d] = g[d0 + d] / (1.f + exp_in_range(arg[d])) * u[d0 + d];
        }
    }
}

/* Index of each row's largest value, the first one on ties and the first NaN if there is one (torch's
 * argmax). Two passes over a row, both vectorised: its max (and whether it holds a NaN), then the first
 * index holding it. torch's argmax over [64, 4096] logits took ~120 us here, this ~47. */
void seawall_argmax_rows(int64_t *out, const float *x, int64_t row_stride, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols >= PARALLEL_FLOATS)
    for (int i = 0; i < rows; i++) {
        const float *r = x + i * row_stride;
        float mx = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
        for (int j = 0; j < cols; j++) {
            mx = r[j] > mx ? r[j] : mx;
            nan |= r[j] != r[j];
        }
        /* The first index holding it, 64 columns at a time: a vectorised test per chunk, a scan of one. */
        int64_t at = 0;
        for (int j0 = 0; j0 < cols; j0 += 64) {
            const int end = j0 + 64 < cols ? j0 + 64 : cols;
            int hit = 0;
#pragma omp simd reduction(| : hit)
            for (int j = j0; j < end; j++) hit |= nan ? r[j] != r[j] : r[j] == mx;
            if (!hit)
                continue;
            for (at = j0; !(nan ? r[at] != r[at] : r[at] == mx); at++)
                ;
            break;
        }
        out[i] = at;
    }
}

#define KEY_TILE 64
#define ROW_TILE 64

/* 16 floats as one value (GCC vector extensions: one AVX-512 register, or two or four narrower ones on CPUs
 * without it); the "u" type may sit at any float-aligned address. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

/* acc[j] = acc[j] * corr[j] + sum over keys t < n of p[j][t] * V_t, for the `group` query heads of one KV
 * head (p rows KEY_TILE + 16 apart, acc rows head_dim apart). Each V row is loaded once for the whole group,
 * and keys go two at a time into separate sums, so no FMA waits on the one before it. */
static inline __attribute__((always_inline)) void weigh_values(float *acc, const float *p, const float *corr,
                                                               const float *const *vrow, int n, int head_dim,
                                                               int group) {
    int dv = 0;
    for (; dv + 16 <= head_dim; dv += 16) {
        v16 a0[group], a1[group];
        for (int j = 0; j < group; j++) a0[j] = *(v16u *)(acc + j * head_dim + dv) * corr[j], a1[j] = (v16){0};
        int t = 0;
        for (; t + 2 <= n; t += 2) {
            const v16 v0 = *(const v16u *)(vrow[t] + dv), v1 = *(const v16u *)(vrow[t + 1] + dv);
            for (int j = 0; j < group; j++) {
                a0[j] += p[j * (KEY_TILE + 16) + t] * v0;
                a1[j] += p[j * (KEY_TILE + 16) + t + 1] * v1;
            }
        }
        if (t < n) {
            const v16 v0 = *(const v16u *)(vrow[t] + dv);
            for (int j = 0; j < group; j++) a0[j] += p[j * (KEY_TILE + 16) + t] * v0;
        }
        for (int j = 0; j < group; j++) *(v16u *)(acc + j * head_dim + dv) = a0[j] + a1[j];
    }
    for (; dv < head_dim; dv++) /* head sizes that are not a multiple of 16 */
        for (int j = 0; j < group; j++) {
            float ad = acc[j * head_dim + dv] * corr[j];
            for (int t = 0; t < n; t++) ad += p[j * (KEY_TILE + 16) + t] * vrow[t][dv];
            acc[j * head_dim + dv] = ad;
        }
}

/* Prompt chunks: chunk c's query rows [token_starts[c], + lens[c]) attend causally to the first prefix[c]
 * + i + 1 tokens of its block table: its cached prefix, then itself (its own K/V are already in the pool,
 * so nothing is gathered); with window > 0 or chunk > 0, those first_key_of leaves; with softcap > 0, scores capped as
 * in the decode; sinks and slopes as in the decode. One job is one chunk, one KV head and up to ROW_TILE rows. It
 * walks the keys in tiles of KEY_TILE, copies each tile's K transposed (head_dim x keys) so that a row's
 * scores are vector FMAs across 64 keys, and keeps an online softmax per row and query head; a row's query
 * heads then weigh V together (weigh_values). The inner loops run independent FMA chains: with one, each
 * FMA waited on the last (latency-bound, 2.5x slower). Measured on 64 fresh 128-token prompts, tiny model:
 * scores ~26 % of the time, the softmax ~36 % (head_dim 32 leaves little work per exp), V ~12 %. */

void seawall_paged_prefill(float *out, int64_t out_row_stride, const float *q, int64_t q_row_stride,
                           const float *k_cache, const float *v_cache, int64_t block_stride, int block_size,
                           int kv_heads, int head_dim, int group, int num_chunks, const int64_t *token_starts,
                           const int64_t *lens, const int64_t *prefix, const int64_t *block_tables,
                           int64_t table_stride, int window, int chunk, float scale, float softcap,
                           const float *sinks, const float *slopes, float alibi_div) {
    int64_t tiles_before[num_chunks + 1];
    tiles_before[0] = 0;
    for (int c = 0; c < num_chunks; c++) tiles_before[c + 1] = tiles_before[c] + (lens[c] + ROW_TILE - 1) / ROW_TILE;
    const int64_t jobs = tiles_before[num_chunks] * kv_heads;
    const int64_t token_stride = (int64_t)kv_heads * head_dim;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1)
    for (int64_t job = 0; job < jobs; job++) {
        const int h = (int)(job % kv_heads);
        const int64_t tile = job / kv_heads;
        int c = 0;
        while (tiles_before[c + 1] <= tile) c++;
        const int64_t row0 = (tile - tiles_before[c]) * ROW_TILE;
        const int rows = (int)(lens[c] - row0 < ROW_TILE ? lens[c] - row0 : ROW_TILE);
        const int64_t first_key_end = prefix[c] + row0 + 1, last_key_end = prefix[c] + row0 + rows;
        const int64_t *table = block_tables + c * table_stride;
        const int nq = rows * group;
        float m[nq], l[nq], s[group * (KEY_TILE + 16)], kt[head_dim * KEY_TILE + 16];
        memset(kt, 0, sizeof(kt)); /* the lanes past a short tile's last key are computed, never used */
        float *acc = calloc((size_t)nq * head_dim, sizeof(float));
        const float *vrow[KEY_TILE];
        for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0.f;
        /* Row i sees keys [first_key_of(key_end), key_end): tiles before row 0's first are skipped. */
        const int64_t first_key = first_key_of(first_key_end, window, chunk);
        for (int64_t ts = first_key / KEY_TILE * KEY_TILE; ts < last_key_end; ts += KEY_TILE) {
            const int n_tile = (int)(last_key_end - ts < KEY_TILE ? last_key_end - ts : KEY_TILE);
            for (int t = 0; t < n_tile; t++) {
                const int64_t key = ts + t;
                const int64_t at = table[key / block_size] * block_stride + (key % block_size) * token_stride +
                                   (int64_t)h * head_dim;
                const float *kr = k_cache + at;
                for (int d = 0; d < head_dim; d++) kt[d * KEY_TILE + t] = kr[d];
                vrow[t] = v_cache + at;
            }
            for (int i = 0; i < rows; i++) {
                const int64_t key_end = first_key_end + i, key_start = first_key_of(key_end, window, chunk);
                if (key_end <= ts || key_start >= ts + n_tile)
                    continue;
                /* The row's keys in this tile: [skip, n) (skip > 0 only where its window or chunk starts in it). */
                const int skip = (int)(key_start > ts ? key_start - ts : 0);
                const int n = (int)(key_end - ts < n_tile ? key_end - ts : n_tile);
                const float *qi = q + (token_starts[c] + row0 + i) * q_row_stride + (int64_t)h * group * head_dim;
                float corr[group];
                for (int j = 0; j < group; j++) {
                    const float *qj = qi + j * head_dim;
                    const int r = i * group + j;
                    float *sj = s + j * (KEY_TILE + 16);
                    {   /* all 64 keys of the tile at once: four independent FMA chains over head_dim */
                        v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
                        for (int d = 0; d < head_dim; d++) {
                            const float qd = qj[d] * scale;
                            const float *kd = kt + d * KEY_TILE;
                            s0 += qd * *(const v16u *)(kd);
                            s1 += qd * *(const v16u *)(kd + 16);
                            s2 += qd * *(const v16u *)(kd + 32);
                            s3 += qd * *(const v16u *)(kd + 48);
                        }
                        *(v16u *)(sj) = s0;
                        *(v16u *)(sj + 16) = s1;
                        *(v16u *)(sj + 32) = s2;
                        *(v16u *)(sj + 48) = s3;
                    }
                    if (slopes)  /* ALiBi: the row's query is at key_end - 1 */
                        for (int t = skip; t < n; t++) sj[t] += alibi_bias(slopes[h * group + j], ts + t, key_end - 1, alibi_div);
                    if (softcap > 0.f)
                        soft_cap(sj + skip, n - skip, softcap);
                    corr[j] = softmax_step(sj + skip, n - skip, &m[r], &l[r]);
                }
                /* The group's query heads share this KV head's V rows: each row is loaded once for all of them. */
                float *a = acc + (int64_t)i * group * head_dim;
                switch (group) {
                case 1: weigh_values(a, s + skip, corr, vrow + skip, n - skip, head_dim, 1); break;
                case 2: weigh_values(a, s + skip, corr, vrow + skip, n - skip, head_dim, 2); break;
                case 4: weigh_values(a, s + skip, corr, vrow + skip, n - skip, head_dim, 4); break;
                case 8: weigh_values(a, s + skip, corr, vrow + skip, n - skip, head_dim, 8); break;
                default: weigh_values(a, s + skip, corr, vrow + skip, n - skip, head_dim, group);
                }
            }
        }
        for (int i = 0; i < rows; i++) {
            float *o = out + (token_starts[c] + row0 + i) * out_row_stride + (int64_t)h * group * head_dim;
            for (int j = 0; j < group; j++) {
                const int r = i * group + j;
                const float inv = 1.f / (sinks ? l[r] + exp_clamped(sinks[h * group + j] - m[r]) : l[r]);
                for (int d = 0; d < head_dim; d++) o[j * head_dim + d] = acc[(int64_t)r * head_dim + d] * inv;
            }
        }
        free(acc);
    }
}
