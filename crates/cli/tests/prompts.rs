//! `hearth run` chats by default: the prompt is one user turn rendered with
//! the model's own chat template, by the same prompter `hearth template` and
//! `hearth serve` use. The templates themselves are checked against
//! transformers' `apply_chat_template` in hearth-chat's tests; here the three
//! commands must agree byte for byte and token for token.

mod common;

use common::{hearth, hearth_cmd};

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use serde_json::{json, Value};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `hearth serve --port 0` and its base URL (from the URL line it prints).
fn serve(model: &str) -> Server {
    let mut child = hearth_cmd()
        .args(["serve", "-m", model, "--port", "0", "-t", "2", "-c", "2048"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("serve printed its URL").unwrap();
        if let Some(u) = line.strip_prefix("hearth serve: listening on ") {
            break u.trim_end_matches("/v1").to_string();
        }
    };
    for line in lines.by_ref() {
        if line.unwrap().contains("ready") {
            break;
        }
    }
    Server(child, url)
}

fn post(url: &str, body: &Value) -> Value {
    let body = ureq::post(url)
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .unwrap()
        .into_string()
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

#[test]
fn run_template_and_serve_render_the_same_prompt() {
    let model = "smollm2-135m";
    let (system, user) = ("You answer in French.", "Name three colours.");
    let messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]);
    let dir = std::env::temp_dir().join(format!("hearth-prompts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let msgs = dir.join("messages.json");
    std::fs::write(&msgs, messages.to_string()).unwrap();

    let t = hearth(&[
        "template",
        "-m",
        model,
        "--messages",
        msgs.to_str().unwrap(),
    ]);
    assert!(t.status.success(), "{}", text(&t.stderr));
    let template = text(&t.stdout);
    assert!(
        template.contains(system) && template.contains(user),
        "{template}"
    );

    let stats = dir.join("stats.json");
    let r = hearth(&[
        "run",
        "-m",
        model,
        "-sys",
        system,
        "-p",
        user,
        "-n",
        "0",
        "--verbose-prompt",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    let shown = err.split_once("):\n").expect("the prompt header").1;
    assert!(
        shown.starts_with(&template),
        "run --verbose-prompt:\n{shown}\ntemplate:\n{template}"
    );
    let run_tokens = serde_json::from_str::<Value>(&std::fs::read_to_string(&stats).unwrap())
        .unwrap()["prompt_tokens"]
        .as_u64()
        .unwrap();

    let server = serve(model);
    let applied = post(
        &format!("{}/apply-template", server.1),
        &json!({"messages": messages}),
    );
    assert_eq!(applied["prompt"], Value::String(template.clone()));
    let reply = post(
        &format!("{}/v1/chat/completions", server.1),
        &json!({"messages": messages, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64(),
        Some(run_tokens),
        "serve and run tokenize the same prompt: {reply}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's first command: the default model answers the question (as a
/// chat model) rather than continuing its text; `--raw` continues it.
#[test]
fn run_answers_as_a_chat_model_by_default() {
    let q = "What is 2 + 2? Answer with one number.";
    let chat = hearth(&["run", "-p", q, "-n", "16", "--temp", "0"]);
    assert!(chat.status.success(), "{}", text(&chat.stderr));
    let answer = text(&chat.stdout);
    assert!(answer.contains('4'), "{answer:?}");
    assert!(
        answer.trim_start().starts_with('4') || answer.trim_start().starts_with("The"),
        "an answer, not a continuation of the question: {answer:?}"
    );

    let raw = hearth(&["run", "--raw", "-p", q, "-n", "16", "--temp", "0"]);
    assert!(raw.status.success(), "{}", text(&raw.stderr));
    assert_ne!(
        text(&raw.stdout),
        answer,
        "--raw completes the text instead"
    );
}

/// `cat main.py | hearth run -p "Review this code"`: the piped text and the
/// prompt both reach the model, stdin first (as Ollama joins them).
#[test]
fn piped_stdin_joins_the_prompt() {
    use std::io::Write;
    let code = "def add(a, b): return a - b";
    let mut child = hearth_cmd()
        .args([
            "run",
            "-m",
            "smollm2-135m",
            "-p",
            "Find the bug in this code, one sentence.",
            "-n",
            "0",
            "--verbose-prompt",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(code.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stderr);
    let (c, p) = (shown.find(code), shown.find("Find the bug in this code"));
    assert!(c.is_some() && p.is_some() && c < p, "{shown}");
    // Without a pipe (stdin /dev/null) only the prompt goes.
    let out = hearth(&[
        "run",
        "-m",
        "smollm2-135m",
        "-p",
        "Hi.",
        "-n",
        "0",
        "--verbose-prompt",
    ]);
    assert!(out.status.success() && !text(&out.stderr).contains(code));
}

/// llama.cpp's multi-letter flags either work or say, in one line, what
/// hearth does instead; never the help with exit 0.
#[test]
fn llama_cpp_flags_never_print_the_help() {
    // The Hub is a closed local port: the download fails at once.
    let home = std::env::temp_dir().join(format!("hearth-hf-flag-{}", std::process::id()));
    let out = hearth_cmd()
        .args([
            "run",
            "-hf",
            "bartowski/Nope-GGUF/nope.gguf",
            "-p",
            "hi",
            "-n",
            "1",
        ])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HEARTH_HOME", &home)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&home);
    let err = text(&out.stderr);
    assert!(!out.status.success() && !err.contains("Usage:"), "{err}");
    assert!(
        err.contains("hf://bartowski/Nope-GGUF/nope.gguf") || err.contains("bartowski"),
        "{err}"
    );
    let out = hearth(&[
        "run",
        "-m",
        "smollm2-135m",
        "-fa",
        "on",
        "-cnv",
        "--jinja",
        "-p",
        "Hi.",
        "-n",
        "1",
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    for note in ["flash", "chats by default", "Jinja"] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("note: ") && l.contains(note)),
            "{note}: {err}"
        );
    }
}

/// A base model (no chat template in its GGUF) completes the prompt as it
/// is, saying so once; `--chat` renders it with the built-in template.
#[test]
fn a_base_model_runs_raw_and_says_so_once() {
    let args = [
        "run",
        "-m",
        "gemma3-270m",
        "-p",
        "Once upon a time",
        "-n",
        "8",
        "--temp",
        "0",
    ];
    let out = hearth(&args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("is a base model").count(), 1, "{err}");
    let raw = hearth(&[&args[..], &["--raw"]].concat());
    assert_eq!(text(&out.stdout), text(&raw.stdout), "the same as --raw");
    assert!(!text(&raw.stderr).contains("base model"));
    let chat = hearth(&[&args[..], &["--chat", "--verbose-prompt"]].concat());
    let err = text(&chat.stderr);
    assert!(
        chat.status.success()
            && err.contains("<start_of_turn>user")
            && !err.contains("is a base model"),
        "{err}"
    );
}

/// Without --verbose a run prints one stats line (load, prompt, first
/// token, eval, total) and no KV or speculation details.
#[test]
fn one_stats_line_unless_verbose() {
    let out = hearth(&[
        "run",
        "-m",
        "smollm2-135m",
        "-p",
        "Hi.",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("load ")
            && lines[0].contains("first token")
            && lines[0].contains("total"),
        "{err}"
    );
    let out = hearth(&[
        "run",
        "-m",
        "smollm2-135m",
        "-p",
        "Hi.",
        "-n",
        "4",
        "--temp",
        "0",
        "-v",
    ]);
    assert!(
        text(&out.stderr).contains("KV cache: "),
        "{}",
        text(&out.stderr)
    );
}

/// `hearth run -h` groups its options by topic, ends with examples, and is
/// wrapped to the terminal's width (COLUMNS when it is not a terminal).
#[test]
fn help_is_grouped_with_examples_and_wrapped() {
    for width in [80usize, 120] {
        let out = hearth_cmd()
            .args(["run", "-h"])
            .env("COLUMNS", width.to_string())
            .output()
            .unwrap();
        let help = text(&out.stdout);
        assert!(out.status.success(), "{help}");
        for heading in [
            "Prompt:",
            "Sampling:",
            "Images:",
            "KV cache:",
            "Speculative decoding:",
            "Examples:",
        ] {
            assert!(help.lines().any(|l| l == heading), "{heading} in:\n{help}");
        }
        let long: Vec<&str> = help.lines().filter(|l| l.chars().count() > width).collect();
        assert!(long.is_empty(), "lines over {width} columns: {long:?}");
    }
    let top = text(&hearth(&["--help"]).stdout);
    assert!(
        top.contains("Examples:") && top.contains("hearth show"),
        "{top}"
    );
    // bench, template and join: grouped the same way, with examples.
    for (cmd, headings) in [
        (
            "bench",
            &[
                "Model:",
                "What to measure:",
                "Output:",
                "Backend:",
                "KV cache:",
            ][..],
        ),
        (
            "template",
            &["Template:", "Conversation:", "Rendering:"][..],
        ),
        ("join", &[][..]),
    ] {
        let out = hearth_cmd()
            .args([cmd, "--help"])
            .env("COLUMNS", "80")
            .output()
            .unwrap();
        let help = text(&out.stdout);
        assert!(out.status.success(), "{help}");
        for heading in headings.iter().chain(&["Examples:"]) {
            assert!(
                help.lines().any(|l| l == *heading),
                "{cmd}: {heading} in:\n{help}"
            );
        }
        let long: Vec<&str> = help.lines().filter(|l| l.chars().count() > 80).collect();
        assert!(long.is_empty(), "{cmd}: lines over 80 columns: {long:?}");
    }
}
