//! Packaged drafters and `--spec auto`, against a temporary registry
//! (`HEARTH_REGISTRY`) that lists a synthetic DFlash drafter for the
//! packaged qwen2.5-coder-0.5b, committed (here: written) at the registry's
//! `local` path, and a temporary `HEARTH_HOME` whose qwen file links to the
//! real one (its `.hearth.json` record copied, so it is not hashed again).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{hearth_cmd, sha256_hex, stderr, temp};
use serde_json::{json, Value};

const QWEN: &str = "qwen2.5-coder-0.5b";
const QWEN_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const DRAFTER: &str = "qwen2.5-coder-0.5b-dflash";
const LOCAL: &str = "models/drafters/qwen2.5-coder-0.5b-dflash.gguf";

fn real_models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
    }
}

struct Fixture {
    dir: PathBuf,
    registry: PathBuf,
    home: PathBuf,
    drafter_bytes: Vec<u8>,
}

impl Fixture {
    /// `entry` edits the drafter's registry entry before it is written.
    fn new(tag: &str, entry: impl FnOnce(&mut Value)) -> Fixture {
        let dir = temp(tag);
        let qwen = real_models_dir().join(QWEN_FILE);
        assert!(
            qwen.is_file(),
            "{} missing: run `python3 scripts/fetch_models.py all`",
            qwen.display()
        );
        let repo = dir.join("repo");
        std::fs::create_dir_all(repo.join("models/drafters")).unwrap();
        let drafter = repo.join(LOCAL);
        let out = hearth_cmd()
            .args(["synth", "--arch", "dflash", "--block-size", "4", "--target"])
            .arg(&qwen)
            .arg("-o")
            .arg(&drafter)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let drafter_bytes = std::fs::read(&drafter).unwrap();
        let mut reg: Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/registry.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let mut e = json!({
            "name": DRAFTER,
            "description": "synthetic DFlash drafter (test)",
            "file": format!("{DRAFTER}.gguf"),
            "size": drafter_bytes.len(),
            "sha256": sha256_hex(&drafter_bytes),
            "drafter_for": QWEN,
            "kind": "dflash",
            "local": LOCAL,
        });
        entry(&mut e);
        reg["drafters"] = json!([e]);
        let registry = repo.join("models/registry.json");
        std::fs::write(&registry, serde_json::to_string_pretty(&reg).unwrap()).unwrap();
        let home = dir.join("home");
        std::fs::create_dir_all(home.join("models")).unwrap();
        std::os::unix::fs::symlink(&qwen, home.join("models").join(QWEN_FILE)).unwrap();
        let rec = PathBuf::from(format!("{}.hearth.json", qwen.display()));
        if rec.is_file() {
            std::fs::copy(&rec, home.join(format!("models/{QWEN_FILE}.hearth.json"))).unwrap();
        }
        Fixture {
            dir,
            registry,
            home,
            drafter_bytes,
        }
    }

    fn hearth(&self, args: &[&str]) -> Output {
        hearth_cmd()
            .args(args)
            .env("HEARTH_HOME", &self.home)
            .env("HEARTH_REGISTRY", &self.registry)
            .output()
            .unwrap()
    }

    /// `hearth run -m MODEL` greedy, 8 tokens, with `extra`: (stdout,
    /// stderr, --stats-json).
    fn run(&self, model: &str, extra: &[&str]) -> (String, String, Value) {
        let stats = self.dir.join("stats.json");
        let _ = std::fs::remove_file(&stats);
        let mut args = vec![
            "run",
            "-m",
            model,
            "-p",
            "def add(a, b):",
            "-n",
            "8",
            "--temp",
            "0",
            "--stats-json",
            stats.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = self.hearth(&args);
        let err = stderr(&out);
        assert!(out.status.success(), "{args:?}: {err}");
        let json = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (String::from_utf8(out.stdout).unwrap(), err, json)
    }

    fn installed(&self) -> PathBuf {
        self.home.join(format!("models/{DRAFTER}.gguf"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn auto_looks_up_on_the_cpu_and_keeps_the_output() {
    let f = Fixture::new("spec-auto", |_| {});
    let (plain, plain_err, plain_stats) = f.run(QWEN, &["--spec", "none"]);
    assert_eq!(plain_stats["spec"], "none");
    assert!(!plain_err.contains("spec auto"), "{plain_err}");

    // The default is auto: on the CPU, prompt lookup, adaptive (the banner
    // says so with --verbose); the DFlash drafter is neither copied in nor used.
    let (text, err, stats) = f.run(QWEN, &["--verbose"]);
    assert!(
        err.contains("spec auto: prompt lookup (n-gram), up to 4 tokens, adaptive"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("spec auto")).count(),
        1,
        "{err}"
    );
    assert_eq!(stats["spec"], "ngram", "{stats}");
    assert_eq!(stats["adaptive"], true);
    assert_eq!(stats["n_draft"], 4);
    assert_eq!(text, plain, "speculation changed the greedy output");
    assert!(
        !f.installed().exists(),
        "auto on the CPU installed the DFlash drafter"
    );

    // Any model: a file by its path, a link without a record, a model
    // without a drafter; no banner without --verbose.
    let bare = f.dir.join("my-model.gguf");
    std::os::unix::fs::symlink(real_models_dir().join(QWEN_FILE), &bare).unwrap();
    let (text, err, stats) = f.run(bare.to_str().unwrap(), &[]);
    assert_eq!(stats["spec"], "ngram");
    assert!(
        !err.contains("spec auto"),
        "no banner without --verbose: {err}"
    );
    assert_eq!(text, plain);
    let (_, err, stats) = f.run("smollm2-135m", &[]);
    assert_eq!(stats["spec"], "ngram");
    assert!(!err.contains("spec auto"), "{err}");
    // --spec-adaptive=false under auto: lookup at a fixed K.
    let (text, _, stats) = f.run(QWEN, &["--spec-adaptive=false"]);
    assert_eq!(
        (stats["spec"].as_str(), stats["adaptive"].as_bool()),
        (Some("ngram"), Some(false))
    );
    assert_eq!(text, plain);

    // --spec dflash without --draft-model takes the packaged drafter (copied
    // in), at a fixed K unless --spec-adaptive.
    let (text, _, stats) = f.run(QWEN, &["--spec", "dflash"]);
    assert_eq!(
        (stats["spec"].as_str(), stats["adaptive"].as_bool()),
        (Some("dflash"), Some(false))
    );
    assert_eq!(stats["n_draft"], 3, "block size 4: K up to 3");
    assert_eq!(text, plain);
    assert_eq!(std::fs::read(f.installed()).unwrap(), f.drafter_bytes);
    assert!(PathBuf::from(format!("{}.hearth.json", f.installed().display())).is_file());
    let (_, _, stats) = f.run(QWEN, &["--spec", "dflash", "--spec-adaptive"]);
    assert_eq!(stats["adaptive"], true);

    // A target without a drafter: explicit dflash says why.
    let out = f.hearth(&["run", "-m", "smollm2-135m", "-p", "hi", "--spec", "dflash"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--spec dflash needs --draft-model FILE")
            && err.contains("smollm2-135m has no packaged DFlash drafter"),
        "{err}"
    );
}

#[test]
fn pull_copies_a_drafter_from_the_repository() {
    let f = Fixture::new("spec-pull", |_| {});
    let out = f.hearth(&["pull", DRAFTER]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("sha256 verified"), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        f.installed().to_str().unwrap()
    );
    assert_eq!(std::fs::read(f.installed()).unwrap(), f.drafter_bytes);
    let list = f.hearth(&["pull", "--list"]);
    let listing = String::from_utf8(list.stdout).unwrap();
    assert!(
        listing
            .lines()
            .any(|l| l.contains(DRAFTER) && l.contains("downloaded")),
        "{listing}"
    );
    // A damaged installed copy is refused, and --force copies it again.
    std::fs::write(f.installed(), b"GGUF broken").unwrap();
    let out = f.hearth(&["pull", DRAFTER]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pull --force"), "{}", stderr(&out));
    let out = f.hearth(&["pull", "--force", DRAFTER]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(f.installed()).unwrap(), f.drafter_bytes);
    // The fetch script installs the same file.
    let script_home = f.dir.join("script-home");
    let out = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_models.py"))
        .arg(DRAFTER)
        .env("HEARTH_HOME", &script_home)
        .env("HEARTH_REGISTRY", &f.registry)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let installed = script_home.join(format!("models/{DRAFTER}.gguf"));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        installed.to_str().unwrap()
    );
    assert_eq!(std::fs::read(installed).unwrap(), f.drafter_bytes);
}

#[test]
fn a_missing_or_mismatched_repository_file_is_reported() {
    // The registry's sha256 does not match the file.
    let f = Fixture::new("spec-badsha", |e| {
        e["sha256"] = json!("ab".repeat(32));
    });
    let out = f.hearth(&["pull", DRAFTER]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the repository file and models/registry.json disagree"),
        "{}",
        stderr(&out)
    );
    assert!(!f.installed().exists());
    // --spec dflash: the same error (auto on the CPU uses no drafter file,
    // and decodes as ever).
    let out = f.hearth(&["run", "-m", QWEN, "-p", "hi", "--spec", "dflash"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the repository file and models/registry.json disagree"),
        "{}",
        stderr(&out)
    );
    let (_, _, stats) = f.run(QWEN, &[]);
    assert_eq!(stats["spec"], "ngram");

    // The repository file is missing.
    let f = Fixture::new("spec-missing", |_| {});
    std::fs::remove_file(f.registry.parent().unwrap().parent().unwrap().join(LOCAL)).unwrap();
    let out = f.hearth(&["pull", DRAFTER]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("is not there") && err.contains(LOCAL), "{err}");
    let out = f.hearth(&["run", "-m", QWEN, "-p", "hi", "--spec", "dflash"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not there"), "{}", stderr(&out));
    let out = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_models.py"))
        .arg(DRAFTER)
        .env("HEARTH_HOME", f.dir.join("script-home"))
        .env("HEARTH_REGISTRY", &f.registry)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is missing"), "{}", stderr(&out));
}
