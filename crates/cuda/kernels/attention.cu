// Attention over the KV cache: split-K flash decoding ("Flash-Decoding",
// Dao et al. 2023). The keys a query attends to are cut into S splits; each
// block takes one (kv head, split, token), scores all the query heads that
// share that kv head (GQA) against its keys, and keeps an online softmax
// (running max m, sum l, unnormalised output). attn_combine merges the
// splits. The same kernels serve one decode token (T = 1, many splits, so
// that long contexts fill the GPU) and blocks of T tokens (speculative
// verify, prefill) with fewer splits.
//
// Caches are [n_kv, slots, hd] in f16 or bf16. A flat cache holds position p
// in slot p; a ring holds it in slot p % slots and slots >= window + T - 1,
// so that the T new keys, written before this kernel runs, never overwrite a
// key that one of the T queries still needs.

#define ATT_TILE 32     // keys per tile
#define ATT_THREADS 128
#define ATT_MAX_G 16    // query heads per kv head
#define ATT_KPAD 32     // halves of padding per K row (conflict-free 16-byte reads by 4 threads per key)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared without passing through registers (cp.async):
// the next tile streams in while this one is computed.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Tiles of keys and values are copied to shared memory with cp.async, two
// buffers deep. Scores: four threads per key, each taking every fourth
// 8-dimension chunk, with the queries of all G heads from shared memory.
// Values: thread pair-of-dimensions dp of every head, over pairs of keys.
template <int HD, bool BF16>
__device__ __forceinline__ void attn_split(const float* __restrict__ q, const u16* __restrict__ kc,
                                           const u16* __restrict__ vc, const int* __restrict__ pos0, int n_heads,
                                           int n_kv, int slots, int window, float scale, float* __restrict__ part_o,
                                           float* __restrict__ part_ml) {
    const int kvh = blockIdx.x, s = blockIdx.y, t = blockIdx.z, S = gridDim.y;
    const int G = n_heads / n_kv;
    const int tid = threadIdx.x;
    const int qpos = pos0[0] + t;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int n = qpos - lo + 1;
    // At least a few tiles per split: short spans use fewer splits (the rest exit).
    const int chunk = max((n + S - 1) / S, 2 * ATT_TILE);
    const int start = lo + s * chunk, end = min(start + chunk, qpos + 1);

    __shared__ __align__(16) u16 Ks[2][ATT_TILE][HD + ATT_KPAD];
    __shared__ __align__(16) u16 Vs[2][ATT_TILE][HD];
    __shared__ __align__(16) float qs[ATT_MAX_G][HD];
    __shared__ __align__(16) float sc[ATT_MAX_G][ATT_TILE];
    __shared__ float alpha[ATT_MAX_G], m_run[ATT_MAX_G], l_run[ATT_MAX_G];

    const u16* kh = kc + (size_t)kvh * slots * HD;
    const u16* vh = vc + (size_t)kvh * slots * HD;
    constexpr int CHUNKS = HD / 8;  // 16-byte pieces per row
    auto issue = [&](int buf, int base) {
        const int n_here = min(ATT_TILE, end - base);
        for (int i = tid; i < n_here * CHUNKS; i += ATT_THREADS) {
            const int r = i / CHUNKS, c = i % CHUNKS;
            const size_t row = (size_t)((base + r) % slots) * HD;
            cp_async16(&Ks[buf][r][c * 8], kh + row + c * 8);
            cp_async16(&Vs[buf][r][c * 8], vh + row + c * 8);
        }
        cp_async_commit();
    };
    if (start < end) issue(0, start);

    for (int i = tid; i < G * HD; i += ATT_THREADS) {
        const int g = i / HD, d = i % HD;
        qs[g][d] = q[((size_t)t * n_heads + kvh * G + g) * HD + d];
    }
    if (tid < G) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }
    const int dp = tid % (HD / 2), kg = tid / (HD / 2), n_kg = ATT_THREADS / (HD / 2);
    float acc[ATT_MAX_G][2];
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++) acc[g][0] = acc[g][1] = 0.0f;

    int buf = 0;
    for (int base = start; base < end; base += ATT_TILE, buf ^= 1) {
        const int n_here = min(ATT_TILE, end - base);
        if (base + ATT_TILE < end) {
            issue(buf ^ 1, base + ATT_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // Scores: key kk, chunks c = 4j + h.
        {
            const int kk = tid / 4, h = tid % 4;
            float sg[ATT_MAX_G];
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++) sg[g] = 0.0f;
            if (kk < n_here) {
#pragma unroll
                for (int j = 0; j < CHUNKS / 4; j++) {
                    const int c = 4 * j + h;
                    const uint4 u = *(const uint4*)&Ks[buf][kk][c * 8];
                    const u32 w[4] = {u.x, u.y, u.z, u.w};
                    float kf[8];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        kf[2 * e] = BF16 ? bf16_to_f32(w[e] & 0xffff) : f16_to_f32(w[e] & 0xffff);
                        kf[2 * e + 1] = BF16 ? bf16_to_f32(w[e] >> 16) : f16_to_f32(w[e] >> 16);
                    }
#pragma unroll
                    for (int g = 0; g < ATT_MAX_G; g++) {
                        if (g < G) {
                            const float4 qa = *(const float4*)&qs[g][c * 8];
                            const float4 qb = *(const float4*)&qs[g][c * 8 + 4];
                            sg[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                     qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                        }
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++) {
                if (g < G) {
                    float v = sg[g] + __shfl_xor_sync(0xffffffffu, sg[g], 1);
                    v += __shfl_xor_sync(0xffffffffu, v, 2);
                    if (h == 0) sc[g][kk] = kk < n_here ? v * scale : -INFINITY;
                }
            }
        }
        __syncthreads();
        // Online softmax per head: warp w takes heads w, w + 4, ...; one key per lane.
        const int warp = tid / WARP, lane = tid % WARP;
        for (int g = warp; g < G; g += ATT_THREADS / WARP) {
            const float x = sc[g][lane];
            const float m_new = fmaxf(m_run[g], warp_max(x));
            const float e = x == -INFINITY ? 0.0f : expf(x - m_new);
            sc[g][lane] = e;
            const float sum = warp_sum(e);
            if (lane == 0) {
                const float a = m_run[g] == -INFINITY ? 0.0f : expf(m_run[g] - m_new);
                alpha[g] = a;
                l_run[g] = l_run[g] * a + sum;
                m_run[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++)
            if (g < G) {
                acc[g][0] *= alpha[g];
                acc[g][1] *= alpha[g];
            }
        for (int jj = kg; 2 * jj < n_here; jj += n_kg) {
            const int j = 2 * jj;
            const u32 r0 = *(const u32*)&Vs[buf][j][2 * dp];
            const bool two = j + 1 < n_here;  // rows past n_here hold stale data
            const u32 r1 = two ? *(const u32*)&Vs[buf][j + 1][2 * dp] : 0u;
            const float v00 = BF16 ? bf16_to_f32(r0 & 0xffff) : f16_to_f32(r0 & 0xffff);
            const float v01 = BF16 ? bf16_to_f32(r0 >> 16) : f16_to_f32(r0 >> 16);
            const float v10 = BF16 ? bf16_to_f32(r1 & 0xffff) : f16_to_f32(r1 & 0xffff);
            const float v11 = BF16 ? bf16_to_f32(r1 >> 16) : f16_to_f32(r1 >> 16);
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) {
                    const float2 p = *(const float2*)&sc[g][j];
                    acc[g][0] += p.x * v00 + p.y * v10;
                    acc[g][1] += p.x * v01 + p.y * v11;
                }
        }
        __syncthreads();
    }
    // Reduce the key groups through shared memory (reusing the K tiles), then
    // write this split's partial result.
    float* o_red = (float*)&Ks[0][0][0];  // [G][HD] floats fit in the K tiles
    for (int r = 0; r < n_kg; r++) {
        if (kg == r) {
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) {
                    o_red[g * HD + 2 * dp] = (r == 0 ? 0.0f : o_red[g * HD + 2 * dp]) + acc[g][0];
                    o_red[g * HD + 2 * dp + 1] = (r == 0 ? 0.0f : o_red[g * HD + 2 * dp + 1]) + acc[g][1];
                }
        }
        __syncthreads();
    }
    for (int i = tid; i < G * HD; i += ATT_THREADS) {
        const int g = i / HD, dd = i % HD;
        const size_t idx = ((size_t)t * n_heads + kvh * G + g) * S + s;
        part_o[idx * HD + dd] = o_red[g * HD + dd];
        if (dd == 0) {
            part_ml[idx * 2] = m_run[g];
            part_ml[idx * 2 + 1] = l_run[g];
        }
    }
}

#define ATTN_KERNEL(name, HD, BF16)                                                                         \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) name(                                             \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                 \
        const int* __restrict__ pos0, int n_heads, int n_kv, int slots, int window, float scale,             \
        float* __restrict__ part_o, float* __restrict__ part_ml) {                                           \
        attn_split<HD, BF16>(q, kc, vc, pos0, n_heads, n_kv, slots, window, scale, part_o, part_ml);          \
    }

ATTN_KERNEL(attn_split_64_f16, 64, false)
ATTN_KERNEL(attn_split_64_bf16, 64, true)
ATTN_KERNEL(attn_split_128_f16, 128, false)
ATTN_KERNEL(attn_split_128_bf16, 128, true)

// Merges the S partial results of each (token, head): out = sum_s e^(m_s - M) o_s
// / sum_s e^(m_s - M) l_s. One block of hd threads per (head, token): the
// split weights are computed once, in parallel, into shared memory.
#define ATT_MAX_SPLITS 1024
// With xq set, the output is also quantized to 8 bits (the next product's input).
extern "C" __global__ void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, int S,
                                        int hd, int flags, float* __restrict__ out, i8* __restrict__ xq,
                                        float* __restrict__ xd, float* __restrict__ xs) {
    const int h = blockIdx.x, t = blockIdx.y, n_heads = gridDim.x, d = threadIdx.x;
    const size_t base = ((size_t)t * n_heads + h) * S;
    __shared__ float wts[ATT_MAX_SPLITS];
    __shared__ float red[32];
    float M = -INFINITY;
    for (int s = d; s < S; s += blockDim.x) M = fmaxf(M, part_ml[(base + s) * 2]);
    M = warp_max(M);
    if (d % WARP == 0) red[d / WARP] = M;
    __syncthreads();
    M = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x / WARP); w++) M = fmaxf(M, red[w]);
    __syncthreads();
    float den = 0.0f;
    for (int s = d; s < S; s += blockDim.x) {
        const float m = part_ml[(base + s) * 2];
        const float w = m == -INFINITY ? 0.0f : expf(m - M);
        wts[s] = w;
        den += w * part_ml[(base + s) * 2 + 1];
    }
    den = block_sum(den);
    // Independent partial sums so that the loads of several splits are in flight.
    float num[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int s = 0;
    for (; s + 4 <= S; s += 4) {
#pragma unroll
        for (int j = 0; j < 4; j++) num[j] += wts[s + j] * part_o[(base + s + j) * hd + d];
    }
    for (; s < S; s++) num[0] += wts[s] * part_o[(base + s) * hd + d];
    float v = ((num[0] + num[1]) + (num[2] + num[3])) / den;
    if (flags & OUT_BF16) v = round_bf16(v);
    const size_t i = ((size_t)t * n_heads + h) * hd + d;
    out[i] = v;
    if (xq) quantize_lane(v, (int)(i / 32), d % WARP, xq, xd, xs);
}
