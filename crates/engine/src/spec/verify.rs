//! The acceptance rule of speculative decoding, independent of the drafter
//! (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
//! Decoding"; Chen et al. 2023; docs/spec/dflash.md §8.3).
//!
//! The target scored `[anchor, d_1..d_K]` in one pass, so logits row `z_i`
//! is the target's next-token distribution after `d_i` (row 0: after the
//! anchor). Scanning i = 0..K−1 with `p_i` = the distribution the normal
//! sampler chain would draw from at row i (penalties, temperature, top-k,
//! top-p, min-p; one-hot when greedy):
//!
//! - greedy: accept `d_{i+1}` iff it is the argmax; on the first miss the
//!   argmax is the correction. No RNG.
//! - sampling: accept `d = d_{i+1}` with probability min(1, p(d)/q(d)), where
//!   q is the distribution d was drawn from (one-hot for a deterministic
//!   drafter, so α = p(d)); on the first rejection draw the correction from
//!   norm(max(0, p − q)). Summed over accept and reject this gives exactly
//!   p: P(x) = min(q(x), p(x)) + (1 − Σ min(p, q)) · max(0, p(x) − q(x)) / Σ max(0, p − q).
//! - all K accepted: a bonus token drawn from `p_K`.
//!
//! Every committed token is therefore a draw from the target's own chain, and
//! the output distribution equals the target's (lossless).

use crate::sampler::{argmax, Sampler};

/// What happened to one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token is committed.
    Accept,
    /// Rejected; this token (drawn from the residual) is committed instead.
    Reject(u32),
}

/// Decides one draft token `d` against the target distribution `p` (the
/// sampler chain's probabilities for the row). `q`: the drafter's
/// distribution `d` was sampled from, or `None` for a deterministic drafter
/// (one-hot at `d`). Greedy samplers compare with the argmax and draw nothing;
/// otherwise this takes one uniform for the test and, on rejection, one for
/// the correction (spec §8.4 order).
pub fn accept_or_resample(sampler: &mut Sampler, p: &[f32], q: Option<&[f32]>, d: u32) -> Verdict {
    let di = d as usize;
    if sampler.is_greedy() {
        let best = argmax(p);
        return if best == d {
            Verdict::Accept
        } else {
            Verdict::Reject(best)
        };
    }
    let pd = p.get(di).copied().unwrap_or(0.0);
    let qd = match q {
        None => 1.0,
        Some(q) => q.get(di).copied().unwrap_or(0.0),
    };
    // α = min(1, p/q); a token the drafter gave no mass cannot have been drawn
    // from q, and the rule degenerates to α = 1 (spec §8.3).
    let alpha = if qd > 0.0 { (pd / qd).min(1.0) } else { 1.0 };
    if sampler.uniform() < alpha {
        return Verdict::Accept;
    }
    let residual = residual_distribution(p, q, di);
    match residual {
        Some(r) => Verdict::Reject(sampler.sample_from_probs(&r)),
        // No residual mass (p ≤ q everywhere, only reachable through rounding):
        // p itself is the right distribution.
        None => Verdict::Reject(sampler.sample_from_probs(p)),
    }
}

/// norm(max(0, p − q)), with q one-hot at `d` when `None` (then simply p with
/// `d` removed). The normaliser is the f64 sum cast to f32 (spec §8.3).
/// `None` when no mass remains.
pub fn residual_distribution(p: &[f32], q: Option<&[f32]>, d: usize) -> Option<Vec<f32>> {
    let mut r: Vec<f32> = match q {
        None => {
            let mut r = p.to_vec();
            if let Some(x) = r.get_mut(d) {
                *x = 0.0;
            }
            r
        }
        Some(q) => p.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).collect(),
    };
    let sum: f64 = r.iter().map(|&x| x as f64).sum();
    if sum <= 0.0 {
        return None;
    }
    let norm = sum as f32;
    r.iter_mut().for_each(|x| *x /= norm);
    Some(r)
}

/// The outcome of verifying one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockOutcome {
    /// Draft tokens accepted (a prefix of the draft).
    pub accepted: usize,
    /// The token after the accepted prefix: the correction at the first
    /// rejection, or the bonus token when every draft was accepted.
    pub next: u32,
}

/// Verifies a whole draft. `logits`: the target's rows for
/// `[anchor, d_1..d_K]`, [K+1, vocab]. `draft_probs`: per draft token the
/// distribution it was drawn from (`None`: deterministic drafter). Each
/// committed token is recorded with `sampler.accept` as it is decided, so the
/// penalties of row i see exactly the tokens before it, as in plain decoding.
/// [`verify_block`] for a greedy sampler without penalties, from each
/// row's argmax alone (`ids`: K+1 of them): the drafts up to the first that
/// is not its row's argmax are accepted, then that row's argmax (or the
/// bonus row's) is next. The same outcome as `verify_block` on the rows.
pub fn verify_greedy_ids(sampler: &mut Sampler, ids: &[u32], draft: &[u32]) -> BlockOutcome {
    assert_eq!(ids.len(), draft.len() + 1, "verify_greedy_ids: not K+1 ids");
    let accepted = draft.iter().zip(ids).take_while(|(d, i)| d == i).count();
    for &d in &draft[..accepted] {
        sampler.accept(d);
    }
    let next = ids[accepted];
    sampler.accept(next);
    BlockOutcome { accepted, next }
}

pub fn verify_block(
    sampler: &mut Sampler,
    logits: &[f32],
    vocab: usize,
    draft: &[u32],
    draft_probs: Option<&[Vec<f32>]>,
) -> BlockOutcome {
    assert_eq!(
        logits.len(),
        (draft.len() + 1) * vocab,
        "verify_block: logits are not [K+1, vocab]"
    );
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    for (i, &d) in draft.iter().enumerate() {
        let verdict = if sampler.is_greedy() && !sampler.has_penalties() {
            // Plain argmax (the fast path: no probability vector needed).
            let best = argmax(rows[i]);
            if best == d {
                Verdict::Accept
            } else {
                Verdict::Reject(best)
            }
        } else {
            let p = sampler.probabilities(rows[i]);
            let q = draft_probs.map(|qs| qs[i].as_slice());
            accept_or_resample(sampler, &p, q, d)
        };
        match verdict {
            Verdict::Accept => sampler.accept(d),
            Verdict::Reject(t) => {
                sampler.accept(t);
                return BlockOutcome {
                    accepted: i,
                    next: t,
                };
            }
        }
    }
    let bonus = sampler.sample(rows[draft.len()]);
    sampler.accept(bonus);
    BlockOutcome {
        accepted: draft.len(),
        next: bonus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplerConfig;

    fn sampling(seed: u64) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerConfig::default()
        })
        .unwrap()
    }

    /// Spec §11.9: excluding token 1 from [0.2, 0.5, 0.3] gives [0.4, 0, 0.6].
    #[test]
    fn exclusion_renormalises() {
        let r = residual_distribution(&[0.2, 0.5, 0.3], None, 1).unwrap();
        assert!(
            (r[0] - 0.4).abs() < 1e-6 && r[1] == 0.0 && (r[2] - 0.6).abs() < 1e-6,
            "{r:?}"
        );
    }

    /// Spec §11.9: residual of p = [0.1, 0.6, 0.3] against q = [0.2, 0.2, 0.6] is [0, 1, 0].
    #[test]
    fn residual_of_p_against_q() {
        let r = residual_distribution(&[0.1, 0.6, 0.3], Some(&[0.2, 0.2, 0.6]), 2).unwrap();
        assert_eq!(r, vec![0.0, 1.0, 0.0]);
    }

    /// Spec §11.9: a rejection followed by exclusion consumes exactly two uniforms;
    /// a certain acceptance consumes one.
    #[test]
    fn rng_draws_per_decision() {
        let mut a = sampling(5);
        let mut b = sampling(5);
        // p(d) = 0: always rejected; correction from the rest.
        let v = accept_or_resample(&mut a, &[0.0, 0.5, 0.5], None, 0);
        assert!(matches!(v, Verdict::Reject(t) if t != 0));
        b.uniform();
        b.uniform();
        assert_eq!(a.uniform(), b.uniform());
        // p(d) = 1: always accepted, one draw.
        assert_eq!(
            accept_or_resample(&mut a, &[0.0, 1.0, 0.0], None, 1),
            Verdict::Accept
        );
        b.uniform();
        assert_eq!(a.uniform(), b.uniform());
    }

    #[test]
    fn greedy_block_accepts_the_argmax_prefix() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        // vocab 3; rows' argmaxes: 2, 1, 0
        let logits = [0.0, 1.0, 2.0, 0.0, 3.0, 1.0, 5.0, 0.0, 0.0];
        let out = verify_block(&mut s, &logits, 3, &[2, 1], None);
        assert_eq!(
            out,
            BlockOutcome {
                accepted: 2,
                next: 0
            }
        );
        let out = verify_block(&mut s, &logits, 3, &[2, 0], None);
        assert_eq!(
            out,
            BlockOutcome {
                accepted: 1,
                next: 1
            }
        );
        let out = verify_block(&mut s, &logits, 3, &[1, 1], None);
        assert_eq!(
            out,
            BlockOutcome {
                accepted: 0,
                next: 2
            }
        );
    }
}
