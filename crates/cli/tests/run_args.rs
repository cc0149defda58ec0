//! `hearth run`/`serve` arguments as issue 14 found them: sizes that used to
//! abort the process (`-c 99999999`: "memory allocation of 38399999616 bytes
//! failed", exit 134) are refused with the numbers before anything is
//! allocated; llama.cpp's habits parse (`-n -1`, `--temp -1`, `-s -1`,
//! `-ngl 99` not read as `-n gl`, `--repeat-last-n -1`, `--ignore-eos`, `-e`);
//! output paths are checked before the model loads; and a truncated or
//! damaged packaged model is caught with the command that repairs it.

mod common;

use common::{hearth, hearth_cmd, stderr, temp};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

fn stats(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn an_impossible_context_is_refused_before_allocating() {
    let o = hearth(&["run", "-m", "smollm2-135m", "-c", "99999999", "-p", "Hello"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    // 99999999 positions x 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes.
    assert!(
        err.contains("-c 99999999 needs 2.1 TiB of KV cache"),
        "{err}"
    );
    assert!(err.contains("GiB available"), "{err}");
    assert!(
        err.contains("the model was trained for 8192 positions"),
        "{err}"
    );
    assert!(
        !err.contains("memory allocation") && !err.contains("panicked"),
        "{err}"
    );

    let o = hearth(&["run", "-m", "smollm2-135m", "-c", "0", "-p", "Hello"]);
    assert!(stderr(&o).contains("-c 0: the context must hold at least one token"));

    // serve would otherwise start listening (or abort): bound the wait.
    let mut child = hearth_cmd()
        .args([
            "serve",
            "-m",
            "smollm2-135m",
            "-c",
            "99999999",
            "--port",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("hearth serve -c 99999999 did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("-c 99999999 needs 2.1 TiB of KV cache"),
        "{}",
        stderr(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).is_empty());
}

#[test]
fn a_context_above_training_warns_and_runs() {
    let o = hearth(&[
        "run",
        "-m",
        "smollm2-135m",
        "-c",
        "9000",
        "-p",
        "Hello",
        "-n",
        "1",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("warning: -c 9000 is above the 8192 positions this model was trained for"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn llama_cpp_numbers_and_flags_parse() {
    let dir = temp("habits");
    let (s1, s2) = (dir.join("stop.json"), dir.join("fill.json"));
    // `hearth run --raw -m smollm2-135m -p Thanks! FLAGS`, which must
    // succeed: its output and its statistics.
    let thanks = |flags: &[&str], stats_path: &Path| {
        let mut v = vec!["run", "--raw", "-m", "smollm2-135m", "-p", "Thanks!"];
        v.extend_from_slice(flags);
        v.extend(["--stats-json", stats_path.to_str().unwrap()]);
        let o = hearth(&v);
        assert!(o.status.success(), "{}", stderr(&o));
        (stats(stats_path), o)
    };
    // Greedy SmolLM2 ends "Thanks!" with end-of-generation after 10 tokens.
    let (a, _) = thanks(&["-n", "24", "--temp", "-1"], &s1);
    assert_eq!(a["finish_reason"], "stop");
    assert!(a["generated_tokens"].as_u64().unwrap() < 24);

    // -n -1 with --ignore-eos runs until the context is full; -ngl 99 is a
    // count (not -n with value "gl") and gets its note; -s -1 and
    // --repeat-last-n -1 are llama.cpp's "random" and "whole context".
    let (b, o) = thanks(
        &[
            "-n",
            "-1",
            "-c",
            "24",
            "--temp",
            "-1",
            "-s",
            "-1",
            "-ngl",
            "99",
            "--repeat-last-n",
            "-1",
            "--repeat-penalty",
            "1.1",
            "--ignore-eos",
            "--top-k",
            "-1",
        ],
        &s2,
    );
    assert_eq!(b["finish_reason"], "length");
    assert_eq!(
        b["prompt_tokens"].as_u64().unwrap() + b["generated_tokens"].as_u64().unwrap(),
        24
    );
    assert!(
        stderr(&o).contains("note: -ngl 99: hearth runs every layer on the CPU"),
        "{}",
        stderr(&o)
    );

    for (args, want) in [
        (&["-n", "-3"][..], "a number of tokens, or -1 for no limit"),
        (&["--seed", "-2"], "a seed"),
        (
            &["--repeat-last-n", "-5"],
            "0 = off, -1 = the whole context",
        ),
        (
            &["--tmep", "0.5"],
            "tip: a similar argument exists: '--temp'",
        ),
    ] {
        let mut v = vec!["run", "-m", "smollm2-135m", "-p", "x"];
        v.extend_from_slice(args);
        let o = hearth(&v);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `-e` turns `\n` into a newline as llama.cpp does: the same tokens and the
/// same greedy text as a prompt typed with a real newline; without `-e` the
/// backslash stays.
#[test]
fn escapes_with_e_equal_the_real_characters() {
    let dir = temp("escape");
    let run = |extra: &[&str], prompt: &str, name: &str| {
        let s = dir.join(name);
        let mut v = vec![
            "run",
            "--raw",
            "-m",
            "smollm2-135m",
            "-n",
            "4",
            "--temp",
            "0",
            "-p",
            prompt,
        ];
        v.extend_from_slice(extra);
        v.extend_from_slice(&["--stats-json", s.to_str().unwrap()]);
        let o = hearth(&v);
        assert!(o.status.success(), "{}", stderr(&o));
        (o.stdout, stats(&s)["prompt_tokens"].as_u64().unwrap())
    };
    let escaped = run(&["-e"], r"Columns:\tname\tage\n1.", "e.json");
    let real = run(&[], "Columns:\tname\tage\n1.", "r.json");
    let literal = run(&[], r"Columns:\tname\tage\n1.", "l.json");
    assert_eq!(escaped, real);
    assert_ne!(literal, real);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_stats_path_is_checked_before_the_model_is_touched() {
    // The model name is unknown too: the path is what gets reported, first.
    let o = hearth(&[
        "run",
        "-m",
        "no-such-model",
        "-p",
        "hi",
        "--stats-json",
        "/nonexistent-dir/x/s.json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(
            "--stats-json /nonexistent-dir/x/s.json: directory /nonexistent-dir/x does not exist"
        ),
        "{err}"
    );
    assert!(o.stdout.is_empty());

    let o = hearth(&[
        "synth",
        "--arch",
        "qwen2",
        "--output",
        "/nonexistent-dir/s.gguf",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o)
        .contains("--output /nonexistent-dir/s.gguf: directory /nonexistent-dir does not exist"));
}

#[test]
fn a_truncated_or_damaged_packaged_model_names_the_repair() {
    let home = temp("packaged");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let src = match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
    }
    .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let data = std::fs::read(&src).unwrap();
    let dest = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let with_home = |args: &[&str]| {
        hearth_cmd()
            .args(args)
            .env("HEARTH_HOME", &home)
            .output()
            .unwrap()
    };

    // An interrupted copy: 5 MB of 98.4.
    std::fs::write(&dest, &data[..5_000_000]).unwrap();
    let list = String::from_utf8(with_home(&["pull", "--list"]).stdout).unwrap();
    let line = list.lines().find(|l| l.contains("smollm2-135m")).unwrap();
    assert!(line.contains("incomplete (5.0 MB of 98.4 MB)"), "{line}");
    assert!(!line.contains("downloaded"), "{line}");
    let o = with_home(&["run", "-m", "smollm2-135m", "-p", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("5000000 bytes, expected 98362432"), "{err}");
    assert!(
        err.contains("run `hearth pull --force smollm2-135m`"),
        "{err}"
    );
    let list = String::from_utf8(with_home(&["list"]).stdout).unwrap();
    assert!(
        list.contains("run `hearth pull --force smollm2-135m`"),
        "{list}"
    );

    // The right size, one byte changed: the published sha256 catches it.
    let mut bad = data.clone();
    bad[60_000_000] ^= 1;
    std::fs::write(&dest, &bad).unwrap();
    let err = stderr(&with_home(&["inspect", "smollm2-135m"]));
    assert!(
        err.contains("does not match the expected b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        "{err}"
    );
    assert!(
        err.contains("run `hearth pull --force smollm2-135m`"),
        "{err}"
    );

    // The real bytes pass, and are hashed once (the record's stamp).
    std::fs::write(&dest, &data).unwrap();
    assert!(with_home(&["inspect", "smollm2-135m"]).status.success());
    let rec: Value = serde_json::from_str(
        &std::fs::read_to_string(models.join("SmolLM2-135M-Instruct.Q4_1.gguf.hearth.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(rec["stamp"]["len"], 98_362_432);
    std::fs::remove_dir_all(&home).unwrap();
}
