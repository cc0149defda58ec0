//! The forward pass on the GPU: per-session state (KV caches and scratch on
//! the device), one decoder layer that walks the architecture's description
//! (`hearth_models::arch`), the output head, and the decode step captured as
//! a CUDA graph.
//!
//! Positions are read by the kernels from a device word (`pos`), so the graph
//! captured for one decode step stays valid for every later step: the host
//! only uploads the token's embedding row and the position before replaying.

use hearth_models::{blocks, FfnAct, Input, LayerKind, LayerSpec, Logits, ModelError, QkNorm};

use crate::driver::{DevBuf, Gpu, Graph};
use crate::error::{CudaError, Result};
use crate::model::{Fused, GpuLayer, GpuModel, Proj};
use crate::ops::{self, AttnArgs, HeadPrep, Segment, Q8};

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

impl GpuState {
    /// The persistent decode kernel's program of this state, once a decode
    /// step recorded it: (operations, grid barriers) per step.
    pub fn persistent_program(&self) -> Option<(usize, usize)> {
        match &self.program {
            Some(Some(p)) => Some((p.len(), p.barriers)),
            _ => None,
        }
    }

    /// Bytes of the KV caches.
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(|c| c.k.bytes + c.v.bytes).sum()
    }

    /// Moves the position back (speculative rollback); fails like the CPU
    /// state when a ring has overwritten keys the new position still needs.
    pub fn rollback(&mut self, pos: usize) -> Result<()> {
        if pos > self.pos {
            return Err(CudaError::Unsupported(format!(
                "rolling forward from {} to {pos}",
                self.pos
            )));
        }
        if self.caches.iter().any(|c| !c.can_serve(pos)) {
            return Err(ModelError::RolledBackTooFar { pos }.into());
        }
        self.pos = pos;
        Ok(())
    }

    pub fn reset(&mut self) {
        self.pos = 0;
        self.caches.iter_mut().for_each(|c| c.oldest_intact = 0);
    }
}

impl GpuModel {
    /// A session state for contexts up to `max_ctx` tokens.
    pub fn new_state(&self, max_ctx: usize) -> Result<GpuState> {
        let c = &self.model.config;
        let g = &*self.gpu;
        g.bind()?;
        let kv_kind = ops::KvKind::of(self.model.kv_types)?;
        let mut caches = Vec::with_capacity(c.n_layers);
        for kind in &c.layers {
            let (window, slots) = match *kind {
                LayerKind::Global { .. } => (0, max_ctx),
                LayerKind::Sliding { window, .. } => (window, (window + GPU_CHUNK).min(max_ctx)),
            };
            let bytes = kv_kind.buffer_bytes(c.n_kv_heads, slots, c.head_dim);
            let span = if window > 0 {
                window.min(max_ctx)
            } else {
                max_ctx
            };
            caches.push(GpuKv {
                k: g.alloc_zeroed(bytes, "the KV cache")?,
                v: g.alloc_zeroed(bytes, "the KV cache")?,
                kind: kv_kind,
                slots,
                window,
                oldest_intact: 0,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                decode_splits: decode_splits(span, c.n_kv_heads),
            });
        }
        let t = GPU_CHUNK;
        let (dim, qd, kvd, ffn) = (
            c.dim,
            c.n_heads * c.head_dim,
            c.n_kv_heads * c.head_dim,
            c.ffn_dim,
        );
        let widest = dim.max(qd).max(ffn);
        let max_dec_splits = caches.iter().map(|k| k.decode_splits).max().unwrap_or(1);
        let part_rows = (t * c.n_heads * 8).max(c.n_heads * max_dec_splits);
        let f = |n: usize| g.alloc(n * 4, "scratch");
        let s = Scratch {
            x: f(t * dim)?,
            h: f(t * dim)?,
            tmp: f(t * dim)?,
            q: f(t * qd)?,
            k: f(t * kvd)?,
            v: f(t * kvd)?,
            gate: f(t * qd)?,
            att: f(t * qd)?,
            fg: f(t * ffn)?,
            fu: f(t * ffn)?,
            aq: g.alloc(t * widest, "scratch")?,
            xh: g.alloc(t * widest * 2, "scratch")?,
            ad: f(t * widest / 32)?,
            as_: f(t * widest / 32)?,
            part_o: f(part_rows * c.head_dim)?,
            part_ml: f(part_rows * 2)?,
            logits: f(LOGIT_ROWS * c.vocab_size)?,
            pos: g.alloc_zeroed(4, "scratch")?,
        };
        g.sync()?;
        Ok(GpuState {
            gpu: self.gpu.clone(),
            pos: 0,
            max_ctx,
            caches,
            s,
            graph: None,
            use_graph: std::env::var("HEARTH_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            use_persistent: self.persistent,
            program: None,
            gemm_min_tokens: 16,
            host_x: Vec::new(),
            invariant: false,
            verify_graphs: Vec::new(),
            id: NEXT_STATE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            batch_graphs: Vec::new(),
            tap_buf: None,
            ids: g.alloc(LOGIT_ROWS * 4, "scratch")?,
        })
    }

    /// Runs `tokens` at positions `state.pos..`, advancing `state.pos`; returns
    /// logits like `Model::forward` ([vocab] for Last, [n, vocab] for All).
    pub fn forward(&self, st: &mut GpuState, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.forward_tapped(st, tokens, want, &[], &mut Vec::new())
    }

    /// Why `tokens` (with hidden-state `taps`) cannot run on `st`, if they cannot.
    fn check(&self, st: &GpuState, tokens: &[u32], taps: &[usize]) -> Result<()> {
        self.check_input(st, Input::Tokens(tokens), taps)
    }

    /// [`Self::check`] for tokens or embedding rows.
    fn check_input(&self, st: &GpuState, input: Input, taps: &[usize]) -> Result<()> {
        let c = &self.model.config;
        input.validate(c.vocab_size, c.dim)?;
        let n = input.len(c.dim);
        if st.pos + n > st.max_ctx {
            return Err(ModelError::ContextFull {
                pos: st.pos,
                n,
                ctx: st.max_ctx,
            }
            .into());
        }
        if st.caches.iter().any(|k| !k.can_serve(st.pos)) {
            return Err(ModelError::RolledBackTooFar { pos: st.pos }.into());
        }
        if let Some(&bad) = taps.iter().find(|&&l| l > c.n_layers) {
            return Err(ModelError::Unsupported {
                backend: "CUDA",
                what: format!("a hidden-state tap at layer {bad} of {}", c.n_layers),
            }
            .into());
        }
        Ok(())
    }

    /// [`GpuModel::forward`] that also appends, for every token, the residual
    /// stream entering each layer in `taps` (`n_layers`: after the last) to
    /// `hidden` ([T, taps.len() * dim], taps in the given order; DFlash's
    /// target hidden states).
    pub fn forward_tapped(
        &self,
        st: &mut GpuState,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>> {
        self.forward_input(st, Input::Tokens(tokens), want, taps, hidden)
    }

    /// [`GpuModel::forward_tapped`] over tokens or embedding rows (an
    /// image's rows, [`Input::Rows`]: they enter where the looked-up token
    /// rows would, through the same embedding norm, without a token-only
    /// embedding scale, as on the CPU).
    pub fn forward_input(
        &self,
        st: &mut GpuState,
        input: Input,
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>> {
        let c = &self.model.config;
        self.check_input(st, input, taps)?;
        self.gpu.bind()?;
        let mut logits = Vec::new();
        let total = input.len(c.dim);
        let n_chunks = total.div_ceil(GPU_CHUNK);
        for ci in 0..n_chunks {
            let range = ci * GPU_CHUNK..((ci + 1) * GPU_CHUNK).min(total);
            let chunk = input.slice(c.dim, range);
            let rows = match want {
                Logits::All => chunk.len(c.dim),
                Logits::Last if ci + 1 == n_chunks => 1,
                _ => 0,
            };
            self.embed_input(st, chunk)?;
            self.gpu.upload(st.s.pos.ptr, &[st.pos as i32])?;
            let t = chunk.len(c.dim);
            if !taps.is_empty() {
                let base = hidden.len();
                hidden.resize(base + t * taps.len() * c.dim, 0.0);
                for li in 0..self.layers.len() {
                    self.tap(st, t, taps, li, &mut hidden[base..])?;
                    self.layer(st, li, t)?;
                }
                self.tap(st, t, taps, c.n_layers, &mut hidden[base..])?;
                match want {
                    Logits::Last if rows == 1 => self.head(st, t - 1, 1)?,
                    _ => {}
                }
            } else if t == 1 && want != Logits::All && self.persistent_step(st)? {
            } else if t == 1 && st.use_graph && !self.gpu.profiling() && want != Logits::All {
                if st.graph.is_none() {
                    self.gpu.begin_capture()?;
                    let captured = self.layers_and_head(st, 1, 1);
                    let graph = self.gpu.end_capture();
                    captured?;
                    st.graph = Some(graph?);
                }
                self.gpu
                    .replay(st.graph.as_ref().expect("captured above"))?;
            } else {
                self.layers_and_head(st, t, if want == Logits::All { 0 } else { rows })?;
            }
            if want == Logits::All {
                for first in (0..t).step_by(LOGIT_ROWS) {
                    let n = (t - first).min(LOGIT_ROWS);
                    self.head(st, first, n)?;
                    let mut out = vec![0.0f32; n * c.vocab_size];
                    self.gpu.download(&mut out, st.s.logits.ptr)?;
                    logits.extend_from_slice(&out);
                }
            } else if rows == 1 {
                let mut out = vec![0.0f32; c.vocab_size];
                self.gpu.download(&mut out, st.s.logits.ptr)?;
                logits.extend_from_slice(&out);
            }
            let end = st.pos + t;
            for k in st.caches.iter_mut().filter(|k| k.window > 0) {
                k.oldest_intact = k.oldest_intact.max(end.saturating_sub(k.slots));
            }
            st.pos = end;
        }
        self.gpu.sync()?;
        Ok(logits)
    }

    /// A batch-invariant pass over `tokens` (at most 16, a speculative verify
    /// block): every token's logits (and taps) come out bit for bit as a
    /// one-token decode step at its position computes them (each product is
    /// the tuned one-token kernel with a grid row per token, each token's
    /// attention the decode kernel with the decode splits), so greedy
    /// speculative decoding emits exactly plain greedy decoding's tokens.
    /// Returns [T, vocab].
    pub fn forward_verify(
        &self,
        st: &mut GpuState,
        tokens: &[u32],
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<f32>> {
        self.verify(st, tokens, taps, hidden, false)?;
        let mut logits = vec![0.0f32; tokens.len() * self.model.config.vocab_size];
        self.gpu.download(&mut logits, st.s.logits.ptr)?;
        Ok(logits)
    }

    /// [`GpuModel::forward_verify`] for a greedy sampler: each row's argmax
    /// (the lowest id among equal maxima), found on the GPU.
    pub fn forward_verify_argmax(
        &self,
        st: &mut GpuState,
        tokens: &[u32],
        taps: &[usize],
        hidden: &mut Vec<f32>,
    ) -> Result<Vec<u32>> {
        self.verify(st, tokens, taps, hidden, true)?;
        let mut ids = vec![0i32; tokens.len()];
        self.gpu.download(&mut ids, st.ids.ptr)?;
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }

    /// The verify pass (logits in the logits buffer; with `argmax`, each
    /// row's argmax in `ids` too), taps appended to `hidden`.
    fn verify(
        &self,
        st: &mut GpuState,
        tokens: &[u32],
        taps: &[usize],
        hidden: &mut Vec<f32>,
        argmax: bool,
    ) -> Result<()> {
        let c = &self.model.config;
        let t = tokens.len();
        if t > LOGIT_ROWS {
            return Err(CudaError::Unsupported(format!(
                "a verify block of {t} tokens (at most {LOGIT_ROWS})"
            )));
        }
        self.check(st, tokens, taps)?;
        self.gpu.bind()?;
        self.embed(st, tokens)?;
        self.gpu.upload(st.s.pos.ptr, &[st.pos as i32])?;
        if !taps.is_empty() && st.tap_buf.as_ref().is_none_or(|b| b.0 < taps.len()) {
            let bytes = taps.len() * LOGIT_ROWS * c.dim * 4;
            st.tap_buf = Some((taps.len(), self.gpu.alloc(bytes, "hidden-state taps")?));
            st.verify_graphs.clear();
        }
        // Everything from the embeddings to the logits (and the taps) reads
        // the position from the device, so one captured graph per block
        // length (and set of taps) serves every later pass.
        st.invariant = true;
        let run = (|| {
            if !st.use_graph || self.gpu.profiling() {
                return self.verify_body(st, t, taps, argmax);
            }
            let i = match st
                .verify_graphs
                .iter()
                .position(|(key, tp, _)| *key == (t, argmax) && tp == taps)
            {
                Some(i) => i,
                None => {
                    self.gpu.begin_capture()?;
                    let captured = self.verify_body(st, t, taps, argmax);
                    let graph = self.gpu.end_capture();
                    captured?;
                    st.verify_graphs.push(((t, argmax), taps.to_vec(), graph?));
                    st.verify_graphs.len() - 1
                }
            };
            self.gpu.replay(&st.verify_graphs[i].2)
        })();
        st.invariant = false;
        run?;
        let base = hidden.len();
        hidden.resize(base + t * taps.len() * c.dim, 0.0);
        if let Some((_, buf)) = &st.tap_buf {
            let mut rows = vec![0.0f32; taps.len() * LOGIT_ROWS * c.dim];
            if !taps.is_empty() {
                self.gpu.download(&mut rows, buf.ptr)?;
            }
            let width = taps.len() * c.dim;
            for slot in 0..taps.len() {
                for r in 0..t {
                    hidden[base + r * width + slot * c.dim..][..c.dim]
                        .copy_from_slice(&rows[(slot * LOGIT_ROWS + r) * c.dim..][..c.dim]);
                }
            }
        }
        let end = st.pos + t;
        for k in st.caches.iter_mut().filter(|k| k.window > 0) {
            k.oldest_intact = k.oldest_intact.max(end.saturating_sub(k.slots));
        }
        st.pos = end;
        Ok(())
    }

    /// The layers and head of a batch-invariant pass, the taps copied on the
    /// device into `tap_buf` (no host transfer: capturable).
    fn verify_body(&self, st: &GpuState, t: usize, taps: &[usize], argmax: bool) -> Result<()> {
        let c = &self.model.config;
        let tap_dev = |layer: usize| -> Result<()> {
            let Some((_, buf)) = &st.tap_buf else {
                return Ok(());
            };
            for (slot, _) in taps.iter().enumerate().filter(|(_, &l)| l == layer) {
                let dst = buf.ptr + (slot * LOGIT_ROWS * c.dim * 4) as u64;
                self.gpu.copy_dtod(dst, st.s.x.ptr, t * c.dim * 4)?;
            }
            Ok(())
        };
        for li in 0..self.layers.len() {
            tap_dev(li)?;
            self.layer(st, li, t)?;
        }
        tap_dev(c.n_layers)?;
        self.head(st, 0, t)?;
        if argmax {
            ops::argmax_rows(&self.gpu, st.s.logits.ptr, t, c.vocab_size, st.ids.ptr)?;
        }
        Ok(())
    }

    /// Copies x ([t, dim], the residual stream entering `layer`) into tap
    /// slot `taps.position(layer)` of `out` ([t, taps.len() * dim]).
    fn tap(
        &self,
        st: &GpuState,
        t: usize,
        taps: &[usize],
        layer: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let dim = self.model.config.dim;
        let width = taps.len() * dim;
        for (slot, _) in taps.iter().enumerate().filter(|(_, &l)| l == layer) {
            let mut rows = vec![0.0f32; t * dim];
            self.gpu.download(&mut rows, st.s.x.ptr)?;
            for (r, row) in rows.chunks_exact(dim).enumerate() {
                out[r * width + slot * dim..][..dim].copy_from_slice(row);
            }
        }
        Ok(())
    }

    /// Token embeddings [T, dim], dequantized on the host from the mapping, uploaded into x.
    fn embed(&self, st: &mut GpuState, tokens: &[u32]) -> Result<()> {
        self.embed_input(st, Input::Tokens(tokens))
    }

    /// The input rows of a pass into x: looked-up token rows (times the
    /// embedding scale), or given rows as they are; then the embedding norm.
    fn embed_input(&self, st: &mut GpuState, input: Input) -> Result<()> {
        let c = &self.model.config;
        let arch = &self.model.arch;
        match input {
            Input::Tokens(tokens) => {
                let e = self.model.mat(&self.model.tok_embd);
                st.host_x.resize(tokens.len() * c.dim, 0.0);
                for (row, &t) in st.host_x.chunks_exact_mut(c.dim).zip(tokens) {
                    e.dequantize_row(t as usize, row);
                }
                if let Some(s) = arch.embed.scale {
                    st.host_x.iter_mut().for_each(|v| *v *= s);
                }
            }
            Input::Rows(rows) => {
                st.host_x.clear();
                st.host_x.extend_from_slice(rows);
            }
        }
        if arch.embed.rms_norm {
            // muse-glimmer: a gainless RMSNorm of the looked-up rows.
            blocks::rmsnorm(&mut st.host_x, c.dim, None, c.norm_eps);
        }
        self.gpu.upload(st.s.x.ptr, &st.host_x)
    }

    /// One decode token for each of several states in one pass (continuous
    /// batching): the products read each weight once for all rows, each
    /// row attends over its own state's cache at its own position. Returns
    /// each state's [vocab] logits. With `invariant`, every row comes out
    /// bit for bit as that state's one-token step computes it (the products
    /// are the one-token kernels with a grid row per token). At most
    /// `LOGIT_ROWS` states; the first one's scratch holds the rows.
    pub fn forward_decode_batch(
        &self,
        states: &mut [&mut GpuState],
        tokens: &[u32],
        invariant: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let n = states.len();
        if n != tokens.len() || n == 0 || n > LOGIT_ROWS {
            return Err(CudaError::Unsupported(format!(
                "a batched decode pass of {n} states and {} tokens (1 to {LOGIT_ROWS}, one token each)",
                tokens.len()
            )));
        }
        for (st, &t) in states.iter().zip(tokens) {
            self.check(st, &[t], &[])?;
        }
        self.gpu.bind()?;
        for st in states.iter() {
            self.gpu.upload(st.s.pos.ptr, &[st.pos as i32])?;
        }
        self.embed(states[0], tokens)?;
        states[0].invariant = invariant;
        let gemm_min = states[0].gemm_min_tokens;
        states[0].gemm_min_tokens = batch_gemm_min();
        // The step is captured as a CUDA graph per set of states (their
        // positions are read from the device, so a graph replays every later
        // step of the same batch); launching ~2,000 small kernels one by one
        // otherwise costs more than they run.
        let key = (states.iter().map(|s| s.id).collect::<Vec<u64>>(), invariant);
        let graphed = states[0].use_graph && !self.gpu.profiling();
        let cached = states[0].batch_graphs.iter().position(|(k, _)| *k == key);
        let run = {
            let views: Vec<&GpuState> = states.iter().map(|s| &**s).collect();
            let lead = views[0];
            let step = || -> Result<()> {
                for li in 0..self.layers.len() {
                    self.layer_of(lead, li, n, Some(&views))?;
                }
                self.head(lead, 0, n)
            };
            (|| -> Result<(Vec<f32>, Option<Graph>)> {
                let mut captured = None;
                match (graphed, cached) {
                    (true, Some(i)) => self.gpu.replay(&lead.batch_graphs[i].1)?,
                    (true, None) => {
                        self.gpu.begin_capture()?;
                        let recorded = step();
                        let graph = self.gpu.end_capture();
                        recorded?;
                        let graph = graph?;
                        self.gpu.replay(&graph)?;
                        captured = Some(graph);
                    }
                    (false, _) => step()?,
                }
                let mut out = vec![0.0f32; n * c.vocab_size];
                self.gpu.download(&mut out, lead.s.logits.ptr)?;
                Ok((out, captured))
            })()
        };
        states[0].invariant = false;
        states[0].gemm_min_tokens = gemm_min;
        let (logits, captured) = run?;
        let graphs = &mut states[0].batch_graphs;
        if let Some(i) = cached {
            let used = graphs.remove(i);
            graphs.push(used);
        }
        if let Some(graph) = captured {
            if graphs.len() >= BATCH_GRAPHS {
                graphs.remove(0);
            }
            graphs.push((key, graph));
        }
        for st in states.iter_mut() {
            let end = st.pos + 1;
            for k in st.caches.iter_mut().filter(|k| k.window > 0) {
                k.oldest_intact = k.oldest_intact.max(end.saturating_sub(k.slots));
            }
            st.pos = end;
        }
        Ok(logits
            .chunks_exact(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// One decode step (token embedded, position uploaded) as the persistent
    /// kernel, recording its program on the state's first step; false (and
    /// nothing run) where the state does not use it or the step has a launch
    /// the kernel cannot run.
    fn persistent_step(&self, st: &mut GpuState) -> Result<bool> {
        if !st.use_persistent {
            return Ok(false);
        }
        if st.program.is_none() {
            let ((), launches) = self
                .gpu
                .record_launches(|| self.layers_and_head(st, 1, 1))?;
            st.program = Some(crate::persistent::Program::build(&self.gpu, &launches).ok());
        }
        let Some(Some(p)) = &st.program else {
            return Ok(false);
        };
        match p.run(&self.gpu) {
            Ok(()) => Ok(true),
            // A launch the driver refuses (too many blocks to be resident at
            // once on this GPU) runs nothing: launch the kernels instead.
            Err(CudaError::Driver { .. }) => {
                st.program = Some(None);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// All layers for `t` tokens already in x, then the head for the last `rows` rows.
    fn layers_and_head(&self, st: &mut GpuState, t: usize, rows: usize) -> Result<()> {
        for li in 0..self.layers.len() {
            self.layer(st, li, t)?;
        }
        if rows > 0 {
            self.head(st, t - rows, rows)?;
        }
        Ok(())
    }

    fn q8(st: &GpuState) -> Q8 {
        Q8 {
            q: st.s.aq.ptr,
            d: st.s.ad.ptr,
            s: st.s.as_.ptr,
        }
    }

    /// W · x for t tokens: x is both in the 8-bit buffer (for the GEMV, small
    /// blocks) and as f32 at `x` (for the tensor-core GEMM, larger blocks).
    /// A per-tensor scale is applied to the product before the bias (the
    /// product then goes through `tmp` when it accumulates into y).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        st: &GpuState,
        w: &ops::GpuMatrix,
        t: usize,
        x: u64,
        y: u64,
        bias: u64,
        flags: i32,
    ) -> Result<()> {
        let product = |dst: u64, bias: u64, flags: i32| {
            if st.invariant {
                let seg = [Segment {
                    y: dst,
                    bias,
                    rows: w.rows,
                }];
                ops::gemv_tokens(&self.gpu, w, Self::q8(st), t, &seg, flags)
            } else if t >= st.gemm_min_tokens && crate::gemm::supported(w) {
                crate::gemm::gemm(
                    &self.gpu,
                    w,
                    x,
                    st.s.xh.ptr,
                    t,
                    dst,
                    w.rows,
                    bias,
                    flags,
                    false,
                )
            } else {
                ops::gemv(&self.gpu, w, Self::q8(st), t, dst, w.rows, bias, flags)
            }
        };
        match w.scale {
            None => product(y, bias, flags),
            Some(scale) => {
                let dst = match flags & ops::OUT_ADD {
                    0 => y,
                    _ if y == st.s.tmp.ptr => {
                        return Err(CudaError::Unsupported(
                            "a scaled product accumulating into the scratch row".into(),
                        ))
                    }
                    _ => st.s.tmp.ptr,
                };
                product(dst, 0, flags & !ops::OUT_ADD)?;
                let n = t * w.rows;
                ops::scale_bias(
                    &self.gpu,
                    dst,
                    y,
                    n,
                    w.rows,
                    scale,
                    bias,
                    flags & ops::OUT_ADD,
                )
            }
        }
    }

    /// Several products of the same input x: those stored together in
    /// `fused` as one GEMV launch when the block is small enough for the GEMV
    /// (decode, verify), the rest (and every product of a prefill) one by one.
    /// `items`: (projection, matrix, output, bias).
    fn projections(
        &self,
        st: &GpuState,
        fused: &Fused,
        t: usize,
        x: u64,
        items: &[(Proj, &ops::GpuMatrix, u64, u64)],
        flags: i32,
    ) -> Result<()> {
        // Fused launches only where the register kernels are the faster ones
        // (one or two tokens; see ops::gemv), and only of unscaled products.
        // A batch-invariant pass does what a one-token step does, per token.
        let together = fused.parts.len() > 1
            && fused.m.tune.x
            && (t <= 2 || st.invariant)
            && items
                .iter()
                .all(|(p, w, ..)| !fused.parts.contains(p) || w.scale.is_none());
        for &(p, w, y, b) in items {
            if !(together && fused.parts.contains(&p)) {
                self.linear(st, w, t, x, y, b, flags)?;
            }
        }
        if together {
            let mut segs = Vec::with_capacity(fused.parts.len());
            for p in &fused.parts {
                let &(_, w, y, bias) = items.iter().find(|i| i.0 == *p).ok_or_else(|| {
                    CudaError::Unsupported(format!("fused part {p:?} without an output"))
                })?;
                segs.push(Segment {
                    y,
                    bias,
                    rows: w.rows,
                });
            }
            match st.invariant {
                true => ops::gemv_tokens(&self.gpu, &fused.m, Self::q8(st), t, &segs, flags)?,
                false => ops::gemv_segments(&self.gpu, &fused.m, Self::q8(st), t, &segs, flags)?,
            }
        }
        Ok(())
    }

    /// The input norm (an RMSNorm kernel writing h and the 8-bit
    /// activations) and the products of `items` from it (`projections`).
    #[allow(clippy::too_many_arguments)]
    fn norm_and_project(
        &self,
        st: &GpuState,
        fused: &Fused,
        t: usize,
        gain: u64,
        norm_flags: i32,
        items: &[(Proj, &ops::GpuMatrix, u64, u64)],
        flags: i32,
    ) -> Result<()> {
        let c = &self.model.config;
        let s = &st.s;
        ops::rmsnorm(
            &self.gpu,
            s.x.ptr,
            s.h.ptr,
            gain,
            t,
            c.dim,
            c.norm_eps,
            norm_flags,
            Some(Self::q8(st)),
        )?;
        self.projections(st, fused, t, s.h.ptr, items, flags)
    }

    /// y (op)= W · glu(a, b): glu_q8 (into a, and the 8-bit activations) then the product.
    #[allow(clippy::too_many_arguments)]
    fn glu_and_project(
        &self,
        st: &GpuState,
        t: usize,
        (a, b, mode, glu_flags): (u64, u64, i32, i32),
        n: usize,
        w: &ops::GpuMatrix,
        y: u64,
        flags: i32,
    ) -> Result<()> {
        ops::glu_q8(&self.gpu, a, b, t * n, mode, glu_flags, a, Self::q8(st))?;
        self.linear(st, w, t, a, y, 0, flags)
    }

    /// Layer li's attention shapes. A layer that scales q before attention
    /// (gemma3, `scale_q_first`) gets the same factor as the softmax scale
    /// here: the same product, rounded once less than the CPU's.
    fn attn_args(&self, li: usize, kv: &GpuKv) -> AttnArgs {
        let c = &self.model.config;
        AttnArgs {
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            slots: kv.slots,
            window: kv.window,
            scale: self.model.arch.layers[li].attn_scale,
            kv: kv.kind,
        }
    }

    /// Attention of layer li into att; with `quantize`, also into the 8-bit buffer.
    fn attention(
        &self,
        st: &GpuState,
        li: usize,
        t: usize,
        out_flags: i32,
        quantize: bool,
    ) -> Result<()> {
        self.attention_of(st, 0, st, li, t, out_flags, quantize)
    }

    /// [`GpuModel::attention`] of the queries at row `row` of `rows`'s
    /// scratch (into its att rows there) over `st`'s cache at `st`'s
    /// position: a batched pass's rows belong to several states.
    #[allow(clippy::too_many_arguments)]
    fn attention_of(
        &self,
        rows: &GpuState,
        row: usize,
        st: &GpuState,
        li: usize,
        t: usize,
        out_flags: i32,
        quantize: bool,
    ) -> Result<()> {
        let c = &self.model.config;
        let qd = c.n_heads * c.head_dim;
        let kv = &st.caches[li];
        let args = self.attn_args(li, kv);
        let q = rows.s.q.ptr + (row * qd * 4) as u64;
        let att = rows.s.att.ptr + (row * qd * 4) as u64;
        let q8 = quantize.then(|| Self::q8(rows).offset(row, qd));
        let out_flags = out_flags | kv.kind.combine_flags();
        if rows.invariant {
            return ops::attention_mode(
                &self.gpu,
                &args,
                ops::AttnMode::PerToken,
                t,
                kv.decode_splits,
                (q, kv.k.ptr, kv.v.ptr, st.s.pos.ptr),
                (st.s.part_o.ptr, st.s.part_ml.ptr),
                att,
                out_flags,
                q8,
            );
        }
        let splits = if t == 1 {
            kv.decode_splits
        } else {
            let reach = st.pos + t;
            block_splits(
                if kv.window > 0 {
                    reach.min(kv.window + t)
                } else {
                    reach
                },
                t,
                args.n_kv * ops::attn_row_blocks(&args, t),
            )
        };
        ops::attention(
            &self.gpu,
            &args,
            t,
            splits,
            q,
            kv.k.ptr,
            kv.v.ptr,
            st.s.pos.ptr,
            st.s.part_o.ptr,
            st.s.part_ml.ptr,
            att,
            out_flags,
            q8,
        )
    }

    /// QK-norm / RoPE of the new tokens' heads and their keys and values
    /// written to layer li's cache, as the layer's description says.
    fn prepare_heads(&self, st: &GpuState, li: usize, t: usize) -> Result<()> {
        self.prepare_heads_of(st, 0, st, li, t)
    }

    /// [`GpuModel::prepare_heads`] of the heads at row `row` of `rows`'s
    /// scratch, the keys and values going to `st`'s cache at `st`'s position.
    fn prepare_heads_of(
        &self,
        rows: &GpuState,
        row: usize,
        st: &GpuState,
        li: usize,
        t: usize,
    ) -> Result<()> {
        let c = &self.model.config;
        let spec: &LayerSpec = &self.model.arch.layers[li];
        let mut flags = 0;
        if let Some(rope) = spec.rope {
            flags |= ops::HEAD_ROPE;
            if rope.layout == hearth_models::RopeLayout::Neox {
                flags |= ops::HEAD_NEOX;
            }
        }
        let l = &self.layers[li];
        let gains = match spec.qk_norm {
            QkNorm::None => (0, 0),
            QkNorm::Gains => {
                flags |= ops::HEAD_QK_RMS;
                (l.q_norm, l.k_norm)
            }
        };
        let prep = HeadPrep {
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            theta: spec.rope.map_or(c.rope_theta, |r| r.theta),
            eps: c.norm_eps,
            flags,
        };
        let (s, kv) = (&rows.s, &st.caches[li]);
        let prep = HeadPrep {
            flags: prep.flags | kv.kind.head_flags(),
            ..prep
        };
        let (qd, kvd) = (c.n_heads * c.head_dim * 4, c.n_kv_heads * c.head_dim * 4);
        ops::prepare_heads(
            &self.gpu,
            &prep,
            t,
            s.q.ptr + (row * qd) as u64,
            s.k.ptr + (row * kvd) as u64,
            s.v.ptr + (row * kvd) as u64,
            gains,
            st.s.pos.ptr,
            kv.k.ptr,
            kv.v.ptr,
            kv.slots,
        )
    }

    /// Decoder layer li over t tokens in x (the walk of
    /// `hearth_models::LayerSpec`; what the kernels cannot do yet is refused
    /// at upload, `model::check_supported`):
    /// x += post_norm(Wo · [gate ·] attn(rope(qk_norm(q)), rope(qk_norm(k)), v));
    /// x += post_norm(W_down · (act(W_gate h) ⊙ W_up h)).
    fn layer(&self, st: &GpuState, li: usize, t: usize) -> Result<()> {
        self.layer_of(st, li, t, None)
    }

    /// [`GpuModel::layer`]; with `batch`, row i of `st`'s scratch is one
    /// decode token of state `batch[i]` (t = batch.len()): the products run
    /// over all rows at once, each row's attention over its own state's
    /// cache at its own position.
    fn layer_of(
        &self,
        st: &GpuState,
        li: usize,
        t: usize,
        batch: Option<&[&GpuState]>,
    ) -> Result<()> {
        let c = &self.model.config;
        let spec: &LayerSpec = &self.model.arch.layers[li];
        let l: &GpuLayer = &self.layers[li];
        let (g, s) = (&*self.gpu, &st.s);
        // Sublayer outputs go to tmp when a post-norm adds them to x, else
        // straight into x.
        let (sub_out, sub_flags) = match spec.post_norm_eps {
            Some(_) => (s.tmp.ptr, 0),
            None => (s.x.ptr, ops::OUT_ADD),
        };
        let post_norm = |gain: u64| -> Result<()> {
            match spec.post_norm_eps {
                Some(eps) => ops::rmsnorm(
                    g,
                    s.tmp.ptr,
                    s.x.ptr,
                    gain,
                    t,
                    c.dim,
                    eps,
                    ops::OUT_ADD,
                    None,
                ),
                None => Ok(()),
            }
        };

        // Attention block.
        let mut items = vec![
            (Proj::Q, &l.wq, s.q.ptr, l.bq),
            (Proj::K, &l.wk, s.k.ptr, l.bk),
            (Proj::V, &l.wv, s.v.ptr, l.bv),
        ];
        let gate = match (spec.output_gate, &l.attn_gate) {
            (true, Some(gate)) => Some(gate),
            (true, None) => {
                return Err(CudaError::Unsupported(
                    "a gated attention layer without its gate".into(),
                ))
            }
            (false, _) => None,
        };
        if let Some(gate) = gate {
            items.push((Proj::Gate, gate, s.gate.ptr, 0));
        }
        self.norm_and_project(st, &l.attn_in, t, l.attn_norm, 0, &items, 0)?;
        let attend = |quantize: bool| -> Result<()> {
            match batch {
                None => {
                    self.prepare_heads(st, li, t)?;
                    self.attention(st, li, t, 0, quantize)
                }
                Some(items) => {
                    for (row, it) in items.iter().enumerate() {
                        self.prepare_heads_of(st, row, it, li, 1)?;
                        self.attention_of(st, row, it, li, 1, 0, quantize)?;
                    }
                    Ok(())
                }
            }
        };
        match gate {
            Some(_) => {
                attend(false)?;
                self.glu_and_project(
                    st,
                    t,
                    (s.att.ptr, s.gate.ptr, ops::GLU_GATE, 0),
                    c.n_heads * c.head_dim,
                    &l.wo,
                    sub_out,
                    sub_flags,
                )?;
            }
            None => {
                attend(true)?;
                self.linear(st, &l.wo, t, s.att.ptr, sub_out, 0, sub_flags)?;
            }
        }
        post_norm(l.post_attn_norm)?;

        // MLP block.
        self.norm_and_project(
            st,
            &l.ffn_in,
            t,
            l.ffn_norm,
            0,
            &[
                (Proj::FfnGate, &l.ffn_gate, s.fg.ptr, 0),
                (Proj::FfnUp, &l.ffn_up, s.fu.ptr, 0),
            ],
            0,
        )?;
        self.glu_and_project(
            st,
            t,
            (s.fg.ptr, s.fu.ptr, glu_mode(spec.ffn_act), 0),
            c.ffn_dim,
            &l.ffn_down,
            sub_out,
            sub_flags,
        )?;
        post_norm(l.post_ffn_norm)
    }

    /// Final norm, LM head, logit scale and soft-cap for rows first..first+n
    /// of x into the logits buffer.
    fn head(&self, st: &GpuState, first: usize, n: usize) -> Result<()> {
        let c = &self.model.config;
        let (g, s) = (&*self.gpu, &st.s);
        let a8 = Self::q8(st);
        let x = s.x.ptr + (first * c.dim * 4) as u64;
        ops::rmsnorm(
            g,
            x,
            s.h.ptr,
            self.output_norm,
            n,
            c.dim,
            c.norm_eps,
            0,
            Some(a8),
        )?;
        self.linear(st, &self.output, n, s.h.ptr, s.logits.ptr, 0, 0)?;
        let spec = self.model.arch.logits;
        if spec.is_identity() {
            return Ok(());
        }
        ops::logit_transform(
            g,
            s.logits.ptr,
            n * c.vocab_size,
            spec.scale.unwrap_or(1.0),
            spec.softcap.unwrap_or(0.0),
        )
    }

    /// Benchmarks: puts `n` positions of pseudo-random keys and values in
    /// every cache and moves the position to `n`, as if `n` tokens had been
    /// prefilled (their values are not a real prefill's; decode reads the
    /// same number of bytes either way).
    pub fn fill_random_context(&self, st: &mut GpuState, n: usize, seed: u32) -> Result<()> {
        if n >= st.max_ctx {
            return Err(ModelError::ContextFull {
                pos: 0,
                n,
                ctx: st.max_ctx,
            }
            .into());
        }
        for (i, kv) in st.caches.iter().enumerate() {
            for (j, buf) in [&kv.k, &kv.v].into_iter().enumerate() {
                self.gpu.fill_random(
                    buf.ptr,
                    buf.bytes / 2,
                    (seed as i32) ^ (2 * i + j) as i32,
                    false,
                )?;
            }
        }
        self.gpu.sync()?;
        st.pos = n;
        for k in st.caches.iter_mut().filter(|k| k.window > 0) {
            k.oldest_intact = n.saturating_sub(k.slots);
        }
        Ok(())
    }

    /// The GPU this model lives on.
    pub fn device(&self) -> &Gpu {
        &self.gpu
    }
}

/// The `glu_q8` mode of a gated MLP's activation.
fn glu_mode(act: FfnAct) -> i32 {
    match act {
        FfnAct::Silu => ops::GLU_SWIGLU,
        FfnAct::GeluF16 => ops::GLU_GELU,
    }
}
