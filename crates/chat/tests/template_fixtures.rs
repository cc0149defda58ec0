//! Chat-template renders against Hugging Face transformers (an independent
//! reference): tests/fixtures/templates/<model>.json holds each packaged
//! model's template, its special tokens, and conversations rendered by
//! transformers' `apply_chat_template(tokenize=False)`
//! (scripts/fixtures/make_template_fixtures.py). Ours must be byte-identical, and must
//! fail wherever transformers failed (with the same message when the template
//! itself called `raise_exception`).

use std::path::{Path, PathBuf};

use hearth_chat::template::{ChatTemplate, TemplateError};
use hearth_gguf::GgufFile;
use serde_json::{Map, Value};

const MODELS: [&str; 4] = [
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b",
    "smollm2-135m",
    "gemma3-270m",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load_fixture(model: &str) -> Value {
    let path = workspace_root().join(format!("tests/fixtures/templates/{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with `python3 scripts/fixtures/make_template_fixtures.py`",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("fixture field '{key}' is not a string"))
}

/// Renders every case of one fixture file (a case's own `template` overrides
/// the file's); returns a description of each mismatch.
fn check_model(model: &str) -> Vec<String> {
    let fx = load_fixture(model);
    let compile = |src: &str| {
        ChatTemplate::from_source(
            src,
            str_field(&fx, "bos_token"),
            str_field(&fx, "eos_token"),
        )
        .unwrap_or_else(|e| panic!("{model}: template does not compile: {e}"))
    };
    let file_template = fx
        .get("template")
        .map(|t| compile(t.as_str().expect("template")));
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "{model}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = str_field(case, "name");
        let own_template = case
            .get("template")
            .map(|t| compile(t.as_str().expect("template")));
        let template = own_template
            .as_ref()
            .or(file_template.as_ref())
            .expect("a template");
        let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
        let kwargs: Map<String, Value> = case["kwargs"].as_object().cloned().unwrap_or_default();
        let agp = case["add_generation_prompt"]
            .as_bool()
            .expect("add_generation_prompt");
        let got = template.render(&case["messages"], tools, agp, &kwargs);
        match (case.get("expected"), case.get("error"), got) {
            (Some(want), _, Ok(got)) if want.as_str() == Some(got.as_str()) => {}
            (Some(want), _, Ok(got)) => failures.push(format!(
                "{model}/{name}: output differs\n  want {:?}\n  got  {got:?}",
                want.as_str().unwrap_or_default()
            )),
            (Some(_), _, Err(e)) => failures.push(format!(
                "{model}/{name}: transformers rendered it, we failed: {e}"
            )),
            (None, Some(err), Ok(got)) => failures.push(format!(
                "{model}/{name}: transformers failed ({}), we rendered {got:?}",
                str_field(err, "message")
            )),
            (None, Some(err), Err(e)) => {
                // jinja2's TemplateError is what raise_exception raises.
                if str_field(err, "type") == "TemplateError" {
                    let want = str_field(err, "message");
                    if !matches!(&e, TemplateError::Raised { message } if message == want) {
                        failures.push(format!(
                            "{model}/{name}: want raise_exception({want:?}), got {e}"
                        ));
                    }
                }
            }
            (None, None, _) => {
                panic!("{model}/{name}: fixture case has neither expected nor error")
            }
        }
    }
    failures
}

fn assert_model(model: &str) {
    let failures = check_model(model);
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen2_5_coder_0_5b_matches_transformers() {
    assert_model("qwen2.5-coder-0.5b");
}

#[test]
fn qwen2_5_coder_1_5b_matches_transformers() {
    assert_model("qwen2.5-coder-1.5b");
}

/// hearth-written templates that exercise the jinja2 features Hub templates
/// use: Python printing, `tojson` options, string methods, loops, macros.
#[test]
fn jinja_features_match_transformers() {
    assert_model("jinja-features");
}

#[test]
fn smollm2_matches_transformers() {
    assert_model("smollm2-135m");
}

#[test]
fn gemma3_matches_transformers() {
    assert_model("gemma3-270m");
}

fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home).join("models"),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
            .join(".cache/hearth/models"),
    }
}

/// The fixtures were made from the packaged GGUFs: `from_gguf` must find the
/// same template (or, without one, the same built-in) and special tokens.
/// Fails (not skips) when a model file is missing, like the tokenizer tests.
#[test]
fn from_gguf_reads_the_fixture_templates() {
    for model in MODELS {
        let fx = load_fixture(model);
        let path = models_dir().join(str_field(&fx, "gguf"));
        assert!(
            path.exists(),
            "model file {} is missing: run `python3 scripts/fetch_models.py {model}` (set HEARTH_HOME to use another models dir)",
            path.display()
        );
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t = ChatTemplate::from_gguf(&file).unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(
            t.source(),
            str_field(&fx, "template"),
            "{model}: template source"
        );
        assert_eq!(t.bos_token(), str_field(&fx, "bos_token"), "{model}: bos");
        assert_eq!(t.eos_token(), str_field(&fx, "eos_token"), "{model}: eos");
        let builtin = str_field(&fx, "template_source").starts_with("builtin:");
        assert_eq!(
            file.metadata().get_str("tokenizer.chat_template").is_none(),
            builtin,
            "{model}: template_source"
        );
    }
}

/// A template that would run for hours stops with an error instead
/// (minijinja's fuel; found by fuzzing chat_template), and one that recurses
/// without end hits the recursion limit.
#[test]
fn runaway_templates_fail_quickly() {
    use hearth_chat::template::ChatTemplate;
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    for (src, want) in [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        (
            "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
            "recursion",
        ),
        ("{{ 'x' * 300000000 }}", "too large"),
    ] {
        let t0 = std::time::Instant::now();
        let e = ChatTemplate::from_source(src, "<s>", "</s>")
            .unwrap()
            .render(&msgs, None, true, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{src}: {e}");
        assert!(t0.elapsed().as_secs() < 30, "{src}: {:?}", t0.elapsed());
    }
}
