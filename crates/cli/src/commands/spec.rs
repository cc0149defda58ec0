//! Speculative-decoding flags shared by `hearth run` and `hearth serve`, and
//! building the chosen drafter.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hearth_engine::sampler::SamplerConfig;
use hearth_engine::spec::dflash::DflashDrafter;
use hearth_engine::spec::draft_model::DraftModelDrafter;
use hearth_engine::spec::ngram::NgramDrafter;
use hearth_engine::spec::{Drafter, SpecKind};
use hearth_models::dflash::DflashModel;
use hearth_models::{Backend, Model};

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

/// What a session needs to speculate: the drafter and K.
pub struct SpecSetup {
    pub drafter: Box<dyn Drafter + Send>,
    pub n_draft: usize,
}

/// Loaded once per process; `make` builds a drafter per session. A draft
/// model runs on the target's backend `B`.
pub enum DrafterFactory<B: Backend> {
    Ngram,
    Draft(Arc<B>),
    Dflash(Arc<DflashModel>),
}

impl SpecArgs {
    /// Checks the flags before anything loads, and refuses drafters the
    /// device cannot serve: DFlash reads the target's hidden states, which
    /// only the CPU backend taps.
    pub fn check(&self, device: Device) -> Result<()> {
        self.check_flags()?;
        if device == Device::Cuda && self.spec == SpecKind::Dflash {
            bail!(
                "--spec dflash needs the target's hidden states, which the CUDA backend does not expose: \
                 use --device cpu, or --spec ngram|draft with --device cuda"
            );
        }
        Ok(())
    }

    fn check_flags(&self) -> Result<()> {
        if self.spec == SpecKind::None {
            if self.draft_model.is_some() || self.block_length.is_some() || self.n_draft.is_some() {
                bail!("--draft-model, --block-length and --n-draft need --spec dflash|draft|ngram");
            }
            return Ok(());
        }
        if self.spec != SpecKind::Dflash && self.block_length.is_some() {
            bail!(
                "--block-length is for --spec dflash (use --n-draft for {})",
                self.spec.as_str()
            );
        }
        if self.n_draft == Some(0) {
            bail!("--n-draft must be at least 1");
        }
        if self.spec == SpecKind::Ngram && self.draft_model.is_some() {
            bail!("--spec ngram uses no draft model");
        }
        Ok(())
    }

    /// Loads whatever the drafter needs, checks the flags; `None` for `--spec
    /// none`. `load_draft` puts a draft model (`--spec draft`) on the target's backend.
    pub fn factory<B: Backend>(
        &self,
        target: &Model,
        load_draft: impl FnOnce(&Path) -> Result<B>,
    ) -> Result<Option<DrafterFactory<B>>> {
        self.check_flags()?;
        if self.spec == SpecKind::None {
            return Ok(None);
        }
        Ok(Some(match self.spec {
            SpecKind::None => unreachable!(),
            SpecKind::Ngram => DrafterFactory::Ngram,
            SpecKind::Draft => {
                let name = self.draft_model.as_deref().context("--spec draft needs --draft-model M (a small model with the target's vocabulary)")?;
                let path = crate::registry::resolve_model(Some(name))?;
                let m = load_draft(&path)
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                if m.config().vocab_size != target.config.vocab_size {
                    bail!(
                        "draft model {} has a vocabulary of {}, the target {}: they must match",
                        path.display(),
                        m.config().vocab_size,
                        target.config.vocab_size
                    );
                }
                DrafterFactory::Draft(Arc::new(m))
            }
            SpecKind::Dflash => {
                let path = self.draft_model.as_deref().context("--spec dflash needs --draft-model FILE (a dflash GGUF; `hearth synth --arch dflash --target T` writes a synthetic one)")?;
                let d = DflashModel::load(path, target)
                    .with_context(|| format!("loading the DFlash draft {path}"))?;
                let bmax = d.config.block_size;
                if let Some(b) = self.block_length {
                    if !(2..=bmax).contains(&b) {
                        bail!("--block-length {b} must be in 2..={bmax} (the draft's trained block size)");
                    }
                }
                let b = self.block_length.unwrap_or(bmax);
                if let Some(k) = self.n_draft {
                    if k > b - 1 {
                        bail!("--n-draft {k} exceeds block length {b} - 1");
                    }
                }
                DrafterFactory::Dflash(Arc::new(d))
            }
        }))
    }

    /// K for this configuration.
    pub fn n_draft<B: Backend>(&self, factory: &DrafterFactory<B>) -> usize {
        match factory {
            DrafterFactory::Ngram => self.n_draft.unwrap_or(3),
            DrafterFactory::Draft(_) => self.n_draft.unwrap_or(3),
            DrafterFactory::Dflash(d) => self
                .n_draft
                .unwrap_or(self.block_length.unwrap_or(d.config.block_size) - 1),
        }
    }
}

impl<B: Backend + 'static> DrafterFactory<B> {
    /// A drafter for one session of `target` (the host model: vocabulary,
    /// DFlash's embeddings and head) with context `max_ctx`.
    pub fn make(
        &self,
        args: &SpecArgs,
        target: &Arc<Model>,
        max_ctx: usize,
        sampling: &SamplerConfig,
    ) -> Result<SpecSetup> {
        let n_draft = args.n_draft(self);
        let drafter: Box<dyn Drafter + Send> = match self {
            DrafterFactory::Ngram => Box::new(NgramDrafter::default()),
            DrafterFactory::Draft(m) => Box::new(DraftModelDrafter::new(
                m.clone(),
                target.config.vocab_size,
                max_ctx,
                n_draft,
                sampling,
            )?),
            DrafterFactory::Dflash(d) => Box::new(DflashDrafter::new(
                d.clone(),
                target.clone(),
                max_ctx,
                args.block_length,
            )?),
        };
        Ok(SpecSetup { drafter, n_draft })
    }
}
