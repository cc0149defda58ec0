// The small per-layer operations between the matrix products, each fused with
// its neighbours so that an intermediate does not make an extra trip through
// device memory: RMSNorm (+ residual add) (+ 8-bit quantization for the next
// product), QK-norm (+ gains) + RoPE + KV-cache write, SwiGLU / sigmoid gate +
// quantization, per-tensor scales and the logit scale / soft-cap.

#define NORM_BF16_GAIN 8  // bf16(bf16(u) * bf16(g)): the gain applied at bf16 rounding points (Muse Glimmer spec §3.1)

// Quantizes the 32 values held by a warp (one per lane) into block b.
__device__ __forceinline__ void quantize_lane(float v, int b, int lane, i8* xq, float* xd, float* xs) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    xq[b * 32 + lane] = (i8)q;
    const int sum = warp_sum_int(q);
    if (lane == 0) {
        xd[b] = d;
        xs[b] = d * (float)sum;
    }
}

// One block per row of x [rows, dim]: v = rmsnorm(x) (* g). With OUT_ADD the
// result is added into `out` (the residual stream); with OUT_BF16 the stored
// value is rounded to bf16. When xq is set, the stored row is also quantized
// to 8 bits (the next matrix product's input). dim % 32 == 0.
//
// The row's 32-value blocks are dealt to `nw` warps (warp w: blocks w, w +
// nw, ...), each summing its squares in that order, and the nw warp sums are
// added by one warp_sum: the result depends on nw only. A block of fewer
// warps than nw (the persistent kernel's) takes several of them per warp and
// gives the same bits as a launch of nw warps. For a single row this is
// latency-bound, so a warp's first NORM_REGS loads are issued together.
#define NORM_REGS 8
// (Activation pointers carry no __restrict__ in the operations the persistent
// kernel runs: a restrict-qualified const pointer may be read through the
// non-coherent cache, which another block's writes in the same launch do not reach.)
__device__ __forceinline__ void rmsnorm_op(const Blk& bk, int nw, const float* x, float* out,
                                           const float* __restrict__ g, int dim, float eps, int flags, i8* xq,
                                           float* xd, float* xs) {
    __shared__ float partial[32];
    const int row = bk.x;
    const float* xr = x + (size_t)row * dim;
    float* o = out + (size_t)row * dim;
    const int lane = bk.tid % WARP, warp = bk.tid / WARP, n_warps = bk.nt / WARP;
    const int n_blocks = dim / 32;
    for (int vw = warp; vw < nw; vw += n_warps) {
        float v[NORM_REGS];
#pragma unroll
        for (int k = 0; k < NORM_REGS; k++) {
            const int b = vw + k * nw;
            v[k] = b < n_blocks ? xr[b * 32 + lane] : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_REGS; k++) ss += v[k] * v[k];
        // Rows wider than NORM_REGS blocks per warp: the rest in a plain loop.
        for (int b = vw + NORM_REGS * nw; b < n_blocks; b += nw) ss += xr[b * 32 + lane] * xr[b * 32 + lane];
        ss = warp_sum(ss);
        if (lane == 0) partial[vw] = ss;
    }
    blk_sync(bk);
    const float ss = warp_sum(lane < nw ? partial[lane] : 0.0f);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int vw = warp; vw < nw; vw += n_warps) {
        for (int b = vw; b < n_blocks; b += nw) {
            const int i = b * 32 + lane;
            const float xv = xr[i];
            float r;
            if (flags & NORM_BF16_GAIN) {
                r = round_bf16(xv * scale);
                if (g) r = round_bf16(r * round_bf16(g[i]));
            } else {
                r = xv * scale;
                if (g) r *= g[i];
            }
            if (flags & OUT_ADD) r += o[i];
            if (flags & OUT_BF16) r = round_bf16(r);
            o[i] = r;
            if (xq) quantize_lane(r, row * n_blocks + b, lane, xq, xd, xs);
        }
    }
}

extern "C" __global__ void rmsnorm(const float* __restrict__ x, float* __restrict__ out, const float* __restrict__ g,
                                   int dim, float eps, int flags, i8* __restrict__ xq, float* __restrict__ xd,
                                   float* __restrict__ xs) {
    PDL_TRIGGER();
    PDL_WAIT();
    rmsnorm_op(launch_blk(), blockDim.x / WARP, x, out, g, dim, eps, flags, xq, xd, xs);
}

#define HEAD_QK_RMS 1   // RMSNorm of each q and k head (then the gains, when given)
#define HEAD_ROPE 2
#define HEAD_NEOX 4     // rotate halves (x[i], x[i + d/2]) instead of adjacent pairs
#define HEAD_BF16 8     // round to bf16 after the norm and after RoPE
#define HEAD_KV_BF16 16 // the cache stores bf16 (else f16)
#define HEAD_ROT_K 32   // rotate q and k (Walsh-Hadamard over the whole head: a quantized K cache)
#define HEAD_ROT_V 64   // rotate v in chunks of 64 (a quantized V cache)
#define HEAD_KV_Q8 128  // the cache stores q8_0 blocks (attention.cu's layout)
#define HEAD_KV_Q4 256  // the cache stores q4_0 blocks

// Prepares the heads of T new tokens: q [T, n_heads, hd] is normed/rotated in
// place; k and v [T, n_kv, hd] are normed/rotated and written to the cache
// [n_kv, slots, hd] at slot (pos % slots). One block of hd/2 threads per
// (token, head) over n_heads + 2 * n_kv heads (queries, keys, values).
// Positions come from device memory (pos0[0] + t) so that a captured graph
// stays valid as the sequence grows.
__device__ __forceinline__ void prepare_heads_op(const Blk& bk, float* q, const float* k, const float* v,
                                                 const float* __restrict__ qk_gain_q,
                                                 const float* __restrict__ qk_gain_k, int n_heads, int n_kv, int hd,
                                                 const int* pos0, float theta, float eps, int flags, u16* k_cache,
                                                 u16* v_cache, int slots) {
    const int per_token = n_heads + 2 * n_kv;
    const int t = bk.x / per_token, h = bk.x % per_token;
    const int i = bk.tid;  // pair index, 0..hd/2
    const int pos = pos0[0] + t;
    const int half = hd / 2;
    const bool is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv;
    float* dst_f = nullptr;
    const float* src;
    int kvh = 0;
    if (is_q) {
        src = dst_f = q + ((size_t)t * n_heads + h) * hd;
    } else if (is_k) {
        kvh = h - n_heads;
        src = k + ((size_t)t * n_kv + kvh) * hd;
    } else {
        kvh = h - n_heads - n_kv;
        src = v + ((size_t)t * n_kv + kvh) * hd;
    }
    const int a_idx = (flags & HEAD_NEOX) ? i : 2 * i;
    const int b_idx = (flags & HEAD_NEOX) ? i + half : 2 * i + 1;
    float x0 = src[a_idx], x1 = src[b_idx];
    const bool is_v = !is_q && !is_k;
    if (!is_v) {
        if (flags & HEAD_QK_RMS) {
            __shared__ float red[32];
            float ss = warp_sum(x0 * x0 + x1 * x1);
            if (i % WARP == 0) red[i / WARP] = ss;
            blk_sync(bk);
            ss = 0.0f;
            for (int w = 0; w < (half + WARP - 1) / WARP; w++) ss += red[w];
            const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
            x0 *= scale;
            x1 *= scale;
            if (flags & HEAD_BF16) {
                x0 = round_bf16(x0);
                x1 = round_bf16(x1);
            }
        }
        const float* gain = is_q ? qk_gain_q : qk_gain_k;
        if (gain) {
            x0 *= gain[a_idx];
            x1 *= gain[b_idx];
        }
        if (flags & HEAD_ROPE) {
            const float ang = (float)pos * (1.0f / powf(theta, (float)(2 * i) / (float)hd));
            float s, c;
            sincosf(ang, &s, &c);
            const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            x0 = r0;
            x1 = r1;
            if (flags & HEAD_BF16) {
                x0 = round_bf16(x0);
                x1 = round_bf16(x1);
            }
        }
    }
    // Where x0 and x1 go in the head (values 2i and 2i + 1 once rotated).
    int wa = a_idx, wb = b_idx;
    const bool rot = (flags & (is_v ? HEAD_ROT_V : HEAD_ROT_K)) != 0;
    const bool quant = !is_q && (flags & (HEAD_KV_Q8 | HEAD_KV_Q4)) != 0;
    if (rot || quant) {
        // The head in shared memory; thread i then owns values 2i and 2i + 1.
        __shared__ float row_s[256];
        row_s[a_idx] = x0;
        row_s[b_idx] = x1;
        blk_sync(bk);
        if (rot) {
            // llama.cpp's rotation with a quantized cache (the CPU path's fwht,
            // same order): chunks of n, scaled by 1/sqrt(n), then butterflies.
            // K: n = the head size (64, 128 or 256 here); V: n = 64.
            const int n = is_v ? 64 : hd;
            const float sc = 1.0f / sqrtf((float)n);
            row_s[2 * i] *= sc;
            row_s[2 * i + 1] *= sc;
            blk_sync(bk);
            for (int len = 1; len < n; len *= 2) {
                const int a = (i / len) * 2 * len + i % len;
                const float u = row_s[a], w = row_s[a + len];
                row_s[a] = u + w;
                row_s[a + len] = u - w;
                blk_sync(bk);
            }
        }
        x0 = row_s[2 * i];
        x1 = row_s[2 * i + 1];
        wa = 2 * i;
        wb = 2 * i + 1;
        if (quant) {
            // Block b = i / 16 of the row (16 lanes of one warp): llama.cpp's
            // CPU quantization (q8_0: its x86 rounding; q4_0: the reference).
            u8* cache = (u8*)(is_k ? k_cache : v_cache);
            const int slot = pos % slots, l = i % 16, b = i / 16;
            const size_t row = (size_t)kvh * slots + slot;
            if (flags & HEAD_KV_Q8) {
                float amax = fmaxf(fabsf(x0), fabsf(x1));
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
                const int q0 = __float2int_rn(__fmul_rn(x0, id)), q1 = __float2int_rn(__fmul_rn(x1, id));
                *(u16*)(cache + row * hd + 2 * i) = (u16)((q0 & 0xff) | ((q1 & 0xff) << 8));
                if (l == 0)
                    *(u16*)(cache + (size_t)n_kv * slots * hd + row * (hd / 16) + b * 2) =
                        f32_to_f16(__fdiv_rn(amax, 127.0f));
            } else {
                // The value of largest magnitude, the first of equals.
                float m = fabsf(x1) > fabsf(x0) ? x1 : x0;
                int mi = fabsf(x1) > fabsf(x0) ? 2 * i + 1 : 2 * i;
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) {
                    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
                    const int i2 = __shfl_xor_sync(0xffffffffu, mi, o);
                    if (fabsf(m2) > fabsf(m) || (fabsf(m2) == fabsf(m) && i2 < mi)) {
                        m = m2;
                        mi = i2;
                    }
                }
                const float d = __fdiv_rn(m, -8.0f);
                const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
                auto q4 = [&](float v) {
                    const float t = __fadd_rn(__fmul_rn(v, id), 8.5f);
                    return (u32)min(15, (int)t);
                };
                const u32 lo = q4(row_s[b * 32 + l]), hi = q4(row_s[b * 32 + l + 16]);
                cache[row * (hd / 2) + b * 16 + l] = (u8)(lo | (hi << 4));
                if (l == 0) *(u16*)(cache + (size_t)n_kv * slots * (hd / 2) + row * (hd / 16) + b * 2) = f32_to_f16(d);
            }
            return;
        }
    }
    if (is_q) {
        dst_f[wa] = x0;
        dst_f[wb] = x1;
    } else {
        u16* cache = is_k ? k_cache : v_cache;
        u16* row = cache + ((size_t)kvh * slots + (pos % slots)) * hd;
        if (flags & HEAD_KV_BF16) {
            row[wa] = f32_to_bf16(x0);
            row[wb] = f32_to_bf16(x1);
        } else {
            row[wa] = f32_to_f16(x0);
            row[wb] = f32_to_f16(x1);
        }
    }
}

extern "C" __global__ void prepare_heads(float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ qk_gain_q,
                                         const float* __restrict__ qk_gain_k, int n_heads, int n_kv, int hd,
                                         const int* __restrict__ pos0, float theta, float eps, int flags,
                                         u16* __restrict__ k_cache, u16* __restrict__ v_cache, int slots) {
    PDL_TRIGGER();
    PDL_WAIT();
    prepare_heads_op(launch_blk(), q, k, v, qk_gain_q, qk_gain_k, n_heads, n_kv, hd, pos0, theta, eps, flags,
                     k_cache, v_cache, slots);
}

#define GLU_SWIGLU 0  // silu(a) * b
#define GLU_GATE 1    // sigmoid(b) * a (Muse Glimmer's attention output gate)
#define GLU_GELU 2    // gelu(a) * b, GELU (tanh) as ggml's f16 table gives it (gemma3)

// ggml's GELU_FP16 table entry: f16(gelu(f16(x))) inside (-10, 10), 0 below, x above.
__device__ __forceinline__ float gelu_f16_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float h = f16_to_f32(f32_to_f16(x));
    const float inner = fmaf(0.044715f * h, h, 1.0f);
    const float g = 0.5f * h * (1.0f + tanhf(0.7978845608f * h * inner));
    return f16_to_f32(f32_to_f16(g));
}

// out = glu(a, b) elementwise over n values (n % 32 == 0), rounded to bf16
// with OUT_BF16, written as f32 (optional) and quantized to 8 bits. One warp per 32 values.
__device__ __forceinline__ void glu_q8_op(const Blk& bk, const float* a, const float* b, int n, int mode, int flags,
                                          float* out, i8* xq, float* xd, float* xs) {
    const int blk = bk.x * (bk.nt / WARP) + bk.tid / WARP;
    const int lane = bk.tid % WARP;
    if (blk >= n / 32) return;
    const int i = blk * 32 + lane;
    float v;
    if (mode == GLU_SWIGLU) {
        const float g = a[i];
        v = g / (1.0f + expf(-g)) * b[i];
    } else if (mode == GLU_GELU) {
        v = gelu_f16_table(a[i]) * b[i];
    } else {
        v = a[i] * (1.0f / (1.0f + expf(-b[i])));
    }
    if (flags & OUT_BF16) v = round_bf16(v);
    if (out) out[i] = v;
    quantize_lane(v, blk, lane, xq, xd, xs);
}

extern "C" __global__ void glu_q8(const float* __restrict__ a, const float* __restrict__ b, int n, int mode,
                                  int flags, float* __restrict__ out, i8* __restrict__ xq, float* __restrict__ xd,
                                  float* __restrict__ xs) {
    PDL_TRIGGER();
    PDL_WAIT();
    glu_q8_op(launch_blk(), a, b, n, mode, flags, out, xq, xd, xs);
}

// out[i] = y[i] * s (+ bias[i % width]) (+ out[i] with OUT_ADD) over n values:
// a product's per-tensor scale (`*.scale`, llama.cpp build_lora_mm), applied
// before its bias as llama.cpp's build_qkv does.
extern "C" __global__ void scale_bias(const float* __restrict__ y, float* __restrict__ out, int n, int width,
                                      float s, const float* __restrict__ bias, int flags) {
    PDL_TRIGGER();
    PDL_WAIT();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = y[i] * s;
        if (bias) v += bias[i % width];
        out[i] = (flags & OUT_ADD) ? out[i] + v : v;
    }
}

// The LM head's output transforms over n logits (llama.cpp muse-glimmer.cpp:
// 185-193): z * scale, then cap * tanh(z * (1 / cap)) when cap > 0.
extern "C" __global__ void logit_transform(float* __restrict__ z, int n, float scale, float cap) {
    PDL_TRIGGER();
    PDL_WAIT();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = z[i] * scale;
        if (cap > 0.0f) v = tanhf(v * (1.0f / cap)) * cap;
        z[i] = v;
    }
}

// Fills n cache entries with pseudo-random values in [-1, 1) (a hash of the
// index and seed), stored as bf16 or f16. Benchmarks use it to put a long
// context in the cache without prefilling it.
extern "C" __global__ void fill_random_kv(u16* __restrict__ dst, u64 n, u32 seed, int bf16) {
    PDL_TRIGGER();
    PDL_WAIT();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u32 h = (u32)i * 0x9e3779b9u ^ (u32)(i >> 32) * 0x85ebca6bu ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        const float v = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        dst[i] = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
}

// out[r] = the index of row r's largest value (the lowest such index on a
// tie, as a front-to-back scan keeping the first maximum finds it), for rows
// of n values. One block per row.
extern "C" __global__ void argmax_rows(const float* __restrict__ x, int n, int* __restrict__ out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float* row = x + (size_t)blockIdx.x * n;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (v > best) {
            best = v;
            idx = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (v2 > best || (v2 == best && i2 < idx)) {
            best = v2;
            idx = i2;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        bv[warp] = best;
        bi[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) {
                best = bv[w];
                idx = bi[w];
            }
        out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}
