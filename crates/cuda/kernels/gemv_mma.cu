// ---- Small token blocks on the tensor cores (batched decode, short blocks) ----
//
// y[t, r] for 3..16 tokens with int8 mma: the warp kernels above read the
// activations of every token again for each row (L1 traffic of 16x the weight
// bytes at 8 tokens); here one mma multiplies 16 rows by 8 tokens of a scale
// group, so each weight is loaded once and each activation once per 16 rows.
//
// A block computes 16 rows; its 4 warps take the super-blocks of those rows in
// turn and are summed through shared memory at the end. Lane (g = lane / 4,
// q = lane % 4) holds rows g and g + 8 of the A fragment and token g of the B
// fragment (mma.m16n8k32 / m16n8k16 .s8 layouts). The k order inside a scale
// group is permuted, the same way for both operands: fragment k 4q..4q+3 and
// 16+4q..16+4q+3 are weights 8q..8q+7 of the group (one 8-byte load per row),
// so that the 4 lanes of a row read its 32 bytes of a Q4_K chunk together.
// Each mma's integer sums are scaled per (row, token) in f32 and accumulated:
//   Q4_K: one m16n8k32 per 32-weight sub-block: (d sc) dx dot - (dmin m) sx;
//   Q6_K: one m16n8k16 per 16-weight group, the two groups of a 32-block
//         combined with their integer scales before the f32 step: d dx (s0 dot0 + s1 dot1).
// NTILE tiles of 8 tokens (1: up to 8, 2: up to 16); tokens past n_tokens
// reuse the last token's activations and are not stored.

__device__ __forceinline__ void mma_s8_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint2 ld_stream2(const void* p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

// The 8 six-bit scales (sc) and mins (m) of a Q4_K/Q5_K super-block, four per word.
__device__ __forceinline__ void scales_k4(u32 s0, u32 s1, u32 s2, u32 (&sc)[2], u32 (&m)[2]) {
    sc[0] = s0 & 0x3f3f3f3fu;
    m[0] = s1 & 0x3f3f3f3fu;
    sc[1] = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
    m[1] = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
}

__device__ __forceinline__ float byte_f(u32 w, int i) { return (float)((w >> (8 * i)) & 0xffu); }

__device__ __forceinline__ int sbyte(int4 v, int i) {
    const int w = i < 4 ? v.x : (i < 8 ? v.y : (i < 12 ? v.z : v.w));
    return (int)(i8)((w >> (8 * (i & 3))) & 0xff);
}

// 4 Q6_K values (bytes of ql, the 2-bit field `sh` of qh), minus 32.
__device__ __forceinline__ int q6_vals(u32 ql, int hi_nibble, u32 qh, int sh) {
    const u32 lo = hi_nibble ? (ql >> 4) & 0x0f0f0f0fu : ql & 0x0f0f0f0fu;
    return (int)__vsub4(lo | (((qh >> sh) & 0x03030303u) << 4), 0x20202020u);
}

// The weight registers of one super-block of rows g and g + 8 (per type).
struct MmaRaw {
    int4 ha, hb;         // Q4_K: [d, dmin, scales[12]]; Q6_K: scales[16]
    uint2 qa[4], qb[4];  // Q4_K: bytes 8q.. of each 32-byte chunk of qs
    u32 la[2][2][3], lb[2][2][3];  // Q6_K: [half][is][ql low, ql high, qh]
    u32 da, db;          // Q6_K: f16 d
};

template <int WT>
__device__ __forceinline__ void mma_load(const u8* __restrict__ wa, const u8* __restrict__ wb,
                                         const u16* __restrict__ wda, const u16* __restrict__ wdb, int b, int q,
                                         MmaRaw& r) {
    if (WT == WT_Q4_K) {
        const u8* ba = wa + b * 144;
        const u8* bb = wb + b * 144;
        r.ha = *(const int4*)ba;
        r.hb = *(const int4*)bb;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            r.qa[c] = ld_stream2(ba + 16 + 32 * c + 8 * q);
            r.qb[c] = ld_stream2(bb + 16 + 32 * c + 8 * q);
        }
    } else if (WT == WT_Q6_K) {
        // Repacked body [ql[128], qh[64], scales[16]] (208 bytes), f16 d apart.
        const u8* ba = wa + b * 208;
        const u8* bb = wb + b * 208;
        r.da = wda[b];
        r.db = wdb[b];
        r.ha = *(const int4*)(ba + 192);
        r.hb = *(const int4*)(bb + 192);
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int is = 0; is < 2; is++) {
                const int o = 16 * is + 4 * q;
                r.la[n][is][0] = *(const u32*)(ba + 64 * n + o);
                r.la[n][is][1] = *(const u32*)(ba + 64 * n + 32 + o);
                r.la[n][is][2] = *(const u32*)(ba + 128 + 32 * n + o);
                r.lb[n][is][0] = *(const u32*)(bb + 64 * n + o);
                r.lb[n][is][1] = *(const u32*)(bb + 64 * n + 32 + o);
                r.lb[n][is][2] = *(const u32*)(bb + 128 + 32 * n + o);
            }
    }
}

// The activations a lane reads: B fragments of token g of each tile, scales of tokens 2q and 2q + 1.
template <int NTILE>
struct MmaAct {
    const i8* xb[NTILE];
    const float *dx0[NTILE], *dx1[NTILE], *sx0[NTILE], *sx1[NTILE];
};

template <int WT, int NTILE>
__device__ __forceinline__ void mma_step(const MmaRaw& r, int b, int q, const MmaAct<NTILE>& x,
                                         float (&acc)[NTILE][4]) {
    if (WT == WT_Q4_K) {
        const float da = f16_to_f32(r.ha.x & 0xffff), mina = f16_to_f32((u32)r.ha.x >> 16);
        const float db = f16_to_f32(r.hb.x & 0xffff), minb = f16_to_f32((u32)r.hb.x >> 16);
        u32 sca[2], ma[2], scb[2], mb[2];
        scales_k4(r.ha.y, r.ha.z, r.ha.w, sca, ma);
        scales_k4(r.hb.y, r.hb.z, r.hb.w, scb, mb);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int kb = b * 8 + 2 * c;
            float2 xd0[NTILE], xd1[NTILE], xs0[NTILE], xs1[NTILE];
#pragma unroll
            for (int nt = 0; nt < NTILE; nt++) {
                xd0[nt] = *(const float2*)(x.dx0[nt] + kb);
                xd1[nt] = *(const float2*)(x.dx1[nt] + kb);
                xs0[nt] = *(const float2*)(x.sx0[nt] + kb);
                xs1[nt] = *(const float2*)(x.sx1[nt] + kb);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h, sh = 4 * h;
                const int a[4] = {(int)((r.qa[c].x >> sh) & 0x0f0f0f0fu), (int)((r.qb[c].x >> sh) & 0x0f0f0f0fu),
                                  (int)((r.qa[c].y >> sh) & 0x0f0f0f0fu), (int)((r.qb[c].y >> sh) & 0x0f0f0f0fu)};
                const float fa = da * byte_f(sca[j / 4], j % 4), oa = mina * byte_f(ma[j / 4], j % 4);
                const float fb = db * byte_f(scb[j / 4], j % 4), ob = minb * byte_f(mb[j / 4], j % 4);
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++) {
                    const uint2 xv = *(const uint2*)(x.xb[nt] + (kb + h) * 32 + 8 * q);
                    int cc[4] = {0, 0, 0, 0};
                    mma_s8_k32(cc, a, (int)xv.x, (int)xv.y);
                    const float d0 = h ? xd0[nt].y : xd0[nt].x, d1 = h ? xd1[nt].y : xd1[nt].x;
                    const float s0 = h ? xs0[nt].y : xs0[nt].x, s1 = h ? xs1[nt].y : xs1[nt].x;
                    acc[nt][0] += fa * (d0 * (float)cc[0]) - oa * s0;
                    acc[nt][1] += fa * (d1 * (float)cc[1]) - oa * s1;
                    acc[nt][2] += fb * (d0 * (float)cc[2]) - ob * s0;
                    acc[nt][3] += fb * (d1 * (float)cc[3]) - ob * s1;
                }
            }
        }
    } else if (WT == WT_Q6_K) {
        const float da = f16_to_f32((u16)r.da), db = f16_to_f32((u16)r.db);
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int g4 = 0; g4 < 4; g4++) {
                const int kb = b * 8 + 4 * n + g4;
                // Group g4 of half n: weights 128 n + 32 g4 + l; ql byte l (+32 for odd g4),
                // nibble g4 / 2, qh bits 2 g4; scales 8 n + 2 g4 + (l >= 16).
                int va[2], vb[2];
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    va[is] = q6_vals(r.la[n][is][g4 & 1], g4 >> 1, r.la[n][is][2], 2 * g4);
                    vb[is] = q6_vals(r.lb[n][is][g4 & 1], g4 >> 1, r.lb[n][is][2], 2 * g4);
                }
                const int s = 8 * n + 2 * g4;
                const int sa0 = sbyte(r.ha, s), sa1 = sbyte(r.ha, s + 1), sb0 = sbyte(r.hb, s), sb1 = sbyte(r.hb, s + 1);
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++) {
                    const int x0 = *(const int*)(x.xb[nt] + kb * 32 + 4 * q);
                    const int x1 = *(const int*)(x.xb[nt] + kb * 32 + 16 + 4 * q);
                    int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
                    mma_s8_k16(c0, va[0], vb[0], x0);
                    mma_s8_k16(c1, va[1], vb[1], x1);
                    const float d0 = x.dx0[nt][kb], d1 = x.dx1[nt][kb];
                    acc[nt][0] += da * (d0 * (float)(sa0 * c0[0] + sa1 * c1[0]));
                    acc[nt][1] += da * (d1 * (float)(sa0 * c0[1] + sa1 * c1[1]));
                    acc[nt][2] += db * (d0 * (float)(sb0 * c0[2] + sb1 * c1[2]));
                    acc[nt][3] += db * (d1 * (float)(sb0 * c0[3] + sb1 * c1[3]));
                }
            }
    }
}

template <int WT, int NTILE>
__device__ __forceinline__ void gemv_mma(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                         const i8* __restrict__ xq, const float* __restrict__ xd,
                                         const float* __restrict__ xs, float* __restrict__ y, int y_stride,
                                         const float* __restrict__ bias, int flags, int n_tokens) {
    constexpr int NW = 4;
    __shared__ float red[NW][NTILE * 4][WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int g = lane >> 2, q = lane & 3;
    const int r0 = blockIdx.x * 16;
    int row_bytes, n_items, nb;
    row_geometry<WT>(K, row_bytes, n_items, nb);
    const int KB = K / 32;
    const int ra = min(r0 + g, rows - 1), rb = min(r0 + g + 8, rows - 1);
    const u8* wa = w + (size_t)ra * row_bytes;
    const u8* wb = w + (size_t)rb * row_bytes;
    const u16* wda = wd ? wd + (size_t)ra * nb : nullptr;
    const u16* wdb = wd ? wd + (size_t)rb * nb : nullptr;
    // The first super-block's weights are requested before waiting for the
    // previous kernel; each next one's before the current one is computed.
    MmaRaw cur;
    if (warp < nb) mma_load<WT>(wa, wb, wda, wdb, warp, q, cur);
    PDL_TRIGGER();
    PDL_WAIT();
    MmaAct<NTILE> x;
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++) {
        x.xb[nt] = xq + (size_t)min(nt * 8 + g, n_tokens - 1) * K;
        const int t0 = min(nt * 8 + 2 * q, n_tokens - 1), t1 = min(nt * 8 + 2 * q + 1, n_tokens - 1);
        x.dx0[nt] = xd + (size_t)t0 * KB;
        x.dx1[nt] = xd + (size_t)t1 * KB;
        x.sx0[nt] = xs + (size_t)t0 * KB;
        x.sx1[nt] = xs + (size_t)t1 * KB;
    }
    float acc[NTILE][4];
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
    for (int b = warp; b < nb; b += NW) {
        MmaRaw nxt;
        if (b + NW < nb) mma_load<WT>(wa, wb, wda, wdb, b + NW, q, nxt);
        mma_step<WT, NTILE>(cur, b, q, x, acc);
        cur = nxt;
    }
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][nt * 4 + i][lane] = acc[nt][i];
    __syncthreads();
    // Warp w writes values w*NTILE .. of every lane.
#pragma unroll
    for (int u = 0; u < NTILE; u++) {
        const int v = warp * NTILE + u, nt = v / 4, i = v % 4;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NW; k++) s += red[k][v][lane];
        const int r = r0 + g + (i >= 2 ? 8 : 0), t = nt * 8 + 2 * q + (i & 1);
        if (r < rows && t < n_tokens) {
            if (bias) s += bias[r];
            if (flags & OUT_BF16) s = round_bf16(s);
            float* out = y + (size_t)t * y_stride + r;
            *out = (flags & OUT_ADD) ? *out + s : s;
        }
    }
}

#define GEMV_MMA_KERNEL(tname, WT, NTILE)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) gemv_##tname##_mma##NTILE(                          \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const i8* __restrict__ xq,   \
        const float* __restrict__ xd, const float* __restrict__ xs, float* __restrict__ y, int y_stride,   \
        const float* __restrict__ bias, int flags, int n_tokens) {                                         \
        gemv_mma<WT, NTILE>(w, wd, rows, K, xq, xd, xs, y, y_stride, bias, flags, n_tokens);               \
    }

GEMV_MMA_KERNEL(q4_k, WT_Q4_K, 1)
GEMV_MMA_KERNEL(q4_k, WT_Q4_K, 2)
GEMV_MMA_KERNEL(q6_k, WT_Q6_K, 1)
GEMV_MMA_KERNEL(q6_k, WT_Q6_K, 2)
