pub mod muse_synth;
