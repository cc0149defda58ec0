pub mod bench;
pub mod inspect;
pub mod pull;
pub mod run;
pub mod synth;
