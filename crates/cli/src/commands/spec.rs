//! Speculative-decoding flags shared by `hearth run` and `hearth serve`. They
//! resolve to the engine's plain `SpecConfig`; the engine's factory builds
//! the drafters (`hearth_engine::spec::factory`).
//!
//! `--spec auto` (the default for `run`): on the CPU, prompt lookup (n-gram
//! drafts of up to [`AUTO_LOOKUP_K`] tokens) for any model, adaptive: its
//! length follows the acceptance and it drafts only while its cycles beat
//! plain steps, so it never costs more than a few probing cycles. On CUDA, the
//! target's packaged DFlash drafter when the registry has one
//! (models/registry.json, `drafters`), else plain decoding. (The DFlash
//! drafter is not used on the CPU: there its draft forward and the wider
//! verify pass cost more than its accepted tokens save; BENCHMARKS.md
//! "Speculative decoding".)

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use hearth_engine::spec::factory::SpecConfig;
use hearth_engine::spec::SpecKind;

use crate::device::Device;
use crate::registry::{models_dir, registry, PackagedModel, Registry};
use crate::store::{self, ModelName};

/// The most tokens `--spec auto`'s prompt lookup drafts per cycle on the
/// CPU (held-out coding prompts, qwen2.5-coder-0.5b, 2 threads: 4 gave 1.27x,
/// 8 1.26x; on three non-code prompts 1.23x and 1.15x).
pub const AUTO_LOOKUP_K: usize = 4;

/// What `--spec` asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecChoice {
    /// The target's packaged drafter if it has one, else none.
    #[default]
    Auto,
    Kind(SpecKind),
}

#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: auto (CPU: prompt lookup, adaptive, for any
    /// model; CUDA: the target's packaged DFlash drafter, else none), none, dflash (a DFlash draft GGUF: --draft-model, or the
    /// target's packaged drafter), draft (a small model with the same
    /// vocabulary, --draft-model) or ngram (prompt lookup, no extra model).
    /// Output is the same as without it. [default: auto for `run`; none for
    /// `serve`, whose speculating sessions would not join the batched passes
    /// of other sessions]
    #[arg(long, value_parser = parse_choice)]
    pub spec: Option<SpecChoice>,
    /// What no `--spec` means (`serve` sets none).
    #[arg(skip)]
    pub unset_means: SpecChoice,
    /// The drafter's model: a model name or .gguf path (draft), or a dflash
    /// GGUF (dflash; default: the target's packaged drafter).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// DFlash block length B (2..=the draft's trained block size) [default: the trained size].
    #[arg(long)]
    pub block_length: Option<usize>,
    /// Most draft tokens per verify pass [default: dflash B-1, draft 3, ngram 3].
    #[arg(long)]
    pub n_draft: Option<usize>,
    /// Pick the number of draft tokens per cycle from recent acceptance (up
    /// to --n-draft; DFlash then runs blocks of that length plus one), and
    /// decode plainly for a while when drafts are mostly rejected. Output is
    /// unchanged; only speed. [default: on for --spec auto, off for an
    /// explicit --spec, which then drafts exactly --n-draft tokens per cycle]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub spec_adaptive: Option<bool>,
}

fn parse_choice(s: &str) -> Result<SpecChoice, String> {
    if s == "auto" {
        return Ok(SpecChoice::Auto);
    }
    SpecKind::parse(s)
        .map(SpecChoice::Kind)
        .ok_or_else(|| format!("unknown --spec '{s}' (auto, none, dflash, draft, ngram)"))
}

/// The model being served: as named on the command line (`None`: the
/// default) and the file it resolved to.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub arg: Option<&'a str>,
    pub path: &'a Path,
}

impl SpecArgs {
    /// The flags' own consistency, before the target is resolved (nothing is
    /// loaded or downloaded for a bad combination).
    pub fn precheck(&self, _device: Device) -> Result<()> {
        match self.choice() {
            SpecChoice::Auto => {
                if self.draft_model.is_some() {
                    bail!("--draft-model needs --spec dflash|draft (--spec auto uses the target's packaged drafter)");
                }
                if self.n_draft == Some(0) {
                    bail!("--n-draft must be at least 1");
                }
                Ok(())
            }
            SpecChoice::Kind(kind) => {
                let mut c = self.explicit(kind);
                if kind == SpecKind::Dflash && c.draft_model.is_none() {
                    // Checked once the target's packaged drafter is known.
                    c.draft_model = Some(PathBuf::new());
                }
                Ok(c.check()?)
            }
        }
    }

    /// `--spec`, or what its absence means for this command.
    pub fn choice(&self) -> SpecChoice {
        self.spec.unwrap_or(self.unset_means)
    }

    fn explicit(&self, kind: SpecKind) -> SpecConfig {
        SpecConfig {
            kind,
            draft_model: self.draft_model.as_ref().map(PathBuf::from),
            block_length: self.block_length,
            n_draft: self.n_draft,
            adaptive: self.spec_adaptive.unwrap_or(false),
        }
    }

    /// The engine's configuration for these flags on `device` for `target`,
    /// the draft model's name resolved to a file (downloading a packaged
    /// one, copying a packaged drafter from the repository). DFlash runs on
    /// either device (on CUDA next to
    /// the target, a plain DFlash1 draft only: the GPU path names what else
    /// it cannot run when the drafter loads).
    pub fn config(&self, device: Device, target: Target) -> Result<SpecConfig> {
        self.precheck(device)?;
        let kind = match self.choice() {
            SpecChoice::Auto => return self.auto(device, target),
            SpecChoice::Kind(k) => k,
        };
        let mut config = self.explicit(kind);
        match (kind, &self.draft_model) {
            (SpecKind::Draft, Some(name)) => {
                config.draft_model = Some(crate::store::resolve_model(Some(name))?);
            }
            (SpecKind::Dflash, None) => {
                let reg = registry()?;
                let Some(d) =
                    packaged_target(&reg, target).and_then(|m| reg.drafter_for(&m.name, "dflash"))
                else {
                    bail!(
                        "--spec dflash needs --draft-model FILE (a dflash GGUF): {} has no packaged DFlash drafter \
                         (`hearth pull --list` shows the drafters; `hearth synth --arch dflash --target MODEL.gguf -o draft.gguf` writes a synthetic one)",
                        target_label(&reg, target)
                    );
                };
                config.draft_model = Some(install_drafter(&reg, d)?);
            }
            _ => {}
        }
        Ok(config)
    }

    /// `--spec auto`: on the CPU prompt lookup, adaptive; on CUDA the
    /// packaged DFlash drafter of a packaged target (with images too: the
    /// drafter reads the target's hidden states), else no speculation
    /// (quietly: with --verbose one stderr line says which drafter was
    /// picked, or why a registered one could not be).
    fn auto(&self, device: Device, target: Target) -> Result<SpecConfig> {
        let adaptive = self.spec_adaptive.unwrap_or(true);
        if device == Device::Cpu {
            let k = self.n_draft.unwrap_or(AUTO_LOOKUP_K);
            if crate::VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
                eprintln!(
                    "spec auto: prompt lookup (n-gram), up to {k} tokens{} (--spec none turns it off)",
                    if adaptive { ", adaptive" } else { "" }
                );
            }
            return Ok(SpecConfig {
                kind: SpecKind::Ngram,
                n_draft: Some(k),
                adaptive,
                ..SpecConfig::default()
            });
        }
        let none = SpecConfig::default();
        let reg = registry()?;
        let Some(m) = packaged_target(&reg, target) else {
            return Ok(none);
        };
        let Some(d) = reg.drafter_for(&m.name, "dflash") else {
            return Ok(none);
        };
        let path = match install_drafter(&reg, d) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("spec auto: the packaged drafter {} is not usable ({e:#}); decoding without one", d.name);
                return Ok(none);
            }
        };
        if crate::VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "spec auto: DFlash drafter {} for {}{} (--spec none turns it off)",
                d.name,
                m.name,
                if adaptive { ", adaptive length" } else { "" }
            );
        }
        Ok(SpecConfig {
            kind: SpecKind::Dflash,
            draft_model: Some(path),
            block_length: self.block_length,
            n_draft: self.n_draft,
            adaptive,
        })
    }
}

/// The packaged model `target` is: named by its packaged name, or a file
/// whose `.hearth.json` record (kept current: same length and modification
/// time as when it was hashed) carries a packaged model's sha256. A file
/// without a record is not hashed to find out (that would read the whole
/// model on every start).
pub fn packaged_target<'r>(reg: &'r Registry, target: Target) -> Option<&'r PackagedModel> {
    let name = target.arg.unwrap_or(&reg.default);
    if let Ok(ModelName::Packaged(m)) = ModelName::parse(name, reg) {
        return Some(m);
    }
    let rec = store::read_record(target.path)?;
    let stamp = store::stamp_of(target.path).ok()?;
    if rec.stamp != Some(stamp) {
        return None;
    }
    reg.models
        .iter()
        .find(|m| m.sha256 == rec.sha256 && m.size == stamp.len)
}

fn target_label(reg: &Registry, target: Target) -> String {
    match packaged_target(reg, target) {
        Some(m) => format!("packaged model {}", m.name),
        None => format!("{} (not a packaged model)", target.path.display()),
    }
}

/// A packaged drafter's file in the models folder: checked if there,
/// otherwise (or when the file there is stale: a retrained drafter)
/// installed from the repository or its wheels.
pub fn install_drafter(reg: &Registry, d: &PackagedModel) -> Result<PathBuf> {
    let dest = models_dir().join(&d.file);
    if dest.is_file() {
        match store::verify_packaged(&dest, d) {
            Ok(()) => return Ok(dest),
            Err(e) if reg.local_path(d).is_some_and(|p| p.is_file()) => {
                eprintln!("{}: {e:#}; installing it again from the repository", d.name);
                std::fs::remove_file(&dest)?;
                let _ = std::fs::remove_file(store::record_path(&dest));
            }
            Err(e) => return Err(e),
        }
    }
    crate::registry::pull(reg, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn args(a: &[&str]) -> SpecArgs {
        Cli::try_parse_from(std::iter::once("t").chain(a.iter().copied()))
            .unwrap()
            .spec
    }

    #[test]
    fn auto_is_the_default_and_adaptive_follows_it() {
        let a = args(&[]);
        assert_eq!(a.choice(), SpecChoice::Auto);
        let serve = SpecArgs {
            unset_means: SpecChoice::Kind(SpecKind::None),
            ..args(&[])
        };
        assert_eq!(serve.choice(), SpecChoice::Kind(SpecKind::None));
        assert_eq!(
            SpecArgs {
                unset_means: SpecChoice::Kind(SpecKind::None),
                ..args(&["--spec", "auto"])
            }
            .choice(),
            SpecChoice::Auto
        );
        assert_eq!(a.spec_adaptive, None);
        assert_eq!(args(&["--spec-adaptive"]).spec_adaptive, Some(true));
        assert_eq!(args(&["--spec-adaptive=false"]).spec_adaptive, Some(false));
        let e = args(&["--spec", "ngram", "--n-draft", "4"]);
        assert!(!e.explicit(SpecKind::Ngram).adaptive, "explicit: fixed K");
        assert!(Cli::try_parse_from(["t", "--spec", "fast"]).is_err());
    }

    #[test]
    fn auto_without_a_packaged_target_looks_up_on_the_cpu() {
        let a = args(&[]);
        let t = Target {
            arg: Some("/nonexistent.gguf"),
            path: Path::new("/nonexistent.gguf"),
        };
        // A file with no packaged record: plain decoding on cuda; prompt
        // lookup on the CPU (any model has a context to look up).
        let c = a.config(Device::Cuda, t).unwrap();
        assert_eq!(c.kind, SpecKind::None);
        let c = a.config(Device::Cpu, t).unwrap();
        assert_eq!(
            (c.kind, c.adaptive, c.n_draft),
            (SpecKind::Ngram, true, Some(AUTO_LOOKUP_K))
        );
        assert!(c.check().is_ok());
        // DFlash on cuda passes the flags' checks (the GPU drafter runs it).
        assert!(args(&["--spec", "dflash"]).precheck(Device::Cuda).is_ok());
        let c = args(&["--spec", "ngram"]).config(Device::Cpu, t).unwrap();
        assert_eq!(c.kind, SpecKind::Ngram);
    }

    #[test]
    fn bad_combinations_fail_before_loading() {
        for (a, want) in [
            (
                &["--draft-model", "x.gguf"][..],
                "--draft-model needs --spec dflash|draft",
            ),
            (
                &["--spec", "none", "--spec-adaptive"],
                "--spec-adaptive needs a drafter",
            ),
            (&["--spec", "none", "--n-draft", "3"], "need --spec"),
            (&["--n-draft", "0"], "at least 1"),
            (&["--spec", "draft"], "--spec draft needs --draft-model"),
        ] {
            let err = format!("{:#}", args(a).precheck(Device::Cpu).unwrap_err());
            assert!(err.contains(want), "{a:?}: {err}");
        }
        // dflash without --draft-model waits for the registry's drafter.
        assert!(args(&["--spec", "dflash"]).precheck(Device::Cpu).is_ok());
    }
}
