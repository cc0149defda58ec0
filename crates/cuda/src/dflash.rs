//! The DFlash drafter on the GPU: a plain DFlash1 draft
//! ([`hearth_models::dflash::PlainDraft`]) run next to its target, sharing
//! the target's LM head on the device and its token embeddings on the host.
//! The math is the CPU drafter's (hearth_models::dflash::forward), through
//! the target's kernels:
//! - context: `g = RMSNorm(fc · f) · hidden_norm` of the target's tapped
//!   rows `f`, then per layer `K = RoPE(k_norm(W_k g))`, `V = W_v g` written
//!   to the draft's cache at the rows' positions;
//! - block `[anchor, MASK, ...]` at positions C..C+B: pre-norm layers with
//!   q/k norms and NeoX RoPE, attention of every block row over the whole
//!   context and the whole block (non-causal: `AttnMode::Full`), SwiGLU MLP;
//!   the output norm and the target's LM head on rows 1..=n, argmax on the host.
//!
//! Not bit-identical to the CPU drafter (other summation orders, RoPE angles
//! from `powf`): a drafter only moves the acceptance rate, never the output,
//! which verification keeps exactly the target's.

use std::sync::Arc;

use hearth_models::dflash::{DflashError, DflashModel, DraftMatrix, DraftRunner, PlainDraft};

use crate::driver::{DevBuf, Gpu, Graph};
use crate::error::{CudaError, Result};
use crate::model::GpuModel;
use crate::ops::{self, AttnArgs, AttnMode, GpuMatrix, HeadPrep, Q8};
use crate::repack::{split_blocks, split_sizes, WeightKind};

/// Context rows written per pass (the backlog after a prompt is split).
const INJECT_ROWS: usize = 64;
/// Key splits of the block attention (fixed, so that a block pass captured
/// as a graph stays valid as the context grows: the kernel cuts the keys it
/// sees into this many chunks).
const SPLITS: usize = 16;

struct Layer {
    attn_norm: DevBuf,
    wq: GpuMatrix,
    wk: GpuMatrix,
    wv: GpuMatrix,
    wo: GpuMatrix,
    q_norm: DevBuf,
    k_norm: DevBuf,
    ffn_norm: DevBuf,
    gate: GpuMatrix,
    up: GpuMatrix,
    down: GpuMatrix,
}

/// A draft's weights on the GPU, shared by every session's runner.
pub struct GpuDraft {
    target: Arc<GpuModel>,
    draft: Arc<DflashModel>,
    fc: GpuMatrix,
    hidden_norm: DevBuf,
    output_norm: DevBuf,
    layers: Vec<Layer>,
    _weights: Vec<DevBuf>,
}

fn vector(g: &Gpu, v: &[f32], what: &str) -> Result<DevBuf> {
    let b = g.alloc(v.len() * 4, what)?;
    g.upload(b.ptr, v)?;
    Ok(b)
}

/// Copies one matrix to the device in the kernels' layout.
fn matrix(g: &Gpu, m: &DraftMatrix, keep: &mut Vec<DevBuf>) -> Result<GpuMatrix> {
    let kind = WeightKind::of(m.ty).ok_or_else(|| {
        CudaError::Unsupported(format!("the DFlash draft's {} of type {:?}", m.name, m.ty))
    })?;
    if !m.cols.is_multiple_of(kind.k_multiple()) {
        return Err(CudaError::Unsupported(format!(
            "the DFlash draft's {}: {} columns, not a multiple of {}",
            m.name,
            m.cols,
            kind.k_multiple()
        )));
    }
    let n_blocks = m.rows * m.cols / kind.block().0;
    let (body, scales) = if kind.is_split() {
        let (nb, ns) = split_sizes(kind, n_blocks);
        let (mut b, mut s) = (vec![0u8; nb], vec![0u8; ns]);
        split_blocks(kind, m.data, &mut b, &mut s);
        let body = g.alloc(nb, "the DFlash draft")?;
        g.upload(body.ptr, &b)?;
        let sc = g.alloc(ns, "the DFlash draft")?;
        g.upload(sc.ptr, &s)?;
        (body, Some(sc))
    } else {
        let body = g.alloc(m.data.len(), "the DFlash draft")?;
        g.upload(body.ptr, m.data)?;
        (body, None)
    };
    let out = GpuMatrix {
        kind,
        rows: m.rows,
        cols: m.cols,
        body: body.ptr,
        scales: scales.as_ref().map_or(0, |s| s.ptr),
        tune: Default::default(),
        scale: m.scale,
    };
    keep.push(body);
    keep.extend(scales);
    Ok(out)
}

impl GpuDraft {
    /// Uploads `draft`'s weights next to `target`; an `Unsupported` error
    /// names what this GPU path cannot run.
    pub fn upload(target: Arc<GpuModel>, draft: Arc<DflashModel>) -> Result<GpuDraft> {
        let c = &draft.config;
        let plain: PlainDraft = draft
            .plain()
            .map_err(|what| CudaError::Unsupported(format!("{what} on the GPU")))?;
        ops::check_attn_shape(c.n_heads, c.n_kv_heads, c.head_dim)?;
        if !c.dim.is_multiple_of(32) || !c.ffn_dim.is_multiple_of(32) {
            return Err(CudaError::Unsupported(format!(
                "a DFlash draft of width {} / ffn {} (multiples of 32 only)",
                c.dim, c.ffn_dim
            )));
        }
        let g = &*target.gpu;
        g.bind()?;
        let mut keep = Vec::new();
        let fc = matrix(g, &plain.fc, &mut keep)?;
        let mut layers = Vec::new();
        for l in &plain.layers {
            layers.push(Layer {
                attn_norm: vector(g, l.attn_norm, "the DFlash draft")?,
                wq: matrix(g, &l.wq, &mut keep)?,
                wk: matrix(g, &l.wk, &mut keep)?,
                wv: matrix(g, &l.wv, &mut keep)?,
                wo: matrix(g, &l.wo, &mut keep)?,
                q_norm: vector(g, l.q_norm, "the DFlash draft")?,
                k_norm: vector(g, l.k_norm, "the DFlash draft")?,
                ffn_norm: vector(g, l.ffn_norm, "the DFlash draft")?,
                gate: matrix(g, &l.gate, &mut keep)?,
                up: matrix(g, &l.up, &mut keep)?,
                down: matrix(g, &l.down, &mut keep)?,
            });
        }
        let hidden_norm = vector(g, plain.hidden_norm, "the DFlash draft")?;
        let output_norm = vector(g, plain.output_norm, "the DFlash draft")?;
        g.sync()?;
        drop(plain);
        Ok(GpuDraft {
            target,
            draft,
            fc,
            hidden_norm,
            output_norm,
            layers,
            _weights: keep,
        })
    }

    /// The draft these weights are.
    pub fn draft(&self) -> &Arc<DflashModel> {
        &self.draft
    }

    /// A session's runner for contexts up to `max_ctx` positions (block included).
    pub fn runner(self: &Arc<Self>, max_ctx: usize) -> Result<GpuRunner> {
        let c = &self.draft.config;
        let g = &*self.target.gpu;
        g.bind()?;
        let (d, nh, nkv, hd) = (c.dim, c.n_heads, c.n_kv_heads, c.head_dim);
        let b = c.block_size;
        let width = self.draft.hidden_width();
        let rows = INJECT_ROWS.max(b);
        let widest = (INJECT_ROWS * width).max(b * d.max(nh * hd).max(c.ffn_dim));
        let vocab = self.target.model.config.vocab_size;
        let f = |n: usize| g.alloc(n * 4, "the DFlash draft's scratch");
        let cache = |_| g.alloc_zeroed(nkv * max_ctx * hd * 2, "the DFlash draft's cache");
        let s = Scratch {
            hid: f(INJECT_ROWS * width)?,
            x: f(b * d)?,
            h: f(rows * d)?,
            tmp: f(rows * d.max(c.ffn_dim))?,
            q: f(rows * nh * hd)?,
            k: f(rows * nkv * hd)?,
            v: f(rows * nkv * hd)?,
            att: f(b * nh * hd)?,
            fg: f(b * c.ffn_dim)?,
            fu: f(b * c.ffn_dim)?,
            aq: g.alloc(widest, "the DFlash draft's scratch")?,
            ad: f(widest / 32)?,
            as_: f(widest / 32)?,
            part_o: f(b * nh * SPLITS * hd)?,
            part_ml: f(b * nh * SPLITS * 2)?,
            logits: f(b * vocab)?,
            ids: f(b)?,
            pos: g.alloc_zeroed(4, "the DFlash draft's scratch")?,
        };
        let k = (0..c.n_layers).map(cache).collect::<Result<Vec<_>>>()?;
        let v = (0..c.n_layers).map(cache).collect::<Result<Vec<_>>>()?;
        g.sync()?;
        Ok(GpuRunner {
            draft: self.clone(),
            ctx_len: 0,
            max_ctx,
            k,
            v,
            s,
            host_x: Vec::new(),
            graphs: Vec::new(),
            use_graph: std::env::var("HEARTH_CUDA_GRAPHS").map_or(true, |v| v != "0"),
        })
    }
}

struct Scratch {
    hid: DevBuf,
    x: DevBuf,
    h: DevBuf,
    tmp: DevBuf,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    att: DevBuf,
    fg: DevBuf,
    fu: DevBuf,
    aq: DevBuf,
    ad: DevBuf,
    as_: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    logits: DevBuf,
    /// Argmax of each drafted row (i32).
    ids: DevBuf,
    pos: DevBuf,
}

/// One session's draft cache ([n_kv, max_ctx, head_dim] f16 per layer,
/// position c in slot c) and scratch.
pub struct GpuRunner {
    draft: Arc<GpuDraft>,
    ctx_len: usize,
    max_ctx: usize,
    k: Vec<DevBuf>,
    v: Vec<DevBuf>,
    s: Scratch,
    host_x: Vec<f32>,
    /// Block passes captured as graphs: (block length, drafted rows, graph).
    graphs: Vec<(usize, usize, Graph)>,
    use_graph: bool,
}

// SAFETY: the runner owns device allocations and captured graphs (plain
// driver handles, not tied to a thread); every use binds the context on the
// calling thread first. A session moves its runner to the engine thread and
// uses it there only (`Send`, not `Sync`), as `GpuState`.
unsafe impl Send for GpuRunner {}

impl GpuRunner {
    fn gpu(&self) -> &Gpu {
        &self.draft.target.gpu
    }

    fn q8(&self) -> Q8 {
        Q8 {
            q: self.s.aq.ptr,
            d: self.s.ad.ptr,
            s: self.s.as_.ptr,
        }
    }

    /// y (+)= W · x for t rows already quantized in the 8-bit buffer; a
    /// per-tensor scale goes through `tmp`.
    fn linear(&self, w: &GpuMatrix, t: usize, y: u64, add: bool) -> Result<()> {
        let g = self.gpu();
        let flags = if add { ops::OUT_ADD } else { 0 };
        match w.scale {
            None => ops::gemv(g, w, self.q8(), t, y, w.rows, 0, flags),
            Some(s) => {
                let tmp = self.s.tmp.ptr;
                ops::gemv(g, w, self.q8(), t, tmp, w.rows, 0, 0)?;
                ops::scale_bias(g, tmp, y, t * w.rows, w.rows, s, 0, flags)
            }
        }
    }

    fn head_prep(&self) -> HeadPrep {
        let c = &self.draft.draft.config;
        HeadPrep {
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            theta: c.rope_theta,
            eps: c.eps,
            flags: ops::HEAD_QK_RMS | ops::HEAD_ROPE | ops::HEAD_NEOX,
        }
    }

    /// Writes `n` context rows (tapped rows in `hid`) at positions ctx_len...
    fn inject_chunk(&mut self, rows: &[f32]) -> Result<()> {
        let dr = self.draft.clone();
        let c = &dr.draft.config;
        let g = &*dr.target.gpu;
        let width = dr.draft.hidden_width();
        let n = rows.len() / width;
        g.upload(self.s.hid.ptr, rows)?;
        ops::quantize_q8(g, self.s.hid.ptr, self.q8(), n * width)?;
        // g = RMSNorm(fc · f) · hidden_norm, quantized for W_k, W_v.
        self.linear(&dr.fc, n, self.s.h.ptr, false)?;
        ops::rmsnorm(
            g,
            self.s.h.ptr,
            self.s.h.ptr,
            dr.hidden_norm.ptr,
            n,
            c.dim,
            c.eps,
            0,
            Some(self.q8()),
        )?;
        g.upload(self.s.pos.ptr, &[self.ctx_len as i32])?;
        for (li, l) in dr.layers.iter().enumerate() {
            self.linear(&l.wk, n, self.s.k.ptr, false)?;
            self.linear(&l.wv, n, self.s.v.ptr, false)?;
            // q is not used for context rows: the kernel norms/rotates
            // scratch that nothing reads.
            ops::prepare_heads(
                g,
                &self.head_prep(),
                n,
                self.s.q.ptr,
                self.s.k.ptr,
                self.s.v.ptr,
                (l.q_norm.ptr, l.k_norm.ptr),
                self.s.pos.ptr,
                self.k[li].ptr,
                self.v[li].ptr,
                self.max_ctx,
            )?;
        }
        self.ctx_len += n;
        Ok(())
    }

    /// The block pass: returns the argmax of rows 1..=n.
    fn block(&mut self, block: &[u32], n: usize) -> Result<Vec<u32>> {
        let dr = self.draft.clone();
        let c = &dr.draft.config;
        let target = &*dr.target;
        let g = &*target.gpu;
        let (d, b) = (c.dim, block.len());
        // Block input: the target's token embeddings (× embedding_scale).
        let e = target.model.mat(&target.model.tok_embd);
        self.host_x.resize(b * d, 0.0);
        for (row, &t) in self.host_x.chunks_exact_mut(d).zip(block) {
            e.dequantize_row(t as usize, row);
        }
        if let Some(s) = c.embedding_scale {
            self.host_x.iter_mut().for_each(|v| *v *= s);
        }
        g.upload(self.s.x.ptr, &self.host_x)?;
        g.upload(self.s.pos.ptr, &[self.ctx_len as i32])?;
        // Everything after the uploads reads the position from the device:
        // one captured graph per (block length, rows) serves every later pass.
        if !self.use_graph || g.profiling() {
            self.block_body(b, n)?;
        } else {
            let i = match self
                .graphs
                .iter()
                .position(|(bb, nn, _)| (*bb, *nn) == (b, n))
            {
                Some(i) => i,
                None => {
                    g.begin_capture()?;
                    let captured = self.block_body(b, n);
                    let graph = g.end_capture();
                    captured?;
                    self.graphs.push((b, n, graph?));
                    self.graphs.len() - 1
                }
            };
            g.replay(&self.graphs[i].2)?;
        }
        let mut ids = vec![0i32; n];
        g.download(&mut ids, self.s.ids.ptr)?;
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }

    /// The block's layers, output norm, LM head and argmax (kernel launches only).
    fn block_body(&self, b: usize, n: usize) -> Result<()> {
        let dr = &*self.draft;
        let c = &dr.draft.config;
        let target = &*dr.target;
        let g = &*target.gpu;
        let d = c.dim;
        let args = AttnArgs {
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            slots: self.max_ctx,
            window: 0,
            scale: c.attn_scale,
            kv: ops::KvKind::F16,
        };
        let s = &self.s;
        for (li, l) in dr.layers.iter().enumerate() {
            ops::rmsnorm(
                g,
                s.x.ptr,
                s.h.ptr,
                l.attn_norm.ptr,
                b,
                d,
                c.eps,
                0,
                Some(self.q8()),
            )?;
            self.linear(&l.wq, b, s.q.ptr, false)?;
            self.linear(&l.wk, b, s.k.ptr, false)?;
            self.linear(&l.wv, b, s.v.ptr, false)?;
            ops::prepare_heads(
                g,
                &self.head_prep(),
                b,
                s.q.ptr,
                s.k.ptr,
                s.v.ptr,
                (l.q_norm.ptr, l.k_norm.ptr),
                s.pos.ptr,
                self.k[li].ptr,
                self.v[li].ptr,
                self.max_ctx,
            )?;
            ops::attention_mode(
                g,
                &args,
                AttnMode::Full,
                b,
                SPLITS,
                (s.q.ptr, self.k[li].ptr, self.v[li].ptr, s.pos.ptr),
                (s.part_o.ptr, s.part_ml.ptr),
                s.att.ptr,
                0,
                Some(self.q8()),
            )?;
            self.linear(&l.wo, b, s.x.ptr, true)?;
            ops::rmsnorm(
                g,
                s.x.ptr,
                s.h.ptr,
                l.ffn_norm.ptr,
                b,
                d,
                c.eps,
                0,
                Some(self.q8()),
            )?;
            self.linear(&l.gate, b, s.fg.ptr, false)?;
            self.linear(&l.up, b, s.fu.ptr, false)?;
            ops::glu_q8(
                g,
                s.fg.ptr,
                s.fu.ptr,
                b * c.ffn_dim,
                ops::GLU_SWIGLU,
                0,
                s.fg.ptr,
                self.q8(),
            )?;
            self.linear(&l.down, b, s.x.ptr, true)?;
        }
        // Output norm of rows 1..=n, the target's LM head, argmax per row.
        ops::rmsnorm(
            g,
            s.x.at(d * 4),
            s.h.ptr,
            dr.output_norm.ptr,
            n,
            d,
            c.eps,
            0,
            Some(self.q8()),
        )?;
        let vocab = target.model.config.vocab_size;
        let head = &target.output;
        ops::gemv(g, head, self.q8(), n, s.logits.ptr, vocab, 0, 0)?;
        if let Some(scale) = head.scale {
            ops::scale_bias(g, s.logits.ptr, s.logits.ptr, n * vocab, vocab, scale, 0, 0)?;
        }
        ops::argmax_rows(g, s.logits.ptr, n, vocab, s.ids.ptr)
    }

    /// [`DraftRunner::draft`] that returns the logits of rows 1..=n ([n, vocab]) too.
    pub fn draft_logits(
        &mut self,
        hidden: &[f32],
        block: &[u32],
        n: usize,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let tokens = self.run(hidden, block, n)?;
        let vocab = self.draft.target.model.config.vocab_size;
        let mut logits = vec![0.0f32; n * vocab];
        self.gpu().download(&mut logits, self.s.logits.ptr)?;
        Ok((tokens, logits))
    }

    fn run(&mut self, hidden: &[f32], block: &[u32], n: usize) -> Result<Vec<u32>> {
        let dr = self.draft.clone();
        let c = &dr.draft.config;
        let width = dr.draft.hidden_width();
        let b = block.len();
        if b < 2 || b > c.block_size || n == 0 || n >= b {
            return Err(CudaError::Unsupported(format!(
                "a draft block of {b} positions for {n} drafts (2..={} positions, 1..B drafts)",
                c.block_size
            )));
        }
        if !hidden.len().is_multiple_of(width) {
            return Err(CudaError::Unsupported(format!(
                "hidden rows of {} values (not multiples of {width})",
                hidden.len()
            )));
        }
        let vocab = dr.target.model.config.vocab_size;
        if let Some(&bad) = block.iter().find(|&&t| t as usize >= vocab) {
            return Err(hearth_models::ModelError::BadToken { token: bad, vocab }.into());
        }
        if self.ctx_len + hidden.len() / width + b > self.max_ctx {
            return Err(CudaError::Unsupported(format!(
                "draft positions up to {} (the draft cache holds {})",
                self.ctx_len + hidden.len() / width + b,
                self.max_ctx
            )));
        }
        self.gpu().bind()?;
        for rows in hidden.chunks(INJECT_ROWS * width) {
            self.inject_chunk(rows)?;
        }
        let out = self.block(block, n);
        self.gpu().sync()?;
        out
    }
}

fn draft_error(e: CudaError) -> DflashError {
    match e {
        CudaError::Model(m) => DflashError::Model(m),
        other => DflashError::Invalid(format!("on the GPU: {other}")),
    }
}

impl DraftRunner for GpuRunner {
    fn draft(
        &mut self,
        hidden: &[f32],
        block: &[u32],
        n: usize,
    ) -> std::result::Result<Vec<u32>, DflashError> {
        self.run(hidden, block, n).map_err(draft_error)
    }

    fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    fn truncate(&mut self, c: usize) {
        self.ctx_len = self.ctx_len.min(c);
    }

    fn skip_context(&mut self, n: usize) -> std::result::Result<(), DflashError> {
        // Only all-sliding drafts skip rows, and those do not run here.
        Err(DflashError::Invalid(format!(
            "skipping {n} context rows: not done by the GPU drafter"
        )))
    }
}
