#![allow(dead_code, unused_imports)] // each test binary uses its own part

pub mod muse_synth;
pub mod reference;

pub use muse_synth::{argmax, floats, ids};
