//! Adaptive draft length: how many tokens to draft per cycle, picked from
//! the recent acceptance (as mistral.rs and mlx-serve do), and plain target
//! steps (no draft) while drafting does not pay.
//!
//! [`AdaptiveDrafter`] wraps any [`Drafter`]: it answers a proposal for up to
//! `k` tokens with at most [`AdaptiveK::next_len`] of them, and learns what
//! the target kept from the next [`Drafter::commit`] (the pending token plus
//! the accepted drafts). It only changes how many tokens are drafted, never
//! which ones are kept: verification is untouched, so the output is the
//! target's exactly as with a fixed K (greedy output equals plain decoding).
//!
//! The rule ([`AdaptiveK`]):
//! - `ema ← α·accepted + (1−α)·ema` after every cycle that drafted (α = 0.3:
//!   about three cycles of memory, so one lucky or unlucky cycle does not
//!   swing the length).
//! - drafted tokens per cycle `K = clamp(round(ema) + 1, 1, K_max)`: the
//!   recent mean run of accepted drafts plus one. The extra token is the
//!   probe that lets K grow: when every draft is accepted, ema climbs toward
//!   K and K steps up by one, up to K_max; when the drafts stop matching, K
//!   falls toward 1 at the EMA's rate. Tokens drafted past the expected run
//!   are mostly wasted verify rows (and, for DFlash, block positions), which
//!   is what the +1 bounds.
//! - when ema stays below 0.5 (less than half a token accepted per cycle)
//!   for 4 cycles in a row, drafting costs more than it returns (a draft
//!   forward plus wider verify rows for < 0.5 extra tokens): the next 8
//!   cycles are plain target steps (no draft). Then one probe cycle drafts
//!   2 tokens; if it accepts nothing the pause repeats, twice as long each
//!   time (up to 64 steps); if it accepts any, drafting resumes from there.
//! - cost (the wrapper times every cycle, from the proposal to the commit
//!   that brings its verdict): tokens per second of plain steps and of
//!   drafted cycles, each a moving average (same α). A session starts with
//!   [`WARMUP_PLAIN`] plain steps to measure the plain rate; from then on,
//!   once 4 drafted cycles in a row have run below the plain rate, drafting
//!   pauses as above (8, 16, … plain steps, then a probe, which resumes
//!   drafting only if its own cycle beat the plain rate). Acceptance alone
//!   does not say whether drafting pays: a verify pass of K+1 rows costs
//!   about K+1 plain steps where decode is compute-bound (small models on
//!   a few CPU cores: 3.2x a plain step for 4 rows on a 2-core AVX2 machine,
//!   measured), but hardly more than one where it is bandwidth-bound (GPUs,
//!   wide CPUs). The measured rates decide, on the machine at hand.

use super::{Draft, Drafter, SpecError};
use crate::sampler::SamplerConfig;

/// Weight of the newest cycle in the moving average.
const ALPHA: f64 = 0.3;
/// Below this many accepted tokens per cycle (on average) drafting pauses...
const LOW: f64 = 0.5;
/// ...once it has stayed there this many drafted cycles in a row.
const PATIENCE: u32 = 4;
/// Plain steps of the first pause, and the most after doubling.
const PAUSE: u32 = 8;
const PAUSE_MAX: u32 = 64;
/// The moving average a session starts from (K = 2).
const INITIAL_EMA: f64 = 1.0;
/// Tokens drafted by the probe cycle after a pause.
const PROBE_LEN: usize = 2;
/// Plain steps a timed controller takes first, to measure the plain rate.
pub const WARMUP_PLAIN: u32 = 2;

/// The adaptive length controller (no drafter in it: see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveK {
    max: usize,
    ema: f64,
    /// Drafted cycles in a row with `ema < LOW`.
    low_cycles: u32,
    /// Plain steps left in the current pause.
    pause_left: u32,
    /// Length of the next pause.
    pause_len: u32,
    /// The next drafted cycle is the probe after a pause.
    probing: bool,
    /// Tokens per second of plain steps and of drafted cycles (moving
    /// averages; `None` until measured).
    plain_rate: Option<f64>,
    draft_rate: Option<f64>,
    /// Drafted cycles in a row below the plain rate.
    slow_cycles: u32,
    /// Plain steps still to take before the first draft (timed controllers).
    warmup_left: u32,
    /// Whether the wrapper feeds it cycle timings.
    timed: bool,
}

impl AdaptiveK {
    /// At most `max` drafted tokens per cycle (the configured K). Starts
    /// with ema = 1 (K = 2): on the CPU a verify pass costs more the more
    /// rows it carries, so a long first guess is expensive when the drafter
    /// turns out poor, while a good one earns its length in a few cycles.
    pub fn new(max: usize) -> AdaptiveK {
        AdaptiveK {
            max,
            ema: INITIAL_EMA,
            low_cycles: 0,
            pause_left: 0,
            pause_len: PAUSE,
            probing: false,
            plain_rate: None,
            draft_rate: None,
            slow_cycles: 0,
            warmup_left: 0,
            timed: false,
        }
    }

    /// A controller fed with cycle timings ([`AdaptiveK::observe_timed`]):
    /// it starts with [`WARMUP_PLAIN`] plain steps that measure the plain
    /// rate, and pauses drafting while drafted cycles yield fewer tokens per
    /// second than plain steps.
    pub fn timed(max: usize) -> AdaptiveK {
        AdaptiveK {
            warmup_left: if max == 0 { 0 } else { WARMUP_PLAIN },
            timed: true,
            ..AdaptiveK::new(max)
        }
    }

    /// Tokens per second of plain steps and of drafted cycles, as measured.
    pub fn rates(&self) -> (Option<f64>, Option<f64>) {
        (self.plain_rate, self.draft_rate)
    }

    fn ema_rate(slot: &mut Option<f64>, rate: f64) {
        *slot = Some(match *slot {
            None => rate,
            Some(r) => ALPHA * rate + (1.0 - ALPHA) * r,
        });
    }

    /// [`AdaptiveK::observe_plain`] of a plain step that took `secs`.
    pub fn observe_plain_timed(&mut self, secs: f64) {
        if secs > 0.0 {
            Self::ema_rate(&mut self.plain_rate, 1.0 / secs);
        }
        if self.warmup_left > 0 {
            self.warmup_left -= 1;
            return;
        }
        self.observe_plain();
    }

    /// [`AdaptiveK::observe`] of a drafted cycle that took `secs` (draft,
    /// verify and commit), then the cost rule.
    pub fn observe_timed(&mut self, drafted: usize, accepted: usize, secs: f64) {
        let rate = (secs > 0.0).then(|| (accepted + 1) as f64 / secs);
        if let Some(r) = rate {
            Self::ema_rate(&mut self.draft_rate, r);
        }
        // A probe after a pause resumes drafting only if it beat plain steps
        // itself: otherwise the next, longer pause starts at once (a probe
        // whose drafts matched but cost too much would else buy 4 more slow
        // cycles every time).
        if let (true, Some(r), Some(plain)) = (self.probing, rate, self.plain_rate) {
            if r < plain {
                self.probing = false;
                self.slow_cycles = 0;
                self.pause_left = self.pause_len;
                self.pause_len = (self.pause_len * 2).min(PAUSE_MAX);
                return;
            }
        }
        self.observe(drafted, accepted);
        if self.pause_left > 0 {
            self.slow_cycles = 0;
            return;
        }
        match (self.plain_rate, self.draft_rate) {
            (Some(plain), Some(draft)) if draft < plain => {
                self.slow_cycles += 1;
                if self.slow_cycles >= PATIENCE {
                    self.slow_cycles = 0;
                    self.low_cycles = 0;
                    self.pause_left = self.pause_len;
                    self.pause_len = (self.pause_len * 2).min(PAUSE_MAX);
                }
            }
            _ => self.slow_cycles = 0,
        }
    }

    /// Drafting pays on the measured rates (or they are not known yet).
    fn pays(&self) -> bool {
        match (self.plain_rate, self.draft_rate) {
            (Some(plain), Some(draft)) => draft >= plain,
            _ => true,
        }
    }

    /// Tokens to draft this cycle: 0 during a pause (a plain target step).
    pub fn next_len(&self) -> usize {
        if self.max == 0 || self.pause_left > 0 || self.warmup_left > 0 {
            return 0;
        }
        if self.probing {
            return PROBE_LEN.min(self.max);
        }
        ((self.ema.round() as usize) + 1).clamp(1, self.max)
    }

    /// The moving average of accepted drafts per drafted cycle.
    pub fn ema(&self) -> f64 {
        self.ema
    }

    /// Whether drafting is paused (the next cycles are plain steps).
    pub fn paused(&self) -> bool {
        self.pause_left > 0
    }

    /// A cycle that drafted nothing (a pause step, or a drafter that found
    /// nothing to propose): only the pause counts down.
    pub fn observe_plain(&mut self) {
        if self.pause_left > 0 {
            self.pause_left -= 1;
            if self.pause_left == 0 {
                self.probing = true;
            }
        }
    }

    /// A cycle drafted `drafted` (> 0) tokens and the target kept `accepted`.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        debug_assert!(drafted > 0 && accepted <= drafted);
        if self.probing {
            self.probing = false;
            if accepted == 0 {
                self.pause_left = self.pause_len;
                self.pause_len = (self.pause_len * 2).min(PAUSE_MAX);
                return;
            }
            // The drafts match again: continue from what the probe saw
            // (the pauses shrink back only once drafting also pays).
            self.ema = accepted as f64;
            self.low_cycles = 0;
            if self.pays() {
                self.pause_len = PAUSE;
            }
            return;
        }
        self.ema = ALPHA * accepted as f64 + (1.0 - ALPHA) * self.ema;
        if self.ema < LOW {
            self.low_cycles += 1;
            if self.low_cycles >= PATIENCE {
                self.low_cycles = 0;
                self.pause_left = self.pause_len;
                self.pause_len = (self.pause_len * 2).min(PAUSE_MAX);
            }
        } else {
            self.low_cycles = 0;
            if self.ema >= 1.0 && self.pays() {
                self.pause_len = PAUSE;
            }
        }
    }
}

/// A drafter whose proposals follow [`AdaptiveK`].
pub struct AdaptiveDrafter<D> {
    inner: D,
    ctl: AdaptiveK,
    /// Tokens of the proposal whose verdict the next commit brings, and
    /// when the proposal began (the cycle's time runs to that commit).
    outstanding: Option<(usize, std::time::Instant)>,
}

impl<D: Drafter> AdaptiveDrafter<D> {
    /// Wraps `inner`, drafting at most `max` tokens per cycle.
    pub fn new(inner: D, max: usize) -> Self {
        AdaptiveDrafter {
            inner,
            ctl: AdaptiveK::timed(max),
            outstanding: None,
        }
    }

    /// Wraps `inner` under a given controller (e.g. an untimed
    /// [`AdaptiveK::new`], whose choices depend on acceptance alone).
    pub fn with_controller(inner: D, ctl: AdaptiveK) -> Self {
        AdaptiveDrafter {
            inner,
            ctl,
            outstanding: None,
        }
    }

    pub fn controller(&self) -> &AdaptiveK {
        &self.ctl
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: Drafter> Drafter for AdaptiveDrafter<D> {
    fn taps(&self) -> &[usize] {
        self.inner.taps()
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Draft, SpecError> {
        let start = std::time::Instant::now();
        let n = self.ctl.next_len().min(k);
        let draft = if n == 0 {
            Draft::default()
        } else {
            let mut d = self.inner.propose(context, n)?;
            d.tokens.truncate(n);
            if let Some(p) = d.probs.as_mut() {
                p.truncate(n);
            }
            d
        };
        self.outstanding = Some((draft.tokens.len(), start));
        Ok(draft)
    }

    fn commit(&mut self, tokens: &[u32], hidden: &[f32]) -> Result<(), SpecError> {
        // A commit right after a proposal is that cycle's verdict: the
        // pending token plus the accepted drafts. Others are prefill chunks
        // and plain steps of turns that do not speculate.
        if let Some((drafted, start)) = self.outstanding.take() {
            let secs = start.elapsed().as_secs_f64();
            let accepted = |d: usize| tokens.len().saturating_sub(1).min(d);
            match (drafted, self.ctl.timed) {
                (0, true) => self.ctl.observe_plain_timed(secs),
                (0, false) => self.ctl.observe_plain(),
                (d, true) => self.ctl.observe_timed(d, accepted(d), secs),
                (d, false) => self.ctl.observe(d, accepted(d)),
            }
        }
        self.inner.commit(tokens, hidden)
    }

    fn reset(&mut self) {
        self.outstanding = None;
        self.inner.reset();
    }

    fn rollback(&mut self, pos: usize) {
        self.outstanding = None;
        self.inner.rollback(pos);
    }

    fn set_sampling(&mut self, config: &SamplerConfig) -> Result<(), SpecError> {
        self.inner.set_sampling(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths chosen over cycles that accept `accept(len)` of each draft.
    fn run(ctl: &mut AdaptiveK, cycles: usize, accept: impl Fn(usize) -> usize) -> Vec<usize> {
        (0..cycles)
            .map(|_| {
                let n = ctl.next_len();
                if n == 0 {
                    ctl.observe_plain();
                } else {
                    ctl.observe(n, accept(n).min(n));
                }
                n
            })
            .collect()
    }

    #[test]
    fn length_grows_to_the_max_when_everything_is_accepted() {
        let mut c = AdaptiveK::new(15);
        let lens = run(&mut c, 60, |n| n);
        assert_eq!(lens[0], 2, "starts at round(1) + 1");
        assert!(lens.windows(2).all(|w| w[1] >= w[0]), "{lens:?}");
        assert_eq!(*lens.last().unwrap(), 15, "{lens:?}");
    }

    #[test]
    fn length_follows_a_steady_acceptance() {
        // The target keeps 2 drafts of every proposal: K settles at 3.
        let mut c = AdaptiveK::new(15);
        let lens = run(&mut c, 30, |_| 2);
        assert_eq!(&lens[20..], &[3; 10], "{lens:?}");
        assert!(!c.paused());
    }

    #[test]
    fn no_acceptance_pauses_then_probes_with_growing_pauses() {
        let mut c = AdaptiveK::new(7);
        let lens = run(&mut c, 200, |_| 0);
        // ema 1 -> .7 -> .49 (low 1) -> .34 -> .24 -> .17 (low 4): the
        // sixth cycle is the first plain step.
        let first_plain = lens.iter().position(|&n| n == 0).unwrap();
        assert_eq!(first_plain, 5, "{lens:?}");
        assert_eq!(&lens[..5], &[2, 2, 1, 1, 1], "{lens:?}");
        // Pauses of 8, 16, 32, 64, 64 plain steps, each ended by one probe
        // of 2 tokens.
        let mut runs = Vec::new();
        let mut i = first_plain;
        while i < lens.len() {
            let start = i;
            while i < lens.len() && lens[i] == 0 {
                i += 1;
            }
            if i == lens.len() {
                break;
            }
            runs.push(i - start);
            assert_eq!(lens[i], PROBE_LEN, "probe after a pause: {lens:?}");
            i += 1;
        }
        assert_eq!(runs, vec![8, 16, 32, 64, 64], "{lens:?}");
    }

    #[test]
    fn a_successful_probe_resumes_drafting() {
        let mut c = AdaptiveK::new(7);
        let dead = run(&mut c, 40, |_| 0);
        assert!(dead.contains(&0));
        // Now the drafter matches everything: after the current pause the
        // probe succeeds, and the length climbs back to the max.
        let lens = run(&mut c, 100, |n| n);
        let probe = lens.iter().position(|&n| n > 0).unwrap();
        assert_eq!(lens[probe], PROBE_LEN);
        assert!(lens[probe + 1..].iter().all(|&n| n > 0), "{lens:?}");
        assert_eq!(*lens.last().unwrap(), 7, "{lens:?}");
    }

    /// A drafter that proposes `k` copies of token 1 and records calls.
    #[derive(Default)]
    struct Ones {
        asked: Vec<usize>,
        committed: Vec<usize>,
    }

    impl Drafter for Ones {
        fn propose(&mut self, _: &[u32], k: usize) -> Result<Draft, SpecError> {
            self.asked.push(k);
            Ok(Draft {
                tokens: vec![1; k],
                probs: None,
            })
        }
        fn commit(&mut self, tokens: &[u32], _: &[f32]) -> Result<(), SpecError> {
            self.committed.push(tokens.len());
            Ok(())
        }
        fn reset(&mut self) {}
        fn rollback(&mut self, _: usize) {}
    }

    #[test]
    fn wrapper_caps_proposals_and_learns_from_commits() {
        let mut d = AdaptiveDrafter::new(Ones::default(), 6);
        // A prefill commit is not a verdict.
        d.commit(&[5, 6, 7], &[]).unwrap();
        assert_eq!(d.controller(), &AdaptiveK::timed(6));
        // The warm-up: plain steps that measure the plain rate.
        for _ in 0..WARMUP_PLAIN {
            assert!(d.propose(&[1], 2).unwrap().tokens.is_empty());
            d.commit(&[1], &[]).unwrap();
        }
        assert!(d.controller().rates().0.is_some());
        // The turn may ask for fewer than the controller's length (budget).
        assert_eq!(d.propose(&[1], 2).unwrap().tokens.len(), 2);
        d.commit(&[1, 1, 1], &[]).unwrap(); // pending + 2 accepted
        let n = d.controller().next_len();
        assert_eq!(d.propose(&[1], 100).unwrap().tokens.len(), n);
        d.commit(&[1], &[]).unwrap(); // nothing accepted
                                      // ema: 1 -> 0.3*2 + 0.7*1 = 1.3 -> 0.7*1.3 = 0.91.
        assert!((d.controller().ema() - 0.91).abs() < 1e-9);
        assert_eq!(d.inner().asked, vec![2, n]);
        assert_eq!(d.inner().committed, vec![3, 1, 1, 3, 1]);
    }

    /// Cycles where a plain step takes 1 s and a drafted cycle of n tokens
    /// takes `cost(n)` seconds and keeps `accept(n)`.
    fn run_timed(
        ctl: &mut AdaptiveK,
        cycles: usize,
        accept: impl Fn(usize) -> usize,
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        (0..cycles)
            .map(|_| {
                let n = ctl.next_len();
                if n == 0 {
                    ctl.observe_plain_timed(1.0);
                } else {
                    ctl.observe_timed(n, accept(n).min(n), cost(n));
                }
                n
            })
            .collect()
    }

    #[test]
    fn drafting_that_does_not_pay_pauses_even_when_drafts_match() {
        // Half the drafts accepted, but every verify row costs a whole plain
        // step (compute-bound): (1 + n/2) tokens per (n + 1) s < 1 token/s.
        let mut c = AdaptiveK::timed(7);
        let lens = run_timed(&mut c, 200, |n| n / 2, |n| (n + 1) as f64);
        assert_eq!(&lens[..2], &[0, 0], "warm-up: {lens:?}");
        let drafted = lens.iter().filter(|&&n| n > 0).count();
        assert!(
            drafted < 40,
            "mostly plain steps: {drafted} drafted, {lens:?}"
        );
        // The pauses grow: the last 100 cycles draft less than the first 100.
        let early = lens[..100].iter().filter(|&&n| n > 0).count();
        let late = lens[100..].iter().filter(|&&n| n > 0).count();
        assert!(late < early, "{early} then {late}: {lens:?}");
        // After the first pause only lone probes draft: 4 slow cycles once,
        // then pauses of 8, 16, 32, 64, 64 each ended by one probe.
        assert_eq!(drafted, 4 + 5, "{lens:?}");
    }

    #[test]
    fn drafting_that_pays_continues() {
        // The same acceptance where a verify pass costs about one plain step
        // (bandwidth-bound): drafting never pauses after the warm-up.
        let mut c = AdaptiveK::timed(7);
        let lens = run_timed(&mut c, 100, |n| n / 2 + 1, |n| 1.0 + 0.05 * n as f64);
        assert!(lens[2..].iter().all(|&n| n > 0), "{lens:?}");
        let (plain, draft) = c.rates();
        assert!(draft.unwrap() > plain.unwrap());
    }
}
