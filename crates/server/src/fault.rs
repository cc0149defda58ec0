//! Fault injection for the robustness tests (tests/server/fuzz_server.py):
//! with `HEARTH_FAULT_INJECTION=1` in the server's environment, a request
//! header `x-hearth-fault: panic-handler` panics in that request's handler
//! and `x-hearth-fault: panic-engine` in the engine's step of its turn. The
//! request must get a 500 (or, streamed, an error event) and the process,
//! the other requests and their sessions must carry on. Off (the header is
//! ignored) unless the variable is set when the server starts.

use std::sync::OnceLock;

use axum::http::HeaderMap;
use hearth_engine::turn::TokenConstraint;

/// Where a request asked to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Handler,
    Engine,
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("HEARTH_FAULT_INJECTION").is_ok_and(|v| v == "1"))
}

/// The fault a request asks for, when injection is on.
pub fn requested(headers: &HeaderMap) -> Option<Fault> {
    if !enabled() {
        return None;
    }
    match headers.get("x-hearth-fault")?.to_str().ok()? {
        "panic-handler" => Some(Fault::Handler),
        "panic-engine" => Some(Fault::Engine),
        _ => None,
    }
}

/// Panics in the handler when the request asks for it.
pub fn maybe_panic_in_handler(headers: &HeaderMap) {
    if requested(headers) == Some(Fault::Handler) {
        panic!("injected fault (x-hearth-fault: panic-handler)");
    }
}

/// A constraint that panics at the turn's first sampled token: the
/// engine-side fault.
struct PanicsInEngine;

impl TokenConstraint for PanicsInEngine {
    fn mask(&mut self, _logits: &mut [f32]) -> Result<(), String> {
        panic!("injected fault (x-hearth-fault: panic-engine)");
    }

    fn commit(&mut self, _token: u32) -> Result<(), String> {
        Ok(())
    }
}

/// The request's constraint, or the panicking one when it asks for an
/// engine fault.
pub fn engine_constraint(
    headers: &HeaderMap,
    constraint: Option<Box<dyn TokenConstraint>>,
) -> Option<Box<dyn TokenConstraint>> {
    if requested(headers) == Some(Fault::Engine) {
        return Some(Box::new(PanicsInEngine));
    }
    constraint
}
