// The Muse Glimmer vision tower's small operations (vision.rs drives them;
// the matrix products are gemm.cu's, the attention attention.cu's FA_FULL
// mode). Activations are f32 rows whose stride is the width rounded up to a
// multiple of 64 (the GEMM's k tile); the padding columns stay zero, so a
// padded product sees exactly the unpadded one.

// LayerNorm of each row of x [rows, stride] over its first `width` values:
// out = (x - mean) / sqrt(var + eps) * w + b (mean and variance over the row,
// two passes, f32). One block per row; out may be x.
extern "C" __global__ void vit_layer_norm(const float* x, float* out, const float* __restrict__ w,
                                          const float* __restrict__ b, int width, int stride, float eps) {
    const size_t row = blockIdx.x;
    const float* xr = x + row * stride;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s) / (float)width;
    float v = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float d = xr[i] - mean;
        v += d * d;
    }
    const float inv = rsqrtf(block_sum(v) / (float)width + eps);
    float* o = out + row * stride;
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// x = GELU(x) with the exact erf form, in place over n values (GELU(0) = 0
// keeps the padding zero).
extern "C" __global__ void vit_gelu(float* x, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float v = x[i];
        x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

// The heads of one block for attention.cu: q, k, v [n, stride] (heads side
// by side, head_dim each) -> 2-D RoPE on q and k (pair j of every head turned
// by the token's angle j: cos/sin [n, head_dim / 2]) -> q as f32 [n, n_head,
// hdp], k and v as f16 [n_head, n, hdp] (the cache layout: head-major), each
// head zero-padded from head_dim to hdp (the attention kernels' head size).
// One thread per (token, head, pair of hdp).
extern "C" __global__ void vit_heads(const float* __restrict__ q, const float* __restrict__ k,
                                     const float* __restrict__ v, const float* __restrict__ cs,
                                     const float* __restrict__ sn, int n, int n_head, int head_dim, int hdp,
                                     int stride, float* __restrict__ qo, u16* __restrict__ ko,
                                     u16* __restrict__ vo) {
    const int pairs = hdp / 2;
    const u64 total = (u64)n * n_head * pairs;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int j = (int)(i % pairs);
        const int h = (int)((i / pairs) % n_head);
        const int t = (int)(i / ((u64)pairs * n_head));
        float q0 = 0.0f, q1 = 0.0f, k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
        if (2 * j < head_dim) {
            const size_t at = (size_t)t * stride + (size_t)h * head_dim + 2 * j;
            const float c = cs[(size_t)t * (head_dim / 2) + j], s = sn[(size_t)t * (head_dim / 2) + j];
            const float a0 = q[at], a1 = q[at + 1], b0 = k[at], b1 = k[at + 1];
            q0 = a0 * c - a1 * s;
            q1 = a0 * s + a1 * c;
            k0 = b0 * c - b1 * s;
            k1 = b0 * s + b1 * c;
            v0 = v[at];
            v1 = v[at + 1];
        }
        const size_t qa = ((size_t)t * n_head + h) * hdp + 2 * j;
        qo[qa] = q0;
        qo[qa + 1] = q1;
        const size_t ka = ((size_t)h * n + t) * hdp + 2 * j;
        ko[ka] = f32_to_f16(k0);
        ko[ka + 1] = f32_to_f16(k1);
        vo[ka] = f32_to_f16(v0);
        vo[ka + 1] = f32_to_f16(v1);
    }
}

// The attention output [n, n_head, hdp] -> [n, stride] with the heads'
// first head_dim values side by side (the output projection's input).
extern "C" __global__ void vit_unpad(const float* __restrict__ a, float* __restrict__ out, int n, int n_head,
                                     int head_dim, int hdp, int stride) {
    const u64 total = (u64)n * n_head * head_dim;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int e = (int)(i % head_dim);
        const int h = (int)((i / head_dim) % n_head);
        const int t = (int)(i / ((u64)head_dim * n_head));
        out[(size_t)t * stride + (size_t)h * head_dim + e] = a[((size_t)t * n_head + h) * hdp + e];
    }
}

// The pixel shuffle: output row g takes the m members idx[g m .. g m + m) of
// x [., stride_in] (rows in the tower's windowed order), channel-major:
// out[g, ch m + k] = x[idx[g m + k], ch] for ch < d.
extern "C" __global__ void vit_shuffle(const float* __restrict__ x, float* __restrict__ out,
                                       const int* __restrict__ idx, int n_out, int m, int d, int stride_in,
                                       int stride_out) {
    const u64 total = (u64)n_out * m * d;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int k = (int)(i % m);
        const int ch = (int)((i / m) % d);
        const int g = (int)(i / ((u64)m * d));
        out[(size_t)g * stride_out + (size_t)ch * m + k] = x[(size_t)idx[g * m + k] * stride_in + ch];
    }
}
