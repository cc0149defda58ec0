// Prefill / block matrix products on tensor cores: Y[t, r] = sum_k W[r, k] X[t, k]
// for many tokens at once (mma.sync.m16n8k16, f16 or bf16 operands, f32
// accumulation; bf16 for Muse Glimmer, whose activations are bf16).
//
// Tiling. A block of 256 threads (8 warps) computes 128 weight rows x 128
// tokens; k advances 64 at a time. Warps are arranged 2 (rows) x 4 (tokens),
// each owning a 64 x 32 sub-tile: 4 x 4 mma tiles, 64 f32 accumulators per
// thread. Shared memory (48 KB, static):
//   As     128 rows   x 64 k   weights dequantized to f16/bf16 (one buffer)
//   Bs[2]  128 tokens x 64 k   activations, two buffers filled by cp.async
// Rows of both are 128 bytes = 8 chunks of 16 bytes, stored with chunk c of
// row r at position c ^ (r & 7): the eight row addresses of one ldmatrix
// phase then fall in eight different bank groups (no conflicts, no padding).
// Fragments are read with ldmatrix.x4 (one x4 = one A fragment 16x16, or the
// B fragments of two 8-token tiles).
//
// Pipeline, per 64-wide k step s:
//   1. cp.async the activations of step s+1 into the other B buffer, and load
//      the raw quantized bytes of step s+1 for this thread's weights into
//      registers (plain global loads, still in flight during 3.);
//   2. wait for the step-s activations, __syncthreads;
//   3. 64 mma per warp on As and Bs[s & 1];
//   4. __syncthreads, then dequantize the registers of step s+1 into As.
// Step 4 is not overlapped with the tensor work of the same block, but two
// blocks fit on a multiprocessor (registers <= 128, 48 KB shared each), so one
// block's dequantization overlaps the other's mma.
//
// Weights: thread pair (2 threads) per row; each thread dequantizes 32 values
// of its row per step as two runs of 16 consecutive k. Q4_K / Q5_K / Q6_K /
// Q8_0 decode bytes to floats with prmt into the mantissa of 2^23 (exact),
// one FADD and one FFMA, then cvt.rn.{f16,bf16}x2.f32 — one rounding from f32,
// as in the CPU reference. The other types (F32, F16, BF16, Q4_0, Q5_0) keep
// the simpler per-8-values dequant8 path, loading in step 4.
//
// Grid: x = token tile, y = row tile, so the blocks that share a weight tile
// run together and the (quantized) weights are read from DRAM about once; the
// activations (a few MB) stay in L2. When there are too few tiles to fill the
// GPU (e.g. 5120 rows x 512 tokens = 160 tiles on 132 multiprocessors), gemm.rs
// launches the *_k2 variants: a cluster of two blocks per tile (grid z = 2),
// each taking half of the k steps, reduced through distributed shared memory.
//
// Measured on an H200 (512 tokens, f16): Q4_K 27648x5120 ~530-570 us (~255-275
// TFLOP/s), 5120x27648 ~670 us (k2), 5120x5120 ~142 us (k2); Q6_K about 10-20%
// slower. An L2 prefetch of the weight bytes a few steps ahead did not help
// (so DRAM latency is not the limit); what is left is mostly step 4 above.

#define GM_BM 128
#define GM_BN 128
#define GM_BK 64
#define GM_THREADS 256

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

// x [n] f32 -> f16 or bf16 (the GEMM's operand type).
extern "C" __global__ void to_half(const float* __restrict__ x, u16* __restrict__ out, int n, int bf16) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}

// Byte j of v (0..255) as an exact float: the byte is placed in the low
// mantissa of 2^23 with prmt, then 2^23 is subtracted.
__device__ __forceinline__ float gm_byte(u32 v, int j) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x4B000000u), "r"(0x7440u | (u32)j));
    return __int_as_float((int)r) - 8388608.0f;
}

// Element offset of (row, 8-value chunk) in a 64-wide swizzled tile.
__device__ __forceinline__ int gm_swz(int row, int chunk) { return row * GM_BK + ((chunk ^ (row & 7)) << 3); }

// Stores 16 values (k = off .. off+15 of the step, off % 16 == 0) of tile row rr.
template <bool BF>
__device__ __forceinline__ void gm_store16(u16* As, int rr, int off, const float* v) {
    uint4 a, b;
    a.x = pack2<BF>(v[0], v[1]); a.y = pack2<BF>(v[2], v[3]);
    a.z = pack2<BF>(v[4], v[5]); a.w = pack2<BF>(v[6], v[7]);
    b.x = pack2<BF>(v[8], v[9]); b.y = pack2<BF>(v[10], v[11]);
    b.z = pack2<BF>(v[12], v[13]); b.w = pack2<BF>(v[14], v[15]);
    *(uint4*)&As[gm_swz(rr, off >> 3)] = a;
    *(uint4*)&As[gm_swz(rr, (off >> 3) + 1)] = b;
}

// Raw bytes of one thread's share of a weight-tile step (fields unused by a type are optimised away).
struct GmRaw {
    uint4 q0, q1, q2;
    u32 s0, s1, s2, s3;
};

template <int WT>
__device__ __forceinline__ constexpr bool gm_fast() {
    return WT == WT_Q4_K || WT == WT_Q5_K || WT == WT_Q6_K || WT == WT_Q8_0;
}

// Loads the raw bytes of step s (k = 64 s .. 64 s + 63) for half h of a row.
template <int WT>
__device__ __forceinline__ void gm_load(const u8* __restrict__ row, const u16* __restrict__ dv, int s, int h, GmRaw& r) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int b = s >> 2, c = s & 3;
        const u8* blk = row + b * (WT == WT_Q4_K ? 144 : 176);
        const uint4 hdr = *(const uint4*)blk;  // d, dmin, scales[12]
        r.s0 = hdr.x; r.s1 = hdr.y; r.s2 = hdr.z; r.s3 = hdr.w;
        r.q0 = *(const uint4*)(blk + (WT == WT_Q4_K ? 16 : 48) + 32 * c + 16 * h);
        if (WT == WT_Q5_K) r.q1 = *(const uint4*)(blk + 16 + 16 * h);
    } else if (WT == WT_Q6_K) {
        // Step s covers groups g = 2 (s & 1) + gg (gg = 0, 1) of half n of super-block b.
        const int b = s >> 2, n = (s >> 1) & 1, gs = s & 1;
        const u8* blk = row + b * 208;
        r.q0 = *(const uint4*)(blk + 64 * n + 16 * h);       // ql, group gg = 0
        r.q1 = *(const uint4*)(blk + 64 * n + 32 + 16 * h);  // ql, gg = 1
        r.q2 = *(const uint4*)(blk + 128 + 32 * n + 16 * h); // qh
        const u8* sc = blk + 192 + 8 * n + h + 4 * gs;
        r.s1 = (u32)sc[0] | ((u32)sc[2] << 8);
        r.s0 = dv[b];
    } else if (WT == WT_Q8_0) {
        const int b = 2 * s + h;
        r.q0 = *(const uint4*)(row + b * 32);
        r.q1 = *(const uint4*)(row + b * 32 + 16);
        r.s0 = dv[b];
    }
}

// 16 values q (0..255 in bytes of the 4 words, after the caller's masking) -> a * q - o.
__device__ __forceinline__ void gm_decode16(const u32* w, float a, float o, float* v) {
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = fmaf(gm_byte(w[i / 4], i % 4), a, -o);
}

// Dequantizes the raw bytes of step s into tile row rr (thread half h).
template <int WT, bool BF>
__device__ __forceinline__ void gm_dequant(const GmRaw& r, int s, int h, u16* As, int rr) {
    float v[16];
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int c = s & 3;
        const float d = f16_to_f32(r.s0 & 0xffff), dmin = f16_to_f32(r.s0 >> 16);
        float sc0, m0, sc1, m1;
        scale_min_k4(r.s1, r.s2, r.s3, 2 * c, sc0, m0);
        scale_min_k4(r.s1, r.s2, r.s3, 2 * c + 1, sc1, m1);
        const u32 q[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w};
        const u32 qh[4] = {r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        u32 lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = q[i] & 0x0f0f0f0fu;
            hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
            if (WT == WT_Q5_K) {
                lo[i] |= ((qh[i] >> (2 * c)) & 0x01010101u) << 4;
                hi[i] |= ((qh[i] >> (2 * c + 1)) & 0x01010101u) << 4;
            }
        }
        // Low nibbles: sub-block 2c, k = 16 h + i; high nibbles: sub-block 2c + 1, k = 32 + 16 h + i.
        gm_decode16(lo, d * sc0, dmin * m0, v);
        gm_store16<BF>(As, rr, 16 * h, v);
        gm_decode16(hi, d * sc1, dmin * m1, v);
        gm_store16<BF>(As, rr, 32 + 16 * h, v);
    } else if (WT == WT_Q6_K) {
        const int gs = s & 1;
        const float d = f16_to_f32((u16)r.s0);
        const u32 ql0[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w};
        const u32 ql1[4] = {r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const u32 qh[4] = {r.q2.x, r.q2.y, r.q2.z, r.q2.w};
#pragma unroll
        for (int gg = 0; gg < 2; gg++) {
            const int g = 2 * gs + gg;
            u32 qv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                qv[i] = (((gg ? ql1[i] : ql0[i]) >> (4 * gs)) & 0x0f0f0f0fu) | (((qh[i] >> (2 * g)) & 0x03030303u) << 4);
            const float a = d * (float)(i8)((r.s1 >> (8 * gg)) & 0xff);
            gm_decode16(qv, a, 32.0f * a, v);  // a (q - 32)
            gm_store16<BF>(As, rr, 32 * gg + 16 * h, v);
        }
    } else if (WT == WT_Q8_0) {
        const float d = f16_to_f32((u16)r.s0);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const uint4 u = half ? r.q1 : r.q0;
            // int8 -> biased byte q + 128 (flip the sign bit), then d (q + 128) - 128 d.
            const u32 w[4] = {u.x ^ 0x80808080u, u.y ^ 0x80808080u, u.z ^ 0x80808080u, u.w ^ 0x80808080u};
            gm_decode16(w, d, 128.0f * d, v);
            gm_store16<BF>(As, rr, 32 * h + 16 * half, v);
        }
    }
}

// y[t * y_stride + r] (op)= f(sum_k W[r, k] x[t, k] + bias[r]) for r < rows, t < T; K % 64 == 0.
// Thread-block clusters (split-K variants): rank in the cluster, cluster-wide barrier, and a
// load from the same shared-memory offset in another block of the cluster.
__device__ __forceinline__ u32 gm_cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void gm_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float gm_ld_remote(u32 local_addr, u32 rank) {
    u32 ra;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(local_addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}

// SPLIT = 1: one block per (token tile, row tile). SPLIT = 2: a cluster of two
// blocks (blockIdx.z = 0, 1) per tile, each taking half of the k steps; block 1
// hands its accumulators to block 0 through distributed shared memory, and
// block 0 adds them (in a fixed order, so results are deterministic) and
// writes the tile. Used when there are too few tiles to fill the GPU.
template <int WT, bool BF, int SPLIT>
__device__ __forceinline__ void gemm_tc(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                        const u16* __restrict__ x, int T, float* __restrict__ y, int y_stride,
                                        const float* __restrict__ bias, int flags) {
    __shared__ __align__(128) u16 smem[(GM_BM + 2 * GM_BN) * GM_BK];
    u16* As = smem;
    u16(*Bs)[GM_BN * GM_BK] = (u16(*)[GM_BN * GM_BK])(smem + GM_BM * GM_BK);
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int t0 = blockIdx.x * GM_BN, r0 = blockIdx.y * GM_BM;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;  // this warp's 64 x 32 sub-tile
    const int gid = lane >> 2, tig = lane & 3;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    const int n_steps = K / GM_BK;
    // k steps [s_begin, s_end) of this block.
    const int s_begin = SPLIT == 1 ? 0 : (int)blockIdx.z * n_steps / SPLIT;
    const int s_end = SPLIT == 1 ? n_steps : ((int)blockIdx.z + 1) * n_steps / SPLIT;

    // This thread's weight row (tile row rr, half h) and whether it exists.
    const int rr = tid >> 1, h = tid & 1;
    const bool row_ok = r0 + rr < rows;
    const u8* wrow = w + (size_t)(row_ok ? r0 + rr : 0) * row_bytes;
    const u16* dvrow = wd ? wd + (size_t)(row_ok ? r0 + rr : 0) * bpr : nullptr;

    // Activation copies: 128 tokens x 8 chunks, four per thread.
    const u32 bs_base = smem_addr(&Bs[0][0]);
    auto issue_b = [&](int s, int buf) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int idx = tid + i * GM_THREADS, tok = idx >> 3, ch = idx & 7;
            const int t = t0 + tok;
            const bool ok = t < T;
            const u16* src = x + (ok ? (u32)t * (u32)K + (u32)(s * GM_BK + ch * 8) : 0u);  // T * K < 2^32
            cp_async16z(bs_base + (u32)(buf * GM_BN * GM_BK + gm_swz(tok, ch)) * 2u, src, ok);
        }
        cp_async_commit();
    };
    auto fill_a = [&](const GmRaw& raw, int s) {
        if (gm_fast<WT>()) {
            gm_dequant<WT, BF>(raw, s, h, As, rr);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v[8];
                if (row_ok) {
                    dequant8<WT>(wrow, dvrow, s * GM_BK + 32 * h + 8 * i, v);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = 0.0f;
                }
                uint4 pk;
                pk.x = pack2<BF>(v[0], v[1]); pk.y = pack2<BF>(v[2], v[3]);
                pk.z = pack2<BF>(v[4], v[5]); pk.w = pack2<BF>(v[6], v[7]);
                *(uint4*)&As[gm_swz(rr, 4 * h + i)] = pk;
            }
        }
    };
    auto load_raw = [&](GmRaw& raw, int s) {
        raw.q0 = raw.q1 = raw.q2 = make_uint4(0, 0, 0, 0);
        raw.s0 = raw.s1 = raw.s2 = raw.s3 = 0;  // a missing row decodes to zeros (d = 0)
        if (gm_fast<WT>() && row_ok) gm_load<WT>(wrow, dvrow, s, h, raw);
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    GmRaw raw;
    if (s_begin < s_end) {
        issue_b(s_begin, 0);
        load_raw(raw, s_begin);
        fill_a(raw, s_begin);
    }

    // ldmatrix row addresses: A, lanes 0-7 / 8-15 / 16-23 / 24-31 give rows 0-7 / 8-15 / 0-7 / 8-15
    // of k chunks 0 / 0 / 1 / 1 (a0..a3); B, tokens 0-7 / 0-7 / 8-15 / 8-15 of chunks 0 / 1 / 0 / 1
    // (b0, b1 of the first 8-token tile, then of the second).
    const u32 as_base = smem_addr(&As[0]);
    const int a_row = wm + (lane & 7) + ((lane >> 3) & 1) * 8, a_ch = lane >> 4;
    const int b_tok = wn + (lane & 7) + (lane >> 4) * 8, b_ch = (lane >> 3) & 1;

    for (int s = s_begin; s < s_end; s++) {
        const bool more = s + 1 < s_end;
        if (more) {
            issue_b(s + 1, (s + 1 - s_begin) & 1);
            load_raw(raw, s + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u32 bbuf = bs_base + (u32)(((s - s_begin) & 1) * GM_BN * GM_BK) * 2u;
#pragma unroll
        for (int ks = 0; ks < GM_BK / 16; ks++) {
            u32 bfr[4][2];
#pragma unroll
            for (int j = 0; j < 2; j++)
                ldsm4(bbuf + (u32)gm_swz(b_tok + 16 * j, 2 * ks + b_ch) * 2u, bfr[2 * j][0], bfr[2 * j][1],
                         bfr[2 * j + 1][0], bfr[2 * j + 1][1]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 af[4];
                ldsm4(as_base + (u32)gm_swz(a_row + 16 * i, 2 * ks + a_ch) * 2u, af[0], af[1], af[2], af[3]);
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816<BF>(acc[i][j], af, bfr[j][0], bfr[j][1]);
            }
        }
        __syncthreads();
        if (more) fill_a(raw, s + 1);
    }

    if (SPLIT == 2) {
        // The main loop ended with __syncthreads, so shared memory is free: block 1
        // stores half of its accumulators at a time (32 KB, [value][thread]),
        // block 0 adds them from block 1's shared memory.
        float* red = (float*)smem;
        const u32 rank = gm_cluster_rank();
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (rank == 1) {
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) red[((i * 4 + j) * 4 + e) * GM_THREADS + tid] = acc[2 * half + i][j][e];
            }
            gm_cluster_sync();
            if (rank == 0) {
                const u32 base = smem_addr(red);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[2 * half + i][j][e] += gm_ld_remote(base + (u32)(((i * 4 + j) * 4 + e) * GM_THREADS + tid) * 4u, 1);
            }
            gm_cluster_sync();
        }
        if (rank != 0) return;
    }

    // Epilogue: c0, c1 at (row gid, tokens 2 tig, 2 tig + 1); c2, c3 at row gid + 8.
#pragma unroll
    for (int i = 0; i < 4; i++)
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
                    float* out = y + (size_t)t * y_stride + r;
                    *out = (flags & OUT_ADD) ? *out + v : v;
                }
            }
}

#define GEMM_KERNEL(name, WT, BF)                                                                            \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) name(                                         \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const u16* __restrict__ x,     \
        int T, float* __restrict__ y, int y_stride, const float* __restrict__ bias, int flags) {              \
        gemm_tc<WT, BF, 1>(w, wd, rows, K, x, T, y, y_stride, bias, flags);                                   \
    }

// Split-K in clusters of two blocks along z (grid z = 2).
#define GEMM_KERNEL_K2(name, WT, BF)                                                                         \
    extern "C" __global__ void __cluster_dims__(1, 1, 2) __launch_bounds__(GM_THREADS, 2) name(              \
        const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K, const u16* __restrict__ x,     \
        int T, float* __restrict__ y, int y_stride, const float* __restrict__ bias, int flags) {              \
        gemm_tc<WT, BF, 2>(w, wd, rows, K, x, T, y, y_stride, bias, flags);                                   \
    }

#define GEMM_KERNELS(tname, WT) \
    GEMM_KERNEL(gemm_##tname##_f16, WT, false) \
    GEMM_KERNEL(gemm_##tname##_bf16, WT, true)

#define GEMM_KERNELS_K2(tname, WT) \
    GEMM_KERNEL_K2(gemm_##tname##_f16_k2, WT, false) \
    GEMM_KERNEL_K2(gemm_##tname##_bf16_k2, WT, true)

GEMM_KERNELS(f32, WT_F32)
GEMM_KERNELS(f16, WT_F16)
GEMM_KERNELS(bf16, WT_BF16)
GEMM_KERNELS(q8_0, WT_Q8_0)
GEMM_KERNELS(q4_0, WT_Q4_0)
GEMM_KERNELS(q5_0, WT_Q5_0)
GEMM_KERNELS(q4_k, WT_Q4_K)
GEMM_KERNELS(q5_k, WT_Q5_K)
GEMM_KERNELS(q6_k, WT_Q6_K)
GEMM_KERNELS_K2(q8_0, WT_Q8_0)
GEMM_KERNELS_K2(q4_k, WT_Q4_K)
GEMM_KERNELS_K2(q5_k, WT_Q5_K)
GEMM_KERNELS_K2(q6_k, WT_Q6_K)
