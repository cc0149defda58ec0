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

#define ATT_TILE 128  // keys per tile = threads per block
#define ATT_MAX_G 16  // query heads per kv head

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
    // At least one tile per split: short spans use fewer splits (the rest exit).
    const int chunk = max((n + S - 1) / S, ATT_TILE);
    const int start = lo + s * chunk, end = min(start + chunk, qpos + 1);

    __shared__ float qs[ATT_MAX_G][HD];
    __shared__ float sc[ATT_MAX_G][ATT_TILE];
    __shared__ float alpha[ATT_MAX_G], m_run[ATT_MAX_G], l_run[ATT_MAX_G];
    __shared__ float o_red[ATT_MAX_G][HD];

    for (int i = tid; i < G * HD; i += blockDim.x) {
        const int g = i / HD, d = i % HD;
        qs[g][d] = q[((size_t)t * n_heads + kvh * G + g) * HD + d];
    }
    if (tid < G) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }
    // V accumulation: thread owns dimension d of every head, for the keys of
    // one "lane group" (HD = 64: two groups of 64 threads split the tile).
    const int d = tid % HD, grp = tid / HD, n_grp = ATT_TILE / HD;
    float acc[ATT_MAX_G];
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++) acc[g] = 0.0f;
    __syncthreads();

    const u16* kh = kc + (size_t)kvh * slots * HD;
    const u16* vh = vc + (size_t)kvh * slots * HD;
    for (int base = start; base < end; base += ATT_TILE) {
        // Scores: thread tid takes key base + tid, reading its row in 16-byte pieces.
        const int p = base + tid;
        float sg[ATT_MAX_G];
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++) sg[g] = 0.0f;
        if (p < end) {
            const uint4* kr = (const uint4*)(kh + (size_t)(p % slots) * HD);
#pragma unroll 4
            for (int c = 0; c < HD / 8; c++) {
                const uint4 u = kr[c];
                const u32 w[4] = {u.x, u.y, u.z, u.w};
                float kf[8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kf[2 * j] = BF16 ? bf16_to_f32(w[j] & 0xffff) : f16_to_f32(w[j] & 0xffff);
                    kf[2 * j + 1] = BF16 ? bf16_to_f32(w[j] >> 16) : f16_to_f32(w[j] >> 16);
                }
#pragma unroll
                for (int g = 0; g < ATT_MAX_G; g++) {
                    if (g < G) {
#pragma unroll
                        for (int j = 0; j < 8; j++) sg[g] += qs[g][c * 8 + j] * kf[j];
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++)
            if (g < G) sc[g][tid] = p < end ? sg[g] * scale : -INFINITY;
        __syncthreads();
        // Online softmax per head: warp w takes heads w, w + 4, ...
        const int warp = tid / WARP, lane = tid % WARP;
        for (int g = warp; g < G; g += ATT_TILE / WARP) {
            float mx = -INFINITY;
            for (int j = lane; j < ATT_TILE; j += WARP) mx = fmaxf(mx, sc[g][j]);
            mx = warp_max(mx);
            const float m_new = fmaxf(m_run[g], mx);
            float sum = 0.0f;
            for (int j = lane; j < ATT_TILE; j += WARP) {
                const float e = sc[g][j] == -INFINITY ? 0.0f : expf(sc[g][j] - m_new);
                sc[g][j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
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
            if (g < G) acc[g] *= alpha[g];
        const int n_here = min(ATT_TILE, end - base);
        for (int j = grp; j < n_here; j += n_grp) {
            const u16 raw = vh[(size_t)((base + j) % slots) * HD + d];
            const float vf = BF16 ? bf16_to_f32(raw) : f16_to_f32(raw);
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) acc[g] += sc[g][j] * vf;
        }
        __syncthreads();
    }
    // Reduce the lane groups and write this split's partial result.
    for (int r = 0; r < n_grp; r++) {
        if (grp == r) {
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) o_red[g][d] = (r == 0 ? 0.0f : o_red[g][d]) + acc[g];
        }
        __syncthreads();
    }
    for (int i = tid; i < G * HD; i += blockDim.x) {
        const int g = i / HD, dd = i % HD;
        const size_t idx = ((size_t)t * n_heads + kvh * G + g) * S + s;
        part_o[idx * HD + dd] = o_red[g][dd];
        if (dd == 0) {
            part_ml[idx * 2] = m_run[g];
            part_ml[idx * 2 + 1] = l_run[g];
        }
    }
}

#define ATTN_KERNEL(name, HD, BF16)                                                                         \
    extern "C" __global__ void __launch_bounds__(ATT_TILE) name(                                             \
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
// / sum_s e^(m_s - M) l_s. One block of hd threads per (head, token).
extern "C" __global__ void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, int S,
                                        int hd, int flags, float* __restrict__ out) {
    const int h = blockIdx.x, t = blockIdx.y, n_heads = gridDim.x, d = threadIdx.x;
    const size_t base = ((size_t)t * n_heads + h) * S;
    float M = -INFINITY;
    for (int s = 0; s < S; s++) M = fmaxf(M, part_ml[(base + s) * 2]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < S; s++) {
        const float m = part_ml[(base + s) * 2];
        if (m == -INFINITY) continue;
        const float w = expf(m - M);
        num += w * part_o[(base + s) * hd + d];
        den += w * part_ml[(base + s) * 2 + 1];
    }
    float v = num / den;
    if (flags & OUT_BF16) v = round_bf16(v);
    out[((size_t)t * n_heads + h) * hd + d] = v;
}
