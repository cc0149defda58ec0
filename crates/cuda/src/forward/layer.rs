//! One decoder layer's steps on the GPU, as the architecture describes them:
//! the linear maps (GEMV or GEMM), fused projections, head preparation,
//! attention and the gated MLP.

use super::*;

impl GpuModel {
    pub(super) fn q8(st: &GpuState) -> Q8 {
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
    pub(super) fn linear(
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
    pub(super) fn layer(&self, st: &GpuState, li: usize, t: usize) -> Result<()> {
        self.layer_of(st, li, t, None)
    }

    /// [`GpuModel::layer`]; with `batch`, row i of `st`'s scratch is one
    /// decode token of state `batch[i]` (t = batch.len()): the products run
    /// over all rows at once, each row's attention over its own state's
    /// cache at its own position.
    pub(super) fn layer_of(
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
}

/// The `glu_q8` mode of a gated MLP's activation.
fn glu_mode(act: FfnAct) -> i32 {
    match act {
        FfnAct::Silu => ops::GLU_SWIGLU,
        FfnAct::GeluF16 => ops::GLU_GELU,
    }
}
