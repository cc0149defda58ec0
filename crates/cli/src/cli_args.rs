//! Argument habits users bring from llama.cpp, and checks made before any
//! work starts: multi-letter single-dash flags (`-ngl 99`), `-1` meaning "no
//! limit", `-e` escape processing, and output paths that must be writable
//! before a model loads.

use std::ffi::OsString;
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::device::Device;

/// llama.cpp's multi-letter single-dash flags and hearth's spelling. Parsed as
/// they are, clap would read `-ngl 99` as `-n gl` followed by a stray `99`.
const SINGLE_DASH: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-md", "--draft-model"),
    ("-sys", "--system-prompt"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
];

/// Flags whose value is free text: the token after them is never rewritten.
const TEXT_FLAGS: &[&str] = &[
    "-p",
    "--prompt",
    "--stop",
    "-f",
    "--file",
    "-m",
    "--model",
    "-sys",
    "--system-prompt",
];

/// llama.cpp's flags for what hearth always does or has no knob for:
/// accepted, with one line saying what hearth does instead. The bool: the
/// flag takes a value (consumed when it is one of `VALUES`, or always).
const ACCEPTED: &[(&str, Taking, &str)] = &[
    ("-fa", Taking::Optional(&["on", "off", "auto", "1", "0", "true", "false"]),
     "hearth's attention is always the tiled (flash) kernel; -fa/--flash-attn changes nothing"),
    ("--flash-attn", Taking::Optional(&["on", "off", "auto", "1", "0", "true", "false"]),
     "hearth's attention is always the tiled (flash) kernel; -fa/--flash-attn changes nothing"),
    ("--jinja", Taking::None,
     "hearth always renders the GGUF's Jinja chat template (--template or --raw change that); --jinja is not needed"),
    ("-cnv", Taking::None,
     "hearth run chats by default when no prompt is given (-p/-f/stdin); -cnv is not needed"),
    ("--conversation", Taking::None,
     "hearth run chats by default when no prompt is given (-p/-f/stdin); --conversation is not needed"),
    ("-no-cnv", Taking::None,
     "hearth run answers one prompt and exits when given one (-p/-f/stdin); -no-cnv is not needed"),
    ("--no-conversation", Taking::None,
     "hearth run answers one prompt and exits when given one (-p/-f/stdin); --no-conversation is not needed"),
    ("--no-mmap", Taking::None, "hearth maps GGUF files read-only; --no-mmap changes nothing"),
    ("--mlock", Taking::None, "hearth does not lock the model in memory; --mlock changes nothing"),
];

#[derive(Clone, Copy)]
enum Taking {
    None,
    /// A value follows when it is one of these.
    Optional(&'static [&'static str]),
}

/// llama.cpp's names for flags hearth has under another name (two dashes
/// or one letter), beyond [`SINGLE_DASH`].
const RENAMED: &[(&str, &str)] = &[
    ("-hf", "--model"),
    ("-hfr", "--model"),
    ("--hf-repo", "--model"),
    ("-np", "--max-sessions"),
    ("--parallel", "--max-sessions"),
];

/// Rewrites llama.cpp's single-dash long flags (`-ngl`, `-ngl=N`, `-md`) to
/// hearth's, `-hf REPO[:QUANT]` to `--model hf://REPO[:QUANT]`, and drops
/// the flags hearth has no use for with a line on stderr saying why;
/// everything after `--` and every text value is left as it is.
pub fn rewrite_llama_flags(args: Vec<OsString>) -> Vec<OsString> {
    let (out, notes) = rewrite_llama_flags_noted(args);
    for n in notes {
        eprintln!("note: {n}");
    }
    out
}

/// [`rewrite_llama_flags`], the notes returned instead of printed.
pub fn rewrite_llama_flags_noted(args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let mut notes: Vec<String> = Vec::new();
    let mut kept = Vec::with_capacity(args.len());
    let mut skip_value = false;
    let mut hf_value = false;
    let mut literal = false;
    for (i, a) in args.iter().enumerate() {
        let s = a.to_str().unwrap_or("");
        if literal {
            kept.push(a.clone());
            continue;
        }
        if skip_value {
            skip_value = false;
            continue;
        }
        if hf_value {
            hf_value = false;
            let v = if s.contains("://") || std::path::Path::new(s).exists() {
                s.to_string()
            } else {
                format!("hf://{s}")
            };
            kept.push(OsString::from(v));
            continue;
        }
        let after_text_flag = i > 0
            && args[i - 1]
                .to_str()
                .is_some_and(|p| TEXT_FLAGS.contains(&p));
        if s == "--" {
            literal = true;
            kept.push(a.clone());
            continue;
        }
        if after_text_flag {
            kept.push(a.clone());
            continue;
        }
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v)),
            _ => (s, None),
        };
        if let Some((_, taking, note)) = ACCEPTED.iter().find(|(f, _, _)| *f == name) {
            if !notes.iter().any(|n| n == note) {
                notes.push(note.to_string());
            }
            if let (Taking::Optional(values), None) = (taking, inline) {
                skip_value = args
                    .get(i + 1)
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| values.contains(&n));
            }
            continue;
        }
        if matches!(name, "-np" | "--parallel") && args.get(1).is_none_or(|c| c != "serve") {
            notes.push(format!(
                "hearth run holds one conversation; {name} (parallel sequences) is `hearth serve --max-sessions N`"
            ));
            skip_value = inline.is_none();
            continue;
        }
        if let Some((_, to)) = RENAMED.iter().find(|(f, _)| *f == name) {
            let hf = to == &"--model" && name.contains("hf");
            match inline {
                Some(v) if hf => kept.push(OsString::from(format!("{to}=hf://{v}"))),
                Some(v) => kept.push(OsString::from(format!("{to}={v}"))),
                None => {
                    kept.push(OsString::from(*to));
                    hf_value = hf;
                }
            }
            continue;
        }
        kept.push(a.clone());
    }
    (rewrite_single_dash(kept), notes)
}

/// [`SINGLE_DASH`]'s rewrites.
fn rewrite_single_dash(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut literal = false;
    for (i, a) in args.iter().enumerate() {
        let after_text_flag = i > 0
            && args[i - 1]
                .to_str()
                .is_some_and(|p| TEXT_FLAGS.contains(&p));
        let replaced = match a.to_str() {
            Some("--") => {
                literal = true;
                None
            }
            Some(s) if !literal && !after_text_flag => SINGLE_DASH.iter().find_map(|(from, to)| {
                if s == *from {
                    Some(OsString::from(to))
                } else {
                    s.strip_prefix(from)
                        .and_then(|v| v.strip_prefix('='))
                        .map(|v| OsString::from(format!("{to}={v}")))
                }
            }),
            _ => None,
        };
        out.push(replaced.unwrap_or_else(|| a.clone()));
    }
    out
}

/// The KV cache's storage types (llama.cpp's `-ctk`/`-ctv`), shared by
/// `run`, `serve` and `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct KvCacheArgs {
    /// KV cache type for keys (-ctk): f16, q8_0 or q4_0. q8_0 stores 34
    /// bytes per 32 values (0.53x of f16), q4_0 18 (0.28x), with llama.cpp's
    /// block formats, its rotations and its attention arithmetic over them.
    /// On --device cuda, K and V take the same type.
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16",
          value_parser = parse_kv_type)]
    pub cache_type_k: hearth_models::KvDtype,
    /// KV cache type for values (-ctv): f16, q8_0 or q4_0.
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16",
          value_parser = parse_kv_type)]
    pub cache_type_v: hearth_models::KvDtype,
}

impl KvCacheArgs {
    pub fn types(&self) -> hearth_models::KvTypes {
        hearth_models::KvTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }

    /// The types on `device`, or why they cannot be used there.
    pub fn for_device(&self, device: Device) -> Result<hearth_models::KvTypes> {
        let t = self.types();
        if device == Device::Cuda && t.k != t.v {
            bail!(
                "--cache-type-k {} with --cache-type-v {}: the CUDA backend takes one type for both (f16, q8_0 or q4_0); mixed types run on --device cpu",
                t.k.name(),
                t.v.name()
            );
        }
        Ok(t)
    }
}

/// `-ctk`/`-ctv`: the KV cache types llama.cpp's CPU flash attention takes
/// that hearth implements.
pub fn parse_kv_type(s: &str) -> Result<hearth_models::KvDtype, String> {
    use hearth_models::KvDtype;
    match KvDtype::parse(s.trim()) {
        Some(t @ (KvDtype::F16 | KvDtype::Q8_0 | KvDtype::Q4_0)) => Ok(t),
        _ => Err(format!("'{s}': a KV cache type: f16, q8_0 or q4_0")),
    }
}

/// `-n`: a token count, or -1 (llama.cpp: until end of generation) / -2
/// (until the context is full); both run until one of them, as the count is
/// clamped to the context anyway.
pub fn parse_n_predict(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1 | -2) => Ok(usize::MAX),
        Ok(n) if n >= 0 => Ok(n as usize),
        _ => Err(format!(
            "'{s}': a number of tokens, or -1 for no limit (until end of generation or the context is full)"
        )),
    }
}

/// `--seed`: -1 is llama.cpp's "random", hearth's 0.
pub fn parse_seed(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(0),
        _ => s
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("'{s}': a seed (a non-negative number; 0 or -1 = random)")),
    }
}

/// `--repeat-last-n`: tokens the repeat penalties look back over; 0 = off,
/// -1 = the whole context.
pub fn parse_repeat_last_n(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(usize::MAX),
        Ok(n) if n >= 0 => Ok(n as usize),
        _ => Err(format!(
            "'{s}': a number of tokens (0 = off, -1 = the whole context)"
        )),
    }
}

/// `--top-k`: llama.cpp turns top-k off with 0 or any negative value.
pub fn parse_top_k(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(_) => Err(format!("'{s}': a number of tokens (0 or negative = off)")),
    }
}

/// `-ngl`: llama.cpp's layers to offload — a count, `auto` or `all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    Auto,
    All,
    Count(i64),
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

pub fn parse_gpu_layers(s: &str) -> Result<GpuLayers, String> {
    match s.trim() {
        "auto" => Ok(GpuLayers::Auto),
        "all" => Ok(GpuLayers::All),
        t => t
            .parse::<i64>()
            .map(|n| {
                if n < 0 {
                    GpuLayers::Auto
                } else {
                    GpuLayers::Count(n)
                }
            })
            .map_err(|_| format!("'{s}': a number of layers, auto or all")),
    }
}

/// hearth places layers by `--device`, not by a count: a one-line note says so.
pub fn note_gpu_layers(ngl: Option<GpuLayers>, device: Device) {
    match (ngl, device) {
        (None, _) => {}
        (Some(n), Device::Cpu) => eprintln!(
            "note: -ngl {n}: hearth runs every layer on the CPU; --device cuda puts all layers on the GPU"
        ),
        (Some(GpuLayers::Count(0)), Device::Cuda) => eprintln!(
            "note: -ngl 0: --device cuda still puts all layers on the GPU; use --device cpu for the CPU"
        ),
        (Some(_), Device::Cuda) => {}
    }
}

/// `-e`: escape sequences in the prompt, as llama.cpp reads them: `\n`, `\r`,
/// `\t`, `\'`, `\"`, `\\` and `\xHH` (a byte; the result must be UTF-8). Any
/// other backslash stays as written.
pub fn process_escapes(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        let simple = match c {
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'\'' | b'"' | b'\\' => Some(c),
            _ => None,
        };
        let hex = |j: usize| b.get(j).and_then(|&h| (h as char).to_digit(16));
        match (simple, c, hex(i + 2), hex(i + 3)) {
            (Some(e), ..) => {
                out.push(e);
                i += 2;
            }
            (None, b'x', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 4;
            }
            _ => {
                out.extend_from_slice(&[b'\\', c]);
                i += 2;
            }
        }
    }
    String::from_utf8(out).context("-e: the \\x escapes do not form valid UTF-8 text")
}

/// The prompt as `run` uses it: with escapes processed under `-e`.
pub fn escaped(on: bool, prompt: String) -> Result<String> {
    if on {
        process_escapes(&prompt)
    } else {
        Ok(prompt)
    }
}

/// An output file must be creatable before the work that fills it starts:
/// its folder exists, it is not a folder, and it can be opened for writing.
/// A file that did not exist is not left behind.
pub fn check_output_path(flag: &str, path: &Path) -> Result<()> {
    let shown = path.display();
    if path.is_dir() {
        bail!("{flag} {shown}: is a directory");
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("{flag} {shown}: directory {} does not exist", dir.display());
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("{flag} {shown}: cannot be written"))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn llama_cpp_flags_work_or_say_what_hearth_does() {
        let (out, notes) = rewrite_llama_flags_noted(os(&[
            "hearth",
            "run",
            "-hf",
            "bartowski/Qwen-GGUF:Q4_K_M",
            "-fa",
            "on",
            "-cnv",
            "--jinja",
            "-p",
            "-fa",
        ]));
        assert_eq!(
            out,
            os(&[
                "hearth",
                "run",
                "--model",
                "hf://bartowski/Qwen-GGUF:Q4_K_M",
                "-p",
                "-fa"
            ])
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("flash") && notes[1].contains("chats by default"));
        // -fa without a value leaves the next argument alone; -hf=REPO.
        let (out, _) = rewrite_llama_flags_noted(os(&[
            "hearth",
            "run",
            "-fa",
            "-n",
            "5",
            "--hf-repo=o/r:Q8_0",
        ]));
        assert_eq!(
            out,
            os(&["hearth", "run", "-n", "5", "--model=hf://o/r:Q8_0"])
        );
        // -np: serve's sessions; run says what it is instead.
        let (out, _) = rewrite_llama_flags_noted(os(&["hearth", "serve", "-np", "4"]));
        assert_eq!(out, os(&["hearth", "serve", "--max-sessions", "4"]));
        let (out, notes) = rewrite_llama_flags_noted(os(&["hearth", "run", "-np", "4", "-p", "x"]));
        assert_eq!(out, os(&["hearth", "run", "-p", "x"]));
        assert!(notes[0].contains("--max-sessions"), "{notes:?}");
        // -no-cnv and --no-mmap: notes, nothing passed on.
        let (out, notes) =
            rewrite_llama_flags_noted(os(&["hearth", "run", "-no-cnv", "--no-mmap"]));
        assert_eq!((out, notes.len()), (os(&["hearth", "run"]), 2));
    }

    #[test]
    fn single_dash_long_flags_are_rewritten_outside_text() {
        assert_eq!(
            rewrite_llama_flags(os(&[
                "hearth", "run", "-ngl", "99", "-ngl=5", "-md", "d.gguf"
            ])),
            os(&[
                "hearth",
                "run",
                "--n-gpu-layers",
                "99",
                "--n-gpu-layers=5",
                "--draft-model",
                "d.gguf"
            ])
        );
        // A prompt that happens to read "-ngl", and anything after "--", stay.
        let kept = os(&["hearth", "run", "-p", "-ngl", "--", "-ngl"]);
        assert_eq!(rewrite_llama_flags(kept.clone()), kept);
        // Ordinary short flags are untouched.
        let kept = os(&["hearth", "run", "-n", "5", "-nglx"]);
        assert_eq!(rewrite_llama_flags(kept.clone()), kept);
        // The KV cache types.
        assert_eq!(
            rewrite_llama_flags(os(&["hearth", "run", "-ctk", "q8_0", "-ctv=q4_0"])),
            os(&[
                "hearth",
                "run",
                "--cache-type-k",
                "q8_0",
                "--cache-type-v=q4_0"
            ])
        );
    }

    #[test]
    fn kv_cache_types() {
        use hearth_models::{KvDtype, KvTypes};
        assert_eq!(parse_kv_type("q8_0"), Ok(KvDtype::Q8_0));
        assert_eq!(parse_kv_type("q4_0"), Ok(KvDtype::Q4_0));
        assert_eq!(parse_kv_type("f16"), Ok(KvDtype::F16));
        // llama.cpp's other types are named in the error, not accepted silently.
        let e = parse_kv_type("q5_1").unwrap_err();
        assert!(e.contains("f16, q8_0 or q4_0"), "{e}");
        let args = KvCacheArgs {
            cache_type_k: KvDtype::Q8_0,
            cache_type_v: KvDtype::F16,
        };
        assert_eq!(
            args.types(),
            KvTypes {
                k: KvDtype::Q8_0,
                v: KvDtype::F16
            }
        );
        assert!(args.for_device(Device::Cpu).is_ok());
        let e = args.for_device(Device::Cuda).unwrap_err().to_string();
        assert!(e.contains("one type for both"), "{e}");
        let same = KvCacheArgs {
            cache_type_k: KvDtype::Q8_0,
            cache_type_v: KvDtype::Q8_0,
        };
        assert_eq!(
            same.for_device(Device::Cuda).unwrap(),
            KvTypes::same(KvDtype::Q8_0)
        );
    }

    #[test]
    fn llama_cpp_numbers() {
        assert_eq!(parse_n_predict("-1"), Ok(usize::MAX));
        assert_eq!(parse_n_predict("-2"), Ok(usize::MAX));
        assert_eq!(parse_n_predict("0"), Ok(0));
        assert_eq!(parse_n_predict("17"), Ok(17));
        assert!(parse_n_predict("-3").is_err());
        assert!(parse_n_predict("gl").is_err());
        assert_eq!(parse_seed("-1"), Ok(0));
        assert_eq!(parse_seed("42"), Ok(42));
        assert!(parse_seed("-5").is_err());
        assert_eq!(parse_repeat_last_n("-1"), Ok(usize::MAX));
        assert_eq!(parse_repeat_last_n("0"), Ok(0));
        assert!(parse_repeat_last_n("-7").is_err());
        assert_eq!(parse_top_k("-1"), Ok(0));
        assert_eq!(parse_gpu_layers("99"), Ok(GpuLayers::Count(99)));
        assert_eq!(parse_gpu_layers("all"), Ok(GpuLayers::All));
        assert_eq!(parse_gpu_layers("-1"), Ok(GpuLayers::Auto));
        assert!(parse_gpu_layers("gl").is_err());
    }

    /// Cases from llama.cpp's string_process_escapes (common/common.cpp).
    #[test]
    fn escapes_like_llama_cpp() {
        let e = |s: &str| process_escapes(s).unwrap();
        assert_eq!(e(r#"a\nb\tc\\d\'e\"f\rg"#), "a\nb\tc\\d'e\"f\rg");
        assert_eq!(e(r"\x41\x62"), "Ab");
        assert_eq!(e(r"\xc3\xa9"), "é");
        // Unknown escapes, a short \x and a trailing backslash stay as written.
        assert_eq!(e(r"\d+\x4\q\"), r"\d+\x4\q\");
        assert_eq!(e(r"\xZZ"), r"\xZZ");
        assert!(process_escapes(r"\xff").is_err());
    }

    #[test]
    fn output_paths_are_checked_without_leaving_files() {
        let dir = std::env::temp_dir().join(format!("hearth-outpath-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("stats.json");
        check_output_path("--stats-json", &f).unwrap();
        assert!(!f.exists());
        let err = check_output_path("--stats-json", &dir.join("missing/stats.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(check_output_path("--stats-json", &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
