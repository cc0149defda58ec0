//! The sampler's random source: 32-bit MT19937 seeded through C++
//! `std::seed_seq`, with libstdc++'s float conversion (model spec §7.5).
//!
//! Matching the reference bit for bit lets a seeded run reproduce its sampled
//! token stream. The tests check the generator against g++/libstdc++ output.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// Seed of a default-constructed `std::mt19937`.
pub const MT19937_DEFAULT_SEED: u32 = 5489;

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The 32-bit Mersenne Twister, identical to C++ `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    /// [624] words of twister state.
    state: [u32; N],
    /// Next word of `state` to temper; `N` means a twist is due.
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// `std::mt19937(seed)`: the classic linear initialisation.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    /// `std::mt19937(std::seed_seq{words...})`.
    pub fn from_seed_seq(words: &[u32]) -> Self {
        let mut state = [0u32; N];
        seed_seq_generate(words, &mut state);
        // An all-zero state would only ever produce zeros; the standard
        // replaces it (only the top bit of word 0 takes part in the twist).
        if state[0] & UPPER_MASK == 0 && state[1..].iter().all(|&w| w == 0) {
            state[0] = UPPER_MASK;
        }
        Mt19937 { state, index: N }
    }

    /// The sampler's generator for a 64-bit session seed: `seed_seq` over
    /// `{seed & 0xFFFFFFFF, seed >> 32}`. Seed 0 means nondeterministic: two
    /// words of OS-seeded entropy are used instead (the reference's
    /// `std::random_device`).
    pub fn from_session_seed(seed: u64) -> Self {
        let words = if seed == 0 {
            entropy_words()
        } else {
            [seed as u32, (seed >> 32) as u32]
        };
        Self::from_seed_seq(&words)
    }

    /// Next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Skip `n` outputs, like `std::mt19937::discard`.
    pub fn discard(&mut self, n: u64) {
        for _ in 0..n {
            self.next_u32();
        }
    }

    /// One uniform f32 in [0, 1) from exactly one 32-bit output; the same value
    /// as `std::uniform_real_distribution<float>(0, 1)` under libstdc++.
    pub fn uniform_f32(&mut self) -> f32 {
        uniform_f32_from_u32(self.next_u32())
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 0 { 0 } else { MATRIX_A };
            self.state[i] = self.state[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }
}

/// libstdc++'s `generate_canonical<float, 24>` for a 32-bit engine:
/// `u = f32(x) / 2^32`, which rounds up to 1 for x near 2^32, so it is clamped
/// to the largest f32 below 1 (spec §7.5).
pub fn uniform_f32_from_u32(x: u32) -> f32 {
    let u = x as f32 / 4_294_967_296.0f32;
    if u >= 1.0 {
        1.0 - f32::EPSILON / 2.0
    } else {
        u
    }
}

/// C++ `std::seed_seq::generate` ([rand.util.seedseq]): fills `out` from the
/// seed words `v`. For `out.len() == 624` this is the algorithm spelled out in
/// spec §7.5 (t = 11, p = 306, q = 317); other lengths follow the standard.
pub fn seed_seq_generate(v: &[u32], out: &mut [u32]) {
    let n = out.len();
    if n == 0 {
        return;
    }
    out.fill(0x8b8b_8b8b);
    let s = v.len();
    let t = if n >= 623 {
        11
    } else if n >= 68 {
        7
    } else if n >= 39 {
        5
    } else if n >= 7 {
        3
    } else {
        (n - 1) / 2
    };
    let p = (n - t) / 2;
    let q = p + t;
    let m = (s + 1).max(n);
    let tf = |x: u32| x ^ (x >> 27);

    for k in 0..m {
        let (kn, kp, kq, km1) = (k % n, (k + p) % n, (k + q) % n, (k + n - 1) % n);
        let r1 = 1_664_525u32.wrapping_mul(tf(out[kn] ^ out[kp] ^ out[km1]));
        let add = if k == 0 {
            s as u32
        } else if k <= s {
            (kn as u32).wrapping_add(v[k - 1])
        } else {
            kn as u32
        };
        let r2 = r1.wrapping_add(add);
        out[kp] = out[kp].wrapping_add(r1);
        out[kq] = out[kq].wrapping_add(r2);
        out[kn] = r2;
    }
    for k in m..m + n {
        let (kn, kp, kq, km1) = (k % n, (k + p) % n, (k + q) % n, (k + n - 1) % n);
        let sum = out[kn].wrapping_add(out[kp]).wrapping_add(out[km1]);
        let r3 = 1_566_083_941u32.wrapping_mul(tf(sum));
        let r4 = r3.wrapping_sub(kn as u32);
        out[kp] ^= r3;
        out[kq] ^= r4;
        out[kn] = r4;
    }
}

/// Two 32-bit words that differ from run to run: the wall clock hashed with
/// std's OS-seeded `RandomState` keys.
fn entropy_words() -> [u32; 2] {
    let mut h = RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    let x = h.finish();
    [x as u32, (x >> 32) as u32]
}
