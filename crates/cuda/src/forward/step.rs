//! The forward entry points over a session's state: prefill and tapped
//! forwards, the verify pass, batched decode, and the output head.

use super::*;

impl GpuModel {
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
}
