//! Prometheus text-format counters (`GET /metrics`). Rates are derived from
//! token and second counters, so they are exact over the server's lifetime.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use std::sync::Arc;

use hearth_engine::scheduler::SchedulerStats;

/// Request counters kept by the HTTP side, and the scheduler's own
/// (tokens, timings, sessions, speculation).
#[derive(Default)]
pub struct Metrics {
    /// (endpoint, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub engine: Arc<SchedulerStats>,
    /// Output that began like a tool call but was not one (returned as content).
    pub tool_call_parse_warnings: AtomicU64,
    /// The served model's name, the `model_name` label of the gateway-named
    /// series (`sglang:*`, `vllm:*`); set once at start.
    pub model_name: std::sync::OnceLock<String>,
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// Speculative decoding counters (nothing when speculation is off).
    fn render_spec(&self, s: &mut String) {
        let Some(info) = self
            .engine
            .spec_config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return;
        };
        let st = self
            .engine
            .spec
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let _ = writeln!(s, "# HELP hearth_spec_info Speculative decoding: the drafter, the most draft tokens per verify pass, and whether the length per cycle adapts to acceptance.\n# TYPE hearth_spec_info gauge\nhearth_spec_info{{spec=\"{}\",n_draft=\"{}\",adaptive=\"{}\"}} 1", info.kind, info.n_draft, info.adaptive);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "hearth_spec_target_forwards_total",
            "Target verify passes (one per speculative cycle).",
            st.target_forwards,
        );
        counter(
            "hearth_spec_drafted_tokens_total",
            "Draft tokens proposed.",
            st.drafted,
        );
        counter(
            "hearth_spec_accepted_tokens_total",
            "Draft tokens accepted by verification.",
            st.accepted,
        );
        counter(
            "hearth_spec_undrafted_steps_total",
            "Verify passes that carried no draft (plain target steps: an adaptive pause, nothing to propose).",
            st.undrafted(),
        );
        let _ = writeln!(s, "# HELP hearth_spec_mean_accepted Mean draft tokens accepted per verify pass.\n# TYPE hearth_spec_mean_accepted gauge\nhearth_spec_mean_accepted {}", st.mean_accepted());
        let _ = writeln!(s, "# HELP hearth_spec_tokens_per_target_forward Tokens committed per target verify pass.\n# TYPE hearth_spec_tokens_per_target_forward gauge\nhearth_spec_tokens_per_target_forward {}", st.tokens_per_forward());
        let _ = writeln!(s, "# HELP hearth_spec_acceptance_by_position Fraction of drafts accepted at each draft position (0-based).\n# TYPE hearth_spec_acceptance_by_position gauge");
        for (i, a) in st.acceptance_by_position().iter().enumerate() {
            let _ = writeln!(
                s,
                "hearth_spec_acceptance_by_position{{position=\"{i}\"}} {a}"
            );
        }
        for (name, help, v) in [
            (
                "hearth_spec_drafted_at_position_total",
                "Cycles that drafted a token at each draft position (0-based).",
                &st.drafted_at,
            ),
            (
                "hearth_spec_accepted_at_position_total",
                "Cycles whose draft token at each position (0-based) was accepted.",
                &st.accepted_at,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, n) in v.iter().enumerate() {
                let _ = writeln!(s, "{name}{{position=\"{i}\"}} {n}");
            }
        }
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
            get(&self.engine.prompt_tokens),
        );
        counter(
            "hearth_completion_tokens_total",
            "Generated tokens.",
            get(&self.engine.completion_tokens),
        );
        counter(
            "hearth_reused_prompt_tokens_total",
            "Prompt tokens reused from resident session KV (not prefilled).",
            get(&self.engine.reused_prompt_tokens),
        );
        counter(
            "hearth_prefill_tokens_total",
            "Prompt tokens prefilled.",
            get(&self.engine.prefill_tokens),
        );
        counter(
            "hearth_decode_tokens_total",
            "Tokens produced by single-token decode steps.",
            get(&self.engine.decode_tokens),
        );
        counter(
            "hearth_session_evictions_total",
            "Idle sessions evicted (least recently used) to make room.",
            get(&self.engine.session_evictions),
        );
        counter(
            "hearth_session_spills_total",
            "Evicted sessions kept in --session-dir (their KV written to disk).",
            get(&self.engine.session_spills),
        );
        counter(
            "hearth_session_unspills_total",
            "Evicted sessions brought back from --session-dir on their next request.",
            get(&self.engine.session_unspills),
        );
        counter(
            "hearth_shared_prefix_tokens_total",
            "Prompt tokens copied from another session's KV (the shared prefix cache) instead of prefilled.",
            get(&self.engine.shared_prefix_tokens),
        );
        counter(
            "hearth_forward_passes_total",
            "Forward passes of the scheduler's batched steps (each carries the next rows of one or more sessions).",
            get(&self.engine.forward_passes),
        );
        counter(
            "hearth_forward_pass_sequences_total",
            "Sessions carried by those passes, summed (divided by the passes: the mean batch size).",
            get(&self.engine.forward_pass_sequences),
        );
        counter(
            "hearth_forward_pass_rows_total",
            "Rows (tokens) carried by those passes, summed.",
            get(&self.engine.forward_pass_rows),
        );
        counter(
            "hearth_cancelled_requests_total",
            "Requests stopped because the client went away.",
            get(&self.engine.cancelled_requests),
        );
        counter(
            "hearth_cancelled_prefill_tokens_total",
            "Prompt tokens never prefilled because the client went away during the prefill (it stops within one 512-token chunk).",
            get(&self.engine.cancelled_prefill_tokens),
        );
        counter(
            "hearth_tool_call_parse_warnings_total",
            "Model output that began like a tool call but was malformed or cut off; returned as content.",
            get(&self.tool_call_parse_warnings),
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
            rate(
                get(&self.engine.prefill_tokens),
                get(&self.engine.prefill_us),
            ),
        );
        gauge(
            "hearth_decode_tokens_per_second",
            "Decode throughput (all sessions together) over the server's lifetime.",
            rate(get(&self.engine.decode_tokens), get(&self.engine.decode_us)),
        );
        gauge(
            "hearth_active_sessions",
            "Sessions holding a KV state.",
            get(&self.engine.live_sessions) as f64,
        );
        gauge(
            "hearth_session_capacity",
            "Most KV states the server holds at once.",
            get(&self.engine.session_capacity) as f64,
        );
        gauge(
            "hearth_active_generations",
            "Requests being prefilled or decoded.",
            get(&self.engine.active_generations) as f64,
        );
        let (running, waiting) = (
            get(&self.engine.active_generations),
            get(&self.engine.waiting_requests),
        );
        let (kv, kv_cap) = (
            get(&self.engine.kv_tokens),
            get(&self.engine.kv_capacity_tokens),
        );
        let usage = if kv_cap == 0 {
            0.0
        } else {
            kv as f64 / kv_cap as f64
        };
        gauge(
            "hearth_waiting_requests",
            "Requests waiting to start (their session busy, or no room).",
            waiting as f64,
        );
        gauge(
            "hearth_kv_tokens",
            "Positions held in the sessions' KV caches.",
            kv as f64,
        );
        gauge(
            "hearth_kv_capacity_tokens",
            "Positions the KV states can hold (states x context).",
            kv_cap as f64,
        );
        // The same load under the names gateways scrape: SGLang's (SGLang
        // Model Gateway) and vLLM's (llm-d's endpoint picker, KServe).
        let model = self.model_name.get().map_or("", String::as_str);
        let label = format!(
            "{{model_name=\"{}\"}}",
            model.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let mut labelled = |name: &str, help: &str, v: f64| {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{label} {v}"
            );
        };
        labelled(
            "sglang:num_running_reqs",
            "Requests running (hearth_active_generations).",
            running as f64,
        );
        labelled(
            "sglang:num_queue_reqs",
            "Requests queued (hearth_waiting_requests).",
            waiting as f64,
        );
        labelled(
            "sglang:num_used_tokens",
            "KV positions in use (hearth_kv_tokens).",
            kv as f64,
        );
        labelled(
            "sglang:token_usage",
            "Share of the KV positions in use.",
            usage,
        );
        labelled(
            "vllm:num_requests_running",
            "Requests running (hearth_active_generations).",
            running as f64,
        );
        labelled(
            "vllm:num_requests_waiting",
            "Requests waiting (hearth_waiting_requests).",
            waiting as f64,
        );
        labelled(
            "vllm:kv_cache_usage_perc",
            "Share of the KV positions in use (0-1).",
            usage,
        );
        self.render_spec(&mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_engine::scheduler::SpecInfo;

    #[test]
    fn spec_series_carry_counts_per_position() {
        let m = Metrics::default();
        assert!(
            !m.render().contains("hearth_spec_"),
            "no speculation, no series"
        );
        *m.engine.spec_config.lock().unwrap() = Some(SpecInfo {
            kind: "dflash".into(),
            n_draft: 3,
            adaptive: true,
        });
        {
            let mut st = m.engine.spec.lock().unwrap();
            st.record(3, 1); // drafted at 0,1,2; accepted at 0
            st.record(2, 2); // drafted at 0,1; accepted at 0,1
            st.record(0, 0); // a plain step
        }
        let text = m.render();
        for line in [
            "hearth_spec_info{spec=\"dflash\",n_draft=\"3\",adaptive=\"true\"} 1",
            "hearth_spec_target_forwards_total 3",
            "hearth_spec_undrafted_steps_total 1",
            "hearth_spec_drafted_at_position_total{position=\"0\"} 2",
            "hearth_spec_drafted_at_position_total{position=\"2\"} 1",
            "hearth_spec_accepted_at_position_total{position=\"0\"} 2",
            "hearth_spec_accepted_at_position_total{position=\"1\"} 1",
            "hearth_spec_accepted_at_position_total{position=\"2\"} 0",
            "hearth_spec_acceptance_by_position{position=\"1\"} 0.5",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }
}
