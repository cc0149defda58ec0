//! The forward driver shared by all architectures: validation, chunking,
//! embedding lookup, the output head. The per-layer math is `layer.rs`,
//! driven by the architecture's description (`arch.rs`).

use std::path::Path;

use hearth_kernels::cpu::interleaved::{matmul_packed, matmul_packed_glu, GluAct, PackedMatrix};
use hearth_kernels::cpu::simd;
use hearth_kernels::{matmul, Activations, RowOrder};

use crate::blocks::rmsnorm;
use crate::config::ConfigError;
use crate::layer::{self, Span};
use crate::state::State;
use crate::weights::{Layer, Linear, Model, ModelError, Numerics};

/// Which logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's row: [vocab].
    Last,
    /// Every token's row: [n_tokens, vocab].
    All,
    /// None (prefilling a prefix).
    None,
}

/// Tokens processed per pass through the layers (bounds scratch memory).
pub const MAX_CHUNK: usize = 512;

/// What a forward pass consumes at its positions: token ids, or rows that
/// take the place of token embeddings (an image's projected rows). Rows get
/// what the architecture does to looked-up embeddings except the token-only
/// scale, as llama.cpp does (`llm_graph_context::build_inp_embd`: the scale
/// multiplies token rows only; muse-glimmer's gainless embedding RMSNorm,
/// `src/models/muse-glimmer.cpp:69`, runs on every row).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Tokens(&'a [u32]),
    /// [n, dim] f32, row-major.
    Rows(&'a [f32]),
}

impl Input<'_> {
    /// Positions this input takes, for a model of width `dim`.
    pub fn len(&self, dim: usize) -> usize {
        match self {
            Input::Tokens(t) => t.len(),
            Input::Rows(r) => r.len() / dim.max(1),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Input::Tokens(t) => t.is_empty(),
            Input::Rows(r) => r.is_empty(),
        }
    }

    /// Why this input cannot enter a model of `vocab` tokens and width `dim`:
    /// empty, a token id out of range, or rows that are not whole rows.
    pub fn validate(&self, vocab: usize, dim: usize) -> Result<(), ModelError> {
        if self.is_empty() {
            return Err(ModelError::Empty);
        }
        match self {
            Input::Tokens(tokens) => {
                if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ModelError::BadToken { token: bad, vocab });
                }
            }
            Input::Rows(rows) => {
                if rows.len() % dim != 0 {
                    return Err(ModelError::BadRows {
                        len: rows.len(),
                        dim,
                    });
                }
            }
        }
        Ok(())
    }

    /// Rows `range` of this input (positions, not floats).
    pub fn slice(&self, dim: usize, range: std::ops::Range<usize>) -> Self {
        match self {
            Input::Tokens(t) => Input::Tokens(&t[range]),
            Input::Rows(r) => Input::Rows(&r[range.start * dim..range.end * dim]),
        }
    }
}

/// One sequence's part of a batched forward pass ([`Model::forward_batch`]).
pub struct BatchItem<'a, S> {
    pub state: &'a mut S,
    pub input: Input<'a>,
    pub want: Logits,
    /// Layers whose input hidden states to record (a drafter's taps, as in
    /// [`Model::forward_tapped`]); `n_layers` is the last layer's output.
    pub taps: &'a [usize],
    /// Out: the tapped rows, [rows, taps.len() * dim] (empty without taps).
    pub hidden: Vec<f32>,
}

impl<'a, S> BatchItem<'a, S> {
    /// An item without taps.
    pub fn new(state: &'a mut S, input: Input<'a>, want: Logits) -> Self {
        BatchItem {
            state,
            input,
            want,
            taps: &[],
            hidden: Vec::new(),
        }
    }

    /// Records the input hidden states of layers `taps` into [`BatchItem::hidden`].
    pub fn tapped(mut self, taps: &'a [usize]) -> Self {
        self.taps = taps;
        self
    }
}

/// How one forward pass computes, passed down as a value: the row order of
/// multi-token matmuls and attention, and where to dump intermediates.
pub(crate) struct Pass<'a> {
    pub order: RowOrder,
    /// Debug aid ([`Model::set_dump_dir`]): every named intermediate is
    /// written as raw little-endian f32 to `DIR/<name>-<layer>.bin`, named
    /// like llama.cpp's graph tensors (attn_norm, Qcur, kqv_out, l_out, ...)
    /// so it can be diffed against a dump of the reference.
    pub dump: Option<&'a Path>,
}

impl Pass<'_> {
    /// Llama.cpp's batched orders, no dumping.
    pub fn plain() -> Pass<'static> {
        Pass {
            order: RowOrder::Batched,
            dump: None,
        }
    }

    pub fn dump(&self, name: &str, layer: usize, x: &[f32]) {
        if let Some(dir) = self.dump {
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            let _ = std::fs::write(dir.join(format!("{name}-{layer}.bin")), bytes);
        }
    }
}

/// Copies `x` ([T, dim]) into tap slot `taps.position(layer)` of `tapped`
/// ([T, taps.len() * dim]) when `layer` is tapped.
fn tap_into(tapped: &mut [f32], x: &[f32], taps: &[usize], layer: usize, dim: usize) {
    for (slot, _) in taps.iter().enumerate().filter(|(_, &l)| l == layer) {
        let width = taps.len() * dim;
        for (dst, src) in tapped.chunks_exact_mut(width).zip(x.chunks_exact(dim)) {
            dst[slot * dim..(slot + 1) * dim].copy_from_slice(src);
        }
    }
}

impl Model {
    /// Runs `tokens` at positions `state.pos..`, advancing `state.pos`.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_ordered(state, tokens, want, &[], &mut Vec::new(), RowOrder::Batched)
    }

    /// The last hidden states of `tokens` run from position 0 in a state of
    /// their own, after the output norm (llama.cpp's `result_norm`, which its
    /// embeddings read): [T, dim]. The caller pools them (embeddings).
    pub fn hidden_states(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let mut state = State::new(self, tokens.len().max(1));
        let mut hidden = Vec::with_capacity(tokens.len() * c.dim);
        self.forward_ordered(
            &mut state,
            tokens,
            Logits::None,
            &[c.n_layers],
            &mut hidden,
            RowOrder::Batched,
        )?;
        rmsnorm(&mut hidden, c.dim, Some(&self.output_norm), c.norm_eps);
        Ok(hidden)
    }

    /// [`Model::forward`] that also records, for every token, the residual
    /// stream entering each layer in `taps` (ascending; `n_layers` means the
    /// last layer's output, 0 the embedding output), appended to `hidden` as
    /// [T, taps.len() * dim], taps concatenated in the given order (DFlash's
    /// target hidden states, docs/spec/dflash.md §3), with multi-token rows
    /// computed in `order` (the [`Backend`](crate::Backend) methods
    /// `forward_tapped` and `forward_verify` are its two orders).
    pub fn forward_ordered(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
        order: RowOrder,
    ) -> Result<Vec<f32>, ModelError> {
        let input = Input::Tokens(tokens);
        self.forward_input_ordered(state, input, want, taps, hidden, order)
    }

    /// [`Model::forward_ordered`] over tokens or embedding rows ([`Input`]).
    pub fn forward_input_ordered(
        &self,
        state: &mut State,
        input: Input,
        want: Logits,
        taps: &[usize],
        hidden: &mut Vec<f32>,
        order: RowOrder,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let pass = Pass {
            order,
            dump: self.dump_dir.as_deref(),
        };
        self.check(state, input, taps)?;
        let n = input.len(c.dim);
        let mut logits = Vec::new();
        let n_chunks = n.div_ceil(MAX_CHUNK);
        for ci in 0..n_chunks {
            let chunk_len = MAX_CHUNK.min(n - ci * MAX_CHUNK);
            let chunk = input.slice(c.dim, ci * MAX_CHUNK..ci * MAX_CHUNK + chunk_len);
            let p0 = state.pos;
            let mut x = self.embed(&pass, chunk);
            let mut tapped = vec![
                0.0f32;
                if taps.is_empty() {
                    0
                } else {
                    chunk_len * taps.len() * c.dim
                }
            ];
            // The rows the last layer carries past its attention (llama.cpp's
            // inp_out_ids): every row when all are wanted or the last layer's
            // output is tapped, else the last row of the last chunk, or none.
            let last_chunk = ci + 1 == n_chunks;
            let keep: Option<Vec<usize>> = match want {
                _ if taps.contains(&c.n_layers) => None,
                Logits::All => None,
                Logits::Last if last_chunk => Some(vec![chunk_len - 1]),
                Logits::Last | Logits::None => Some(vec![]),
            };
            for li in 0..c.n_layers {
                tap_into(&mut tapped, &x, taps, li, c.dim);
                let keep = keep.as_deref().filter(|_| li + 1 == c.n_layers);
                let mut span = [Span {
                    cache: &mut state.caches[li],
                    p0,
                    rows: 0..chunk_len,
                }];
                layer::layer(self, &pass, li, &mut x, &mut span, keep);
            }
            tap_into(&mut tapped, &x, taps, c.n_layers, c.dim);
            hidden.extend_from_slice(&tapped);
            state.pos += chunk_len;
            let rows = match want {
                Logits::All => x,
                Logits::Last if last_chunk => x[x.len() - c.dim..].to_vec(),
                _ => continue,
            };
            logits.extend(self.head(&pass, rows));
        }
        Ok(logits)
    }

    /// Why `input` cannot run on `state` (with hidden-state `taps`), if it cannot.
    fn check(&self, state: &State, input: Input, taps: &[usize]) -> Result<(), ModelError> {
        let c = &self.config;
        if let Some(&bad) = taps.iter().find(|&&l| l > c.n_layers) {
            let msg = format!(
                "hidden-state tap at layer {bad}: the model has {} layers",
                c.n_layers
            );
            return Err(ModelError::Config(ConfigError::Invalid(msg)));
        }
        input.validate(c.vocab_size, c.dim)?;
        let n = input.len(c.dim);
        if state.pos + n > state.max_ctx {
            return Err(ModelError::ContextFull {
                pos: state.pos,
                n,
                ctx: state.max_ctx,
            });
        }
        if state.caches.iter().any(|cache| !cache.can_serve(state.pos)) {
            return Err(ModelError::RolledBackTooFar { pos: state.pos });
        }
        Ok(())
    }

    /// One forward pass over the rows of several sequences (continuous
    /// batching): each item's input runs at its state's positions, as
    /// [`Model::forward_input_ordered`] would run it (with the item's taps
    /// into its [`BatchItem::hidden`]), but the
    /// row-wise work of every layer (norms, every matmul) goes over the rows
    /// of all items at once, so the weights are read once per pass rather
    /// than once per sequence; attention stays per sequence, over its own
    /// cache. An item whose input cannot run (a bad token, a full context)
    /// gets its error and the others run. Items should hold at most
    /// [`MAX_CHUNK`] rows between them (scratch memory grows with the rows).
    ///
    /// With [`RowOrder::Invariant`] every row is computed as a one-row pass
    /// computes it, so a batch of single-token decode steps equals those
    /// steps run one by one, bit for bit; with [`RowOrder::Batched`] a row
    /// may round differently from the same row computed alone.
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, State>],
        order: RowOrder,
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let c = &self.config;
        let pass = Pass { order, dump: None };
        let mut results: Vec<Result<Vec<f32>, ModelError>> = items
            .iter()
            .map(|it| self.check(it.state, it.input, it.taps).map(|_| Vec::new()))
            .collect();
        let live: Vec<bool> = results.iter().map(Result::is_ok).collect();
        if !live.contains(&true) {
            return results;
        }
        // The rows of every live item, in item order, and which rows go on
        // to the head (llama.cpp's inp_out_ids, over the whole batch).
        let mut x = Vec::new();
        let mut ranges = Vec::with_capacity(live.len());
        let mut keep = Vec::new();
        for it in items
            .iter()
            .zip(&live)
            .filter(|(_, &l)| l)
            .map(|(it, _)| it)
        {
            let start = x.len() / c.dim;
            x.extend(self.embed(&pass, it.input));
            let end = x.len() / c.dim;
            match it.want {
                Logits::All => keep.extend(start..end),
                Logits::Last => keep.push(end - 1),
                Logits::None => {}
            }
            ranges.push(start..end);
        }
        let total = x.len() / c.dim;
        let keep_all = keep.len() == total;
        // An item tapping the last layer's output needs all its rows past
        // the last layer's attention: then every row goes through, and the
        // wanted ones are picked for the head after.
        let tap_last = items.iter().any(|it| it.taps.contains(&c.n_layers));
        for it in items
            .iter_mut()
            .zip(&live)
            .filter(|(_, &l)| l)
            .map(|(it, _)| it)
        {
            if !it.taps.is_empty() {
                let rows = it.input.len(c.dim);
                it.hidden = vec![0.0; rows * it.taps.len() * c.dim];
            }
        }
        let tap = |items: &mut [BatchItem<'_, State>], x: &[f32], li: usize| {
            let fed = items.iter_mut().zip(&live).filter(|(_, &l)| l);
            for ((it, _), range) in fed.zip(&ranges) {
                let rows = &x[range.start * c.dim..range.end * c.dim];
                tap_into(&mut it.hidden, rows, it.taps, li, c.dim);
            }
        };
        for li in 0..c.n_layers {
            tap(items, &x, li);
            let mut spans: Vec<Span> = items
                .iter_mut()
                .zip(&live)
                .filter(|(_, &l)| l)
                .zip(&ranges)
                .map(|((it, _), range)| Span {
                    p0: it.state.pos,
                    cache: &mut it.state.caches[li],
                    rows: range.clone(),
                })
                .collect();
            let last = li + 1 == c.n_layers;
            let keep = (last && !keep_all && !tap_last).then_some(keep.as_slice());
            layer::layer(self, &pass, li, &mut x, &mut spans, keep);
        }
        if tap_last {
            tap(items, &x, c.n_layers);
            if !keep_all {
                x = keep
                    .iter()
                    .flat_map(|&r| x[r * c.dim..(r + 1) * c.dim].iter().copied())
                    .collect();
            }
        }
        let logits = if keep.is_empty() {
            Vec::new()
        } else {
            self.head(&pass, x)
        };
        // Hand each item its rows of the head's output.
        let mut at = 0;
        let fed = (0..items.len()).filter(|&i| live[i]);
        for (i, range) in fed.zip(&ranges) {
            let it = &mut items[i];
            it.state.pos += range.len();
            let n = match it.want {
                Logits::All => range.len(),
                Logits::Last => 1,
                Logits::None => 0,
            };
            results[i] = Ok(logits[at * c.vocab_size..(at + n) * c.vocab_size].to_vec());
            at += n;
        }
        results
    }

    /// The layers' input, [T, dim]: rows of `token_embd` dequantized on
    /// demand (then scaled), or the given rows as they are.
    fn embed(&self, pass: &Pass, input: Input) -> Vec<f32> {
        let c = &self.config;
        let mut x = match input {
            Input::Tokens(tokens) => {
                let e = self.mat(&self.tok_embd);
                let mut x = vec![0.0f32; tokens.len() * c.dim];
                for (row, &t) in x.chunks_exact_mut(c.dim).zip(tokens) {
                    e.dequantize_row(t as usize, row);
                }
                if let Some(s) = self.arch.embed.scale {
                    x.iter_mut().for_each(|v| *v *= s);
                    pass.dump("inp_scaled", 0, &x);
                }
                x
            }
            Input::Rows(rows) => rows.to_vec(),
        };
        if self.arch.embed.rms_norm {
            // muse-glimmer.cpp:69: a gainless RMSNorm of the looked-up rows.
            rmsnorm(&mut x, c.dim, None, c.norm_eps);
        }
        x
    }

    /// Final norm, LM head, logit scale and soft-cap for rows `x` ([n, dim])
    /// -> [n, vocab].
    fn head(&self, pass: &Pass, mut x: Vec<f32>) -> Vec<f32> {
        rmsnorm(
            &mut x,
            self.config.dim,
            Some(&self.output_norm),
            self.config.norm_eps,
        );
        pass.dump("result_norm", 0, &x);
        let mut logits = self.linear(pass, &self.output, &x);
        let spec = self.arch.logits;
        if !spec.is_identity() {
            logits.iter_mut().for_each(|z| *z = spec.apply(*z));
        }
        pass.dump("result_output", 0, &logits);
        logits
    }

    /// `(x @ W^T) · scale` for rows `x` ([n, cols]) -> [n, rows], computed
    /// from the quantized weights in place.
    pub(crate) fn linear(&self, pass: &Pass, w: &Linear, x: &[f32]) -> Vec<f32> {
        let n = x.len() / w.cols;
        let mut out = vec![0.0f32; n * w.rows];
        match (&w.packed, self.activations()) {
            (Some(p), Activations::Quantized) => {
                matmul_packed(simd::active(), p, &self.mat(w), x, n, &mut out, pass.order)
            }
            (_, mode) => matmul(&self.mat(w), x, n, &mut out, mode, pass.order),
        }
        if let Some(s) = w.scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
        out
    }

    /// The fused gate/up matrix of a layer, when the fused pass applies
    /// (quantized activations, not dumping intermediates).
    pub(crate) fn fused_gate_up<'a>(&self, pass: &Pass, l: &'a Layer) -> Option<&'a PackedMatrix> {
        let p = l.ffn_gate_up.as_deref()?;
        (self.activations() == Activations::Quantized && pass.dump.is_none()).then_some(p)
    }

    /// `act(gate, up)` of a gated MLP from gate and up packed together
    /// (`Layer::ffn_gate_up`): one activation quantization and one pass over
    /// both matrices; `act(column, gate, up)`. [n, ffn].
    pub(crate) fn glu(
        &self,
        pass: &Pass,
        gate_up: &PackedMatrix,
        x: &[f32],
        act: GluAct,
    ) -> Vec<f32> {
        let n = x.len() / gate_up.cols;
        let mut out = vec![0.0f32; n * gate_up.rows / 2];
        matmul_packed_glu(simd::active(), gate_up, x, n, act, &mut out, pass.order);
        out
    }

    /// How activations enter the matmuls: converted to each weight type's
    /// `vec_dot_type` as llama.cpp does, or exact f32.
    pub fn activations(&self) -> Activations {
        match self.numerics {
            Numerics::F32 => Activations::F32,
            Numerics::Reference => Activations::Quantized,
        }
    }

    pub fn new_state(&self, max_ctx: usize) -> State {
        State::new(self, max_ctx)
    }
}
