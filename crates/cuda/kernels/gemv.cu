// Quantized matrix-vector products for decode (and small token blocks):
// (Every kernel also takes grid row y as a block of tokens of its own: a
// launch over T tokens with grid (x, T) computes each token exactly as T
// one-token launches would: the batch-invariant verify pass, forward.rs.)
//
// y[t, r] = sum_k W[r, k] * x[t, k] for NT activation columns at once, with the
// activations quantized to 8 bits per 32-value block (quantize_q8 below) so
// that every weight type is consumed by packed integer dot products (dp4a).
//
// One warp per output row. A row is cut into "items" (64 weights of a K-quant
// super-block, or one 32-weight block); lanes stride over the items, so the
// warp reads the row front to back in wide, coalesced loads. Decode is bound
// by reading the weights once, so the loop body only has to keep enough loads
// in flight; the arithmetic per byte is small.
//
// Weight layouts are ggml's block layouts, except that types whose blocks are
// not 16-byte multiples (Q8_0, Q4_0, Q5_0, Q6_K) are uploaded split into an
// aligned body array and a separate array of f16 scales (see repack.rs).

// Weight type ids shared with the host (WeightKind in repack.rs).
#define WT_F32 0
#define WT_F16 1
#define WT_BF16 2
#define WT_Q8_0 3
#define WT_Q4_0 4
#define WT_Q5_0 5
#define WT_Q4_K 6
#define WT_Q5_K 7
#define WT_Q6_K 8


// Quantizes x [n_blocks * 32] into int8 with one f32 scale per 32 values:
// d = amax / 127, q = round(x / d) (halves away from zero), and s = d * sum(q)
// so kernels can fold a weight offset (dmin, or the -8/-16/-32 of the
// symmetric types) without a second pass over q.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ xq, float* __restrict__ xd,
                                       float* __restrict__ xs, int n_blocks) {
    PDL_TRIGGER();
    PDL_WAIT();
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (b >= n_blocks) return;
    const float v = x[b * 32 + lane];
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

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// Byte i (0..11) of the packed K-quant scales held in three words.
__device__ __forceinline__ int scale_byte(u32 s0, u32 s1, u32 s2, int i) {
    const u32 w = i < 4 ? s0 : (i < 8 ? s1 : s2);
    return (int)((w >> (8 * (i & 3))) & 0xffu);
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(u32 s0, u32 s1, u32 s2, int j, float& sc, float& m) {
    if (j < 4) {
        sc = (float)(scale_byte(s0, s1, s2, j) & 63);
        m = (float)(scale_byte(s0, s1, s2, j + 4) & 63);
    } else {
        sc = (float)((scale_byte(s0, s1, s2, j + 4) & 15) | ((scale_byte(s0, s1, s2, j - 4) >> 6) << 4));
        m = (float)((scale_byte(s0, s1, s2, j + 4) >> 4) | ((scale_byte(s0, s1, s2, j) >> 6) << 4));
    }
}

// Spreads bits 0..3 of b to bit 4 of bytes 0..3.
__device__ __forceinline__ int spread_bits4(u32 b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

__device__ __forceinline__ void load8(const void* p, int* v) {
    const int4 a = ((const int4*)p)[0], b = ((const int4*)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void load4(const void* p, int* v) {
    const int4 a = *(const int4*)p;
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}

// Asks L2 for the bytes [p, p + n) in 128-byte lines, spread over the lanes of
// a warp: the rows a warp starts with are requested before it waits for the
// previous kernel (PDL), overlapping their latency with that kernel's tail.
__device__ __forceinline__ void prefetch_rows_l2(const u8* p, int n, int lane) {
    for (int o = lane * 128; o < n; o += WARP * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

// Activations of column t: xq + t*K, xd/xs + t*K/32.
struct Act {
    const i8* q;
    const float* d;
    const float* s;
    int K;
};

// ---- per-item dot products; `it` indexes the items of one row ----
//
// Each item is split into a load (the weight bytes into registers, with
// streaming loads that bypass L1 so the activations stay cached there) and a
// compute step, so that the row loop can issue the loads of several items
// before the first dot product needs them.

// 16 bytes of weights, read once: not allocated in L1.
__device__ __forceinline__ int4 ld_stream(const void* p) {
    int4 r;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ void ld_stream4(const void* p, int* v) {
    const int4 a = ld_stream(p);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}

// The raw registers of one item (fields unused by a type are optimised away).
struct Raw {
    int w[16];
    u32 x0, x1, x2, x3;
};

template <int WT>
__device__ __forceinline__ void load_item(const u8* row, const u16* dv, int it, Raw& r) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        // Q4_K: 144-byte super-blocks [d, dmin, scales[12], qs[128]]; Q5_K: 176
        // bytes with qh[32] before qs. Item c (0..3) is sub-blocks 2c (low
        // nibbles of qs[32c..]) and 2c+1 (high nibbles).
        const int b = it >> 2, c = it & 3;
        const u8* blk = row + b * (WT == WT_Q4_K ? 144 : 176);
        const int4 hdr = *(const int4*)blk;  // d, dmin, scales[0..12]: L1-cached, shared by 4 lanes
        r.x0 = hdr.x; r.x1 = hdr.y; r.x2 = hdr.z; r.x3 = hdr.w;
        const u8* qs = blk + (WT == WT_Q4_K ? 16 : 48) + 32 * c;
        ld_stream4(qs, r.w);
        ld_stream4(qs + 16, r.w + 4);
        if (WT == WT_Q5_K) {
            const int4 h0 = *(const int4*)(blk + 16), h1 = *(const int4*)(blk + 32);
            r.w[8] = h0.x; r.w[9] = h0.y; r.w[10] = h0.z; r.w[11] = h0.w;
            r.w[12] = h1.x; r.w[13] = h1.y; r.w[14] = h1.z; r.w[15] = h1.w;
        }
    } else if (WT == WT_Q6_K) {
        // Repacked: 208-byte bodies [ql[128], qh[64], scales[16]], f16 d apart.
        // Item i (0..3): half n = i/2, lanes l0 = 16*(i%2): four 16-value groups
        // at offsets 128n + l0 + 32g, each with its own scale.
        const int b = it >> 2, i = it & 3, n = i >> 1, l0 = (i & 1) * 16;
        const u8* blk = row + b * 208;
        ld_stream4(blk + 64 * n + l0, r.w);
        ld_stream4(blk + 64 * n + l0 + 32, r.w + 4);
        ld_stream4(blk + 128 + 32 * n + l0, r.w + 8);
        const u8* sc = blk + 192 + 8 * n + l0 / 16;
        r.x1 = (u32)sc[0] | ((u32)sc[2] << 8) | ((u32)sc[4] << 16) | ((u32)sc[6] << 24);
        r.x0 = dv[b];
    } else if (WT == WT_Q8_0) {
        ld_stream4(row + it * 32, r.w);
        ld_stream4(row + it * 32 + 16, r.w + 4);
        r.x0 = dv[it];
    } else if (WT == WT_Q4_0) {
        ld_stream4(row + it * 16, r.w);
        r.x0 = dv[it];
    } else if (WT == WT_Q5_0) {
        const u32* body = (const u32*)(row + it * 20);
        r.x1 = body[0];
        r.w[0] = (int)body[1]; r.w[1] = (int)body[2]; r.w[2] = (int)body[3]; r.w[3] = (int)body[4];
        r.x0 = dv[it];
    }
}

template <int WT, int NT>
__device__ __forceinline__ void dot_item(const Raw& r, int it, Act a, float* acc) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int b = it >> 2, c = it & 3;
        const float d = f16_to_f32(r.x0 & 0xffff), dmin = f16_to_f32(r.x0 >> 16);
        float sc0, m0, sc1, m1;
        scale_min_k4(r.x1, r.x2, r.x3, 2 * c, sc0, m0);
        scale_min_k4(r.x1, r.x2, r.x3, 2 * c + 1, sc1, m1);
        int lo[8], hi[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lo[i] = r.w[i] & 0x0f0f0f0f;
            hi[i] = (r.w[i] >> 4) & 0x0f0f0f0f;
            if (WT == WT_Q5_K) {
                lo[i] |= ((r.w[8 + i] >> (2 * c)) & 0x01010101) << 4;
                hi[i] |= ((r.w[8 + i] >> (2 * c + 1)) & 0x01010101) << 4;
            }
        }
        const int k0 = b * 256 + 64 * c;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int x0[8], x1[8];
            load8(a.q + t * a.K + k0, x0);
            load8(a.q + t * a.K + k0 + 32, x1);
            int dot0 = 0, dot1 = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                dot0 = dp4a(lo[i], x0[i], dot0);
                dot1 = dp4a(hi[i], x1[i], dot1);
            }
            const int bi = t * (a.K / 32) + k0 / 32;
            acc[t] += d * (sc0 * (float)dot0 * a.d[bi] + sc1 * (float)dot1 * a.d[bi + 1]) -
                      dmin * (m0 * a.s[bi] + m1 * a.s[bi + 1]);
        }
    } else if (WT == WT_Q6_K) {
        const int b = it >> 2, i = it & 3, n = i >> 1, l0 = (i & 1) * 16;
        const float d = f16_to_f32((u16)r.x0);
        int v[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int la = r.w[j], lb = r.w[4 + j], h = r.w[8 + j];
            v[0][j] = __vsub4((la & 0x0f0f0f0f) | ((h & 0x03030303) << 4), 0x20202020);
            v[1][j] = __vsub4((lb & 0x0f0f0f0f) | (((h >> 2) & 0x03030303) << 4), 0x20202020);
            v[2][j] = __vsub4(((la >> 4) & 0x0f0f0f0f) | (((h >> 4) & 0x03030303) << 4), 0x20202020);
            v[3][j] = __vsub4(((lb >> 4) & 0x0f0f0f0f) | (((h >> 6) & 0x03030303) << 4), 0x20202020);
        }
        float s[4];
#pragma unroll
        for (int g = 0; g < 4; g++) s[g] = (float)(i8)((r.x1 >> (8 * g)) & 0xff);
        const int kb = b * 256 + 128 * n;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float sum = 0.0f;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                int x[4];
                load4(a.q + t * a.K + kb + 32 * g + l0, x);
                int dot = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) dot = dp4a(v[g][j], x[j], dot);
                sum += s[g] * (float)dot * a.d[t * (a.K / 32) + (kb + 32 * g) / 32];
            }
            acc[t] += d * sum;
        }
    } else if (WT == WT_Q8_0) {
        const float d = f16_to_f32((u16)r.x0);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int x[8];
            load8(a.q + t * a.K + it * 32, x);
            int dot = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) dot = dp4a(r.w[i], x[i], dot);
            acc[t] += d * (float)dot * a.d[t * (a.K / 32) + it];
        }
    } else if (WT == WT_Q4_0 || WT == WT_Q5_0) {
        // Q4_0: value l is (qs[l] & 15) - 8 for l < 16, (qs[l-16] >> 4) - 8 above.
        // Q5_0: (nibble | bit l of qh << 4) - 16.
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = r.w[i] & 0x0f0f0f0f;
            hi[i] = (r.w[i] >> 4) & 0x0f0f0f0f;
            if (WT == WT_Q5_0) {
                lo[i] |= spread_bits4(r.x1 >> (4 * i));
                hi[i] |= spread_bits4(r.x1 >> (16 + 4 * i));
            }
        }
        const float d = f16_to_f32((u16)r.x0);
        const float off = WT == WT_Q4_0 ? 8.0f : 16.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int x[8];
            load8(a.q + t * a.K + it * 32, x);
            int dot = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                dot = dp4a(lo[i], x[i], dot);
                dot = dp4a(hi[i], x[i + 4], dot);
            }
            const int bi = t * (a.K / 32) + it;
            acc[t] += d * ((float)dot * a.d[bi] - off * a.s[bi]);
        }
    }
}

// Float weights (F32, F16, BF16): 32 values per item against the dequantized activations.
template <int WT, int NT>
__device__ __forceinline__ void item_float(const u8* row, const u16*, int it, Act a, float* acc) {
    float w[32];
    if (WT == WT_F32) {
        const float4* p = (const float4*)(row + it * 128);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 f = p[i];
            w[4 * i] = f.x; w[4 * i + 1] = f.y; w[4 * i + 2] = f.z; w[4 * i + 3] = f.w;
        }
    } else {
        const u32* p = (const u32*)(row + it * 64);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 u = p[i];
            w[2 * i] = WT == WT_F16 ? f16_to_f32(u & 0xffff) : bf16_to_f32(u & 0xffff);
            w[2 * i + 1] = WT == WT_F16 ? f16_to_f32(u >> 16) : bf16_to_f32(u >> 16);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const i8* x = a.q + t * a.K + it * 32;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) dot += w[i] * (float)x[i];
        acc[t] += dot * a.d[t * (a.K / 32) + it];
    }
}

// Bytes of one row's body and number of items, per weight type.
template <int WT>
__device__ __forceinline__ void row_geometry(int K, int& row_bytes, int& n_items, int& blocks_per_row) {
    switch (WT) {
        case WT_Q4_K: blocks_per_row = K / 256; row_bytes = blocks_per_row * 144; n_items = blocks_per_row * 4; break;
        case WT_Q5_K: blocks_per_row = K / 256; row_bytes = blocks_per_row * 176; n_items = blocks_per_row * 4; break;
        case WT_Q6_K: blocks_per_row = K / 256; row_bytes = blocks_per_row * 208; n_items = blocks_per_row * 4; break;
        case WT_Q8_0: blocks_per_row = K / 32; row_bytes = blocks_per_row * 32; n_items = blocks_per_row; break;
        case WT_Q4_0: blocks_per_row = K / 32; row_bytes = blocks_per_row * 16; n_items = blocks_per_row; break;
        case WT_Q5_0: blocks_per_row = K / 32; row_bytes = blocks_per_row * 20; n_items = blocks_per_row; break;
        case WT_F32: blocks_per_row = K / 32; row_bytes = K * 4; n_items = blocks_per_row; break;
        default: blocks_per_row = K / 32; row_bytes = K * 2; n_items = blocks_per_row; break;
    }
}

// y[t * y_stride + r] (op)= f(acc + bias[r]) for rows r of W [rows, K].
// ---- R rows per warp (single token): the activations of an item are loaded
// once into registers and used for R rows, which cuts the L1 traffic that
// bounds the one-row kernel (activations are twice the bytes of 4-bit weights).

struct ActRegs {
    int x[16];
    float d[4];
    float s[2];
};

template <int WT>
__device__ __forceinline__ void load_act(int it, Act a, ActRegs& ar) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int k0 = (it >> 2) * 256 + 64 * (it & 3);
        load8(a.q + k0, ar.x);
        load8(a.q + k0 + 32, ar.x + 8);
        const float2 d = *(const float2*)(a.d + k0 / 32), s = *(const float2*)(a.s + k0 / 32);
        ar.d[0] = d.x; ar.d[1] = d.y; ar.s[0] = s.x; ar.s[1] = s.y;
    } else if (WT == WT_Q6_K) {
        const int i = it & 3, kb = (it >> 2) * 256 + 128 * (i >> 1), l0 = (i & 1) * 16;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            load4(a.q + kb + 32 * g + l0, ar.x + 4 * g);
            ar.d[g] = a.d[(kb + 32 * g) / 32];
        }
    } else {
        load8(a.q + it * 32, ar.x);
        ar.d[0] = a.d[it];
        ar.s[0] = a.s[it];
    }
}

template <int WT>
__device__ __forceinline__ float dot_regs(const Raw& r, int it, const ActRegs& ar) {
    if (WT == WT_Q4_K || WT == WT_Q5_K) {
        const int c = it & 3;
        const float d = f16_to_f32(r.x0 & 0xffff), dmin = f16_to_f32(r.x0 >> 16);
        float sc0, m0, sc1, m1;
        scale_min_k4(r.x1, r.x2, r.x3, 2 * c, sc0, m0);
        scale_min_k4(r.x1, r.x2, r.x3, 2 * c + 1, sc1, m1);
        int dot0 = 0, dot1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = r.w[i] & 0x0f0f0f0f, hi = (r.w[i] >> 4) & 0x0f0f0f0f;
            if (WT == WT_Q5_K) {
                lo |= ((r.w[8 + i] >> (2 * c)) & 0x01010101) << 4;
                hi |= ((r.w[8 + i] >> (2 * c + 1)) & 0x01010101) << 4;
            }
            dot0 = dp4a(lo, ar.x[i], dot0);
            dot1 = dp4a(hi, ar.x[8 + i], dot1);
        }
        return d * (sc0 * (float)dot0 * ar.d[0] + sc1 * (float)dot1 * ar.d[1]) - dmin * (m0 * ar.s[0] + m1 * ar.s[1]);
    } else if (WT == WT_Q6_K) {
        const float d = f16_to_f32((u16)r.x0);
        int dot[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int la = r.w[j], lb = r.w[4 + j], h = r.w[8 + j];
            // Group g of this item is against activations x[4g .. 4g + 4).
            dot[0] = dp4a(__vsub4((la & 0x0f0f0f0f) | ((h & 0x03030303) << 4), 0x20202020), ar.x[j], dot[0]);
            dot[1] = dp4a(__vsub4((lb & 0x0f0f0f0f) | (((h >> 2) & 0x03030303) << 4), 0x20202020), ar.x[4 + j], dot[1]);
            dot[2] = dp4a(__vsub4(((la >> 4) & 0x0f0f0f0f) | (((h >> 4) & 0x03030303) << 4), 0x20202020), ar.x[8 + j], dot[2]);
            dot[3] = dp4a(__vsub4(((lb >> 4) & 0x0f0f0f0f) | (((h >> 6) & 0x03030303) << 4), 0x20202020), ar.x[12 + j], dot[3]);
        }
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) sum += (float)(i8)((r.x1 >> (8 * g)) & 0xff) * (float)dot[g] * ar.d[g];
        return d * sum;
    } else if (WT == WT_Q8_0) {
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) dot = dp4a(r.w[i], ar.x[i], dot);
        return f16_to_f32((u16)r.x0) * (float)dot * ar.d[0];
    } else {
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int lo = r.w[i] & 0x0f0f0f0f, hi = (r.w[i] >> 4) & 0x0f0f0f0f;
            if (WT == WT_Q5_0) {
                lo |= spread_bits4(r.x1 >> (4 * i));
                hi |= spread_bits4(r.x1 >> (16 + 4 * i));
            }
            dot = dp4a(lo, ar.x[i], dot);
            dot = dp4a(hi, ar.x[i + 4], dot);
        }
        const float off = WT == WT_Q4_0 ? 8.0f : 16.0f;
        return f16_to_f32((u16)r.x0) * ((float)dot * ar.d[0] - off * ar.s[0]);
    }
}

// Rows r0 .. r0 + R - 1 (those below `rows`) of W by one warp: the
// arithmetic of every one-row-per-warp kernel (each lane sums every 32nd item
// of the row in order, then one warp_sum), which the persistent decode kernel
// runs too. The activations `a` are read with ordinary loads.
template <int WT, int R>
__device__ __forceinline__ void gemv_rows_warp(const u8* __restrict__ w, const u16* __restrict__ wd, int rows,
                                               int K, Act a, float* y, const float* __restrict__ bias, int flags,
                                               int r0, int lane) {
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    float acc[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++) acc[rr] = 0.0f;
    for (int it = lane; it < n_items; it += WARP) {
        Raw raw[R];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
            if (r0 + rr < rows)
                load_item<WT>(w + (size_t)(r0 + rr) * row_bytes, wd ? wd + (size_t)(r0 + rr) * bpr : nullptr, it, raw[rr]);
        ActRegs ar;
        load_act<WT>(it, a, ar);
#pragma unroll
        for (int rr = 0; rr < R; rr++)
            if (r0 + rr < rows) acc[rr] += dot_regs<WT>(raw[rr], it, ar);
    }
#pragma unroll
    for (int rr = 0; rr < R; rr++) acc[rr] = warp_sum(acc[rr]);
    if (lane < R && r0 + lane < rows) {
        float v = 0.0f;
#pragma unroll
        for (int rr = 0; rr < R; rr++)
            if (rr == lane) v = acc[rr];
        const int r = r0 + lane;
        if (bias) v += bias[r];
        if (flags & OUT_BF16) v = round_bf16(v);
        y[r] = (flags & OUT_ADD) ? y[r] + v : v;
    }
}

template <int WT, int R>
__device__ __forceinline__ void gemv_rows(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                          const i8* __restrict__ xq, const float* __restrict__ xd,
                                          const float* __restrict__ xs, float* __restrict__ y,
                                          const float* __restrict__ bias, int flags) {
    const int lane = threadIdx.x % WARP, wpb = blockDim.x / WARP;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    const Act a = {xq, xd, xs, K};
    {
        const int r0 = (blockIdx.x * wpb + threadIdx.x / WARP) * R;
        if (r0 < rows) prefetch_rows_l2(w + (size_t)r0 * row_bytes, min(R, rows - r0) * row_bytes, lane);
    }
    PDL_TRIGGER();
    PDL_WAIT();
    for (int r0 = (blockIdx.x * wpb + threadIdx.x / WARP) * R; r0 < rows; r0 += gridDim.x * wpb * R)
        gemv_rows_warp<WT, R>(w, wd, rows, K, a, y, bias, flags, r0, lane);
}

// gemv_rows for up to MT tokens at once (tokens blockIdx.y * MT ..), each
// token's arithmetic exactly gemv_rows<WT, R>'s for that token alone (same
// items per lane in the same order, same warp sum): the weights are read once
// for all of them. The batch-invariant verify pass uses it for the matrices
// whose tuned one-token variant is gemv_rows (e.g. the LM head).
template <int WT, int R, int MT>
__device__ __forceinline__ void gemv_rows_t(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                            const i8* __restrict__ xq, const float* __restrict__ xd,
                                            const float* __restrict__ xs, float* __restrict__ y, int y_stride,
                                            const float* __restrict__ bias, int flags, int n_tokens) {
    const int lane = threadIdx.x % WARP, wpb = blockDim.x / WARP;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    const int t0 = blockIdx.y * MT, nt = min(MT, n_tokens - t0);
    {
        const int r0 = (blockIdx.x * wpb + threadIdx.x / WARP) * R;
        if (r0 < rows) prefetch_rows_l2(w + (size_t)r0 * row_bytes, min(R, rows - r0) * row_bytes, lane);
    }
    PDL_TRIGGER();
    PDL_WAIT();
    for (int r0 = (blockIdx.x * wpb + threadIdx.x / WARP) * R; r0 < rows; r0 += gridDim.x * wpb * R) {
        float acc[MT][R];
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int rr = 0; rr < R; rr++) acc[t][rr] = 0.0f;
        for (int it = lane; it < n_items; it += WARP) {
            Raw raw[R];
#pragma unroll
            for (int rr = 0; rr < R; rr++)
                if (r0 + rr < rows)
                    load_item<WT>(w + (size_t)(r0 + rr) * row_bytes, wd ? wd + (size_t)(r0 + rr) * bpr : nullptr, it, raw[rr]);
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t < nt) {
                    const size_t tk = (size_t)(t0 + t);
                    const Act a = {xq + tk * K, xd + tk * (K / 32), xs + tk * (K / 32), K};
                    ActRegs ar;
                    load_act<WT>(it, a, ar);
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
                        if (r0 + rr < rows) acc[t][rr] += dot_regs<WT>(raw[rr], it, ar);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t < nt) {
#pragma unroll
                for (int rr = 0; rr < R; rr++) acc[t][rr] = warp_sum(acc[t][rr]);
                if (lane < R && r0 + lane < rows) {
                    float v = 0.0f;
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
                        if (rr == lane) v = acc[t][rr];
                    const int r = r0 + lane;
                    if (bias) v += bias[r];
                    if (flags & OUT_BF16) v = round_bf16(v);
                    float* out = y + (size_t)(t0 + t) * y_stride + r;
                    *out = (flags & OUT_ADD) ? *out + v : v;
                }
            }
        }
    }
}

template <int WT, int NT, int U>
__device__ __forceinline__ void gemv(const u8* __restrict__ w, const u16* __restrict__ wd, int rows, int K,
                                     const i8* __restrict__ xq, const float* __restrict__ xd,
                                     const float* __restrict__ xs, float* __restrict__ y, int y_stride,
                                     const float* __restrict__ bias, int flags) {
    const int lane = threadIdx.x % WARP, wpb = blockDim.x / WARP;
    int row_bytes, n_items, bpr;
    row_geometry<WT>(K, row_bytes, n_items, bpr);
    const Act a = {xq, xd, xs, K};
    {
        const int r = blockIdx.x * wpb + threadIdx.x / WARP;
        if (r < rows) prefetch_rows_l2(w + (size_t)r * row_bytes, row_bytes, lane);
    }
    PDL_TRIGGER();
    PDL_WAIT();
    // Rows r, r + (warps in the grid), ...: with a grid smaller than the
    // matrix (one sized to the GPU) each warp streams several rows.
    for (int r = blockIdx.x * wpb + threadIdx.x / WARP; r < rows; r += gridDim.x * wpb) {
        const u8* row = w + (size_t)r * row_bytes;
        const u16* dv = wd ? wd + (size_t)r * bpr : nullptr;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        // The hot loop: each lane takes every 32nd item of the row, issuing the
        // weight loads of U items before computing on the first.
        if (WT == WT_F32 || WT == WT_F16 || WT == WT_BF16) {
            for (int it = lane; it < n_items; it += WARP) item_float<WT, NT>(row, dv, it, a, acc);
        } else {
            for (int base = lane; base < n_items; base += U * WARP) {
                Raw raw[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (base + u * WARP < n_items) load_item<WT>(row, dv, base + u * WARP, raw[u]);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (base + u * WARP < n_items) dot_item<WT, NT>(raw[u], base + u * WARP, a, acc);
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
        if (lane < NT) {
            float v = 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t == lane) v = acc[t];
            if (bias) v += bias[r];
            if (flags & OUT_BF16) v = round_bf16(v);
            float* out = y + (size_t)lane * y_stride + r;
            *out = (flags & OUT_ADD) ? *out + v : v;
        }
    }
}

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
