//! The forward pass on the GPU: per-session state (KV caches and scratch on
//! the device), one decoder layer that walks the architecture's description
//! (`hearth_models::arch`), the output head, and the decode step captured as
//! a CUDA graph.
//!
//! Positions are read by the kernels from a device word (`pos`), so the graph
//! captured for one decode step stays valid for every later step: the host
//! only uploads the token's embedding row and the position before replaying.
//!
//! Parts: [`state`] (a session's device state), [`step`] (the entry points:
//! prefill, verify, batched decode, the output head), [`layer`] (one decoder
//! layer's steps: projections, attention, the MLP).

use hearth_models::{blocks, FfnAct, Input, LayerKind, LayerSpec, Logits, ModelError, QkNorm};

use crate::driver::{DevBuf, Gpu, Graph};
use crate::error::{CudaError, Result};
use crate::layer_weights::{Fused, GpuLayer, Proj};
use crate::model::GpuModel;
use crate::ops::{self, AttnArgs, HeadPrep, Segment, Q8};

mod layer;
mod state;
mod step;

/// Tokens per pass through the layers (bounds scratch memory; rings get this much slack).
pub const GPU_CHUNK: usize = 512;
/// Rows of logits computed per head launch.
const LOGIT_ROWS: usize = 16;
/// Rows from which a batched decode pass's products use the tensor-core
/// GEMM instead of the multi-token GEMV (`HEARTH_CUDA_BATCH_GEMM`, default
/// 17: never, a pass has at most DECODE_BATCH = 16 rows; the tensor-core
/// GEMV, ops::gemv, measured faster than the GEMM at 16 tokens on an H200).
fn batch_gemm_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("HEARTH_CUDA_BATCH_GEMM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DECODE_BATCH + 1)
    })
}

/// Most states in one batched decode pass ([`GpuModel::forward_decode_batch`]).
pub const DECODE_BATCH: usize = LOGIT_ROWS;
/// Keys per decode split at least (two 32-key tiles of the attention kernel).
const ATT_TILE: usize = 64;

/// One layer's K and V caches, [n_kv, slots, head_dim] each: f16 values,
/// or q8_0 / q4_0 blocks (quants, then scales: [`ops::KvKind`]).
pub struct GpuKv {
    pub k: DevBuf,
    pub v: DevBuf,
    /// What K and V store.
    pub kind: ops::KvKind,
    pub slots: usize,
    /// 0: global (flat); else the sliding window (ring of `slots` >= window + GPU_CHUNK).
    pub window: usize,
    /// Lowest position still intact (a ring overwrites older ones).
    pub(crate) oldest_intact: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Attention splits for a single decode token.
    decode_splits: usize,
}

impl GpuKv {
    fn can_serve(&self, q: usize) -> bool {
        self.window == 0 || (q + 1).saturating_sub(self.window) >= self.oldest_intact
    }
}

/// Device scratch for passes of up to GPU_CHUNK tokens.
struct Scratch {
    x: DevBuf,
    h: DevBuf,
    tmp: DevBuf,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    gate: DevBuf,
    att: DevBuf,
    fg: DevBuf,
    fu: DevBuf,
    aq: DevBuf,
    /// Activations as f16/bf16 for the GEMM: [T, widest].
    xh: DevBuf,
    ad: DevBuf,
    as_: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    logits: DevBuf,
    pos: DevBuf,
}

/// Source of [`GpuState`] ids.
static NEXT_STATE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Batched decode graphs kept per leading state (least recently used dropped first).
const BATCH_GRAPHS: usize = 8;

/// A session on the GPU: position, KV caches, scratch, and the captured decode graph.
pub struct GpuState {
    /// The device the caches live on (saving and restoring copy through it).
    pub(crate) gpu: std::sync::Arc<Gpu>,
    pub pos: usize,
    pub max_ctx: usize,
    pub caches: Vec<GpuKv>,
    s: Scratch,
    graph: Option<Graph>,
    /// Replay decode steps from a captured CUDA graph (default on).
    pub use_graph: bool,
    /// Run decode steps as the persistent kernel (starts as
    /// [`GpuModel::persistent`], which HEARTH_CUDA_PERSISTENT=1 sets at upload).
    pub use_persistent: bool,
    /// The decode step as the persistent kernel's program, once recorded:
    /// None if not yet, Some(None) if the step has a launch it cannot run.
    program: Option<Option<crate::persistent::Program>>,
    /// Prefill token-block threshold: blocks of more tokens use the tensor-core GEMM.
    pub gemm_min_tokens: usize,
    host_x: Vec<f32>,
    /// Set for the duration of a batch-invariant pass ([`GpuModel::forward_verify`]):
    /// every product and attention computes each token as a decode step would.
    invariant: bool,
    /// Verify passes captured as graphs: ((tokens, argmax only), taps, graph).
    verify_graphs: Vec<((usize, bool), Vec<usize>, Graph)>,
    /// A number no other state of this process has: batched decode graphs are
    /// keyed by the ids of the states they were captured over.
    id: u64,
    /// Batched decode steps led by this state, captured as graphs: ((the
    /// states' ids, batch-invariant), graph), most recently used last.
    batch_graphs: Vec<((Vec<u64>, bool), Graph)>,
    /// Each verify row's argmax (i32, LOGIT_ROWS of them).
    ids: DevBuf,
    /// Hidden-state taps of a verify pass on the device, [taps, LOGIT_ROWS, dim].
    tap_buf: Option<(usize, DevBuf)>,
}

/// Splits for a single decode token over a span of `span` keys: about 256
/// blocks over all kv heads. With the tensor-core kernel (two warps per block,
/// 48 KB of shared memory) half a wave of longer splits measured faster than
/// a full wave of short ones on an H200: 40/8 heads at 32K, 48.5 us with 32
/// splits against 50.9 with 64; 32/2 heads at 128K, 56.9 us with 128 against
/// 64.6 with 256 (`hearth bench --device cuda --kernels`).
fn decode_splits(span: usize, n_kv: usize) -> usize {
    span.div_ceil(ATT_TILE).clamp(1, (256 / n_kv).max(1))
}

/// Splits for a block of `t` tokens (t > 1) whose keys reach `span`
/// positions: enough blocks for several waves on the GPU (2048 over all kv
/// heads and row blocks; `_b` attention blocks fit 2 to 4 per multiprocessor),
/// at least 256 keys per split, and within the partial buffers (GPU_CHUNK * 8
/// rows per head).
pub(crate) fn block_splits(span: usize, t: usize, blocks: usize) -> usize {
    2048usize
        .div_ceil(blocks.max(1))
        .min(span.div_ceil(256))
        .min(GPU_CHUNK * 8 / t.max(1))
        .clamp(1, 1024)
}
