//! Every subcommand that writes to stdout exits quietly when the reader has
//! gone (`hearth inspect M | head -2`): its stdout is a pipe whose read end is
//! closed before it starts, so the first write fails for certain. Quiet means
//! exit 0, death by SIGPIPE or exit 141 (what a shell reports for it), and no
//! panic or error text (before, these panicked with exit 101).
//! A full disk (`>/dev/full`) is an error message, not a panic. (`serve` is
//! not covered: its listening lines are printed by the server crate.)

mod common;

use common::{hearth_cmd as hearth, temp};

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

/// Runs `cmd` with stdout a pipe nobody reads (read end closed) and `input`
/// on stdin.
fn with_closed_stdout(mut cmd: Command, input: &str) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = cmd
        .stdout(writer)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn assert_quiet(what: &str, out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            || out.status.signal() == Some(libc::SIGPIPE)
            || out.status.code() == Some(141),
        "{what}: {:?}\n{err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(!err.contains("error"), "{what}: {err}");
}

#[test]
fn inspect_list_and_pull_exit_quietly_on_a_closed_stdout() {
    for args in [
        &["inspect", "gemma3-270m"][..],
        &["inspect", "smollm2-135m", "--json"],
        &["list"],
        &["list", "--json"],
        &["pull", "--list"],
        &["pull", "smollm2-135m"],
        &["--help"],
    ] {
        let mut c = hearth();
        c.args(args);
        assert_quiet(&args.join(" "), &with_closed_stdout(c, ""));
    }
}

#[test]
fn run_bench_template_and_parse_exit_quietly_on_a_closed_stdout() {
    let run = [
        "run",
        "-m",
        "smollm2-135m",
        "-p",
        "Once upon a time",
        "-n",
        "8",
        "--temp",
        "0",
        "-c",
        "64",
    ];
    let bench = [
        "bench",
        "-m",
        "smollm2-135m",
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
    ];
    for (args, input) in [
        (&run[..], ""),
        (&bench, ""),
        (
            &["template", "-m", "smollm2-135m", "--messages", "-"],
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            &["parse", "--format", "hermes"],
            "Hello <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>",
        ),
    ] {
        let mut c = hearth();
        c.args(args);
        assert_quiet(args[0], &with_closed_stdout(c, input));
    }
}

#[test]
fn synth_and_rm_exit_quietly_on_a_closed_stdout() {
    let dir = temp("synth");
    let mut c = hearth();
    c.args(["synth", "--arch", "qwen2", "--layers", "1", "--output"])
        .arg(dir.join("s.gguf"));
    assert_quiet("synth", &with_closed_stdout(c, ""));

    let home = temp("rm");
    std::fs::create_dir_all(home.join("models")).unwrap();
    std::fs::write(home.join("models/stray.gguf"), b"x").unwrap();
    let mut c = hearth();
    c.args(["rm", "stray.gguf"]).env("HEARTH_HOME", &home);
    assert_quiet("rm", &with_closed_stdout(c, ""));
    assert!(!home.join("models/stray.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&home).unwrap();
}

/// `pull --list >/dev/full` used to panic; a full disk is a clear error.
#[test]
fn a_full_disk_is_an_error_not_a_panic() {
    for args in [
        &["pull", "--list"][..],
        &["list"],
        &["inspect", "smollm2-135m"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = hearth().args(args).stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("error: writing to stdout: No space left on device"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
