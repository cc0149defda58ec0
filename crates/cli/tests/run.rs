//! `hearth run` end to end against llama.cpp's own CLI output and the hybrid
//! KV layout.

mod common;

use common::{fixture, hearth, hearth_cmd};

use serde_json::Value;

/// llama.cpp's `llama-completion -p P -n 16 --temp 0` printed, on stdout, the
/// prompt, the generated text and a final "\n\n" (recorded in the parity
/// fixture); `hearth run --raw` (plain completion, as llama-completion's
/// `-no-cnv`) prints only the generated text.
#[test]
fn gemma3_greedy_text_equals_llama_cpp() {
    let fx = fixture("parity/gemma3-270m.json");
    let case = &fx["prompts"][0];
    assert_eq!(
        case["cli_command_16"],
        "llama-completion -m $GGUF -p 'The capital of France is' -n 16 --temp 0 -t 2 -no-cnv"
    );
    let stats = std::env::temp_dir().join(format!("hearth-run-{}.json", std::process::id()));
    let out = hearth_cmd()
        .args([
            "run",
            "--raw",
            "-m",
            "gemma3-270m",
            "-p",
            "The capital of France is",
            "-n",
            "16",
            "--temp",
            "0",
            "-t",
            "2",
            "-c",
            "32768",
            "--verbose",
            "--spec",
            "none",
            "--stats-json",
        ])
        .arg(&stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        format!("The capital of France is{text}\n\n"),
        case["cli_text_16"].as_str().unwrap()
    );

    // Hybrid KV cache at -c 32768: 3 global layers hold every position, 15
    // sliding layers hold the 512-position window; 1 KV head x 256 dims, K and
    // V in f16 = 1024 bytes per layer-position. (`--spec none`: llama-completion
    // does not speculate; with the default prompt lookup the sliding layers keep
    // K more slots so a rejected draft can roll back, see spec_auto.rs.)
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(s["kv_bytes"], (3 * 32768 + 15 * 512) * 1024);
    assert_eq!(s["prompt_tokens"], 6);
    assert_eq!(s["generated_tokens"], 16);
    assert!(
        s["prefill_tok_s"].as_f64().unwrap() > 0.0 && s["decode_tok_s"].as_f64().unwrap() > 0.0
    );
    for key in ["load_ms", "time_to_first_token_ms", "total_ms"] {
        assert!(s[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {s}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    // --verbose: the KV cache's layout after the one stats line.
    assert!(
        stderr.contains("3 global layers x 32768 positions + 15 sliding layers x 512 slots"),
        "{stderr}"
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("load "))
        .expect("the stats line");
    for part in [
        "| prompt 6 tokens, ",
        " tok/s | first token ",
        "| eval 16 tokens, ",
        "| total ",
        "| finish: length",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    std::fs::remove_file(&stats).unwrap();
}

#[test]
fn bad_arguments_are_clear_errors() {
    // No -p, no -f, nothing on stdin.
    let out = hearth(&["run", "-m", "smollm2-135m"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("give a prompt with -p TEXT, -f FILE, or on stdin"));
    let out = hearth(&["run", "-m", "smollm2-135m", "-p", "hello world", "-c", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not fit the context"));
}
