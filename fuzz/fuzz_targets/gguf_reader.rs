//! GGUF reader on arbitrary bytes, and what loads from a GGUF's metadata (chat
//! template, tokenizer): errors, never panics. See [`hearth_fuzz::check_gguf`].
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hearth_fuzz::check_gguf(data));
