//! The host sampler (model spec §7).
//!
//! One [`Sampler`] per session. For a logits row it computes, in this order:
//!
//! 1. **Penalties** on the raw logits, with llama.cpp's semantics, for tokens
//!    among the last `repeat_last_n` accepted ([`apply_penalties`]).
//! 2. **Greedy** when `temperature <= 0`: the argmax, lowest index on ties, and
//!    no RNG draw (§7.2).
//! 3. Otherwise the probability vector of §7.3: temperature, top-k (selected on
//!    the penalised, untempered logits), top-p nucleus (on tempered mass), then
//!    **min-p**, then renormalisation. Min-p is not in the spec; it drops tokens
//!    whose tempered probability is below `min_p` times the largest, after the
//!    nucleus and before renormalising. With `min_p = 0` the result is exactly
//!    §7.3. (llama.cpp's default chain applies temperature last, so there min-p
//!    sees untempered logits; here it sees tempered ones.)
//! 4. The categorical draw of §7.4 with one f32 uniform from the session's
//!    MT19937 ([`crate::rng`]), see [`categorical`].

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::VecDeque;

use crate::rng::Mt19937;

/// A sampling parameter outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("sampler parameter `{field}` = {value} is invalid: it must be {expected}")]
    InvalidParameter {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Sampling parameters, fixed for a session (defaults follow llama.cpp).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// −1 or [0, 2]; ≤ 0 means greedy.
    pub temperature: f32,
    /// Keep the k highest logits; 0, or k ≥ vocabulary size, means off.
    pub top_k: usize,
    /// Nucleus mass in (0, 1]; 1 means off.
    pub top_p: f32,
    /// In [0, 1]: drop tokens with p < min_p · p_max; 0 means off.
    pub min_p: f32,
    /// Positive; divides the positive logits of recent tokens and multiplies
    /// their non-positive ones. 1 means off.
    pub repeat_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at;
    /// 0 turns all three penalties off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// Subtracted from a recent token's logit once per occurrence.
    pub frequency_penalty: f32,
    /// RNG seed (§7.5); 0 means nondeterministic.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Argmax decoding with every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }

    /// True when sampling is the argmax (temperature ≤ 0, §7.2).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks every field against its range (§7.1); the error names the first
    /// bad field.
    pub fn validate(&self) -> Result<(), SamplerError> {
        fn bad(field: &'static str, value: f32, expected: &'static str) -> SamplerError {
            SamplerError::InvalidParameter {
                field,
                value: value.to_string(),
                expected,
            }
        }
        let t = self.temperature;
        if !(t == -1.0 || (0.0..=2.0).contains(&t)) {
            return Err(bad("temperature", t, "-1 or in [0, 2]"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p, "in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", self.min_p, "in [0, 1]"));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(bad("repeat_penalty", self.repeat_penalty, "finite and > 0"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad("presence_penalty", self.presence_penalty, "finite"));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad("frequency_penalty", self.frequency_penalty, "finite"));
        }
        Ok(())
    }

    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// Per-session sampling state: the config, the RNG and the recent tokens the
/// penalties look at.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Mt19937,
    /// The last `repeat_last_n` accepted tokens, oldest first.
    recent: VecDeque<u32>,
}

impl Sampler {
    /// Validates `config` and seeds the RNG from `config.seed`.
    pub fn new(config: SamplerConfig) -> Result<Self, SamplerError> {
        config.validate()?;
        Ok(Sampler {
            config,
            rng: Mt19937::from_session_seed(config.seed),
            recent: VecDeque::with_capacity(config.repeat_last_n.min(4096)),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    pub fn is_greedy(&self) -> bool {
        self.config.is_greedy()
    }

    /// Whether repeat/presence/frequency penalties change the logits.
    pub fn has_penalties(&self) -> bool {
        self.config.penalties_on()
    }

    /// Re-seeds the RNG (fresh entropy when the seed is 0) and forgets the
    /// recent tokens: the state at the start of a new prefill.
    pub fn reset(&mut self) {
        self.rng = Mt19937::from_session_seed(self.config.seed);
        self.recent.clear();
    }

    /// Records a committed token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        let n = self.config.repeat_last_n;
        if n == 0 {
            return;
        }
        if self.recent.len() == n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// The tokens the penalties currently look at, oldest first.
    pub fn recent_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.recent.iter().copied()
    }

    /// The distribution the next draw would use for this logits row: penalties
    /// and the §7.3 pipeline (min-p included), or a one-hot at the argmax when
    /// greedy. Zero outside the kept tokens.
    pub fn probabilities(&self, logits: &[f32]) -> Vec<f32> {
        assert!(!logits.is_empty(), "probabilities: empty logits row");
        let logits = self.penalized(logits);
        let mut p = vec![0.0f32; logits.len()];
        if self.is_greedy() {
            p[argmax(&logits) as usize] = 1.0;
        } else {
            for (id, pi) in kept_distribution(&logits, &self.config) {
                p[id as usize] = pi;
            }
        }
        p
    }

    /// Samples the next token from a logits row (length = vocabulary size).
    /// Consumes one uniform when T > 0 and none when greedy. Does not record
    /// the token: call [`Sampler::accept`] once it is committed. Same result
    /// and RNG use as `sample_from_probs(&probabilities(logits))`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "sample: empty logits row");
        let logits = self.penalized(logits);
        if self.is_greedy() {
            return argmax(&logits);
        }
        let kept = kept_distribution(&logits, &self.config);
        let u = self.rng.uniform_f32();
        categorical_sparse(&kept, u, logits.len())
    }

    /// Samples from a probability vector (e.g. a residual distribution in
    /// speculative decoding). Greedy: the argmax of `p`, no draw; otherwise one
    /// uniform and [`categorical`].
    pub fn sample_from_probs(&mut self, p: &[f32]) -> u32 {
        assert!(!p.is_empty(), "sample_from_probs: empty distribution");
        if self.is_greedy() {
            return argmax(p);
        }
        categorical(p, self.rng.uniform_f32())
    }

    /// One f32 uniform in [0, 1) from the session RNG, for draws outside
    /// `sample` (speculative acceptance tests) that must share its stream.
    pub fn uniform(&mut self) -> f32 {
        self.rng.uniform_f32()
    }

    fn penalized<'a>(&self, logits: &'a [f32]) -> Cow<'a, [f32]> {
        if !self.config.penalties_on() || self.recent.is_empty() {
            return Cow::Borrowed(logits);
        }
        let mut owned = logits.to_vec();
        let recent: Vec<u32> = self.recent.iter().copied().collect();
        apply_penalties(
            &mut owned,
            &recent,
            self.config.repeat_penalty,
            self.config.presence_penalty,
            self.config.frequency_penalty,
        );
        Cow::Owned(owned)
    }
}

/// llama.cpp's penalties (`llama_sampler_penalties`), for every distinct token
/// of `recent` with `count` occurrences:
/// `ℓ = ℓ ≤ 0 ? ℓ·repeat : ℓ/repeat`, then
/// `ℓ -= count·frequency + presence`. Tokens outside `logits` are ignored.
pub fn apply_penalties(
    logits: &mut [f32],
    recent: &[u32],
    repeat_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
) {
    let mut sorted = recent.to_vec();
    sorted.sort_unstable();
    for run in sorted.chunk_by(|a, b| a == b) {
        let Some(l) = logits.get_mut(run[0] as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= repeat_penalty;
        } else {
            *l /= repeat_penalty;
        }
        *l -= run.len() as f32 * frequency_penalty + presence_penalty;
    }
}

/// Index of the largest value, lowest index on ties (§7.2). NaNs never win;
/// an all-NaN row gives 0.
pub fn argmax(values: &[f32]) -> u32 {
    hearth_models::backend::first_argmax(values)
}

/// The categorical draw of §7.4: walk indices in order with an f32 cumulative
/// sum and return the first with `cum ≥ u`.
///
/// Zero-probability entries are never returned: they are skipped, and when no
/// index qualifies (rounding left `cum` short of `u`) the last nonzero index is
/// returned instead of V−1. This agrees with §7.4 on every draw where §7.4
/// returns a token of nonzero probability; it differs only where §7.4 would
/// return a token the filters excluded (u = 0 with p₀ = 0, or a short sum with
/// p_{V−1} = 0). An all-zero `p` gives V−1.
pub fn categorical(p: &[f32], u: f32) -> u32 {
    let mut cum = 0.0f32;
    let mut last_nonzero = None;
    for (i, &pi) in p.iter().enumerate() {
        if pi > 0.0 {
            cum += pi;
            last_nonzero = Some(i);
            if cum >= u {
                return i as u32;
            }
        }
    }
    last_nonzero.unwrap_or(p.len().saturating_sub(1)) as u32
}

/// [`categorical`] over the nonzero entries of a distribution given as
/// `(id, p)` pairs in increasing id order; `v` is the vocabulary size. Gives
/// the same token as [`categorical`] on the dense vector.
fn categorical_sparse(kept: &[(u32, f32)], u: f32, v: usize) -> u32 {
    let mut cum = 0.0f32;
    let mut last_nonzero = None;
    for &(id, pi) in kept {
        if pi > 0.0 {
            cum += pi;
            last_nonzero = Some(id);
            if cum >= u {
                return id;
            }
        }
    }
    last_nonzero.unwrap_or(v.saturating_sub(1) as u32)
}

/// A token still in the running: its id, its logit as a rank key (NaN → −inf)
/// and, once computed, its weight `exp((ℓ − m)/T)`.
#[derive(Clone, Copy)]
struct Candidate {
    key: f32,
    id: u32,
    w: f32,
}

/// Logit descending, then id ascending: the order of top-k and the nucleus.
/// (−0 and +0 compare equal; keys are never NaN.)
fn by_rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.key
        .partial_cmp(&a.key)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

fn rank_key(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The `k` best-ranked tokens, in rank order, in O(V): candidates beating the
/// current k-th are buffered, and the buffer is cut back to k when it reaches
/// 2k. A later token that only ties the k-th has a higher id, so it ranks
/// below it and is skipped.
fn top_k_ranked(logits: &[f32], k: usize) -> Vec<Candidate> {
    let mut buf: Vec<Candidate> = Vec::with_capacity(2 * k);
    let mut floor: Option<f32> = None;
    for (i, &l) in logits.iter().enumerate() {
        let key = rank_key(l);
        if floor.is_some_and(|f| key <= f) {
            continue;
        }
        buf.push(Candidate {
            key,
            id: i as u32,
            w: 0.0,
        });
        if buf.len() == 2 * k {
            buf.select_nth_unstable_by(k - 1, by_rank);
            buf.truncate(k);
            floor = Some(buf[k - 1].key);
        }
    }
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, by_rank);
        buf.truncate(k);
    }
    buf.sort_unstable_by(by_rank);
    buf
}

/// f64 sum of the weights in increasing id order.
fn weight_sum_by_id(c: &[Candidate]) -> f64 {
    let mut w: Vec<(u32, f32)> = c.iter().map(|c| (c.id, c.w)).collect();
    w.sort_unstable_by_key(|&(id, _)| id);
    w.iter().map(|&(_, w)| w as f64).sum()
}

/// §7.3 for T > 0, followed by min-p (see the module docs), as `(id, p)` in
/// increasing id order; tokens not listed have p = 0.
fn kept_distribution(logits: &[f32], config: &SamplerConfig) -> Vec<(u32, f32)> {
    let v = logits.len();
    let t = config.temperature;
    let top_k_on = config.top_k > 0 && config.top_k < v;

    // Top-k on the untempered logits, in rank order. Without top-k the
    // candidates are built below, once it is known which are needed.
    let mut cands = if top_k_on {
        top_k_ranked(logits, config.top_k)
    } else {
        Vec::new()
    };
    let m = if top_k_on {
        cands[0].key
    } else {
        logits
            .iter()
            .map(|&l| rank_key(l))
            .fold(f32::NEG_INFINITY, f32::max)
    };
    if !m.is_finite() {
        // All kept logits are −inf, or some are +inf: the limit is a one-hot.
        let best = if top_k_on {
            cands[0].id
        } else {
            argmax(logits)
        };
        return vec![(best, 1.0)];
    }

    // w_i = exp((ℓ_i − m)/T) in f32; S = Σ w_i in f64, in id order.
    let weight = |key: f32| ((key - m) / t).exp();
    let mut norm = if top_k_on {
        for c in cands.iter_mut() {
            c.w = weight(c.key);
        }
        weight_sum_by_id(&cands)
    } else {
        logits.iter().map(|&l| weight(rank_key(l)) as f64).sum()
    };

    if config.top_p < 1.0 {
        // Nucleus: walk in rank order while A < top_p·S; the crossing token is
        // kept. Without top-k, rank only the best `prefix` tokens and grow the
        // prefix until the walk crosses (real distributions cross early).
        let threshold = config.top_p as f64 * norm;
        let mut prefix = 64.min(v);
        let (a, n_keep) = loop {
            if !top_k_on {
                cands = top_k_ranked(logits, prefix);
                for c in cands.iter_mut() {
                    c.w = weight(c.key);
                }
            }
            let (mut a, mut n_keep) = (0.0f64, 0);
            for c in &cands {
                if a >= threshold {
                    break;
                }
                a += c.w as f64;
                n_keep += 1;
            }
            if a >= threshold || top_k_on || prefix == v {
                break (a, n_keep);
            }
            prefix = (prefix * 8).min(v);
        };
        cands.truncate(n_keep);
        norm = a;
    } else if !top_k_on {
        let all = logits.iter().enumerate();
        cands = all
            .map(|(i, &l)| {
                let key = rank_key(l);
                Candidate {
                    key,
                    id: i as u32,
                    w: weight(key),
                }
            })
            .collect();
    }

    if config.min_p > 0.0 {
        // The top-ranked kept token has ℓ = m, so w_max = exp(0) = 1.
        let w_max = cands.iter().map(|c| c.w).fold(0.0f32, f32::max);
        let floor = config.min_p * w_max;
        let before = cands.len();
        cands.retain(|c| c.w == 0.0 || c.w >= floor);
        if cands.len() < before {
            norm = weight_sum_by_id(&cands);
        }
    }

    let norm = norm as f32;
    let mut kept: Vec<(u32, f32)> = cands.iter().map(|c| (c.id, c.w / norm)).collect();
    kept.sort_unstable_by_key(|&(id, _)| id);
    kept
}
