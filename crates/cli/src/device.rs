//! `--device`: which backend runs the model. The CUDA backend lives in the
//! hearth-cuda crate behind the `cuda` feature; this file is the only place
//! the CLI asks which backend it has.

use anyhow::Result;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

/// Fails clearly when `--device cuda` was asked of a build without the feature.
pub fn check(device: Device) -> Result<()> {
    if device == Device::Cuda && !cfg!(feature = "cuda") {
        anyhow::bail!("--device cuda: this hearth was built without CUDA support (build with `--features cuda`)");
    }
    Ok(())
}
