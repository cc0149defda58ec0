//! Structured output: the model's tokens constrained to a grammar.
//!
//! The grammars are compiled and matched by [llguidance] (the engine
//! llama.cpp, vLLM and mistral.rs use): [`Grammars`] holds its view of the
//! model's vocabulary (built once per model), [`Grammars::constraint`] turns
//! an [`OutputGrammar`] into a [`TokenConstraint`] for one turn. What the
//! grammars say is built here:
//! - [`json_schema`] / [`json_object`]: a whole answer that is JSON (after the
//!   output format's answer framing, [`answer_prefix`]);
//! - [`tool_calls`]: one or more calls in the model's own tool-call syntax
//!   (Hermes, Qwen3-XML, ATEM, Muse Glimmer, Harmony), arguments constrained
//!   to each tool's schema, either for the whole output (`tool_choice`
//!   `required` or a named function) or lazily, from the moment the model
//!   opens a call on its own (`strict` tools under `tool_choice: auto`);
//! - [`lark`]: a user's grammar in llguidance's Lark syntax (`--grammar`).
//!
//! JSON is generated compactly on one line (`", "` and `": "` separators, no
//! free whitespace): a small model cannot loop on newlines inside an object.

pub mod limits;

use std::sync::Arc;

use hearth_chat::parser::OutputFormat;
use hearth_chat::parser::{ToolDef, ToolSet};
use hearth_engine::turn::TokenConstraint;
use hearth_tokenizer::{TokenAttr, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// A grammar that cannot be built or compiled; the message names the part.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// An error for the API: its first line only. llguidance reports an
/// internal panic with the panic's backtrace after the message; that is
/// for a developer's log, not for a client.
fn err(e: impl std::fmt::Display) -> GrammarError {
    GrammarError(first_line(&e.to_string()))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

/// The vocabulary as llguidance sees it: every token's bytes (control
/// tokens as special tokens, which grammars name by id), hearth's own
/// tokenizer for text the grammar forces.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // Forced text: tokenized as a prompt would be (no special parsing);
        // a tail that is not UTF-8 goes byte by byte through the trie.
        let valid = match std::str::from_utf8(s) {
            Ok(_) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = std::str::from_utf8(&s[..valid]).expect("checked prefix");
        let mut ids = self.tokenizer.encode(text, false, false);
        ids.extend(self.trie.greedy_tokenize(&s[valid..]));
        ids
    }
}

/// llguidance's compiled view of one model's vocabulary; build it once per
/// loaded model and share it across requests.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    tokenizer: Arc<Tokenizer>,
}

impl Grammars {
    /// `n_vocab` is the model's logits width (it may exceed the tokenizer's
    /// vocabulary; the extra ids are never allowed).
    pub fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> Result<Grammars, GrammarError> {
        let n = n_vocab.max(tokenizer.vocab_size());
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                if id as usize >= tokenizer.vocab_size() {
                    return Vec::new();
                }
                let piece = tokenizer.token_to_piece(id);
                if tokenizer
                    .token_attr(id)
                    .contains(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
                {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let mut eog: Vec<u32> = tokenizer.eos_set().iter().copied().collect();
        if let Some(e) = tokenizer.eos() {
            eog.retain(|&t| t != e);
            eog.insert(0, e);
        }
        let first = *eog
            .first()
            .ok_or_else(|| err("the model has no end-of-generation token"))?;
        let trie = TokTrie::from(&TokRxInfo::new(n as u32, first), &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(Env {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(err)?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
            tokenizer,
        })
    }

    /// Compiles `grammar` for one turn.
    pub fn constraint(
        &self,
        grammar: &OutputGrammar,
    ) -> Result<Box<dyn TokenConstraint>, GrammarError> {
        match grammar {
            OutputGrammar::Full(g) => Ok(Box::new(Constraint {
                matcher: Some(self.matcher(g)?),
                lazy: None,
            })),
            OutputGrammar::Lazy { trigger, grammar } => {
                // Compiled now so a bad grammar fails the request, not the turn.
                self.matcher(grammar)?;
                let trigger_token = self
                    .tokenizer
                    .token_id(trigger)
                    .filter(|&id| self.tokenizer.token_to_piece(id) == trigger.as_bytes());
                Ok(Box::new(Constraint {
                    matcher: None,
                    lazy: Some(Lazy {
                        grammars: self.clone(),
                        trigger: trigger.clone(),
                        trigger_token,
                        grammar: grammar.clone(),
                        tail: Vec::new(),
                    }),
                }))
            }
        }
    }

    /// A matcher for `g`, with its first mask computed: a grammar whose
    /// start already exceeds llguidance's limits (items per row, lexer
    /// fuel) fails here, before the request is admitted, not at its first
    /// token.
    fn matcher(&self, g: &TopLevelGrammar) -> Result<Matcher, GrammarError> {
        let parser = self.factory.create_parser(g.clone()).map_err(err)?;
        let mut m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(err(e));
        }
        m.compute_mask().map_err(|e| {
            GrammarError(format!(
                "the constraint engine cannot run this grammar ({})",
                e.to_string().lines().next().unwrap_or_default()
            ))
        })?;
        Ok(m)
    }

    /// How a literal marker is written in a Lark grammar: a control token by
    /// its id (`<[N]>`), anything else as a quoted string.
    fn lit(&self, s: &str) -> String {
        match self.tokenizer.token_id(s) {
            Some(id)
                if self.tokenizer.is_special(id)
                    && self.tokenizer.token_to_piece(id) == s.as_bytes() =>
            {
                format!("<[{id}]>")
            }
            _ => quote(s),
        }
    }
}

/// A Lark string literal.
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// What one turn's output must follow.
#[derive(Clone, Debug)]
pub enum OutputGrammar {
    /// The whole output.
    Full(TopLevelGrammar),
    /// Free text until the model writes `trigger` on its own, then `grammar`
    /// for what follows it (and nothing after the grammar ends).
    Lazy {
        trigger: String,
        grammar: TopLevelGrammar,
    },
}

struct Lazy {
    grammars: Grammars,
    trigger: String,
    /// The trigger as one token, when the vocabulary has it.
    trigger_token: Option<u32>,
    grammar: TopLevelGrammar,
    /// The last bytes generated (text triggers).
    tail: Vec<u8>,
}

struct Constraint {
    matcher: Option<Matcher>,
    /// Waiting for the trigger.
    lazy: Option<Lazy>,
}

impl TokenConstraint for Constraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let Some(m) = self.matcher.as_mut() else {
            return Ok(());
        };
        let allowed = m
            .compute_mask_or_eos()
            .map_err(|e| first_line(&e.to_string()))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if let Some(m) = self.matcher.as_mut() {
            if m.is_stopped() {
                // The grammar is complete: only end-of-generation was allowed.
                return Ok(());
            }
            return m
                .consume_token(token)
                .map_err(|e| first_line(&e.to_string()));
        }
        let Some(lazy) = self.lazy.as_mut() else {
            return Ok(());
        };
        // The bytes after the trigger that this token already wrote.
        let fired: Option<Vec<u8>> = if lazy.trigger_token == Some(token) {
            Some(Vec::new())
        } else {
            let keep = lazy.trigger.len() + 64;
            if lazy.tail.len() > keep {
                lazy.tail.drain(..lazy.tail.len() - keep);
            }
            let before = lazy.tail.len();
            let piece = lazy.grammars.tokenizer.token_to_piece(token);
            lazy.tail.extend_from_slice(piece);
            let trig = lazy.trigger.as_bytes();
            // The first occurrence that ends inside this token.
            (0..(lazy.tail.len() + 1).saturating_sub(trig.len()))
                .find(|&at| at + trig.len() > before && lazy.tail[at..].starts_with(trig))
                .map(|at| lazy.tail[at + trig.len()..].to_vec())
        };
        if let Some(rest) = fired {
            let lazy = self.lazy.take().expect("checked");
            let mut m = lazy.grammars.matcher(&lazy.grammar).map_err(|e| e.0)?;
            if !rest.is_empty() {
                let ids = lazy.grammars.factory.tok_env().tokenize_bytes(&rest);
                m.consume_tokens(&ids)
                    .map_err(|e| first_line(&e.to_string()))?;
            }
            self.matcher = Some(m);
        }
        Ok(())
    }
}

/// llguidance's options for the JSON it generates: one line, `, ` and `: `.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A `%json` item of a Lark grammar.
fn json_item(schema: &Value) -> String {
    format!("%json {}", compact(schema.clone()))
}

/// The text the output format puts before the answer to the user (the
/// grammar of a `response_format` starts after it).
pub fn answer_prefix(format: OutputFormat) -> &'static [&'static str] {
    match format {
        OutputFormat::MuseGlimmer => &[" to=user", "<|message|>"],
        OutputFormat::Harmony => &["<|channel|>", "final", "<|message|>"],
        _ => &[],
    }
}

impl Grammars {
    fn prefix(&self, format: OutputFormat) -> String {
        answer_prefix(format)
            .iter()
            .map(|s| self.lit(s))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// An answer that is JSON valid under `schema` (a JSON Schema), after the
    /// format's answer framing. Errors name what llguidance rejected.
    pub fn json_schema(
        &self,
        format: OutputFormat,
        schema: &Value,
    ) -> Result<OutputGrammar, GrammarError> {
        if !schema.is_object() && !schema.is_boolean() {
            return Err(err("the schema must be a JSON object"));
        }
        limits::check_schema(schema)?;
        let lark = format!(
            "%llguidance {{}}\nstart: {} {}\n",
            self.prefix(format),
            json_item(schema)
        );
        let g = OutputGrammar::Full(TopLevelGrammar::from_lark(lark));
        // The error names the schema's problem; the Lark wrapper around it is
        // ours, not the user's, so it is left out.
        self.constraint(&g).map_err(|e| {
            let first = e.0.lines().next().unwrap_or_default();
            let msg = match first.split_once("): ") {
                Some((at, rest)) if at.starts_with("at ") => rest,
                _ => first,
            };
            GrammarError(msg.to_string())
        })?;
        Ok(g)
    }

    /// An answer that is some JSON object (`response_format: json_object`).
    pub fn json_object(&self, format: OutputFormat) -> Result<OutputGrammar, GrammarError> {
        self.json_schema(format, &json!({"type": "object"}))
    }

    /// A user's grammar in llguidance's Lark syntax (`%llguidance {}` and
    /// `%json` allowed).
    pub fn lark(&self, source: &str) -> Result<OutputGrammar, GrammarError> {
        let g = OutputGrammar::Full(TopLevelGrammar::from_lark(source.to_string()));
        self.constraint(&g)?;
        Ok(g)
    }

    /// Tool calls in the output format's syntax ([`ToolCallGrammar`]).
    pub fn tool_calls(&self, req: &ToolCallGrammar) -> Result<OutputGrammar, GrammarError> {
        let tools: Vec<&ToolDef> = match req.only {
            Some(name) => {
                let t = req
                    .tools
                    .tools
                    .iter()
                    .find(|t| t.name == name)
                    .ok_or_else(|| err(format!("no tool named {name:?} in `tools`")))?;
                vec![t]
            }
            None => req.tools.tools.iter().collect(),
        };
        if tools.is_empty() {
            return Err(err("tool calls were asked for but `tools` is empty"));
        }
        let syntax = CallSyntax::of(req.format)?;
        let mut rules = Vec::new();
        let mut calls = Vec::new();
        // The tools compile into one grammar: their schemas share one budget.
        let mut budget = limits::Budget::default();
        for (i, t) in tools.iter().enumerate() {
            let strict = req.strict.get(t.name.as_str()).copied().unwrap_or(true);
            let args = if strict && t.parameters.is_object() {
                budget.spend(&t.parameters).map_err(|e| {
                    let all = if i > 0 {
                        " (all tools' parameters together)"
                    } else {
                        ""
                    };
                    err(format!("tool {:?}'s parameters: {e}{all}", t.name))
                })?;
                t.parameters.clone()
            } else {
                json!({"type": "object"})
            };
            let body = match syntax {
                CallSyntax::Hermes => json_item(&json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": args},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })),
                CallSyntax::Harmony => json_item(&args),
                CallSyntax::Qwen3Xml | CallSyntax::Atem | CallSyntax::MuseGlimmer => {
                    self.xml_params(syntax, &mut rules, i, &args)
                }
            };
            let full = syntax.head(&t.name);
            let head = if req.lazy {
                // The model wrote the trigger itself; the grammar starts after it.
                let at = full
                    .find(syntax.trigger())
                    .expect("heads hold their trigger");
                &full[at + syntax.trigger().len()..]
            } else {
                &full[..]
            };
            let tail = self.text(syntax.tail());
            rules.push(format!("args_{i}: {body} {tail}"));
            rules.push(format!("call_{i}: {} args_{i}", self.text(head)));
            rules.push(format!("full_{i}: {} args_{i}", self.text(&full)));
            calls.push(i);
        }
        let alt = |prefix: &str| {
            calls
                .iter()
                .map(|i| format!("{prefix}_{i}"))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let call = alt("call");
        // Later calls are written in full (their trigger included).
        rules.push(format!("next_call: {}", alt("full")));
        let start = if req.parallel && syntax.parallel() {
            "call (\"\\n\" next_call)*"
        } else {
            "call"
        };
        let mut lark = format!("%llguidance {{}}\nstart: {start}\ncall: {call}\n");
        for r in &rules {
            lark.push_str(r);
            lark.push('\n');
        }
        let grammar = TopLevelGrammar::from_lark(lark);
        let g = if req.lazy {
            OutputGrammar::Lazy {
                trigger: syntax.trigger().to_string(),
                grammar,
            }
        } else {
            OutputGrammar::Full(grammar)
        };
        self.constraint(&g)?;
        Ok(g)
    }

    /// Literal text as Lark items: control tokens by id, the rest quoted.
    fn text(&self, s: &str) -> String {
        let mut items = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let next = SPECIAL_MARKERS
                .iter()
                .filter_map(|m| rest.find(m).map(|at| (at, *m)))
                .min();
            match next {
                Some((at, m)) => {
                    if at > 0 {
                        items.push(quote(&rest[..at]));
                    }
                    items.push(self.lit(m));
                    rest = &rest[at + m.len()..];
                }
                None => {
                    items.push(quote(rest));
                    rest = "";
                }
            }
        }
        if items.is_empty() {
            "\"\"".to_string()
        } else {
            items.join(" ")
        }
    }

    /// Parameters of an XML-style call: required ones in schema order, then
    /// optional ones, each `?`; string values are free text up to the closing
    /// tag, other values JSON under their schema.
    fn xml_params(
        &self,
        syntax: CallSyntax,
        rules: &mut Vec<String>,
        tool: usize,
        schema: &Value,
    ) -> String {
        let props = schema.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(props) = props else {
            return String::new();
        };
        let mut items = Vec::new();
        for (j, (key, sub)) in props.iter().enumerate() {
            let rule = format!("p_{tool}_{j}");
            let is_string = sub.get("type").and_then(Value::as_str) == Some("string");
            let choices: Option<Vec<&str>> = match (sub.get("enum"), sub.get("const")) {
                (Some(Value::Array(e)), _) => e.iter().map(Value::as_str).collect(),
                (_, Some(Value::String(c))) => Some(vec![c.as_str()]),
                _ => None,
            };
            let (open, close) = syntax.param_tags(key);
            let value = match choices {
                // String choices are written raw, like any string value.
                Some(c) if !c.is_empty() => {
                    let alts: Vec<String> = c.iter().map(|v| quote(v)).collect();
                    format!("({}) {}", alts.join(" | "), quote(&close))
                }
                _ if is_string => {
                    // Shortest text that ends with the closing tag.
                    let close_rx = regex_escape(&close);
                    rules.push(format!("{rule}_v[lazy]: /(?s:.*){close_rx}/"));
                    format!("{rule}_v")
                }
                _ => format!("{} {}", json_item(sub), quote(&close)),
            };
            rules.push(format!("{rule}: {} {value}", quote(&open)));
            if required.contains(&key.as_str()) {
                items.push((0, rule));
            } else {
                items.push((1, format!("{rule}?")));
            }
        }
        items.sort_by_key(|(o, _)| *o);
        items
            .into_iter()
            .map(|(_, r)| r)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Escapes text for a Lark `/regex/`.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/-".contains(c) {
            out.push('\\');
            out.push(c);
        } else if c == '\n' {
            out.push_str("\\n");
        } else {
            out.push(c);
        }
    }
    out
}

/// What [`Grammars::tool_calls`] builds.
pub struct ToolCallGrammar<'a> {
    pub format: OutputFormat,
    pub tools: &'a ToolSet,
    /// Per tool name: whether its arguments are constrained to its schema
    /// (absent: constrained).
    pub strict: std::collections::HashMap<&'a str, bool>,
    pub only: Option<&'a str>,
    pub lazy: bool,
    pub parallel: bool,
}

/// Markers that may be control tokens, written by id in grammars.
const SPECIAL_MARKERS: &[&str] = &[
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
    "<|eom|>",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallSyntax {
    Hermes,
    Qwen3Xml,
    Atem,
    MuseGlimmer,
    Harmony,
}

impl CallSyntax {
    fn of(format: OutputFormat) -> Result<CallSyntax, GrammarError> {
        Ok(match format {
            OutputFormat::Hermes => CallSyntax::Hermes,
            OutputFormat::Qwen3Xml => CallSyntax::Qwen3Xml,
            OutputFormat::Atem => CallSyntax::Atem,
            OutputFormat::MuseGlimmer => CallSyntax::MuseGlimmer,
            OutputFormat::Harmony => CallSyntax::Harmony,
            other => {
                return Err(err(format!(
                    "the model's output format ({other:?}) has no tool-call syntax to constrain"
                )))
            }
        })
    }

    /// The text whose appearance starts a lazy grammar.
    fn trigger(self) -> &'static str {
        match self {
            CallSyntax::Hermes | CallSyntax::Qwen3Xml => "<tool_call>",
            CallSyntax::Atem | CallSyntax::MuseGlimmer => "<atem:function_calls>",
            CallSyntax::Harmony => " to=functions.",
        }
    }

    /// Whether several calls may follow each other in one output (Harmony's
    /// and Muse Glimmer's calls end the generation).
    fn parallel(self) -> bool {
        !matches!(self, CallSyntax::Harmony | CallSyntax::MuseGlimmer)
    }

    /// A call's text before its arguments (it holds the trigger).
    fn head(self, name: &str) -> String {
        match self {
            CallSyntax::Hermes => "<tool_call>\n".into(),
            CallSyntax::Qwen3Xml => format!("<tool_call>\n<function={name}>\n"),
            CallSyntax::Atem => format!("<atem:function_calls>\n<atem:invoke name=\"{name}\">\n"),
            CallSyntax::MuseGlimmer => format!(
                " to={name}<|message|><atem:function_calls>\n<atem:invoke name=\"{name}\">\n"
            ),
            CallSyntax::Harmony => {
                format!("<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>")
            }
        }
    }

    /// A call's text after its arguments.
    fn tail(self) -> &'static str {
        match self {
            CallSyntax::Hermes => "\n</tool_call>",
            CallSyntax::Qwen3Xml => "</function>\n</tool_call>",
            CallSyntax::Atem | CallSyntax::MuseGlimmer => "</atem:invoke>\n</atem:function_calls>",
            CallSyntax::Harmony => "",
        }
    }

    fn param_tags(self, key: &str) -> (String, String) {
        match self {
            CallSyntax::Qwen3Xml => (
                format!("<parameter={key}>\n"),
                "\n</parameter>\n".to_string(),
            ),
            _ => (
                format!("<atem:parameter name=\"{key}\">"),
                "</atem:parameter>\n".to_string(),
            ),
        }
    }
}
