pub mod inspect;
pub mod pull;
