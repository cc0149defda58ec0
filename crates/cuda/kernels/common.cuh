// Shared helpers for hearth's CUDA kernels. Compiled by NVRTC with no system
// headers: half and bfloat16 conversions are written with PTX or bit
// arithmetic, so the sources need nothing but the compiler's built-ins.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32

// Programmatic dependent launch (sm_90+): a kernel launched with the
// programmatic-serialization attribute (driver.rs, for the kernels listed in
// ops::PDL_KERNELS) may start while the previous kernel in the stream is
// still finishing. PDL_WAIT blocks until that kernel has completed and its
// writes are visible, so such kernels call it before touching any memory
// another kernel writes (weights may be read before it). PDL_TRIGGER lets the
// next kernel start launching. Both are no-ops for ordinary launches.
#if __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_TRIGGER()
#endif
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Round to nearest even, as `half::bf16::from_f32` does (NaN stays NaN).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 64);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The block an operation runs as: a kernel's own launch block, or one of the
// virtual blocks the persistent decode kernel (persistent.cu) runs in turn on
// its physical blocks. Operations take their indices from here instead of
// blockIdx/gridDim/threadIdx and synchronise with blk_sync, so that one
// device function serves both (the same arithmetic, bit for bit). A virtual
// block may have fewer threads than the physical one (nt): the others skip
// the operation, and blk_sync is then a named barrier over the nt threads.
struct Blk {
    int x, y, z;     // block index
    int gx, gy, gz;  // grid size
    int tid, nt;     // thread index, threads per block
    int bar;         // barrier: 0 = the whole physical block (__syncthreads)
};

__device__ __forceinline__ Blk launch_blk() {
    return Blk{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.x, (int)gridDim.y,
               (int)gridDim.z, (int)threadIdx.x, (int)blockDim.x, 0};
}

__device__ __forceinline__ void blk_sync(const Blk& b) {
    if (b.bar == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;" ::"r"(b.bar), "r"(b.nt) : "memory");
}

// Sum over the b.nt threads of a block (a multiple of 32, at most 1024).
__device__ float block_sum(float v, const Blk& b) {
    __shared__ float partial[32];
    v = warp_sum(v);
    const int lane = b.tid % WARP, warp = b.tid / WARP;
    blk_sync(b);
    if (lane == 0) partial[warp] = v;
    blk_sync(b);
    const int n_warps = b.nt / WARP;
    v = lane < n_warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_sum(float v) { return block_sum(v, launch_blk()); }

// Flags shared by the kernels that write activations.
#define OUT_BF16 1   // round the result to bfloat16 (Muse Glimmer's rounding points)
#define OUT_ADD 2    // add the result into the output instead of overwriting it
#define OUT_ROT64 4  // attn_combine: rotate the result back (Walsh-Hadamard, chunks of 64)

// ---- Tensor-core building blocks (attention.cu, gemm.cu) ----

// Shared-memory address of a generic pointer, for PTX that takes one.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared without passing through registers (cp.async);
// with `valid` false nothing is read and the 16 bytes are zeroed (src must
// still be a mapped address).
__device__ __forceinline__ void cp_async16z(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Four 8x8 16-bit matrices from shared memory (ldmatrix .x4), plain and transposed.
__device__ __forceinline__ void ldsm4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// c += a b (16 x 16 by 16 x 8, f16 or bf16 operands, f32 accumulators).
template <bool BF>
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    if (BF)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one f16x2 / bf16x2 word (lo in the low half), round to nearest even.
template <bool BF>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if (BF)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
