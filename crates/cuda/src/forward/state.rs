//! A session's state on the device: allocation, rollback, reset, and the
//! benchmarks' random context.

use super::*;

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
}

impl GpuModel {
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
