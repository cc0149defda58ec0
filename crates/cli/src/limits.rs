//! Sizes checked before allocating: the KV cache and forward scratch a
//! context needs, computed from the model's config, against the memory this
//! machine has available and the context the model was trained for. A size
//! that cannot fit is an error naming the numbers, not an allocation failure.

use std::path::Path;

use anyhow::{bail, Context, Result};
use hearth_gguf::GgufFile;
use hearth_models::{KvTypes, ModelConfig};

use crate::device::Device;

/// Checks `-c ctx` for `sessions` states of a model before it loads. On the
/// CPU the caches live in host memory, checked against MemAvailable; with
/// `--device cuda` they live on the GPU, which reports its own failures.
pub fn check_context(
    path: &Path,
    ctx: usize,
    sessions: usize,
    device: Device,
    kv: KvTypes,
) -> Result<()> {
    check_sized(path, &format!("-c {ctx}"), ctx, sessions, device, kv)
}

/// [`check_context`] for a context the user sized by other flags; `label`
/// names it in messages ("-p 512 (a context of 513)").
pub fn check_sized(
    path: &Path,
    label: &str,
    ctx: usize,
    sessions: usize,
    device: Device,
    kv: KvTypes,
) -> Result<()> {
    let file = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    if let Some(n) = file.metadata().get_u64("split.count").filter(|&n| n > 1) {
        bail!(
            "{} is one part of a split GGUF ({n} files); hearth loads single-file GGUFs only: \
             merge the parts with llama.cpp's `llama-gguf-split --merge FIRST-PART merged.gguf`",
            path.display()
        );
    }
    let Ok(config) = ModelConfig::from_gguf(&file) else {
        // The loader reports what is wrong with the file.
        return Ok(());
    };
    let available = if device == Device::Cpu {
        mem_available()
    } else {
        None
    };
    if let Err(e) = kv.check(config.head_dim) {
        bail!("--cache-type-k/-v {kv}: {e}");
    }
    let verdict = judge(&config, label, ctx, sessions, available, kv)?;
    for w in verdict {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// The decision itself: an error for a size that cannot fit, warnings for
/// one that fits but is past what the model or the machine comfortably does.
pub fn judge(
    config: &ModelConfig,
    label: &str,
    ctx: usize,
    sessions: usize,
    available: Option<u64>,
    kv: KvTypes,
) -> Result<Vec<String>> {
    if ctx == 0 {
        bail!("{label}: the context must hold at least one token");
    }
    let trained = config.context_length;
    let kv = config.kv_cache_bytes(kv, ctx, 0);
    let scratch = config.forward_scratch_bytes(ctx);
    let mut warnings = Vec::new();
    if let Some(avail) = available {
        if kv.saturating_add(scratch) > avail {
            bail!(
                "{label} needs {} of KV cache (+ {} of scratch); this machine has {} available; \
                 the model was trained for {trained} positions",
                bytes(kv),
                bytes(scratch),
                bytes(avail)
            );
        }
        let all = kv.saturating_mul(sessions as u64).saturating_add(scratch);
        if sessions > 1 && all > avail {
            warnings.push(format!(
                "{sessions} sessions of {label} would hold {} of KV cache; this machine has {} available: \
                 lower --max-sessions or -c, or bound the caches with --kv-budget-mib",
                bytes(all),
                bytes(avail)
            ));
        }
    }
    if ctx > trained {
        warnings.push(format!(
            "{label} is above the {trained} positions this model was trained for; text past {trained} tokens may degrade"
        ));
    }
    Ok(warnings)
}

/// MemAvailable from /proc/meminfo (Linux); `None` where there is none.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Binary units, as memory is counted: "36.0 GiB".
pub fn bytes(n: u64) -> String {
    let x = n as f64;
    const K: f64 = 1024.0;
    match x {
        _ if x >= K * K * K * K => format!("{:.1} TiB", x / (K * K * K * K)),
        _ if x >= K * K * K => format!("{:.1} GiB", x / (K * K * K)),
        _ => format!("{:.1} MiB", x / (K * K)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_models::{Architecture, LayerKind, RopeLayout};

    /// SmolLM2-135M's shape: 30 layers, 3 KV heads of 64, trained for 8192.
    fn smollm2() -> ModelConfig {
        ModelConfig {
            arch: Architecture::Llama,
            n_layers: 30,
            dim: 576,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            ffn_dim: 1536,
            vocab_size: 49152,
            context_length: 8192,
            norm_eps: 1e-5,
            rope_theta: 100000.0,
            rope_theta_sliding: 100000.0,
            rope_layout: RopeLayout::Interleaved,
            attn_scale: 0.125,
            layers: vec![LayerKind::Global { rope: true }; 30],
            logit_scale: None,
            final_logit_softcap: None,
            defaults_used: vec![],
        }
    }

    const F16: KvTypes = KvTypes::same(hearth_models::KvDtype::F16);

    #[test]
    fn impossible_sizes_are_refused_with_the_numbers() {
        let c = smollm2();
        let gib = 1u64 << 30;
        // 99999999 positions x 30 layers x 3 x 64 x 2 (K, V) x 2 bytes = 2.1 TiB.
        let err = judge(&c, "-c 99999999", 99_999_999, 1, Some(23 * gib), F16)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("-c 99999999 needs 2.1 TiB of KV cache"),
            "{err}"
        );
        assert!(err.contains("this machine has 23.0 GiB available"), "{err}");
        assert!(err.contains("trained for 8192 positions"), "{err}");
        // 4096 positions: 90 MiB, fine on a small machine and within training.
        assert!(judge(&c, "-c 4096", 4096, 1, Some(gib), F16)
            .unwrap()
            .is_empty());
        assert!(judge(&c, "-c 0", 0, 1, Some(gib), F16).is_err());
        // A q8_0 cache is sized as q8_0: 34 of f16's 64 bytes per 32 values.
        let q8 = KvTypes::same(hearth_models::KvDtype::Q8_0);
        let err = judge(&c, "-c 99999999", 99_999_999, 1, Some(23 * gib), q8)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs 1.1 TiB of KV cache"), "{err}");
    }

    #[test]
    fn warnings_past_the_trained_context_and_for_many_sessions() {
        let c = smollm2();
        let w = judge(&c, "-c 16384", 16384, 1, Some(64 << 30), F16).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("above the 8192 positions"), "{w:?}");
        // 8 sessions x 4096 positions x 22.5 KiB = 720 MiB > 512 MiB.
        let w = judge(&c, "-c 4096", 4096, 8, Some(512 << 20), F16).unwrap();
        assert!(w[0].contains("8 sessions"), "{w:?}");
        // Without a memory figure (another OS, or the GPU) only the context is judged.
        assert!(judge(&c, "-c 99999999", 99_999_999, 1, None, F16).unwrap()[0].contains("above"));
    }

    #[test]
    fn meminfo_parses() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   23068672 kB\n";
        assert_eq!(parse_meminfo(text), Some(23_068_672 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }
}
