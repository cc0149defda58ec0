//! A persistent worker pool for the forward pass. Every op hands the same
//! closure to all threads (`run(|thread, n_threads| ...)`), each thread takes
//! its static share of the work, and `run` returns when all are done: one
//! atomic epoch bump to start, one counter to finish. Workers spin briefly
//! between ops (ops follow each other within microseconds during decode) and
//! park on a condvar when idle, so an idle runtime costs no CPU.
//!
//! Per-op overhead is what matters: decoding a 135M model runs ~300 ops per
//! token, so a general-purpose task system's tens of microseconds per op would
//! dominate the step.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Spins before a worker parks (about 50–100 µs on current CPUs).
const SPINS_BEFORE_PARK: u32 = 1 << 15;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    n_threads: usize,
    /// The current job; written by `run` before bumping `epoch`, read by
    /// workers after observing the bump.
    job: UnsafeCell<Option<*const Job>>,
    epoch: AtomicUsize,
    /// Workers that finished the current epoch.
    done: AtomicUsize,
    shutdown: AtomicBool,
    sleepers: Mutex<usize>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the thread inside `run` while no worker
// reads it (all workers finished the previous epoch, checked via `done`), and
// only read by workers between an epoch bump and their `done` increment.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes concurrent callers of `run` (the pool runs one op at a time).
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` (including the calling thread, which does share 0).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            job: UnsafeCell::new(None),
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|idx| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("hearth-worker-{idx}"))
                    .spawn(move || worker(s, idx))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(thread, n_threads)` on every thread of the pool and returns
    /// when all calls have returned. Not reentrant: `f` must not call `run`.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let s = &*self.shared;
        if s.n_threads == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: lifetime erasure. `f` outlives every use: this function does
        // not return before all workers have reported done for this epoch.
        let job: *const Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static Job>(job)
        };
        unsafe { *s.job.get() = Some(job) };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        {
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        f(0, s.n_threads);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < s.n_threads - 1 {
            spin(&mut spins);
        }
        unsafe { *s.job.get() = None };
    }
}

/// One step of a spin-wait. Yields to the OS now and then, so that a pool
/// with more threads than free cores still makes progress.
#[inline]
fn spin(spins: &mut u32) {
    *spins += 1;
    if (*spins).is_multiple_of(256) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn worker(s: Arc<Shared>, idx: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin, then park.
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen || s.shutdown.load(Ordering::Relaxed) {
                break e;
            }
            if spins < SPINS_BEFORE_PARK {
                spin(&mut spins);
            } else {
                let mut sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
                *sleepers += 1;
                while s.epoch.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Relaxed)
                {
                    sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                }
                *sleepers -= 1;
                spins = 0;
            }
        };
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch;
        // SAFETY: see `Shared`; the job pointer is valid until we report done.
        let job = unsafe { (*s.job.get()).expect("a job is set for every epoch") };
        unsafe { (*job)(idx, s.n_threads) };
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        {
            let _sleepers = self
                .shared
                .sleepers
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer handed to every thread of a pool job, for jobs whose
/// threads write disjoint parts of one buffer (the caller guarantees it).
pub struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only the address crosses threads; writers keep to disjoint ranges.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// The share of `0..total` that thread `idx` of `n` handles (contiguous,
/// sizes differ by at most one).
pub fn share(total: usize, idx: usize, n: usize) -> Range<usize> {
    let base = total / n;
    let extra = total % n;
    let start = idx * base + idx.min(extra);
    start..start + base + usize::from(idx < extra)
}

static GLOBAL: OnceLock<ThreadPool> = OnceLock::new();

/// Sizes the process-wide pool; returns false if it already exists.
pub fn init_global(n_threads: usize) -> bool {
    tune_allocator();
    GLOBAL.set(ThreadPool::new(n_threads)).is_ok()
}

/// Keeps freed activation buffers in the process (glibc otherwise returns
/// every large block to the kernel with munmap, and each forward step pays
/// page faults and page zeroing for its multi-megabyte buffers again).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// The process-wide pool (all available cores unless `init_global` ran first).
pub fn global() -> &'static ThreadPool {
    GLOBAL.get_or_init(|| {
        tune_allocator();
        ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn shares_cover_the_range_exactly() {
        for total in 0..50 {
            for n in 1..7 {
                let mut next = 0;
                for i in 0..n {
                    let r = share(total, i, n);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn every_thread_runs_every_job_once() {
        for n in [1, 2, 3, 5] {
            let jobs = if n > 2 { 200 } else { 2000 };
            let pool = ThreadPool::new(n);
            let sum = AtomicU64::new(0);
            for job in 0..jobs {
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    sum.fetch_add(job * 10 + i as u64, Ordering::Relaxed);
                });
            }
            let per_job: u64 = (0..n as u64).sum();
            let want: u64 = (0..jobs).map(|j| j * 10 * n as u64 + per_job).sum();
            assert_eq!(sum.load(Ordering::Relaxed), want);
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(3);
        let count = AtomicU64::new(0);
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 6);
    }
}
