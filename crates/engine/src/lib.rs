//! The engine: per-session state on top of a shared, read-only model.
//!
//! - [`sampler`]: the host sampler (penalties, temperature, top-k, top-p,
//!   min-p, categorical draw), model spec §7.
//! - [`rng`]: the MT19937 + `std::seed_seq` generator the reference samples
//!   with, so seeded streams reproduce bit for bit (§7.5).

pub mod generate;
pub mod rng;
pub mod sampler;
pub mod session;
pub mod spec;
