//! Building drafters: a plain [`SpecConfig`] in, a [`DrafterFactory`] (what
//! the drafter needs, loaded once per process) out, and from it one drafter
//! per session. `hearth run`, `hearth serve` and the tests all build their
//! drafters here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hearth_models::dflash::{DflashModel, DraftRunner};
use hearth_models::{Backend, Model};

use super::adaptive::AdaptiveDrafter;
use super::dflash::DflashDrafter;
use super::draft_model::DraftModelDrafter;
use super::ngram::NgramDrafter;
use super::{Drafter, SpecError, SpecKind};
use crate::sampler::SamplerConfig;

/// What speculation to run: plain values (the CLI's flags, resolved).
#[derive(Clone, Debug, Default)]
pub struct SpecConfig {
    pub kind: SpecKind,
    /// The drafter's model file: a small model with the target's vocabulary
    /// (`Draft`) or a DFlash GGUF (`Dflash`).
    pub draft_model: Option<PathBuf>,
    /// DFlash block length B (2..=the draft's trained block size) [default: the trained size].
    pub block_length: Option<usize>,
    /// Most draft tokens per verify pass [default: dflash B-1, draft 3, ngram 3].
    pub n_draft: Option<usize>,
    /// Pick the draft length per cycle from recent acceptance, up to
    /// `n_draft` (and pause drafting while it does not pay): see
    /// [`super::adaptive`]. DFlash then runs blocks of K+1 positions.
    pub adaptive: bool,
}

impl SpecConfig {
    /// Checks the combination of settings before anything loads.
    pub fn check(&self) -> Result<(), SpecError> {
        let bad = |m: &str| Err(SpecError::Config(m.to_string()));
        if self.kind == SpecKind::None {
            if self.draft_model.is_some() || self.block_length.is_some() || self.n_draft.is_some() {
                return bad(
                    "--draft-model, --block-length and --n-draft need --spec dflash|draft|ngram",
                );
            }
            if self.adaptive {
                return bad("--spec-adaptive needs a drafter (--spec auto|dflash|draft|ngram)");
            }
            return Ok(());
        }
        if self.kind != SpecKind::Dflash && self.block_length.is_some() {
            return Err(SpecError::Config(format!(
                "--block-length is for --spec dflash (use --n-draft for {})",
                self.kind.as_str()
            )));
        }
        if self.n_draft == Some(0) {
            return bad("--n-draft must be at least 1");
        }
        if self.kind == SpecKind::Ngram && self.draft_model.is_some() {
            return bad("--spec ngram uses no draft model");
        }
        match (self.kind, &self.draft_model) {
            (SpecKind::Draft, None) => bad(
                "--spec draft needs --draft-model M (a small model with the target's vocabulary)",
            ),
            (SpecKind::Dflash, None) => bad("--spec dflash needs --draft-model FILE (a dflash GGUF; `hearth synth --arch dflash --target T` writes a synthetic one)"),
            _ => Ok(()),
        }
    }
}

/// What the drafters of a process share, loaded once; [`DrafterFactory::make`]
/// builds one per session. A draft model runs on the target's backend `B`.
pub struct DrafterFactory<B: Backend> {
    kind: SpecKind,
    n_draft: usize,
    block_length: Option<usize>,
    adaptive: bool,
    /// The host model: vocabulary, and DFlash's embeddings and LM head.
    target: Arc<Model>,
    source: Source<B>,
    /// Where DFlash drafts run when not on the CPU ([`DrafterFactory::with_dflash_runner`]).
    dflash_runner: Option<Arc<RunnerMaker>>,
}

/// Builds a session's DFlash draft forward on a device: (draft, positions
/// the session's context plus one block needs).
pub type RunnerMaker =
    dyn Fn(&Arc<DflashModel>, usize) -> Result<Box<dyn DraftRunner>, String> + Send + Sync;

enum Source<B> {
    Ngram,
    Draft(Arc<B>),
    Dflash(Arc<DflashModel>),
}

impl<B: Backend + 'static> DrafterFactory<B> {
    /// Loads what `config`'s drafter needs for `target`; `None` for no
    /// speculation. `load_draft` opens a draft model (`Draft`) on the
    /// target's backend.
    pub fn new(
        config: &SpecConfig,
        target: &Arc<Model>,
        load_draft: impl FnOnce(&Path) -> Result<B, String>,
    ) -> Result<Option<DrafterFactory<B>>, SpecError> {
        config.check()?;
        let missing = || SpecError::Config("no draft model given".into());
        let (source, default_k) = match config.kind {
            SpecKind::None => return Ok(None),
            SpecKind::Ngram => (Source::Ngram, 3),
            SpecKind::Draft => {
                let path = config.draft_model.as_deref().ok_or_else(missing)?;
                let m = load_draft(path).map_err(|e| {
                    SpecError::Config(format!("loading the draft model {}: {e}", path.display()))
                })?;
                if m.config().vocab_size != target.config.vocab_size {
                    return Err(SpecError::Config(format!(
                        "draft model {} has a vocabulary of {}, the target {}: they must match",
                        path.display(),
                        m.config().vocab_size,
                        target.config.vocab_size
                    )));
                }
                (Source::Draft(Arc::new(m)), 3)
            }
            SpecKind::Dflash => {
                let path = config.draft_model.as_deref().ok_or_else(missing)?;
                let d = DflashModel::load(path, target).map_err(|e| {
                    SpecError::Config(format!("loading the DFlash draft {}: {e}", path.display()))
                })?;
                let bmax = d.config.block_size;
                if let Some(b) = config.block_length {
                    if !(2..=bmax).contains(&b) {
                        return Err(SpecError::Config(format!(
                            "--block-length {b} must be in 2..={bmax} (the draft's trained block size)"
                        )));
                    }
                }
                let b = config.block_length.unwrap_or(bmax);
                if let Some(k) = config.n_draft {
                    if k > b - 1 {
                        return Err(SpecError::Config(format!(
                            "--n-draft {k} exceeds block length {b} - 1"
                        )));
                    }
                }
                (Source::Dflash(Arc::new(d)), b - 1)
            }
        };
        Ok(Some(DrafterFactory {
            kind: config.kind,
            n_draft: config.n_draft.unwrap_or(default_k),
            block_length: config.block_length,
            adaptive: config.adaptive,
            target: target.clone(),
            source,
            dflash_runner: None,
        }))
    }

    /// Runs DFlash drafts through `make` (e.g. on the GPU that holds the
    /// target) instead of on the CPU. Checked once here with a tiny state, so
    /// a draft the device cannot run fails at load with the reason.
    pub fn with_dflash_runner(mut self, make: Arc<RunnerMaker>) -> Result<Self, SpecError> {
        if let Source::Dflash(d) = &self.source {
            make(d, d.config.block_size + 1).map_err(|e| {
                SpecError::Config(format!("the DFlash draft cannot run on this device: {e}"))
            })?;
            self.dflash_runner = Some(make);
        }
        Ok(self)
    }
}

/// A drafter factory as the scheduler sees it (whatever its backend).
pub trait MakeDrafter: Send + Sync {
    fn kind(&self) -> SpecKind;
    /// K: the most draft tokens per verify pass.
    fn n_draft(&self) -> usize;
    /// Whether the drafters pick their length per cycle (up to K).
    fn adaptive(&self) -> bool;
    /// A drafter for one session with context `max_ctx`, sampling as the
    /// target does (a drafter that samples follows its temperature).
    fn make(
        &self,
        max_ctx: usize,
        sampling: &SamplerConfig,
    ) -> Result<Box<dyn Drafter + Send>, SpecError>;
}

impl<B: Backend + 'static> MakeDrafter for DrafterFactory<B> {
    fn kind(&self) -> SpecKind {
        self.kind
    }

    fn n_draft(&self) -> usize {
        self.n_draft
    }

    fn adaptive(&self) -> bool {
        self.adaptive
    }

    fn make(
        &self,
        max_ctx: usize,
        sampling: &SamplerConfig,
    ) -> Result<Box<dyn Drafter + Send>, SpecError> {
        let drafter: Box<dyn Drafter + Send> = match &self.source {
            Source::Ngram => Box::new(NgramDrafter::default()),
            Source::Draft(m) => Box::new(DraftModelDrafter::new(
                m.clone(),
                self.target.config.vocab_size,
                max_ctx,
                self.n_draft,
                sampling,
            )?),
            Source::Dflash(d) => {
                let mut drafter = match &self.dflash_runner {
                    None => DflashDrafter::new(
                        d.clone(),
                        self.target.clone(),
                        max_ctx,
                        self.block_length,
                    )?,
                    Some(make) => {
                        let runner =
                            make(d, max_ctx + d.config.block_size).map_err(SpecError::Config)?;
                        DflashDrafter::with_runner(d.clone(), runner, self.block_length)?
                    }
                };
                drafter.set_block_follows_draft(self.adaptive);
                Box::new(drafter)
            }
        };
        Ok(match self.adaptive {
            true => Box::new(AdaptiveDrafter::new(drafter, self.n_draft)),
            false => drafter,
        })
    }
}
