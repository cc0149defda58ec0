// ---- Activations in registers (the decode kernels) ----
//
// Thread j of a block owns item j of every row (blockDim.x >= items per
// row): it loads the activations of that item for NT tokens into registers
// once, then streams rows through them in tiles of R, R weight loads in
// flight per thread. The activations are no longer re-read from L1 for every
// row (that traffic, twice the weight bytes at 4 bits, bound the one-row
// kernels above). A tile's NT*R partial sums are reduced across each warp by
// halving exchanges (lane (32/V)*j ends with value j), then across the warps
// through shared memory, one barrier per tile.
//
// Rows may be split into up to four output segments (fused projections:
// q|k|v|gate, or gate|up): rows [0, s1) go to y0, [s1, s2) to y1, [s2, s3) to
// y2, [s3, rows) to y3, each dense [NT, segment rows], each with its own bias.

// Sums v[0..V) (V a power of two, at most 32) over the warp; returns, in lane
// (32/V)*j, the total of v[j].
template <int V>
__device__ __forceinline__ float reduce_scatter(float (&v)[V], int lane) {
#pragma unroll
    for (int s = 0; s < 5; s++) {
        const int o = 16 >> s, n = V >> s;
        if (n > 1) {
            const bool up = lane & o;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float send = up ? v[i] : v[i + n / 2];
                const float keep = up ? v[i + n / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
    return v[0];
}

struct Segments {
    int s1, s2, s3;
    float *y0, *y1, *y2, *y3;
    const float *b0, *b1, *b2, *b3;
};

template <int WT, int NT, int R, int IPT>
__device__ __forceinline__ void gemv_x(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                       const i8* __restrict__ xq, const float* __restrict__ xd,
                                       const float* __restrict__ xs, int flags, Segments sg) {
    constexpr int V = NT * R;
    __shared__ float red[2][16][V];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    bool mine[IPT];
    ActRegs ar[IPT][NT];
#pragma unroll
    for (int u = 0; u < IPT; u++) mine[u] = tid + u * (int)blockDim.x < n_items;
    // The first tile's weights are requested before waiting for the previous
    // kernel (they do not depend on it), so their latency overlaps its tail;
    // each later tile's loads are issued before the current tile's reduction.
    const int stride = gridDim.x * R;
    Raw raw[IPT][R];
    auto load_tile = [&](int r0) {
#pragma unroll
        for (int u = 0; u < IPT; u++)
#pragma unroll
            for (int rr = 0; rr < R; rr++)
                if (mine[u] && r0 + rr < rows)
                    load_item<WT>(w + (size_t)(r0 + rr) * row_bytes, wd ? wd + (size_t)(r0 + rr) * bpr : nullptr,
                                  tid + u * blockDim.x, raw[u][rr]);
    };
    load_tile(blockIdx.x * R);
    PDL_TRIGGER();
    PDL_WAIT();
#pragma unroll
    for (int u = 0; u < IPT; u++) {
        if (mine[u]) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const Act a = {xq + (size_t)t * K, xd + (size_t)t * (K / 32), xs + (size_t)t * (K / 32), K};
                load_act<WT>(tid + u * blockDim.x, a, ar[u][t]);
            }
        }
    }
    int buf = 0;
    for (int r0 = blockIdx.x * R; r0 < rows; r0 += stride, buf ^= 1) {
        float v[V];
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < IPT; u++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int rr = 0; rr < R; rr++)
                    if (mine[u] && r0 + rr < rows) v[t * R + rr] += dot_regs<WT>(raw[u][rr], tid + u * blockDim.x, ar[u][t]);
        if (r0 + stride < rows) load_tile(r0 + stride);
        const float tot = reduce_scatter<V>(v, lane);
        if (lane % (32 / V) == 0) red[buf][warp][lane / (32 / V)] = tot;
        __syncthreads();
        if (tid < V) {
            const int t = tid / R, r = r0 + tid % R;
            if (r < rows) {
                float acc = 0.0f;
                for (int k = 0; k < n_warps; k++) acc += red[buf][k][tid];
                float* y;
                const float* b;
                int lo, hi;
                if (r < sg.s1) {
                    y = sg.y0; b = sg.b0; lo = 0; hi = sg.s1;
                } else if (r < sg.s2) {
                    y = sg.y1; b = sg.b1; lo = sg.s1; hi = sg.s2;
                } else if (r < sg.s3) {
                    y = sg.y2; b = sg.b2; lo = sg.s2; hi = sg.s3;
                } else {
                    y = sg.y3; b = sg.b3; lo = sg.s3; hi = rows;
                }
                if (b) acc += b[r - lo];
                if (flags & OUT_BF16) acc = round_bf16(acc);
                float* out = y + (size_t)t * (hi - lo) + (r - lo);
                *out = (flags & OUT_ADD) ? *out + acc : acc;
            }
        }
    }
}

// Blocks of at most 512 threads (16 warps): items beyond 512 per row take IPT = 2.
#define GEMV_X_KERNEL(tname, WT, NT, R, IPT)                                                               \
    extern "C" __global__ void __launch_bounds__(512) gemv_##tname##_x##NT##_r##R##_i##IPT(               \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const i8* __restrict__ xq,   \
        const float* __restrict__ xd, const float* __restrict__ xs, int flags, int s1, int s2, int s3,      \
        float* y0, float* y1, float* y2, float* y3, const float* b0, const float* b1, const float* b2,      \
        const float* b3) {                                                                                 \
        /* Grid row y: tokens y*NT.. (token_offsets), each computed as a launch of its own. */              \
        const int tb = blockIdx.y * NT;                                                                    \
        const Segments sg = {s1,                                                                           \
                             s2,                                                                           \
                             s3,                                                                           \
                             y0 ? y0 + (size_t)tb * s1 : y0,                                               \
                             y1 ? y1 + (size_t)tb * (s2 - s1) : y1,                                        \
                             y2 ? y2 + (size_t)tb * (s3 - s2) : y2,                                        \
                             y3 ? y3 + (size_t)tb * (rows - s3) : y3,                                      \
                             b0, b1, b2, b3};                                                              \
        gemv_x<WT, NT, R, IPT>(w, wd, rows, K, xq + (size_t)tb * K, xd + (size_t)tb * (K / 32),              \
                               xs + (size_t)tb * (K / 32), flags, sg);                                     \
    }

// Tile heights per type are the ones that fit 128 registers without spills.
#define GEMV_X_KERNELS(tname, WT)           \
    GEMV_X_KERNEL(tname, WT, 1, 1, 1)       \
    GEMV_X_KERNEL(tname, WT, 1, 2, 1)       \
    GEMV_X_KERNEL(tname, WT, 1, 4, 1)       \
    GEMV_X_KERNEL(tname, WT, 2, 2, 1)

// 32-value blocks: rows up to 512 blocks use one item per thread, longer ones two.
#define GEMV_X_KERNELS32(tname, WT)         \
    GEMV_X_KERNELS(tname, WT)               \
    GEMV_X_KERNEL(tname, WT, 1, 8, 1)       \
    GEMV_X_KERNEL(tname, WT, 1, 2, 2)       \
    GEMV_X_KERNEL(tname, WT, 1, 4, 2)       \
    GEMV_X_KERNEL(tname, WT, 2, 2, 2)

GEMV_X_KERNELS32(q8_0, WT_Q8_0)
GEMV_X_KERNELS32(q4_0, WT_Q4_0)
GEMV_X_KERNELS32(q5_0, WT_Q5_0)
GEMV_X_KERNELS(q4_k, WT_Q4_K)
GEMV_X_KERNELS(q5_k, WT_Q5_K)
GEMV_X_KERNELS(q6_k, WT_Q6_K)

#define GEMV_U(NT) ((NT) == 1 ? 4 : ((NT) == 2 ? 2 : 1))

#define GEMV_KERNEL(name, WT, NT) GEMV_KERNEL_U(name, WT, NT, GEMV_U(NT))

#define GEMV_KERNEL_U(name, WT, NT, U)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) name(                                                \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const i8* __restrict__ xq,   \
        const float* __restrict__ xd, const float* __restrict__ xs, float* __restrict__ y, int y_stride,   \
        const float* __restrict__ bias, int flags) {                                                       \
        const size_t tb = (size_t)blockIdx.y * NT;                                                         \
        gemv<WT, NT, U>(w, wd, rows, K, xq + tb * K, xd + tb * (K / 32), xs + tb * (K / 32),                \
                        y + tb * y_stride, y_stride, bias, flags);                                         \
    }

#define GEMV_ROWS_KERNEL(name, WT, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) name(                                                \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const i8* __restrict__ xq,   \
        const float* __restrict__ xd, const float* __restrict__ xs, float* __restrict__ y, int y_stride,   \
        const float* __restrict__ bias, int flags) {                                                       \
        const size_t tb = blockIdx.y;                                                                      \
        xq += tb * K;                                                                                      \
        xd += tb * (K / 32);                                                                               \
        xs += tb * (K / 32);                                                                               \
        y += tb * y_stride;                                                                                \
        if (WT == WT_F32 || WT == WT_F16 || WT == WT_BF16)                                                 \
            gemv<WT, 1, 1>(w, wd, rows, K, xq, xd, xs, y, y_stride, bias, flags);                          \
        else                                                                                               \
            gemv_rows<WT, R>(w, wd, rows, K, xq, xd, xs, y, bias, flags);                                  \
    }

#define GEMV_ROWS_T_KERNEL(name, WT, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) name(                                                \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const i8* __restrict__ xq,   \
        const float* __restrict__ xd, const float* __restrict__ xs, float* __restrict__ y, int y_stride,   \
        const float* __restrict__ bias, int flags, int n_tokens) {                                         \
        gemv_rows_t<WT, R, 8>(w, wd, rows, K, xq, xd, xs, y, y_stride, bias, flags, n_tokens);            \
    }

#define GEMV_ROWS_T_KERNELS(tname, WT)                 \
    GEMV_ROWS_T_KERNEL(gemv_##tname##_1_r2_t8, WT, 2) \
    GEMV_ROWS_T_KERNEL(gemv_##tname##_1_r4_t8, WT, 4)

GEMV_ROWS_T_KERNELS(q8_0, WT_Q8_0)
GEMV_ROWS_T_KERNELS(q4_0, WT_Q4_0)
GEMV_ROWS_T_KERNELS(q5_0, WT_Q5_0)
GEMV_ROWS_T_KERNELS(q4_k, WT_Q4_K)
GEMV_ROWS_T_KERNELS(q5_k, WT_Q5_K)
GEMV_ROWS_T_KERNELS(q6_k, WT_Q6_K)

#define GEMV_KERNELS(tname, WT) \
    GEMV_ROWS_KERNEL(gemv_##tname##_1_r2, WT, 2) \
    GEMV_ROWS_KERNEL(gemv_##tname##_1_r4, WT, 4) \
    GEMV_KERNEL_U(gemv_##tname##_1_u1, WT, 1, 1) \
    GEMV_KERNEL_U(gemv_##tname##_1_u2, WT, 1, 2) \
    GEMV_KERNEL_U(gemv_##tname##_1_u4, WT, 1, 4) \
    GEMV_KERNEL(gemv_##tname##_2, WT, 2) \
    GEMV_KERNEL(gemv_##tname##_4, WT, 4) \
    GEMV_KERNEL(gemv_##tname##_8, WT, 8)

GEMV_KERNELS(f32, WT_F32)
GEMV_KERNELS(f16, WT_F16)
GEMV_KERNELS(bf16, WT_BF16)
GEMV_KERNELS(q8_0, WT_Q8_0)
GEMV_KERNELS(q4_0, WT_Q4_0)
GEMV_KERNELS(q5_0, WT_Q5_0)
GEMV_KERNELS(q4_k, WT_Q4_K)
GEMV_KERNELS(q5_k, WT_Q5_K)
GEMV_KERNELS(q6_k, WT_Q6_K)
