// Prefill / block matrix products on tensor cores: Y[t, r] = sum_k W[r, k] X[t, k]
// for many tokens at once. Each block computes a 64 (weight rows) x 128
// (tokens) tile: per 64-wide step of k it dequantizes its weight tile to
// f16 (bf16 for Muse Glimmer, whose activations are bf16) into shared memory,
// copies the activations (converted to the same type once, by to_half) and
// multiplies with mma.sync.m16n8k16 (f32 accumulation). Eight warps each own
// 32 x 32 of the tile.

#define GM_BM 64
#define GM_BN 128
#define GM_THREADS 256
#define GM_BK 64
#define GM_PAD 8  // halves of padding per shared-memory row (bank conflicts)

// 8 consecutive weights W[r, k..k+8] (k % 8 == 0) as floats.
template <int WT>
__device__ __forceinline__ void dequant8(const u8* __restrict__ row, const u16* __restrict__ dv, int k, float* w) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int b = k / 256, j = (k % 256) / 32, l = k % 32, c = j / 2;
        const u8* blk = row + b * (WT == WT_Q4_K ? 144 : 176);
        const u32 dm = *(const u32*)blk;
        const float d = f16_to_f32(dm & 0xffff), dmin = f16_to_f32(dm >> 16);
        const u32* S = (const u32*)(blk + 4);
        float sc, m;
        scale_min_k4(S[0], S[1], S[2], j, sc, m);
        const float a = d * sc, o = dmin * m;
        const u8* qs = blk + (WT == WT_Q4_K ? 16 : 48) + 32 * c + l;
        const uint2 qq = *(const uint2*)qs;
        const u32 q2[2] = {qq.x, qq.y};
        uint2 hh = make_uint2(0, 0);
        if (WT == WT_Q5_K) hh = *(const uint2*)(blk + 16 + l);
        const u32 h2[2] = {hh.x, hh.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = (q2[i / 4] >> (8 * (i % 4) + 4 * (j & 1))) & 15;
            if (WT == WT_Q5_K) q |= ((h2[i / 4] >> (8 * (i % 4) + j)) & 1) << 4;
            w[i] = a * (float)q - o;
        }
    } else if (WT == WT_Q6_K) {
        const int b = k / 256, n = (k % 256) / 128, r = k % 128, g = r / 32, l = r % 32;
        const u8* blk = row + b * 208;
        const float d = f16_to_f32(dv[b]);
        const uint2 L = *(const uint2*)(blk + 64 * n + (g & 1) * 32 + l);
        const uint2 H = *(const uint2*)(blk + 128 + 32 * n + l);
        const float a = d * (float)((const i8*)(blk + 192))[8 * n + l / 16 + 2 * g];
        const u32 L2[2] = {L.x, L.y}, H2[2] = {H.x, H.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = (L2[i / 4] >> (8 * (i % 4) + 4 * (g >> 1))) & 15;
            const int hi = (H2[i / 4] >> (8 * (i % 4) + 2 * g)) & 3;
            w[i] = a * (float)((lo | (hi << 4)) - 32);
        }
    } else if (WT == WT_Q8_0) {
        const int b = k / 32, l = k % 32;
        const float d = f16_to_f32(dv[b]);
        const uint2 qq = *(const uint2*)(row + b * 32 + l);
        const u32 q2[2] = {qq.x, qq.y};
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = d * (float)(i8)((q2[i / 4] >> (8 * (i % 4))) & 0xff);
    } else if (WT == WT_Q4_0 || WT == WT_Q5_0) {
        const int b = k / 32, l = k % 32;
        const float d = f16_to_f32(dv[b]);
        const u8* body = row + b * (WT == WT_Q4_0 ? 16 : 20);
        const u8* qs = body + (WT == WT_Q4_0 ? 0 : 4);
        const u32 qh = WT == WT_Q5_0 ? *(const u32*)body : 0u;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int li = l + i;
            int q = li < 16 ? (qs[li] & 15) : (qs[li - 16] >> 4);
            if (WT == WT_Q5_0) q |= ((qh >> li) & 1) << 4;
            w[i] = d * (float)(q - (WT == WT_Q4_0 ? 8 : 16));
        }
    } else if (WT == WT_F32) {
        const float4 a = *(const float4*)(row + k * 4), b = *(const float4*)(row + k * 4 + 16);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
        const uint4 u = *(const uint4*)(row + k * 2);
        const u32 p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = WT == WT_F16 ? f16_to_f32(p[i] & 0xffff) : bf16_to_f32(p[i] & 0xffff);
            w[2 * i + 1] = WT == WT_F16 ? f16_to_f32(p[i] >> 16) : bf16_to_f32(p[i] >> 16);
        }
    }
}

template <bool BF>
__device__ __forceinline__ u32 pack2(float a, float b) {
    const u16 lo = BF ? f32_to_bf16(a) : f32_to_f16(a);
    const u16 hi = BF ? f32_to_bf16(b) : f32_to_f16(b);
    return (u32)lo | ((u32)hi << 16);
}

template <bool BF>
__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
    if (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// y[t * y_stride + r] (op)= f(sum_k W[r, k] x[t, k] + bias[r]) for r < rows, t < T; K % 64 == 0.
// x [n] f32 -> f16 or bf16 (the GEMM's operand type).
extern "C" __global__ void to_half(const float* __restrict__ x, u16* __restrict__ out, int n, int bf16) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}

template <int WT, bool BF>
__device__ __forceinline__ void gemm_tc(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                        const u16* __restrict__ x, int T, float* __restrict__ y, int y_stride,
                                        const float* __restrict__ bias, int flags) {
    __shared__ __align__(16) u16 As[GM_BM][GM_BK + GM_PAD];
    __shared__ __align__(16) u16 Bs[GM_BN][GM_BK + GM_PAD];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int r0 = blockIdx.x * GM_BM, t0 = blockIdx.y * GM_BN;
    const int wm = (warp / 4) * 32, wn = (warp % 4) * 32;  // this warp's 32 x 32 sub-tile
    const int gid = lane >> 2, tig = lane & 3;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += GM_BK) {
        // Weight tile: 64 rows x 64 k = 512 groups of 8, two per thread.
#pragma unroll
        for (int gi = 0; gi < 2; gi++) {
            const int grp = tid + gi * GM_THREADS, rr = grp / 8, kk = (grp % 8) * 8;
            const int r = r0 + rr;
            float v[8];
            if (r < rows) {
                dequant8<WT>(w + (size_t)r * row_bytes, wd ? wd + (size_t)r * bpr : nullptr, k0 + kk, v);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = 0.0f;
            }
            uint4 pk = make_uint4(pack2<BF>(v[0], v[1]), pack2<BF>(v[2], v[3]), pack2<BF>(v[4], v[5]), pack2<BF>(v[6], v[7]));
            *(uint4*)&As[rr][kk] = pk;
        }
        // Activation tile: 128 tokens x 64 k = 1024 pieces of 16 bytes, four per thread.
#pragma unroll
        for (int gi = 0; gi < 4; gi++) {
            const int grp = tid + gi * GM_THREADS, tt = grp / 8, kk = (grp % 8) * 8;
            const int t = t0 + tt;
            *(uint4*)&Bs[tt][kk] = t < T ? *(const uint4*)(x + (size_t)t * K + k0 + kk) : make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < GM_BK; ks += 16) {
            u32 af[2][4], bfr[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int m = wm + i * 16;
                af[i][0] = *(const u32*)&As[m + gid][ks + tig * 2];
                af[i][1] = *(const u32*)&As[m + gid + 8][ks + tig * 2];
                af[i][2] = *(const u32*)&As[m + gid][ks + tig * 2 + 8];
                af[i][3] = *(const u32*)&As[m + gid + 8][ks + tig * 2 + 8];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = wn + j * 8;
                bfr[j][0] = *(const u32*)&Bs[n + gid][ks + tig * 2];
                bfr[j][1] = *(const u32*)&Bs[n + gid][ks + tig * 2 + 8];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816<BF>(acc[i][j], af[i], bfr[j]);
        }
        __syncthreads();
    }
    // Epilogue: c0,c1 at (row gid, tokens 2*tig, 2*tig+1); c2,c3 at row gid + 8.
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + wm + i * 16 + gid + (e >= 2 ? 8 : 0);
                const int t = t0 + wn + j * 8 + tig * 2 + (e & 1);
                if (r < rows && t < T) {
                    float v = acc[i][j][e];
                    if (bias) v += bias[r];
                    if (flags & OUT_BF16) v = round_bf16(v);
                    if (flags & OUT_SOFTCAP) v = 20.0f * tanhf(v * 0.19611613513f / 20.0f);
                    float* out = y + (size_t)t * y_stride + r;
                    *out = (flags & OUT_ADD) ? *out + v : v;
                }
            }
}

#define GEMM_KERNEL(name, WT, BF)                                                                            \
    extern "C" __global__ void __launch_bounds__(GM_THREADS) name(                                            \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const u16* __restrict__ x,     \
        int T, float* __restrict__ y, int y_stride, const float* __restrict__ bias, int flags) {              \
        gemm_tc<WT, BF>(w, wd, rows, K, x, T, y, y_stride, bias, flags);                                      \
    }

#define GEMM_KERNELS(tname, WT) \
    GEMM_KERNEL(gemm_##tname##_f16, WT, false) \
    GEMM_KERNEL(gemm_##tname##_bf16, WT, true)

GEMM_KERNELS(f32, WT_F32)
GEMM_KERNELS(f16, WT_F16)
GEMM_KERNELS(bf16, WT_BF16)
GEMM_KERNELS(q8_0, WT_Q8_0)
GEMM_KERNELS(q4_0, WT_Q4_0)
GEMM_KERNELS(q5_0, WT_Q5_0)
GEMM_KERNELS(q4_k, WT_Q4_K)
GEMM_KERNELS(q5_k, WT_Q5_K)
GEMM_KERNELS(q6_k, WT_Q6_K)
