//! The engine: per-session state on top of a shared, read-only model, and
//! the one machine that generates with it.
//!
//! - [`turn`]: a generation turn, step by step (prefill chunks, decode
//!   tokens or speculative cycles; end of generation, stop strings, budget,
//!   streaming text). Every driver uses it.
//! - [`scheduler`]: the thread that owns a model and many sessions and
//!   interleaves their turns (the server talks to it through a channel).
//! - [`session`]: a conversation's KV state and resident ids; the store that
//!   hosts many on one model load.
//! - [`prompt`]: a prompt's ids and the encoded images placed among them.
//! - [`generate`]: a whole turn in one call (tests, examples, benchmarks).
//! - [`spec`]: speculative decoding (drafters, verification, the factory).
//! - [`sampler`]: the host sampler (penalties, temperature, top-k, top-p,
//!   min-p, categorical draw), model spec §7.
//! - [`rng`]: the MT19937 + `std::seed_seq` generator the reference samples
//!   with, so seeded streams reproduce bit for bit (§7.5).

pub mod generate;
pub mod prompt;
pub mod rng;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod spec;
pub mod turn;
