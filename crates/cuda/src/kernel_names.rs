//! The names of the kernels the host launches, and which of them are written
//! for programmatic dependent launch: what the compiler checks the sources
//! against and the driver launches by (re-exported from [`crate::ops`]).

/// Every kernel name the host launches (checked against the sources by a host test).
pub const KERNEL_NAMES: &[&str] = &[
    "quantize_q8",
    "rmsnorm",
    "prepare_heads",
    "glu_q8",
    "fa_attn_64_f16_d",
    "fa_attn_64_bf16_d",
    "fa_attn_128_f16_d",
    "fa_attn_128_bf16_d",
    "fa_attn_64_f16_b",
    "fa_attn_64_bf16_b",
    "fa_attn_128_f16_b",
    "fa_attn_128_bf16_b",
    "fa_attn_256_f16_d",
    "fa_attn_256_f16_b",
    "fa_attn_64_q8_d",
    "fa_attn_128_q8_d",
    "fa_attn_256_q8_d",
    "fa_attn_64_q8_b",
    "fa_attn_128_q8_b",
    "fa_attn_256_q8_b",
    "fa_attn_64_q4_d",
    "fa_attn_128_q4_d",
    "fa_attn_256_q4_d",
    "fa_attn_64_q4_b",
    "fa_attn_128_q4_b",
    "fa_attn_256_q4_b",
    "attn_combine",
    "mk_decode",
    "gemv_q4_k_1_u1",
    "gemv_q4_k_1_u4",
    "gemv_q6_k_1_r4",
    "gemv_q6_k_8",
    "gemv_q4_k_x1_r4_i1",
    "gemv_q8_0_x2_r2_i2",
    "gemm_q4_k_f16",
    "gemm_q6_k_bf16",
    "fill_random_kv",
    "to_half",
    "scale_bias",
    "logit_transform",
    "argmax_rows",
    "gemv_q8_0_1_r2_t8",
    "gemv_q6_k_1_r4_t8",
    "gemv_q4_k_mma1",
    "gemv_q4_k_mma2",
    "gemv_q6_k_mma1",
    "gemv_q6_k_mma2",
    "vit_layer_norm",
    "vit_gelu",
    "vit_heads",
    "vit_unpad",
    "vit_shuffle",
];

/// Whether a kernel is written for programmatic dependent launch (it calls
/// PDL_WAIT before touching memory other kernels write; common.cuh).
pub fn uses_pdl(name: &str) -> bool {
    name.starts_with("gemv_")
        || matches!(
            name,
            "quantize_q8"
                | "rmsnorm"
                | "prepare_heads"
                | "glu_q8"
                | "fill_random_kv"
                | "scale_bias"
                | "logit_transform"
        )
}
