//! What `hearth run` shows on a terminal while it waits: a spinner while
//! the model loads, the prefill's percentage while a long prompt is read.
//! Both go to stderr and only when stderr is a terminal, so
//! `hearth run -f big.txt > out` keeps stdout (and a redirected stderr) clean.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A spinner with a label, until dropped (then its line is cleared).
pub struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    pub fn start(label: String) -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::io::stderr().is_terminal().then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                // Quick loads show nothing.
                std::thread::sleep(Duration::from_millis(150));
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    eprint!("\r{} {label}", FRAMES[i % FRAMES.len()]);
                    let _ = std::io::stderr().flush();
                    i += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                if i > 0 {
                    eprint!("\r\x1b[K");
                    let _ = std::io::stderr().flush();
                }
            })
        });
        Spinner { stop, thread }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The prefill's percentage on one stderr line (prompts of more than one
/// chunk, on a terminal); cleared when the prompt is done.
pub struct Prefill {
    shown: bool,
    on: bool,
}

impl Prefill {
    pub fn new(total: usize) -> Prefill {
        Prefill {
            shown: false,
            on: total > hearth_models::MAX_CHUNK && std::io::stderr().is_terminal(),
        }
    }

    /// `done` of `total` prompt tokens are in.
    pub fn update(&mut self, done: usize, total: usize) {
        if !self.on {
            return;
        }
        if done >= total {
            self.clear();
            return;
        }
        eprint!(
            "\r\x1b[2mreading the prompt: {}% ({done}/{total} tokens)\x1b[0m",
            done * 100 / total.max(1)
        );
        let _ = std::io::stderr().flush();
        self.shown = true;
    }

    pub fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
            self.shown = false;
        }
    }
}

impl Drop for Prefill {
    fn drop(&mut self) {
        self.clear();
    }
}
