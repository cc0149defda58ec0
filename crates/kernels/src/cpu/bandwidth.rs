//! The machine's memory read bandwidth, measured the way decode reads
//! weights: every pool thread streams its share of a buffer far larger than
//! any last-level cache, once per pass. `hearth bench` reports decode's weight
//! bandwidth as a fraction of it (the decode roofline on this machine).

use std::time::Instant;

use crate::pool;

/// What [`read_bandwidth`] measured.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    /// Bytes per second of the fastest pass.
    pub best: f64,
    /// The buffer's size and the passes timed.
    pub bytes: usize,
    pub passes: usize,
    pub threads: usize,
}

/// Reads a `bytes`-long buffer `passes` times on the global pool (after one
/// untimed pass that also faults its pages in); the fastest pass counts, as
/// a roofline is the best the machine does.
pub fn read_bandwidth(bytes: usize, passes: usize) -> Bandwidth {
    let words = (bytes / 8).max(1 << 10);
    // Filled with non-zero data so no page is a shared zero page.
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let pool = pool::global();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let pass = || {
        pool.run(|i, nt| {
            let part = &buf[pool::share(words, i, nt)];
            // Eight independent sums: loads are the only dependency chain.
            let mut acc = [0u64; 8];
            let chunks = part.chunks_exact(8);
            let rest = chunks.remainder();
            for c in chunks {
                for k in 0..8 {
                    acc[k] = acc[k].wrapping_add(c[k]);
                }
            }
            let s = acc.iter().chain(rest).fold(0u64, |a, &b| a.wrapping_add(b));
            sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
    };
    pass();
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let t0 = Instant::now();
        pass();
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    Bandwidth {
        best,
        bytes: words * 8,
        passes: passes.max(1),
        threads: pool.n_threads(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_something_plausible() {
        let b = read_bandwidth(8 << 20, 2);
        assert_eq!(b.bytes, 8 << 20);
        // Between 100 MB/s and 10 TB/s on any machine this runs on.
        assert!(b.best > 1e8 && b.best < 1e13, "{}", b.best);
    }
}
