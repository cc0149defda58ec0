pub mod bench;
pub mod inspect;
pub mod parse;
pub mod pull;
pub mod run;
pub mod serve;
pub mod synth;
pub mod template;
