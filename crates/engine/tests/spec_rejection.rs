//! The rejection sampler reproduces the target's distribution (statistical
//! tests, fixed seeds, many samples). The reference is the target
//! distribution p itself: the sampler chain's probabilities for a logits row
//! (temperature, top-k, top-p, min-p), against which the empirical counts of
//! the committed tokens are chi-square tested, with a draft distribution q
//! that is deliberately different (mass on tokens p excludes, too little on
//! tokens p likes).

use hearth_engine::rng::Mt19937;
use hearth_engine::sampler::{categorical, Sampler, SamplerConfig};
use hearth_engine::spec::verify::{accept_or_resample, verify_block, Verdict};

const V: usize = 8;

fn sampler(seed: u64) -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.9,
        top_k: 6,
        top_p: 0.97,
        min_p: 0.0,
        repeat_penalty: 1.0,
        seed,
        ..SamplerConfig::default()
    })
    .unwrap()
}

/// Chi-square critical value at significance 0.001 (Wilson–Hilferty).
fn chi2_critical(df: usize) -> f64 {
    let d = df as f64;
    let z = 3.090_232; // standard normal quantile of 0.999
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// Chi-square statistic of `counts` against probabilities `p`; also checks
/// that cells with p = 0 got nothing. Returns (statistic, degrees of freedom).
fn chi2(counts: &[u64], p: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(c, 0, "a token outside the target's support was committed");
            continue;
        }
        let e = pi * n as f64;
        assert!(
            e >= 5.0,
            "expected count {e} too small for the chi-square approximation"
        );
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    (stat, cells - 1)
}

const LOGITS: [f32; V] = [2.0, 1.5, 0.3, -0.5, 1.0, 0.0, -3.0, 0.8];

/// One drafted position: d ~ q, then accept or resample; the committed token
/// must be distributed as p, for a sampled q and for a deterministic drafter.
#[test]
fn single_position_commits_tokens_distributed_as_p() {
    let mut s = sampler(12345);
    let p = s.probabilities(&LOGITS);
    assert_eq!(
        p.iter().filter(|&&x| x == 0.0).count(),
        2,
        "top-k 6 keeps 6 of 8: {p:?}"
    );
    // Deliberately different: mass on excluded tokens (3 and 6 are outside top-k),
    // little on the favourite.
    let q: [f32; V] = [0.02, 0.10, 0.30, 0.15, 0.08, 0.05, 0.20, 0.10];
    let mut draw = Mt19937::new(777);
    let n = 400_000;
    let mut sampled = [0u64; V];
    let mut deterministic = [0u64; V];
    let mut raw_drafts = [0u64; V];
    for _ in 0..n {
        let d = categorical(&q, draw.uniform_f32());
        raw_drafts[d as usize] += 1;
        let t = match accept_or_resample(&mut s, &p, Some(&q), d) {
            Verdict::Accept => d,
            Verdict::Reject(t) => t,
        };
        sampled[t as usize] += 1;
        // A deterministic drafter always proposes token 2 (one-hot q).
        let t = match accept_or_resample(&mut s, &p, None, 2) {
            Verdict::Accept => 2,
            Verdict::Reject(t) => t,
        };
        deterministic[t as usize] += 1;
    }
    let p64: Vec<f64> = p.iter().map(|&x| x as f64).collect();
    for (what, counts) in [("sampled q", &sampled), ("one-hot q", &deterministic)] {
        let (stat, df) = chi2(counts, &p64);
        let crit = chi2_critical(df);
        eprintln!("{what}: chi2 = {stat:.2} (df {df}, critical {crit:.2} at 0.001), counts {counts:?}, p {p:?}");
        assert!(stat < crit, "{what}: chi2 {stat:.2} >= {crit:.2}");
    }
    // The test has power: the drafts themselves (always accepting) are far from p.
    let e = |i: usize| p64[i] * n as f64;
    let stat: f64 = (0..V)
        .filter(|&i| p64[i] > 0.0)
        .map(|i| (raw_drafts[i] as f64 - e(i)).powi(2) / e(i))
        .sum();
    assert!(
        stat > 100.0 * chi2_critical(5),
        "unverified drafts would pass: chi2 {stat:.1}"
    );
}

/// Whole blocks through `verify_block` with a Markov "target" (next-token
/// logits depend on the previous token) and a different Markov drafter: the
/// first two committed tokens after an anchor must follow
/// P(x1, x2) = p(x1 | a) · p(x2 | x1), however many cycles that takes.
#[test]
fn blocks_commit_pairs_distributed_as_the_target_chain() {
    let target = |prev: u32| -> [f32; V] {
        let mut z = LOGITS;
        z.rotate_left(prev as usize % V);
        z[(prev as usize + 3) % V] += 1.0;
        z
    };
    let draft_q = |prev: u32| -> [f32; V] {
        // 0.05 · 6 + 0.45 + 0.25 = 1
        let mut q = [0.05f32; V];
        q[(prev as usize + 1) % V] = 0.45;
        q[(prev as usize + 5) % V] = 0.25;
        q
    };
    let anchor = 4u32;
    let mut s = sampler(99);
    let mut draw = Mt19937::new(4242);
    let n = 300_000;
    let mut pairs = vec![0u64; V * V];
    let k = 3;
    for _ in 0..n {
        let mut committed: Vec<u32> = Vec::new();
        let mut last = anchor;
        while committed.len() < 2 {
            // Draft k tokens from the drafter's chain.
            let mut drafts = Vec::new();
            let mut qs = Vec::new();
            let mut prev = last;
            for _ in 0..k {
                let q = draft_q(prev);
                let d = categorical(&q, draw.uniform_f32());
                drafts.push(d);
                qs.push(q.to_vec());
                prev = d;
            }
            // The target's rows for [last, d1, d2, d3].
            let mut rows = Vec::new();
            rows.extend_from_slice(&target(last));
            for &d in &drafts {
                rows.extend_from_slice(&target(d));
            }
            let out = verify_block(&mut s, &rows, V, &drafts, Some(&qs));
            committed.extend_from_slice(&drafts[..out.accepted]);
            committed.push(out.next);
            last = out.next;
        }
        pairs[committed[0] as usize * V + committed[1] as usize] += 1;
    }
    // The reference: the chain's own probabilities from the sampler chain.
    let p1 = s.probabilities(&target(anchor));
    let mut want = vec![0.0f64; V * V];
    for x1 in 0..V {
        let p2 = s.probabilities(&target(x1 as u32));
        for x2 in 0..V {
            want[x1 * V + x2] = p1[x1] as f64 * p2[x2] as f64;
        }
    }
    // Merge cells with tiny expectations into their own test of emptiness only
    // where p is exactly 0; all others have expected counts well above 5.
    let keep: Vec<usize> = (0..V * V)
        .filter(|&i| want[i] * n as f64 >= 5.0 || want[i] == 0.0)
        .collect();
    let rare: f64 = (0..V * V)
        .filter(|i| !keep.contains(i))
        .map(|i| want[i])
        .sum();
    let rare_count: u64 = (0..V * V)
        .filter(|i| !keep.contains(i))
        .map(|i| pairs[i])
        .sum();
    let mut counts: Vec<u64> = keep.iter().map(|&i| pairs[i]).collect();
    let mut probs: Vec<f64> = keep.iter().map(|&i| want[i]).collect();
    if rare > 0.0 {
        counts.push(rare_count);
        probs.push(rare);
    }
    let (stat, df) = chi2(&counts, &probs);
    let crit = chi2_critical(df);
    eprintln!("pairs: chi2 = {stat:.2} (df {df}, critical {crit:.2} at 0.001)");
    assert!(stat < crit, "chi2 {stat:.2} >= {crit:.2}");
}

/// A greedy target ignores q: the committed token is always the argmax.
#[test]
fn greedy_verification_commits_the_argmax() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    let p = s.probabilities(&LOGITS);
    for d in 0..V as u32 {
        let t = match accept_or_resample(&mut s, &p, Some(&[0.125; V]), d) {
            Verdict::Accept => d,
            Verdict::Reject(t) => t,
        };
        assert_eq!(t, 0);
    }
}
