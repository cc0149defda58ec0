//! Speculative-decoding flags shared by `hearth run` and `hearth serve`. They
//! resolve to the engine's plain `SpecConfig`; the engine's factory builds
//! the drafters (`hearth_engine::spec::factory`).

use anyhow::{bail, Result};
use hearth_engine::spec::factory::SpecConfig;
use hearth_engine::spec::SpecKind;

use crate::device::Device;

#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: none, dflash (a DFlash draft GGUF, --draft-model),
    /// draft (a small model with the same vocabulary, --draft-model) or ngram
    /// (prompt lookup, no extra model). Output is the same as without it.
    #[arg(long, default_value = "none", value_parser = parse_kind)]
    pub spec: SpecKind,
    /// The drafter's model: a model name or .gguf path (draft), or a dflash GGUF (dflash).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// DFlash block length B (2..=the draft's trained block size) [default: the trained size].
    #[arg(long)]
    pub block_length: Option<usize>,
    /// Most draft tokens per verify pass [default: dflash B-1, draft 3, ngram 3].
    #[arg(long)]
    pub n_draft: Option<usize>,
}

fn parse_kind(s: &str) -> Result<SpecKind, String> {
    SpecKind::parse(s).ok_or_else(|| format!("unknown --spec '{s}' (none, dflash, draft, ngram)"))
}

impl SpecArgs {
    /// The engine's configuration for these flags on `device`, the draft
    /// model's name resolved to a file (downloading a packaged one). Fails
    /// before anything loads on a bad combination, and for drafters the device
    /// cannot serve: DFlash reads the target's hidden states, which only the
    /// CPU backend taps.
    pub fn config(&self, device: Device) -> Result<SpecConfig> {
        if device == Device::Cuda && self.spec == SpecKind::Dflash {
            bail!(
                "--spec dflash needs the target's hidden states, which the CUDA backend does not expose: \
                 use --device cpu, or --spec ngram|draft with --device cuda"
            );
        }
        let mut config = SpecConfig {
            kind: self.spec,
            draft_model: None,
            block_length: self.block_length,
            n_draft: self.n_draft,
        };
        config.draft_model = self.draft_model.as_ref().map(std::path::PathBuf::from);
        config.check()?;
        if let (SpecKind::Draft, Some(name)) = (self.spec, &self.draft_model) {
            config.draft_model = Some(crate::registry::resolve_model(Some(name))?);
        }
        Ok(config)
    }
}
