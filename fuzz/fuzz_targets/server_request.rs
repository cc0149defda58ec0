//! Request decoding of `/v1/chat/completions` and `/v1/completions`, and of
//! the Anthropic, Ollama and Responses bodies translated onto them
//! (crates/server/src/request.rs): any body gives a request or a 4xx error
//! naming what was wrong, never a panic or a 5xx.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hearth_fuzz::check_request(data));
