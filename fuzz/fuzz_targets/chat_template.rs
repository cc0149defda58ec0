//! Chat template rendering: the packaged models' Jinja templates and the
//! built-in Muse Glimmer renderer on arbitrary conversations, and arbitrary
//! template sources. Errors, never panics. See [`hearth_fuzz::check_template`].
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hearth_fuzz::check_template(data));
