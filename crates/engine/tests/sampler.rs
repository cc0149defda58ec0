//! Sampler and RNG tests.
//!
//! Independent references: the spec §8.10 vectors, constants printed by a g++
//! 12.2 / libstdc++ program (`std::mt19937`, `std::seed_seq`,
//! `std::uniform_real_distribution<float>`), hand-computed llama.cpp penalty
//! values, a naive full-sort implementation of spec §7.3, and a chi-square test
//! against the exact softmax.

use hearth_engine::rng::{seed_seq_generate, uniform_f32_from_u32, Mt19937, MT19937_DEFAULT_SEED};
use hearth_engine::sampler::{
    apply_penalties, argmax, categorical, Sampler, SamplerConfig, SamplerError,
};

/// T = 1 with every filter and penalty off.
fn plain() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 42,
    }
}

fn probs(config: SamplerConfig, logits: &[f32]) -> Vec<f32> {
    Sampler::new(config).unwrap().probabilities(logits)
}

fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol,
            "index {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

fn ln(xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|x| x.ln()).collect()
}

// ---- Spec §8.10 vectors ----

#[test]
fn softmax_at_t1() {
    let z = 1.0 + 1f64.exp() + 2f64.exp();
    let want = [1.0 / z, 1f64.exp() / z, 2f64.exp() / z];
    assert_close(&probs(plain(), &[0.0, 1.0, 2.0]), &want, 1e-6);
}

#[test]
fn top_k_2() {
    let c = SamplerConfig {
        top_k: 2,
        ..plain()
    };
    let (e3, e2) = (3f64.exp(), 2f64.exp());
    let want = [0.0, e3 / (e3 + e2), 0.0, e2 / (e3 + e2)];
    assert_close(&probs(c, &[0.0, 3.0, 1.0, 2.0]), &want, 1e-6);
}

#[test]
fn top_p_keeps_the_crossing_token() {
    let c = SamplerConfig {
        top_p: 0.75,
        ..plain()
    };
    let got = probs(c, &ln(&[0.5, 0.3, 0.15, 0.05]));
    assert_close(&got, &[0.625, 0.375, 0.0, 0.0], 1e-6);
    assert_eq!(&got[2..], &[0.0, 0.0]);
}

#[test]
fn top_p_ties_go_to_lower_id_and_negative_zero_equals_zero() {
    let c = SamplerConfig {
        top_p: 0.5,
        ..plain()
    };
    let got = probs(c, &[-0.0, 0.0, 0.0]);
    assert_close(&got, &[0.5, 0.5, 0.0], 1e-7);
    assert_eq!(got[2], 0.0);
}

#[test]
fn top_k_then_top_p() {
    let c = SamplerConfig {
        top_k: 3,
        top_p: 0.6,
        ..plain()
    };
    let got = probs(c, &ln(&[0.4, 0.3, 0.2, 0.1]));
    assert_close(&got, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0], 1e-6);
}

#[test]
fn top_k_ties_go_to_lower_id() {
    let c = SamplerConfig {
        top_k: 2,
        ..plain()
    };
    assert_eq!(probs(c, &[1.0, 1.0, 1.0, 0.0]), vec![0.5, 0.5, 0.0, 0.0]);
}

#[test]
fn argmax_ties_lowest_index() {
    let logits = [-4.0, 3.0, 1.0, 3.0, 2.0, 3.0, 0.0];
    assert_eq!(argmax(&logits), 1);
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(s.sample(&logits), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN, 2.0, 2.0]), 3);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
}

#[test]
fn greedy_consumes_no_draws() {
    let config = SamplerConfig {
        seed: 42,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(config).unwrap();
    for _ in 0..10 {
        assert_eq!(s.sample(&[0.1, 0.7, 0.2]), 1);
        assert_eq!(s.sample_from_probs(&[0.1, 0.2, 0.7]), 2);
    }
    // The first uniform of seed 42, as printed by g++/libstdc++.
    assert_eq!(s.uniform().to_bits(), 0x3f53_842f);
    // temperature = -1 is greedy too.
    let mut s = Sampler::new(SamplerConfig {
        temperature: -1.0,
        ..config
    })
    .unwrap();
    assert_eq!(s.sample(&[0.1, 0.7, 0.2]), 1);
    assert_eq!(s.uniform().to_bits(), 0x3f53_842f);
    assert_eq!(s.probabilities(&[0.1, 0.7, 0.2]), vec![0.0, 1.0, 0.0]);
}

// ---- Beyond the spec vectors ----

#[test]
fn temperature_scales_before_top_k() {
    // T = 0.5, top-k = 3 on [1, 4, 2, 3, 0]: keep ids 1, 3, 2 and softmax
    // their logits / 0.5.
    let c = SamplerConfig {
        temperature: 0.5,
        top_k: 3,
        ..plain()
    };
    let w = [0.0, 8f64.exp(), 4f64.exp(), 6f64.exp(), 0.0];
    let z: f64 = w.iter().sum();
    let want: Vec<f64> = w.iter().map(|x| x / z).collect();
    assert_close(&probs(c, &[1.0, 4.0, 2.0, 3.0, 0.0]), &want, 1e-6);
}

#[test]
fn min_p_drops_below_fraction_of_max_after_top_p() {
    // w = [1, .6, .3, .1]; min_p 0.2 drops only the .1 token.
    let c = SamplerConfig {
        min_p: 0.2,
        ..plain()
    };
    let got = probs(c, &ln(&[0.5, 0.3, 0.15, 0.05]));
    assert_close(&got, &[1.0 / 1.9, 0.6 / 1.9, 0.3 / 1.9, 0.0], 1e-6);
    assert_eq!(got[3], 0.0);
    // After a nucleus of {0, 1}, min_p 0.7 also drops the 0.6 token.
    let c = SamplerConfig {
        min_p: 0.7,
        top_p: 0.75,
        ..plain()
    };
    assert_eq!(
        probs(c, &ln(&[0.5, 0.3, 0.15, 0.05])),
        vec![1.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn nonfinite_logits() {
    let c = SamplerConfig {
        top_p: 0.9,
        ..plain()
    };
    let got = probs(c, &[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0]);
    assert_close(&got, &[0.0, 0.5, 0.0, 0.5], 1e-7);
    assert_eq!(
        probs(plain(), &[0.0, f32::INFINITY, 1.0]),
        vec![0.0, 1.0, 0.0]
    );
    assert_eq!(probs(plain(), &[f32::NEG_INFINITY; 3]), vec![1.0, 0.0, 0.0]);
}

/// §7.3 written naively: a full sort of every token for top-k and the nucleus.
fn spec_probabilities(logits: &[f32], t: f32, top_k: usize, top_p: f32) -> Vec<f32> {
    let v = logits.len();
    let mut order: Vec<usize> = (0..v).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
    let k = if top_k == 0 || top_k >= v { v } else { top_k };
    let kept = &order[..k];
    let m = logits[kept[0]];
    let mut w = vec![0.0f32; v];
    for &i in kept {
        w[i] = ((logits[i] - m) / t).exp();
    }
    let s: f64 = w.iter().map(|&x| x as f64).sum();
    if top_p >= 1.0 {
        return w.iter().map(|&x| x / s as f32).collect();
    }
    let (mut a, mut n) = (0.0f64, 0);
    while n < k && a < top_p as f64 * s {
        a += w[kept[n]] as f64;
        n += 1;
    }
    let mut p = vec![0.0f32; v];
    for &i in &kept[..n] {
        p[i] = w[i] / a as f32;
    }
    p
}

/// Deterministic pseudo-random logits on a 1/8 grid, so many ties occur.
fn grid_logits(v: usize, seed: u32) -> Vec<f32> {
    let mut g = Mt19937::new(seed);
    (0..v)
        .map(|_| (g.next_u32() % 64) as f32 / 8.0 - 4.0)
        .collect()
}

#[test]
fn matches_naive_spec_pipeline_on_large_vocab() {
    // Covers the growing partial sort the nucleus uses without top-k.
    for (v, t, top_k, top_p) in [
        (5000, 1.0, 0, 0.9),
        (5000, 0.3, 0, 0.5),
        (5000, 1.7, 0, 0.999),
        (5000, 0.8, 40, 0.95),
        (5000, 1.0, 4999, 0.7),
        (5000, 1.0, 0, 1.0),
        (7, 1.0, 3, 0.2),
    ] {
        let logits = grid_logits(v, 7 + v as u32 + top_k as u32);
        let c = SamplerConfig {
            temperature: t,
            top_k,
            top_p,
            ..plain()
        };
        let got = probs(c, &logits);
        let want = spec_probabilities(&logits, t, top_k, top_p);
        assert_eq!(got, want, "v={v} t={t} top_k={top_k} top_p={top_p}");
    }
    // Orders that stress the streaming top-k: ascending, descending, all tied.
    let ascending: Vec<f32> = (0..5000).map(|i| i as f32 / 500.0).collect();
    let descending: Vec<f32> = ascending.iter().rev().copied().collect();
    let tied = vec![0.25f32; 5000];
    for logits in [&ascending, &descending, &tied] {
        for (top_k, top_p) in [(1, 1.0), (10, 1.0), (1000, 0.9), (2500, 1.0), (4999, 0.5)] {
            let c = SamplerConfig {
                top_k,
                top_p,
                ..plain()
            };
            let want = spec_probabilities(logits, 1.0, top_k, top_p);
            assert_eq!(probs(c, logits), want, "top_k={top_k} top_p={top_p}");
        }
    }
}

// ---- Penalties (llama.cpp semantics, hand-computed) ----

#[test]
fn penalties_follow_llama_cpp() {
    let mut logits = [2.0f32, -1.0, 0.5, 3.0, 0.0, 1.5];
    // Token 0 twice, 1 and 4 once, 9 is outside the vocabulary.
    apply_penalties(&mut logits, &[0, 1, 0, 4, 9], 2.0, 0.5, 0.25);
    // 0: 2/2 − (2·0.25 + 0.5) = 0;  1: −1·2 − 0.75 = −2.75;  4: 0·2 − 0.75.
    assert_eq!(logits, [0.0, -2.75, 0.5, 3.0, -0.75, 1.5]);
}

#[test]
fn penalties_use_the_last_n_accepted_tokens() {
    let config = SamplerConfig {
        repeat_penalty: 10.0,
        repeat_last_n: 2,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(config).unwrap();
    let logits = [5.0, 4.0, 3.0];
    s.accept(0);
    assert_eq!(s.sample(&logits), 1); // 0 → 0.5
    s.accept(1);
    s.accept(2);
    assert_eq!(s.recent_tokens().collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(s.sample(&logits), 0); // 0 has left the window
    s.accept(0);
    assert_eq!(s.sample(&logits), 1); // window [2, 0]: 0 → 0.5, 2 → 0.3
    s.reset();
    assert_eq!(s.recent_tokens().count(), 0);

    // Penalties shape the distribution too: presence 1 on token 1 of [0, 1].
    let config = SamplerConfig {
        presence_penalty: 1.0,
        repeat_last_n: 4,
        ..plain()
    };
    let mut s = Sampler::new(config).unwrap();
    s.accept(1);
    assert_close(&s.probabilities(&[0.0, 1.0]), &[0.5, 0.5], 1e-7);
}

// ---- Draws ----

#[test]
fn categorical_rule() {
    let p = [0.2f32, 0.3, 0.5];
    assert_eq!(categorical(&p, 0.0), 0);
    assert_eq!(categorical(&p, 0.2), 0); // cum ≥ u
    assert_eq!(categorical(&p, 0.200_001), 1);
    assert_eq!(categorical(&p, 0.999_999_94), 2);
    // Never a zero-probability token: u = 0 with p₀ = 0, and a short sum.
    assert_eq!(categorical(&[0.0, 0.5, 0.5], 0.0), 1);
    assert_eq!(categorical(&[0.3, 0.3, 0.0], 0.9), 1);
    assert_eq!(categorical(&[0.0, 0.0], 0.5), 1);
}

#[test]
fn draws_use_the_libstdcxx_uniforms() {
    // Seed 42's first uniforms (g++/libstdc++): 0.826235712 0.466466874
    // 0.361650646 0.755001843 0.588852108. Against cumulative p
    // [.1, .3, .6, 1] they pick 3, 2, 2, 3, 2.
    let mut s = Sampler::new(plain()).unwrap();
    let logits = ln(&[0.1, 0.2, 0.3, 0.4]);
    let tokens: Vec<u32> = (0..5).map(|_| s.sample(&logits)).collect();
    assert_eq!(tokens, vec![3, 2, 2, 3, 2]);
}

/// Regression guard: one seed always gives one stream; `sample` and
/// `sample_from_probs(probabilities)` agree draw for draw.
#[test]
fn fixed_seed_is_deterministic() {
    let config = SamplerConfig {
        seed: 1234,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let run = |via_probs: bool| {
        let mut s = Sampler::new(config).unwrap();
        (0..200u32)
            .map(|step| {
                let logits = grid_logits(1000, step);
                let t = if via_probs {
                    let p = s.probabilities(&logits);
                    s.sample_from_probs(&p)
                } else {
                    s.sample(&logits)
                };
                s.accept(t);
                t
            })
            .collect::<Vec<_>>()
    };
    let a = run(false);
    assert_eq!(a, run(false));
    assert_eq!(a, run(true));
    assert!(a.iter().any(|&t| t != a[0]), "stream never varies: {a:?}");

    // reset() restarts the stream.
    let mut s = Sampler::new(config).unwrap();
    let first: Vec<f32> = (0..4).map(|_| s.uniform()).collect();
    s.reset();
    assert_eq!(first, (0..4).map(|_| s.uniform()).collect::<Vec<_>>());

    // Seed 0 draws fresh entropy per sampler.
    let zero = SamplerConfig { seed: 0, ..config };
    let (mut x, mut y) = (Sampler::new(zero).unwrap(), Sampler::new(zero).unwrap());
    let xs: Vec<f32> = (0..8).map(|_| x.uniform()).collect();
    let ys: Vec<f32> = (0..8).map(|_| y.uniform()).collect();
    assert_ne!(xs, ys);
}

#[test]
fn chi_square_matches_softmax() {
    let logits = [0.5f32, -1.0, 2.0, 0.0, 1.0];
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    let mut s = Sampler::new(SamplerConfig {
        seed: 20_240_601,
        ..plain()
    })
    .unwrap();
    let n = 200_000;
    let mut counts = [0u64; 5];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    let chi2: f64 = logits
        .iter()
        .zip(&counts)
        .map(|(&l, &c)| {
            let e = n as f64 * (l as f64).exp() / z;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    // Critical value of chi-square with 4 degrees of freedom at p = 0.001.
    assert!(chi2 < 18.467, "chi2 = {chi2}, counts = {counts:?}");
}

// ---- Validation ----

#[test]
fn validation_names_the_bad_field() {
    let field_of = |c: SamplerConfig| match c.validate() {
        Err(SamplerError::InvalidParameter { field, .. }) => Some(field),
        Ok(()) => None,
    };
    let d = SamplerConfig::default();
    assert_eq!(field_of(d), None);
    assert_eq!(field_of(SamplerConfig::greedy()), None);
    for t in [-1.0, 0.0, 2.0] {
        assert_eq!(
            field_of(SamplerConfig {
                temperature: t,
                ..d
            }),
            None,
            "temperature {t}"
        );
    }
    for t in [-0.5, 2.01, f32::NAN, f32::INFINITY] {
        assert_eq!(
            field_of(SamplerConfig {
                temperature: t,
                ..d
            }),
            Some("temperature")
        );
    }
    assert_eq!(field_of(SamplerConfig { top_p: 1.0, ..d }), None);
    for p in [0.0, -0.1, 1.01, f32::NAN] {
        assert_eq!(field_of(SamplerConfig { top_p: p, ..d }), Some("top_p"));
    }
    for p in [-0.01, 1.5, f32::NAN] {
        assert_eq!(field_of(SamplerConfig { min_p: p, ..d }), Some("min_p"));
    }
    for r in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        assert_eq!(
            field_of(SamplerConfig {
                repeat_penalty: r,
                ..d
            }),
            Some("repeat_penalty")
        );
    }
    let pp = SamplerConfig {
        presence_penalty: f32::NEG_INFINITY,
        ..d
    };
    assert_eq!(field_of(pp), Some("presence_penalty"));
    let fp = SamplerConfig {
        frequency_penalty: f32::NAN,
        ..d
    };
    assert_eq!(field_of(fp), Some("frequency_penalty"));

    let err = Sampler::new(SamplerConfig {
        temperature: 3.0,
        ..d
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("temperature") && msg.contains('3'), "{msg}");
}

// ---- RNG against g++ 12.2 / libstdc++ ----

#[test]
fn mt19937_default_seed_10000th_output() {
    // C++ [rand.predef]: the 10000th output of a default-constructed mt19937.
    let mut g = Mt19937::new(MT19937_DEFAULT_SEED);
    g.discard(9999);
    assert_eq!(g.next_u32(), 4_123_659_995);
}

#[test]
fn seed_seq_generate_matches_libstdcxx() {
    // std::seed_seq{42u, 0u}.generate(out, out + 624).
    let mut out = [0u32; 624];
    seed_seq_generate(&[42, 0], &mut out);
    assert_eq!(&out[..3], &[7_914_369, 2_507_652_537, 1_695_572_323]);
    assert_eq!(out[623], 2_300_061_864);
}

#[test]
fn session_seed_matches_libstdcxx() {
    // First six outputs of std::mt19937 g(std::seed_seq{seed & 0xFFFFFFFF,
    // seed >> 32}), and the bits of the first five
    // std::uniform_real_distribution<float>(0, 1) values (each used one output:
    // the sixth raw output equals the output after five floats).
    let cases: [(u64, [u32; 6], [u32; 5]); 4] = [
        (
            1,
            [
                2848731434, 2859044665, 1677398595, 2546747724, 2657536642, 2508571462,
            ],
            [0x3f29cc31, 0x3f2a698f, 0x3ec7f625, 0x3f17cc49, 0x3f1e66cb],
        ),
        (
            42,
            [
                3548655438, 2003459968, 1553277671, 3242708156, 2529100641, 3070386108,
            ],
            [0x3f53842f, 0x3eeed4bf, 0x3eb92a46, 0x3f4147cd, 0x3f16bf03],
        ),
        (
            0x0123_4567_89ab_cdef,
            [
                3070560217, 3127906990, 2523544545, 81080988, 1254008696, 2453113252,
            ],
            [0x3f370508, 0x3f3a7013, 0x3f166a3c, 0x3c9aa654, 0x3e957d4f],
        ),
        (
            u64::MAX,
            [
                840950037, 921719519, 2883678189, 3742511946, 602914279, 3920084439,
            ],
            [0x3e487f84, 0x3e5bc14b, 0x3f2be170, 0x3f5f1233, 0x3e0fbef8],
        ),
    ];
    for (seed, raw, float_bits) in cases {
        let mut g = Mt19937::from_session_seed(seed);
        let got: Vec<u32> = (0..6).map(|_| g.next_u32()).collect();
        assert_eq!(got, raw, "raw outputs, seed {seed:#x}");
        let mut g = Mt19937::from_session_seed(seed);
        let got: Vec<u32> = (0..5).map(|_| g.uniform_f32().to_bits()).collect();
        assert_eq!(got, float_bits, "uniform floats, seed {seed:#x}");
        assert_eq!(g.next_u32(), raw[5], "one output per float, seed {seed:#x}");
    }
}

#[test]
fn uniform_is_below_one() {
    // libstdc++ generate_canonical<float, 24> on an engine returning
    // 0xFFFFFFFF gives 0x3f7fffff (the largest float below 1).
    assert_eq!(uniform_f32_from_u32(u32::MAX).to_bits(), 0x3f7f_ffff);
    assert_eq!(uniform_f32_from_u32(0), 0.0);
    assert_eq!(uniform_f32_from_u32(1 << 31), 0.5);
}
