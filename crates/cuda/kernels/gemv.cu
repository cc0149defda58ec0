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
