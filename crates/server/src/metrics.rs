//! Prometheus text-format counters (`GET /metrics`). Rates are derived from
//! token and second counters, so they are exact over the server's lifetime.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    /// (endpoint, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Prompt tokens served from a session's resident KV.
    pub reused_prompt_tokens: AtomicU64,
    /// Tokens prefilled and the time spent (µs).
    pub prefill_tokens: AtomicU64,
    pub prefill_us: AtomicU64,
    /// Tokens from single-token decode passes and the time spent (µs).
    pub decode_tokens: AtomicU64,
    pub decode_us: AtomicU64,
    pub live_sessions: AtomicU64,
    pub active_generations: AtomicU64,
    pub session_evictions: AtomicU64,
    pub session_capacity: AtomicU64,
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP hearth_requests_total HTTP requests by endpoint and status."
        );
        let _ = writeln!(s, "# TYPE hearth_requests_total counter");
        for ((endpoint, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                s,
                "hearth_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "hearth_prompt_tokens_total",
            "Prompt tokens of completed requests.",
            get(&self.prompt_tokens),
        );
        counter(
            "hearth_completion_tokens_total",
            "Generated tokens.",
            get(&self.completion_tokens),
        );
        counter(
            "hearth_reused_prompt_tokens_total",
            "Prompt tokens reused from resident session KV (not prefilled).",
            get(&self.reused_prompt_tokens),
        );
        counter(
            "hearth_prefill_tokens_total",
            "Prompt tokens prefilled.",
            get(&self.prefill_tokens),
        );
        counter(
            "hearth_decode_tokens_total",
            "Tokens produced by single-token decode steps.",
            get(&self.decode_tokens),
        );
        counter(
            "hearth_session_evictions_total",
            "Idle sessions evicted (least recently used) to make room.",
            get(&self.session_evictions),
        );
        let rate = |tokens: u64, us: u64| {
            if us == 0 {
                0.0
            } else {
                tokens as f64 / (us as f64 / 1e6)
            }
        };
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "hearth_prefill_tokens_per_second",
            "Prefill throughput over the server's lifetime.",
            rate(get(&self.prefill_tokens), get(&self.prefill_us)),
        );
        gauge(
            "hearth_decode_tokens_per_second",
            "Decode throughput (all sessions together) over the server's lifetime.",
            rate(get(&self.decode_tokens), get(&self.decode_us)),
        );
        gauge(
            "hearth_active_sessions",
            "Sessions holding a KV state.",
            get(&self.live_sessions) as f64,
        );
        gauge(
            "hearth_session_capacity",
            "Most KV states the server holds at once.",
            get(&self.session_capacity) as f64,
        );
        gauge(
            "hearth_active_generations",
            "Requests being prefilled or decoded.",
            get(&self.active_generations) as f64,
        );
        s
    }
}
