// The persistent decode kernel: one launch runs a whole decode step.
//
// A one-token decode step is ~10 small launches per layer; on a small model
// each of them is over before the next has started, so the step costs launch
// gaps rather than bytes (Qwen2.5-1.5B: 17% of the copy roofline with CUDA
// graphs and programmatic dependent launch). Here the step's launches, as the
// host recorded them (persistent.rs), are a list of operations that one grid
// of co-resident blocks (one per multiprocessor) walks in order. Each
// operation runs as the blocks of its own launch would (the same device
// function, with the launch's grid and block size as virtual blocks dealt to
// the physical ones), so every result is bit for bit the kernel-by-kernel
// step's; between dependent operations the grid meets at a barrier (a counter
// in global memory) instead of a kernel boundary.
//
// Weights do not depend on the step's data, so while the grid works on one
// stage (the operations between two barriers) each block asks L2 for the
// weight rows it will read two stages later (cp.async.bulk.prefetch): the
// memory system streams weights during the barriers, and the products read
// them from L2. A product's rows are dealt to the blocks in contiguous
// ranges, so that a block's share of a matrix is one range of bytes.

#define MK_NORM 1
#define MK_GEMV 2
#define MK_HEADS 3
#define MK_ATTN 4
#define MK_COMBINE 5
#define MK_GLU 6

#define MK_THREADS 256

// One operation (persistent.rs `MkOp`, same layout).
struct MkOp {
    int kind;
    int sync;              // grid barrier before this operation
    int gx, gy, gz, nt;    // the recorded launch's grid and block size
    int sub;               // GEMV: weight type; ATTN: variant (head dim, cache type)
    int pf_lo, pf_hi;      // at the start: prefetch the weights of operations [pf_lo, pf_hi)
    int r;                 // GEMV: rows per warp (1, 2 or 4); others: 1 = every block runs every
                           // virtual block (replicated: no barrier before its readers)
    int i[6];
    float f[4];
    u64 p[16];
};

// Arrival at grid barrier number `gen` (1, 2, ...): every block's earlier
// writes are visible to every block after it (release/acquire at gpu scope,
// as cooperative groups' grid sync does).
__device__ __forceinline__ void grid_barrier(u32* bar, u32 gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        const u32 target = gen * gridDim.x;
        u32 v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
        __threadfence();
    }
    __syncthreads();
}

// Rows [lo, hi) of `rows` that physical block b of n takes in a product.
__device__ __forceinline__ void mk_rows(int rows, int b, int n, int& lo, int& hi) {
    const int per = (rows + n - 1) / n;
    lo = min(rows, b * per);
    hi = min(rows, lo + per);
}

__device__ __forceinline__ void mk_row_bytes(int wt, int K, int& row_bytes, int& bpr) {
    int n_items;
    switch (wt) {
        case WT_Q4_K: row_geometry<WT_Q4_K>(K, row_bytes, n_items, bpr); break;
        case WT_Q5_K: row_geometry<WT_Q5_K>(K, row_bytes, n_items, bpr); break;
        case WT_Q6_K: row_geometry<WT_Q6_K>(K, row_bytes, n_items, bpr); break;
        case WT_Q8_0: row_geometry<WT_Q8_0>(K, row_bytes, n_items, bpr); break;
        case WT_Q4_0: row_geometry<WT_Q4_0>(K, row_bytes, n_items, bpr); break;
        default: row_geometry<WT_Q5_0>(K, row_bytes, n_items, bpr); break;
    }
}

// Asks L2 for [p, p + n) (whole 16-byte units inside it), in 32 KiB pieces
// spread over the threads of the block.
__device__ __forceinline__ void mk_prefetch(const u8* p, size_t n) {
    const u64 a = ((u64)p + 15) & ~(u64)15, e = ((u64)p + n) & ~(u64)15;
    if (e <= a) return;
    const u64 piece = 32768;
    for (u64 o = a + (u64)threadIdx.x * piece; o < e; o += (u64)MK_THREADS * piece) {
        const u32 len = (u32)min(piece, e - o);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(o), "r"(len) : "memory");
    }
}

// A GEMV operation's arguments: p[0] w, p[1] wd, p[2] xq, p[3] xd, p[4] xs,
// p[5] y, p[6] bias; i[0] rows, i[1] K, i[2] flags, i[3] whether to prefetch
// its weights (not the largest: they would evict the stages in between).
__device__ __forceinline__ void mk_prefetch_gemv(const MkOp& op) {
    int lo, hi, row_bytes, bpr;
    mk_rows(op.i[0], blockIdx.x, gridDim.x, lo, hi);
    if (lo >= hi) return;
    mk_row_bytes(op.sub, op.i[1], row_bytes, bpr);
    mk_prefetch((const u8*)op.p[0] + (size_t)lo * row_bytes, (size_t)(hi - lo) * row_bytes);
    if (op.p[1]) mk_prefetch((const u8*)op.p[1] + (size_t)lo * bpr * 2, (size_t)(hi - lo) * bpr * 2);
}

template <int WT, int R>
__device__ __forceinline__ void mk_gemv_t(const MkOp& op) {
    int lo, hi;
    mk_rows(op.i[0], blockIdx.x, gridDim.x, lo, hi);
    const int K = op.i[1];
    const Act a = {(const i8*)op.p[2], (const float*)op.p[3], (const float*)op.p[4], K};
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int r0 = lo + warp * R; r0 < hi; r0 += (MK_THREADS / WARP) * R)
        gemv_rows_warp<WT, R>((const u8*)op.p[0], (const u16*)op.p[1], hi, K, a, (float*)op.p[5],
                              (const float*)op.p[6], op.i[2], r0, lane);
}

template <int WT>
__device__ __forceinline__ void mk_gemv_r(const MkOp& op) {
    switch (op.r) {
        case 4: mk_gemv_t<WT, 4>(op); break;
        case 2: mk_gemv_t<WT, 2>(op); break;
        default: mk_gemv_t<WT, 1>(op); break;
    }
}

__device__ __forceinline__ void mk_gemv(const MkOp& op) {
    switch (op.sub) {
        case WT_Q4_K: mk_gemv_r<WT_Q4_K>(op); break;
        case WT_Q5_K: mk_gemv_r<WT_Q5_K>(op); break;
        case WT_Q6_K: mk_gemv_r<WT_Q6_K>(op); break;
        case WT_Q8_0: mk_gemv_r<WT_Q8_0>(op); break;
        case WT_Q4_0: mk_gemv_r<WT_Q4_0>(op); break;
        case WT_Q5_0: mk_gemv_r<WT_Q5_0>(op); break;
    }
}

// Attention variants (persistent.rs `attn_variant`): head dim x cache type, decode blocks.
#define MK_FA(HD, BF16, STAGES, KQ)                                                                             \
    fa_attn<HD, BF16, 1, 2, STAGES, KQ>(b, smem, (const float*)op.p[0], (const u16*)op.p[1], (const u16*)op.p[2], \
                                        (const int*)op.p[3], op.i[0], op.i[1], op.i[2], op.i[3], op.i[4],          \
                                        op.f[0], (float*)op.p[4], (float*)op.p[5], op.i[5])

__device__ __forceinline__ void mk_attn(const MkOp& op, const Blk& b, u16* smem) {
    switch (op.sub) {
        case 0: MK_FA(64, false, 4, FA_16); break;
        case 1: MK_FA(64, true, 4, FA_16); break;
        case 2: MK_FA(128, false, 3, FA_16); break;
        case 3: MK_FA(128, true, 3, FA_16); break;
        case 4: MK_FA(256, false, 2, FA_16); break;
        case 5: MK_FA(64, false, 4, FA_Q8); break;
        case 6: MK_FA(128, false, 3, FA_Q8); break;
        case 7: MK_FA(256, false, 2, FA_Q8); break;
    }
}

// The operations other than products: each virtual block of the recorded
// launch in turn, on the first op.nt threads of a physical block. A
// replicated operation (a one-row norm before products) runs whole on every
// block, each writing the same values, so that the products after it read
// their own block's writes and need no grid barrier.
__device__ __forceinline__ void mk_blocks(const MkOp& op, u16* smem) {
    const int n = op.gx * op.gy * op.gz;
    const int first = op.r ? 0 : blockIdx.x, step = op.r ? 1 : gridDim.x;
    for (int v = first; v < n; v += step) {
        const Blk b = {v % op.gx, (v / op.gx) % op.gy, v / (op.gx * op.gy), op.gx, op.gy, op.gz,
                       (int)threadIdx.x, op.nt, op.nt == MK_THREADS ? 0 : 1};
        if ((int)threadIdx.x < op.nt || op.kind == MK_NORM) {
            switch (op.kind) {
                case MK_NORM: {
                    // Recorded with op.nt threads (up to 1024): its nt / 32 warps, emulated.
                    const Blk pb = {b.x, b.y, b.z, b.gx, b.gy, b.gz, (int)threadIdx.x, MK_THREADS, 0};
                    rmsnorm_op(pb, op.nt / WARP, (const float*)op.p[0], (float*)op.p[1], (const float*)op.p[2],
                               op.i[0], op.f[0], op.i[1], (i8*)op.p[3], (float*)op.p[4], (float*)op.p[5]);
                    break;
                }
                case MK_HEADS:
                    prepare_heads_op(b, (float*)op.p[0], (const float*)op.p[1], (const float*)op.p[2],
                                     (const float*)op.p[3], (const float*)op.p[4], op.i[0], op.i[1], op.i[2],
                                     (const int*)op.p[5], op.f[0], op.f[1], op.i[3], (u16*)op.p[6], (u16*)op.p[7],
                                     op.i[4]);
                    break;
                case MK_ATTN: mk_attn(op, b, smem); break;
                case MK_COMBINE:
                    attn_combine_op(b, (const float*)op.p[0], (const float*)op.p[1], op.i[0], op.i[1], op.i[2],
                                    (float*)op.p[2], (i8*)op.p[3], (float*)op.p[4], (float*)op.p[5]);
                    break;
                case MK_GLU:
                    glu_q8_op(b, (const float*)op.p[0], (const float*)op.p[1], op.i[0], op.i[1], op.i[2],
                              (float*)op.p[2], (i8*)op.p[3], (float*)op.p[4], (float*)op.p[5]);
                    break;
            }
        }
        __syncthreads();  // the next virtual block reuses the shared memory
    }
}

// ops [n_ops]: the step; bar: the barrier counter, zeroed before the launch.
// Launched cooperatively with one block of MK_THREADS per multiprocessor and
// the attention variants' tiles as dynamic shared memory.
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1)
    mk_decode(const MkOp* __restrict__ ops, int n_ops, u32* bar) {
    extern __shared__ __align__(128) u16 mk_smem[];
    __shared__ MkOp op;
    u32 gen = 0;
    for (int k = 0; k < n_ops; k++) {
        __syncthreads();  // everyone is done with the previous operation's copy
        if (threadIdx.x < sizeof(MkOp) / 4) ((u32*)&op)[threadIdx.x] = ((const u32*)(ops + k))[threadIdx.x];
        __syncthreads();
        for (int j = op.pf_lo; j < op.pf_hi; j++)
            if (ops[j].kind == MK_GEMV && ops[j].i[3]) mk_prefetch_gemv(ops[j]);
        if (op.sync) grid_barrier(bar, ++gen);
        if (op.kind == MK_GEMV)
            mk_gemv(op);
        else
            mk_blocks(op, mk_smem);
    }
}
