// Attention over the KV cache on tensor cores: FlashAttention-2 (Dao 2023)
// tiling with split-K over the keys ("Flash-Decoding", Dao et al. 2023).
//
// Rows. For one kv head, the G = n_heads / n_kv query heads that share it and
// the T tokens of the pass form R = G * T query rows, row r = t * G + g. These
// rows are the M dimension of mma.sync.m16n8k16: a warp owns 16 rows (padded
// with zero rows past R). One kernel thus serves decode (T = 1: G rows), a
// speculative verify block (G * T rows) and a prefill block (many 16-row
// warp tiles), all sharing each K/V tile loaded for the kv head.
//
// Grid (row blocks, n_kv, S). Block (x, y, z) takes rows [x * 16 WR, +16 WR)
// of kv head y, and split z of the keys those rows can see (row blocks vary
// fastest, so the blocks that share a K/V chunk run together and share it in
// L2): the union [c_lo, c_hi]
// of their spans, cut into S chunks of whole 32-key tiles. Each row is masked
// to its own span: keys p with lo(t) <= p <= pos0 + t (causal), lo(t) =
// pos0 + t - window + 1 for a sliding window (ring cache: slot = p % slots),
// 0 for a flat cache (slot = p). Each (row, split) writes a partial result:
// running max m (natural-log units), sum l and unnormalised o; a row that sees
// no key in its split writes m = -inf, l = 0, o = 0, which attn_combine
// weighs as 0. attn_combine merges the S splits (unchanged).
//
// Two shapes of block (WR row warps x WK key warps):
//   _d (decode, R <= 16): 2 warps on the same 16 rows, each taking 16 of the
//       32 keys of every tile; their (m, l, o) are merged through shared
//       memory at the end. 64 threads, many splits: bandwidth bound.
//   _b (blocks, R > 16): 4 warps on 64 rows, each taking all 32 keys of a
//       tile. 128 threads; a warp whose rows cannot see a tile skips it
//       (the causal diagonal of prefill).
//
// Per warp and 32-key tile (K and V [32][hd] 16-bit in shared memory):
//   S = Q K^T: Q (16 x hd) A fragments live in registers for the whole kernel
//     (q converted once from f32 to the cache's type: f16 or bf16); K B
//     fragments by ldmatrix.x4 (non-transposed: a K row is a column of K^T).
//   Online softmax in f32 on the accumulator fragments (each thread holds 2
//     rows; row max/sum over the 4 threads of a quad by shuffles), in base 2
//     with scale * log2(e) folded into the scores.
//   O += P V: the S accumulator fragment is already laid out as the A fragment
//     of P (FA2's register reuse); V B fragments by ldmatrix.x4.trans. P is
//     split into hi = round16(p) and lo = round16(p - hi), two MMAs, so P V
//     keeps ~22 (f16) / ~16 (bf16) bits of P. O accumulates in f32.
//
// Shared memory: STAGES buffers of K and V tiles filled with cp.async (3 for
// hd 128: 48 KB static, 4 for hd 64: 32 KB), one __syncthreads per tile.
// Keys past the split's end are zero-filled (cp.async src-size 0) so that P V
// never meets stale or NaN bits. Rows of 16-byte chunks are XOR-swizzled
// (chunk c of key row r lives at chunk c ^ (r & 7)): the 8 row addresses of
// every ldmatrix phase, and every 8 consecutive cp.async writes, fall in 8
// distinct 16-byte bank groups, so neither conflicts (no padding needed).
//
// Quantized caches (KQ = FA_Q8 / FA_Q4: llama.cpp's q8_0 / q4_0 blocks, K and
// V of the same type). A layer's buffer holds each key row's block quants
// first ([n_kv, slots, QB] bytes: QB = hd for q8_0, hd / 2 for q4_0, byte j of
// a q4_0 block holding values j (low nibble) and j + 16 (high)), then every
// row's f16 block scales ([n_kv, slots, hd / 32]). cp.async brings a tile's
// quants and scales into STAGES staging buffers; before the tile is used, the
// block's threads dequantize it into one f16 K tile and one f16 V tile
// (value = q * d rounded once to f16, through the 1024 + u f16 bit trick),
// laid out and swizzled as the 16-bit path's, so the MMA code is the same.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16/.bf16; g = lane / 4,
// c = lane % 4): A regs a0: (row g, cols 2c..2c+1), a1: (g + 8, 2c..),
// a2: (g, 2c + 8..), a3: (g + 8, 2c + 8..); B regs b0: (k rows 2c..2c+1,
// col g), b1: (k rows 2c + 8.., col g); C: c0, c1: (g, 2c..2c+1), c2, c3:
// (g + 8, 2c..). The lower-indexed element sits in the low 16 bits.
// ldmatrix.x4: lane l gives the address of row l % 8 of matrix l / 8, and
// receives from matrix i the pair (row l / 4, cols 2 (l % 4)..+1), or with
// .trans the pair (rows 2 (l % 4)..+1, col l / 4).

#define FA_BK 32  // keys per shared-memory tile

// Masking modes (the kernels' last argument; ops.rs AttnMode).
#define FA_CAUSAL 0
#define FA_PER_TOKEN 1
#define FA_FULL 2

// Cache element types (the kernels' KQ parameter; ops.rs KvKind).
#define FA_16 0  // f16 or bf16 values
#define FA_Q8 1  // q8_0 blocks
#define FA_Q4 2  // q4_0 blocks

// cp.async of N (4, 8 or 16) bytes, zero-filled when `valid` is false.
template <int N>
__device__ __forceinline__ void cp_async_nz(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0));
}

// Four bytes b0..b3 (each 1024 + u as the f16 bit pattern 0x6400 | u) minus
// `bias`, times the f16 scale pair d2: two f16x2 words (b0, b1), (b2, b3).
// u - bias is an exact small integer, so each result is q * d rounded once.
__device__ __forceinline__ void fa_deq4(u32 w, u32 bias2, u32 d2, u32& lo, u32& hi) {
    u32 a = __byte_perm(w, 0x64646464u, 0x4140), b = __byte_perm(w, 0x64646464u, 0x4342);
    asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(a) : "r"(bias2));
    asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(b) : "r"(bias2));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(a) : "r"(d2));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(b) : "r"(d2));
    lo = a;
    hi = b;
}

// Quant bytes and scale bytes of one key row of a KQ cache of head size HD.
template <int HD, int KQ>
struct FaRow {
    static constexpr int QB = KQ == FA_Q8 ? HD : HD / 2;
    static constexpr int SB = HD / 32 * 2;
    static constexpr int STG = 32 * (QB + SB);  // one matrix's staging bytes per tile
};

// p0, p1 -> hi (rounded) and lo (rounded remainder) packed pairs.
template <bool BF16>
__device__ __forceinline__ void fa_split(float p0, float p1, u32& hi, u32& lo) {
    hi = pack2<BF16>(p0, p1);
    float h0, h1;
    if (BF16) {
        h0 = __uint_as_float(hi << 16);
        h1 = __uint_as_float(hi & 0xffff0000u);
    } else {
        h0 = f16_to_f32((u16)(hi & 0xffffu));
        h1 = f16_to_f32((u16)(hi >> 16));
    }
    lo = pack2<BF16>(p0 - h0, p1 - h1);
}

__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The K/V tile buffers: static shared memory up to the 48 KiB every kernel
// may use; DYN kernels (head dim 256) take theirs as dynamic shared memory,
// sized by the launch (fa_smem_bytes in ops.rs) above that limit.
extern __shared__ __align__(128) u16 fa_dyn_smem[];

// Shared memory of fa_attn in halves: 16-bit caches: STAGES K/V tile pairs;
// quantized: STAGES staging pairs, then the one f16 K/V tile pair.
template <int HD, int STAGES, int KQ>
__host__ __device__ constexpr int fa_smem_halves() {
    return KQ == FA_16 ? STAGES * 2 * FA_BK * HD
                       : STAGES * FaRow<HD, KQ == FA_16 ? FA_Q8 : KQ>::STG + 2 * FA_BK * HD;
}

// One (kv head, split, row block) of block `bk`. WR warps of rows x WK warps
// of keys. fa_smem: fa_smem_halves() halves, 128-byte aligned.
template <int HD, bool BF16, int WR, int WK, int STAGES, int KQ>
__device__ __forceinline__ void fa_attn(const Blk& bk, u16* fa_smem, const float* q, const u16* kc, const u16* vc,
                                        const int* pos0p, int n_tokens, int n_heads, int n_kv, int slots,
                                        int window, float scale, float* part_o, float* part_ml, int mode) {
    constexpr int NT = WR * WK * WARP;  // threads
    constexpr int KW = FA_BK / WK;      // keys per warp per tile
    constexpr int NKT = KW / 8;         // S column tiles per warp
    constexpr int KS = HD / 16;         // k steps of Q K^T
    constexpr int DT = HD / 8;          // O column tiles
    constexpr int CH = HD / 8;          // 16-byte chunks per key row
    constexpr int TILE = FA_BK * HD;    // halves per K (or V) tile
    using QR = FaRow<HD, KQ == FA_16 ? FA_Q8 : KQ>;
    constexpr int SMEM = fa_smem_halves<HD, STAGES, KQ>();
    static_assert(KW % 16 == 0, "a warp takes whole 16-key steps");
    static_assert((WK - 1) * WR * (DT * 4 + 4) * WARP * 4 <= SMEM * 2, "merge buffer fits");
    static_assert(KQ == FA_16 || !BF16, "quantized caches dequantize to f16");
    // The quantized path's f16 tile pair, after the staging buffers.
    u16* const fa_tile16 = fa_smem + (KQ == FA_16 ? 0 : STAGES * QR::STG);

    const int kvh = bk.y, s = bk.z, S = bk.gz;
    // FA_PER_TOKEN: block x is token x alone, its G rows placed and masked
    // exactly as a one-token decode pass at position pos0 + x places them
    // (rows past the token's invalid), so each row's result is bit for bit
    // that pass's (batch-invariant verify). FA_FULL: every row sees all
    // n_tokens rows of the pass (the DFlash drafter's non-causal block).
    const int G = n_heads / n_kv;
    const int R = mode == FA_PER_TOKEN ? (bk.x + 1) * G : G * n_tokens;
    const int tid = bk.tid, warp = tid / WARP, lane = tid % WARP;
    const int gq = lane >> 2, tq = lane & 3;
    const int rt = warp % WR, kg = warp / WR;
    const int pos0 = pos0p[0];
    const int row0 = mode == FA_PER_TOKEN ? bk.x * G : bk.x * 16 * WR;

    // This block's keys: the union of its rows' spans, split y of S.
    const int t_first = row0 / G, t_last = (min(R, row0 + 16 * WR) - 1) / G;
    const int c_hi = mode == FA_FULL ? pos0 + n_tokens - 1 : pos0 + t_last;
    const int c_lo = window > 0 ? max(0, pos0 + t_first - window + 1) : 0;
    int chunk = (c_hi - c_lo + S) / S;
    chunk = (max(chunk, FA_BK) + FA_BK - 1) / FA_BK * FA_BK;
    const int start = c_lo + s * chunk, end = min(start + chunk, c_hi + 1);
    const int n_tiles = start < end ? (end - start + FA_BK - 1) / FA_BK : 0;

    const u16* kh = kc + (size_t)kvh * slots * HD;
    const u16* vh = vc + (size_t)kvh * slots * HD;
    // Quantized: this head's quant rows and scale rows.
    const u8* kq = (const u8*)kc + (size_t)kvh * slots * QR::QB;
    const u8* vq = (const u8*)vc + (size_t)kvh * slots * QR::QB;
    const u8* kd = (const u8*)kc + (size_t)n_kv * slots * QR::QB + (size_t)kvh * slots * QR::SB;
    const u8* vd = (const u8*)vc + (size_t)n_kv * slots * QR::QB + (size_t)kvh * slots * QR::SB;
    auto issue = [&](int tile) {
        if (KQ != FA_16) {
            if (tile < n_tiles) {
                const int base = start + tile * FA_BK;
                const u32 ks = smem_addr(fa_smem + (tile % STAGES) * QR::STG);
                const u32 vs = ks + QR::STG;
                constexpr int QC = QR::QB / 16;  // 16-byte chunks of quants per row
                for (int i = tid; i < FA_BK * QC; i += NT) {
                    const int r = i / QC, c = i % QC;
                    const int p = base + r;
                    const bool ok = p < end;
                    int slot = ok ? p : start;
                    if (slot >= slots) slot %= slots;
                    const size_t off = (size_t)slot * QR::QB + c * 16;
                    cp_async16z(ks + r * QR::QB + c * 16, kq + off, ok);
                    cp_async16z(vs + r * QR::QB + c * 16, vq + off, ok);
                }
                for (int r = tid; r < FA_BK; r += NT) {
                    const int p = base + r;
                    const bool ok = p < end;
                    int slot = ok ? p : start;
                    if (slot >= slots) slot %= slots;
                    const u32 so = FA_BK * QR::QB + r * QR::SB;
                    cp_async_nz<QR::SB>(ks + so, kd + (size_t)slot * QR::SB, ok);
                    cp_async_nz<QR::SB>(vs + so, vd + (size_t)slot * QR::SB, ok);
                }
            }
            cp_async_commit();
            return;
        }
        if (tile < n_tiles) {
            const int base = start + tile * FA_BK;
            const u32 ks = smem_addr(fa_smem + (tile % STAGES) * 2 * TILE);
            const u32 vs = ks + TILE * 2;
            for (int i = tid; i < FA_BK * CH; i += NT) {
                const int r = i / CH, c = i % CH;
                const int p = base + r;
                const bool ok = p < end;
                int slot = ok ? p : start;
                if (slot >= slots) slot %= slots;
                const size_t off = (size_t)slot * HD + c * 8;
                const u32 so = (u32)(r * HD + ((c ^ (r & 7)) * 8)) * 2;
                cp_async16z(ks + so, kh + off, ok);
                cp_async16z(vs + so, vh + off, ok);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) issue(i);

    // This thread's two rows (g and g + 8 of the warp tile): key bounds within
    // the split (inclusive), output row, and Q fragments.
    int rlo[2], rhi[2], orow[2];
    bool rvalid[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = row0 + rt * 16 + gq + 8 * h;
        rvalid[h] = r < R;
        const int rc = min(r, R - 1), t = rc / G, g = rc % G;
        const int qp = mode == FA_FULL ? pos0 + n_tokens - 1 : pos0 + t;
        const int lo = window > 0 ? max(0, qp - window + 1) : 0;
        rlo[h] = rvalid[h] ? max(lo, start) : (1 << 30);
        rhi[h] = rvalid[h] ? min(qp, end - 1) : -(1 << 30);
        orow[h] = t * n_heads + kvh * G + g;
    }
    u32 qa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, half = i >> 1;
            float2 v = make_float2(0.0f, 0.0f);
            if (rvalid[h]) v = *(const float2*)(q + (size_t)orow[h] * HD + k * 16 + half * 8 + 2 * tq);
            qa[k][i] = pack2<BF16>(v.x, v.y);
        }
    // Warp-wide bounds: a tile outside [a_lo, a_hi] is skipped; one inside
    // [f_lo, f_hi] needs no mask (rows past R do not constrain f).
    int a_lo = min(rlo[0], rlo[1]), a_hi = max(rhi[0], rhi[1]);
    int f_lo = max(rvalid[0] ? rlo[0] : -(1 << 30), rvalid[1] ? rlo[1] : -(1 << 30));
    int f_hi = min(rvalid[0] ? rhi[0] : (1 << 30), rvalid[1] ? rhi[1] : (1 << 30));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a_lo = min(a_lo, __shfl_xor_sync(0xffffffffu, a_lo, o));
        a_hi = max(a_hi, __shfl_xor_sync(0xffffffffu, a_hi, o));
        f_lo = max(f_lo, __shfl_xor_sync(0xffffffffu, f_lo, o));
        f_hi = min(f_hi, __shfl_xor_sync(0xffffffffu, f_hi, o));
    }

    const float sl2 = scale * 1.4426950408889634f;  // scores in base-2 units
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<STAGES - 2>();
        blk_sync(bk);  // tile j visible to all; everyone is done with tile j - 1's buffer
        issue(j + STAGES - 1);
        if (KQ != FA_16) {
            // Dequantize tile j's staging buffers into the f16 tile pair: chunk c
            // (values 8c..8c+7) of key row r, swizzled as the 16-bit path's.
            const u8* st = (const u8*)(fa_smem + (j % STAGES) * QR::STG);
            const u32 bias2 = KQ == FA_Q8 ? 0x64806480u : 0x64086408u;  // f16 1152 (1024 + 128), 1032 (1024 + 8)
            for (int i = tid; i < 2 * FA_BK * CH; i += NT) {
                const int mat = i / (FA_BK * CH), r = (i / CH) % FA_BK, c = i % CH;
                const u8* mb = st + mat * QR::STG;
                const u16 dbits = *(const u16*)(mb + FA_BK * QR::QB + r * QR::SB + (c / 4) * 2);
                const u32 d2 = (u32)dbits | ((u32)dbits << 16);
                uint2 w;
                if (KQ == FA_Q8) {
                    w = *(const uint2*)(mb + r * QR::QB + c * 8);
                    w.x ^= 0x80808080u;
                    w.y ^= 0x80808080u;
                } else {
                    const int e0 = (c % 4) * 8;  // first value within its block
                    w = *(const uint2*)(mb + r * QR::QB + (c / 4) * 16 + (e0 & 15));
                    const int sh = e0 >= 16 ? 4 : 0;
                    w.x = (w.x >> sh) & 0x0f0f0f0fu;
                    w.y = (w.y >> sh) & 0x0f0f0f0fu;
                }
                uint4 h;
                fa_deq4(w.x, bias2, d2, h.x, h.y);
                fa_deq4(w.y, bias2, d2, h.z, h.w);
                *(uint4*)(fa_tile16 + mat * TILE + r * HD + ((c ^ (r & 7)) * 8)) = h;
            }
            blk_sync(bk);
        }
        const int kb = start + j * FA_BK + kg * KW;  // first key of this warp's slice
        if (kb > a_hi || kb + KW - 1 < a_lo) continue;
        const int kr = kg * KW;  // its first row in the tile
        const u32 ks = smem_addr(KQ == FA_16 ? fa_smem + (j % STAGES) * 2 * TILE : fa_tile16);
        const u32 vs = ks + TILE * 2;

        // S = Q K^T.
        float sc[NKT][4];
#pragma unroll
        for (int n = 0; n < NKT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; k++)
#pragma unroll
            for (int np = 0; np < NKT / 2; np++) {
                // matrices: (keys +0, d +0), (keys +0, d +8), (keys +8, d +0), (keys +8, d +8)
                const int row = kr + np * 16 + ((lane >> 4) << 3) + (lane & 7);
                const int c = k * 2 + ((lane >> 3) & 1);
                u32 b0, b1, b2, b3;
                ldsm4(ks + (u32)(row * HD + ((c ^ (row & 7)) * 8)) * 2, b0, b1, b2, b3);
                mma16816<BF16>(sc[2 * np], qa[k], b0, b1);
                mma16816<BF16>(sc[2 * np + 1], qa[k], b2, b3);
            }

        // Online softmax per row (h: row g, g + 8), base 2.
        const bool full = kb >= f_lo && kb + KW - 1 <= f_hi;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NKT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float x = sc[n][2 * h + e] * sl2;
                    if (!full) {
                        const int p = kb + n * 8 + 2 * tq + e;
                        if (p < rlo[h] || p > rhi[h]) x = -INFINITY;
                    }
                    sc[n][2 * h + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[h], mx);
            const float base = mn == -INFINITY ? 0.0f : mn;
            const float alpha = fa_exp2(m[h] - base);  // 0 while the row had no key
            m[h] = mn;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NKT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = fa_exp2(sc[n][2 * h + e] - base);
                    sc[n][2 * h + e] = p;
                    sum += p;
                }
            l[h] = l[h] * alpha + sum;
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][2 * h] *= alpha;
                o[d][2 * h + 1] *= alpha;
            }
        }

        // O += P V, P = hi + lo.
#pragma unroll
        for (int kk = 0; kk < KW / 16; kk++) {
            u32 ah[4], al[4];
            fa_split<BF16>(sc[2 * kk][0], sc[2 * kk][1], ah[0], al[0]);
            fa_split<BF16>(sc[2 * kk][2], sc[2 * kk][3], ah[1], al[1]);
            fa_split<BF16>(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ah[2], al[2]);
            fa_split<BF16>(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ah[3], al[3]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                // matrices: (keys +0, d +0), (keys +8, d +0), (keys +0, d +8), (keys +8, d +8)
                const int row = kr + kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
                const int c = dp * 2 + (lane >> 4);
                u32 b0, b1, b2, b3;
                ldsm4_trans(vs + (u32)(row * HD + ((c ^ (row & 7)) * 8)) * 2, b0, b1, b2, b3);
                mma16816<BF16>(o[2 * dp], ah, b0, b1);
                mma16816<BF16>(o[2 * dp], al, b0, b1);
                mma16816<BF16>(o[2 * dp + 1], ah, b2, b3);
                mma16816<BF16>(o[2 * dp + 1], al, b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    blk_sync(bk);  // the tiles' shared memory is free from here

    if (WK > 1) {
        // Key warps 1.. hand their (m, l, o) to key warp 0 of the same rows,
        // lane for lane (same fragment positions).
        constexpr int PER = DT * 4 + 4;
        float* red = (float*)fa_smem;
        if (kg > 0) {
            float* my = red + ((kg - 1) * WR + rt) * PER * WARP + lane;
#pragma unroll
            for (int d = 0; d < DT; d++)
#pragma unroll
                for (int e = 0; e < 4; e++) my[(d * 4 + e) * WARP] = o[d][e];
            my[(DT * 4) * WARP] = m[0];
            my[(DT * 4 + 1) * WARP] = m[1];
            my[(DT * 4 + 2) * WARP] = l[0];
            my[(DT * 4 + 3) * WARP] = l[1];
        }
        blk_sync(bk);
        if (kg == 0) {
            for (int w = 1; w < WK; w++) {
                const float* ot = red + ((w - 1) * WR + rt) * PER * WARP + lane;
                float a0[2], a1[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float m2 = ot[(DT * 4 + h) * WARP], l2 = ot[(DT * 4 + 2 + h) * WARP];
                    const float mn = fmaxf(m[h], m2);
                    const float base = mn == -INFINITY ? 0.0f : mn;
                    a0[h] = fa_exp2(m[h] - base);
                    a1[h] = fa_exp2(m2 - base);
                    l[h] = l[h] * a0[h] + l2 * a1[h];
                    m[h] = mn;
                }
#pragma unroll
                for (int d = 0; d < DT; d++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[d][e] = o[d][e] * a0[e >> 1] + ot[(d * 4 + e) * WARP] * a1[e >> 1];
            }
        }
    }
    if (kg != 0) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float lt = l[h];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        if (!rvalid[h]) continue;
        const size_t idx = (size_t)orow[h] * S + s;
        float* po = part_o + idx * HD + 2 * tq;
#pragma unroll
        for (int d = 0; d < DT; d++) *(float2*)(po + d * 8) = make_float2(o[d][2 * h], o[d][2 * h + 1]);
        if (tq == 0) {
            part_ml[idx * 2] = m[h] * 0.6931471805599453f;  // back to natural-log units
            part_ml[idx * 2 + 1] = lt;
        }
    }
}

// _d: decode (at most 16 rows), 2 key warps. _b: blocks of rows, 4 row warps.
#define FA_KERNEL(name, HD, BF16, WR, WK, STAGES, DYN, KQ)                                                         \
    extern "C" __global__ void __launch_bounds__(WR * WK * WARP) name(                                             \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                        \
        const int* __restrict__ pos0, int n_tokens, int n_heads, int n_kv, int slots, int window, float scale,      \
        float* __restrict__ part_o, float* __restrict__ part_ml, int mode) {                                        \
        __shared__ __align__(128) u16 fa_static_smem[DYN ? 8 : fa_smem_halves<HD, STAGES, KQ>()];                  \
        fa_attn<HD, BF16, WR, WK, STAGES, KQ>(launch_blk(), DYN ? fa_dyn_smem : fa_static_smem, q, kc, vc, pos0,    \
                                              n_tokens, n_heads, n_kv, slots, window, scale, part_o, part_ml,      \
                                              mode);                                                                \
    }

FA_KERNEL(fa_attn_64_f16_d, 64, false, 1, 2, 4, false, FA_16)
FA_KERNEL(fa_attn_64_bf16_d, 64, true, 1, 2, 4, false, FA_16)
FA_KERNEL(fa_attn_128_f16_d, 128, false, 1, 2, 3, false, FA_16)
FA_KERNEL(fa_attn_128_bf16_d, 128, true, 1, 2, 3, false, FA_16)
FA_KERNEL(fa_attn_64_f16_b, 64, false, 4, 1, 4, false, FA_16)
FA_KERNEL(fa_attn_64_bf16_b, 64, true, 4, 1, 4, false, FA_16)
FA_KERNEL(fa_attn_128_f16_b, 128, false, 4, 1, 3, false, FA_16)
FA_KERNEL(fa_attn_128_bf16_b, 128, true, 4, 1, 3, false, FA_16)
// Head dim 256 (gemma3): two 64 KiB stages of K and V tiles, dynamic shared memory.
FA_KERNEL(fa_attn_256_f16_d, 256, false, 1, 2, 2, true, FA_16)
FA_KERNEL(fa_attn_256_f16_b, 256, false, 4, 1, 2, true, FA_16)
// q8_0 / q4_0 caches: static shared memory below head dim 256 (hd 128 q8_0:
// 3 x 8.5 KiB staging + 16 KiB f16 tiles), dynamic at 256 (ops.rs fa_dyn_smem_bytes).
FA_KERNEL(fa_attn_64_q8_d, 64, false, 1, 2, 4, false, FA_Q8)
FA_KERNEL(fa_attn_128_q8_d, 128, false, 1, 2, 3, false, FA_Q8)
FA_KERNEL(fa_attn_256_q8_d, 256, false, 1, 2, 2, true, FA_Q8)
FA_KERNEL(fa_attn_64_q8_b, 64, false, 4, 1, 4, false, FA_Q8)
FA_KERNEL(fa_attn_128_q8_b, 128, false, 4, 1, 3, false, FA_Q8)
FA_KERNEL(fa_attn_256_q8_b, 256, false, 4, 1, 2, true, FA_Q8)
FA_KERNEL(fa_attn_64_q4_d, 64, false, 1, 2, 4, false, FA_Q4)
FA_KERNEL(fa_attn_128_q4_d, 128, false, 1, 2, 4, false, FA_Q4)
FA_KERNEL(fa_attn_256_q4_d, 256, false, 1, 2, 2, true, FA_Q4)
FA_KERNEL(fa_attn_64_q4_b, 64, false, 4, 1, 4, false, FA_Q4)
FA_KERNEL(fa_attn_128_q4_b, 128, false, 4, 1, 4, false, FA_Q4)
FA_KERNEL(fa_attn_256_q4_b, 256, false, 4, 1, 2, true, FA_Q4)

// Merges the S partial results of each (token, head): out = sum_s e^(m_s - M) o_s
// / sum_s e^(m_s - M) l_s. One block of hd threads per (head, token): the
// split weights are computed once, in parallel, into shared memory.
#define ATT_MAX_SPLITS 1024
// With xq set, the output is also quantized to 8 bits (the next product's input).
__device__ __forceinline__ void attn_combine_op(const Blk& bk, const float* part_o, const float* part_ml, int S,
                                                int hd, int flags, float* out, i8* xq, float* xd, float* xs) {
    const int h = bk.x, t = bk.y, n_heads = bk.gx, d = bk.tid;
    const size_t base = ((size_t)t * n_heads + h) * S;
    __shared__ float wts[ATT_MAX_SPLITS];
    __shared__ float red[32];
    float M = -INFINITY;
    for (int s = d; s < S; s += bk.nt) M = fmaxf(M, part_ml[(base + s) * 2]);
    M = warp_max(M);
    if (d % WARP == 0) red[d / WARP] = M;
    blk_sync(bk);
    M = -INFINITY;
    for (int w = 0; w < (int)(bk.nt / WARP); w++) M = fmaxf(M, red[w]);
    blk_sync(bk);
    float den = 0.0f;
    for (int s = d; s < S; s += bk.nt) {
        const float m = part_ml[(base + s) * 2];
        const float w = m == -INFINITY ? 0.0f : expf(m - M);
        wts[s] = w;
        den += w * part_ml[(base + s) * 2 + 1];
    }
    den = block_sum(den, bk);
    // Independent partial sums so that the loads of several splits are in flight.
    float num[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int s = 0;
    for (; s + 4 <= S; s += 4) {
#pragma unroll
        for (int j = 0; j < 4; j++) num[j] += wts[s + j] * part_o[(base + s + j) * hd + d];
    }
    for (; s < S; s++) num[0] += wts[s] * part_o[(base + s) * hd + d];
    float v = ((num[0] + num[1]) + (num[2] + num[3])) / den;
    if (flags & OUT_ROT64) {
        // Back from llama.cpp's rotated V basis (a quantized V cache): the
        // Walsh-Hadamard transform in chunks of 64, its own inverse, in the
        // CPU path's order (scale by 1/8 first, then the butterflies).
        __shared__ float rot[256];
        rot[d] = v * 0.125f;
        blk_sync(bk);
        for (int len = 1; len < 64; len *= 2) {
            if (d < hd / 2) {
                const int a = (d / len) * 2 * len + d % len;
                const float x = rot[a], y = rot[a + len];
                rot[a] = x + y;
                rot[a + len] = x - y;
            }
            blk_sync(bk);
        }
        v = rot[d];
    }
    if (flags & OUT_BF16) v = round_bf16(v);
    const size_t i = ((size_t)t * n_heads + h) * hd + d;
    out[i] = v;
    if (xq) quantize_lane(v, (int)(i / 32), d % WARP, xq, xd, xs);
}

extern "C" __global__ void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, int S,
                                        int hd, int flags, float* __restrict__ out, i8* __restrict__ xq,
                                        float* __restrict__ xd, float* __restrict__ xs) {
    attn_combine_op(launch_blk(), part_o, part_ml, S, hd, flags, out, xq, xd, xs);
}
