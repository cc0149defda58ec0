//! Output parser (`qwen3_xml`): no panic, chunking invariance, and the event
//! invariants checked in [`hearth_fuzz::check_parser`].
#![no_main]

use hearth_chat::parser::OutputFormat;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hearth_fuzz::check_parser(OutputFormat::Qwen3Xml, data));
