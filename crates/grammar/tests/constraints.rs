//! The grammars against hand-written text in each output format and the
//! chat crate's own parsers: a well-formed answer or call (tokenized as the
//! model would write it) passes the constraint token by token and parses to
//! the expected call; text that breaks the schema is stopped at the token
//! that breaks it. Vocabulary: the packaged qwen2.5-coder-0.5b tokenizer
//! (markers it lacks, such as Harmony's, are plain text to it).

use std::collections::HashMap;
use std::sync::Arc;

use hearth_chat::parser::{parser_with, ChatEvent, FinishHint, OutputFormat, ToolSet};
use hearth_grammar::{Grammars, OutputGrammar, ToolCallGrammar};
use hearth_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn tokenizer() -> Arc<Tokenizer> {
    let path = hearth_models::packaged::model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    Arc::new(Tokenizer::from_gguf_path(&path).expect("packaged qwen2.5-coder-0.5b"))
}

fn grammars(t: &Arc<Tokenizer>) -> Grammars {
    Grammars::new(t.clone(), t.vocab_size()).unwrap()
}

/// Feeds `text`'s tokens through a fresh constraint: `Ok` when every token
/// was allowed and end-of-generation is allowed after the last, else the
/// text of the first refused token (and what came before).
fn walk(g: &Grammars, t: &Tokenizer, grammar: &OutputGrammar, text: &str) -> Result<(), String> {
    let mut c = g.constraint(grammar).unwrap();
    let ids = t.encode(text, false, true);
    let mut done = String::new();
    for &id in &ids {
        let mut logits = vec![0.0f32; t.vocab_size()];
        c.mask(&mut logits).unwrap();
        let piece = String::from_utf8_lossy(t.token_to_piece(id)).into_owned();
        if logits[id as usize] == f32::NEG_INFINITY {
            return Err(format!("refused {piece:?} after {done:?}"));
        }
        c.commit(id).unwrap();
        done.push_str(&piece);
    }
    let mut logits = vec![0.0f32; t.vocab_size()];
    c.mask(&mut logits).unwrap();
    let eos = t.eos().unwrap();
    if logits[eos as usize] == f32::NEG_INFINITY {
        return Err(format!("end-of-generation refused after {done:?}"));
    }
    Ok(())
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1}},
                "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "add", "description": "Add",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}}}
    ])
}

/// The calls the format's own parser finds in `text`.
fn parse(format: OutputFormat, text: &str) -> Vec<(String, Value)> {
    let tools = tools();
    let mut p = parser_with(format, Some(&tools), Default::default()).unwrap();
    let mut events = p.feed(text);
    events.extend(p.finish(FinishHint::Stop));
    events
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::ToolCall {
                name, arguments, ..
            } => Some((name, arguments)),
            _ => None,
        })
        .collect()
}

/// One call of get_weather {"city": "Paris", "unit": "c"} and, where the
/// format allows several, a second one of add {"a": 2, "b": 3}, hand-written.
fn canonical(format: OutputFormat) -> (&'static str, &'static str) {
    match format {
        OutputFormat::Hermes => (
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
            "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>",
        ),
        OutputFormat::Qwen3Xml => (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>",
            "\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>",
        ),
        OutputFormat::Atem => (
            "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n<atem:parameter name=\"unit\">c</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "\n<atem:function_calls>\n<atem:invoke name=\"add\">\n<atem:parameter name=\"a\">2</atem:parameter>\n<atem:parameter name=\"b\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
        ),
        OutputFormat::MuseGlimmer => (
            " to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n<atem:parameter name=\"unit\">c</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "",
        ),
        OutputFormat::Harmony => (
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}",
            "",
        ),
        other => panic!("no calls in {other:?}"),
    }
}

const FORMATS: [OutputFormat; 5] = [
    OutputFormat::Hermes,
    OutputFormat::Qwen3Xml,
    OutputFormat::Atem,
    OutputFormat::MuseGlimmer,
    OutputFormat::Harmony,
];

fn calls(g: &Grammars, format: OutputFormat, only: Option<&str>, lazy: bool) -> OutputGrammar {
    let set = ToolSet::from_json(&tools()).unwrap();
    g.tool_calls(&ToolCallGrammar {
        format,
        tools: &set,
        strict: HashMap::new(),
        only,
        lazy,
        parallel: true,
    })
    .unwrap()
}

#[test]
fn required_calls_pass_in_every_format_and_parse_back() {
    let t = tokenizer();
    let g = grammars(&t);
    for format in FORMATS {
        let grammar = calls(&g, format, None, false);
        let (one, two) = canonical(format);
        walk(&g, &t, &grammar, one).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert_eq!(
            parse(format, one),
            vec![("get_weather".into(), json!({"city": "Paris", "unit": "c"}))],
            "{format:?}"
        );
        if !two.is_empty() {
            let both = format!("{one}{two}");
            walk(&g, &t, &grammar, &both).unwrap_or_else(|e| panic!("{format:?}: {e}"));
            assert_eq!(parse(format, &both).len(), 2, "{format:?}");
        }
        // Nothing but calls: an answer in words is refused at once.
        assert!(walk(&g, &t, &grammar, "Sure!").is_err(), "{format:?}");
    }
}

#[test]
fn arguments_outside_the_schema_are_refused() {
    let t = tokenizer();
    let g = grammars(&t);
    for format in FORMATS {
        let grammar = calls(&g, format, None, false);
        let (one, _) = canonical(format);
        // A value outside the enum, a tool that does not exist, a required
        // parameter left out.
        let bad_enum = if format == OutputFormat::Hermes || format == OutputFormat::Harmony {
            one.replace("\"c\"", "\"k\"")
        } else {
            one.replace(">c<", ">k<").replace("\nc\n", "\nk\n")
        };
        let bad_name = one.replace("get_weather", "get_wether");
        let missing = match format {
            OutputFormat::Hermes | OutputFormat::Harmony => one.replace(", \"unit\": \"c\"", ""),
            OutputFormat::Qwen3Xml => one.replace("<parameter=unit>\nc\n</parameter>\n", ""),
            _ => one.replace("<atem:parameter name=\"unit\">c</atem:parameter>\n", ""),
        };
        for (what, text) in [
            ("enum", bad_enum),
            ("name", bad_name),
            ("required", missing),
        ] {
            assert_ne!(text, one, "{format:?} {what}: the edit changed nothing");
            assert!(
                walk(&g, &t, &grammar, &text).is_err(),
                "{format:?}: {what} accepted: {text}"
            );
        }
    }
}

#[test]
fn a_named_function_allows_only_that_function() {
    let t = tokenizer();
    let g = grammars(&t);
    let grammar = calls(&g, OutputFormat::Hermes, Some("add"), false);
    let (one, two) = canonical(OutputFormat::Hermes);
    assert!(walk(&g, &t, &grammar, one).is_err());
    walk(&g, &t, &grammar, two.trim_start()).unwrap();
}

#[test]
fn lazy_calls_leave_text_free_until_the_model_opens_a_call() {
    let t = tokenizer();
    let g = grammars(&t);
    for format in FORMATS {
        let grammar = calls(&g, format, None, true);
        let (one, _) = canonical(format);
        // Any text, then a well-formed call (Harmony: after a reasoning
        // message, as gpt-oss writes it).
        walk(&g, &t, &grammar, "I will look it up {not json}.").unwrap();
        let before = match format {
            OutputFormat::Harmony => {
                "<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant"
            }
            _ => "Let me check.\n",
        };
        let text = format!("{before}{one}");
        walk(&g, &t, &grammar, &text).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert_eq!(parse(format, &text).len(), 1, "{format:?}");
        // Once opened, the call follows the schema.
        let bad = text.replace("get_weather", "get_wether");
        assert!(walk(&g, &t, &grammar, &bad).is_err(), "{format:?}");
    }
}

#[test]
fn json_schemas_accept_valid_instances_and_refuse_invalid_ones() {
    let t = tokenizer();
    let g = grammars(&t);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1},
        "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["zip"], "additionalProperties": false},
        "score": {"type": "number"}},
        "required": ["name", "tags", "address"], "additionalProperties": false});
    let grammar = g.json_schema(OutputFormat::Hermes, &schema).unwrap();
    walk(
        &g,
        &t,
        &grammar,
        r#"{"name": "Ann", "tags": ["a", "b"], "address": {"zip": "12345"}, "score": 1.5}"#,
    )
    .unwrap();
    walk(
        &g,
        &t,
        &grammar,
        r#"{"name": "Ann", "tags": ["b"], "address": {"zip": "00000"}}"#,
    )
    .unwrap();
    for bad in [
        r#"{"name": "Ann", "tags": [], "address": {"zip": "12345"}}"#,
        r#"{"name": "Ann", "tags": ["c"], "address": {"zip": "12345"}}"#,
        r#"{"name": "Ann", "tags": ["a"], "address": {"zip": "1234x"}}"#,
        r#"{"name": "Ann", "tags": ["a"]}"#,
        r#"{"name": "Ann", "tags": ["a"], "address": {"zip": "12345"}, "extra": 1}"#,
        r#"{"name": 5, "tags": ["a"], "address": {"zip": "12345"}}"#,
        "Here is the JSON:",
    ] {
        assert!(walk(&g, &t, &grammar, bad).is_err(), "accepted: {bad}");
    }
    // json_object: any object, nothing else.
    let any = g.json_object(OutputFormat::Hermes).unwrap();
    walk(&g, &t, &any, r#"{"x": [1, {"y": null}]}"#).unwrap();
    assert!(walk(&g, &t, &any, "[1, 2]").is_err());
    // Formats that frame their answer: the JSON comes after the framing.
    let framed = g.json_object(OutputFormat::MuseGlimmer).unwrap();
    walk(&g, &t, &framed, r#" to=user<|message|>{"x": 1}"#).unwrap();
    assert!(walk(&g, &t, &framed, r#"{"x": 1}"#).is_err());
}

#[test]
fn bad_schemas_and_grammars_are_errors_that_say_why() {
    let t = tokenizer();
    let g = grammars(&t);
    let e = g
        .json_schema(
            OutputFormat::Hermes,
            &json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
        )
        .unwrap_err();
    assert!(!e.0.is_empty());
    assert!(g.json_schema(OutputFormat::Hermes, &json!([1])).is_err());
    let e = g.lark("start: undefined_rule").unwrap_err();
    assert!(e.0.contains("undefined_rule"), "{}", e.0);
    g.lark("start: \"yes\" | \"no\"").unwrap();
}

/// Schemas past the limits (hearth_grammar::limits) are refused before
/// compiling, with the limit named, as response formats and as strict tool
/// parameters; a grammar whose start overflows llguidance's own limits
/// (here: ~2,000 optional properties put ~8,000 Earley items in the first
/// row, against its 2,000) is refused when the constraint is built, not at
/// the turn's first token. All on the request's thread: the wide schema
/// that used to overflow the stack (10,000 required properties) is refused
/// before llguidance recurses over it.
#[test]
fn oversized_schemas_are_refused_before_generation() {
    let t = tokenizer();
    let g = grammars(&t);
    let props = |n: usize, required: bool| {
        let p: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("k{i}"), json!({"type": "integer"})))
            .collect();
        let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        match required {
            true => json!({"type": "object", "properties": p, "required": names}),
            false => json!({"type": "object", "properties": p}),
        }
    };
    let enum_of = |n: usize| json!({"enum": (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>()});
    let fmt = OutputFormat::Hermes;
    for (schema, named) in [
        (props(10_000, true), "object properties"),
        (props(100_000, true), "object properties"),
        (enum_of(100_000), "enum values"),
        (props(2_000, false), "optional properties"),
    ] {
        let e = g
            .json_schema(fmt, &schema)
            .err()
            .unwrap_or_else(|| panic!("{named}: accepted"))
            .0;
        assert!(e.contains(named), "{e}");
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": schema}}]);
        let tools = ToolSet::from_json(&tools).unwrap();
        let strict = HashMap::from([("f", true)]);
        let req = ToolCallGrammar {
            format: fmt,
            tools: &tools,
            strict,
            only: None,
            lazy: false,
            parallel: false,
        };
        let e = g.tool_calls(&req).expect_err("refused").0;
        assert!(e.contains(named), "{e}");
    }
    // Within the limits, wide schemas still compile.
    g.json_schema(fmt, &props(3_000, true)).unwrap();
    g.json_schema(fmt, &enum_of(10_000)).unwrap();
    // At the optional-property limit, an answer still runs past the `{`.
    let wide = g.json_schema(fmt, &props(450, false)).unwrap();
    walk(&g, &t, &wide, "{\"k5\": 1, \"k449\": 2}").unwrap();
}

/// A request's tools compile into one grammar, so their schemas share one
/// budget: 200 copies of a 3,000-property tool are refused by name, and
/// the widest tool sets within the budget, in every call syntax, either
/// compile or are refused in one line (never llguidance's internal panic
/// with its backtrace as the message).
#[test]
fn a_requests_tools_share_one_schema_budget() {
    let t = tokenizer();
    let g = grammars(&t);
    let props = |n: usize, required: bool| {
        let p: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("k{i}"), json!({"type": "integer"})))
            .collect();
        let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        match required {
            true => json!({"type": "object", "properties": p, "required": names}),
            false => json!({"type": "object", "properties": p}),
        }
    };
    let request = |copies: usize, schema: &Value, format: OutputFormat| {
        let tools: Vec<Value> = (0..copies)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": schema}}))
            .collect();
        let tools = ToolSet::from_json(&Value::Array(tools)).unwrap();
        let strict = HashMap::new();
        let req = ToolCallGrammar {
            format,
            tools: &tools,
            strict,
            only: None,
            lazy: false,
            parallel: true,
        };
        g.tool_calls(&req).err().map(|e| e.0)
    };
    let e = request(200, &props(3_000, true), OutputFormat::Hermes).expect("refused");
    assert!(
        e.contains("object properties") && e.contains("all tools"),
        "{e}"
    );
    let anyof = json!({"type": "object", "properties": {"a": {"anyOf": (0..2_500)
        .map(|i| json!({"const": i})).collect::<Vec<_>>()}}});
    for format in OutputFormat::ALL {
        if format == OutputFormat::Plain {
            continue;
        }
        for (copies, schema) in [
            (5, props(1_000, true)),
            (1, props(5_000, true)),
            (50, props(100, false)),
            (1, props(450, false)),
            (2, anyof.clone()),
        ] {
            if let Some(e) = request(copies, &schema, format) {
                assert!(
                    !e.contains('\n') && !e.contains("panic"),
                    "{format:?} x{copies}: {e}"
                );
            }
        }
    }
}
