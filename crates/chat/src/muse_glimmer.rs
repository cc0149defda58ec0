//! The Muse Glimmer prompt format, built in (spec chat-format.md §1–§2, §6).
//!
//! ```text
//! prompt   := BOS system_turn* turn* "<|start|>assistant"
//! message  := "<|start|>" header "<|message|>" body ( "<|eom|>" | "<|eot|>" )
//! ```
//! [`render_prompt`] builds the prompt as [`Piece`]s so that structure tokens come
//! only from the renderer: message text is tokenized with special-token parsing
//! off (§2.7), and each image is a run of `<|patch|>` slots whose length the
//! vision encoder decides ([`Prompt::encode`]). [`render`] is the same prompt as
//! one string, images shown as [`IMAGE_MARKER`].

use serde_json::{Map, Value};

pub use crate::parser::ChatError;
use crate::parser::{atem, pyjson, ToolSet};

/// The special tokens of §1, by their fixed ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    BeginOfText,
    EndOfText,
    Eom,
    Eot,
    Start,
    Message,
    ImageStart,
    ImageEnd,
    Patch,
}

impl Special {
    pub const ALL: [Special; 9] = [
        Special::BeginOfText,
        Special::EndOfText,
        Special::Eom,
        Special::Eot,
        Special::Start,
        Special::Message,
        Special::ImageStart,
        Special::ImageEnd,
        Special::Patch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Special::BeginOfText => "<|begin_of_text|>",
            Special::EndOfText => "<|end_of_text|>",
            Special::Eom => "<|eom|>",
            Special::Eot => "<|eot|>",
            Special::Start => "<|start|>",
            Special::Message => "<|message|>",
            Special::ImageStart => "<|image_start|>",
            Special::ImageEnd => "<|image_end|>",
            Special::Patch => "<|patch|>",
        }
    }

    pub fn id(self) -> u32 {
        match self {
            Special::BeginOfText => 200000,
            Special::EndOfText => 200001,
            Special::Eom => 200007,
            Special::Eot => 200008,
            Special::Start => 200022,
            Special::Message => 200023,
            Special::ImageStart => 200080,
            Special::ImageEnd => 200081,
            Special::Patch => 200092,
        }
    }
}

/// Stop ids (§3.1): `<|eot|>` and `<|end_of_text|>`; `<|eom|>` is not a stop.
pub const STOP_IDS: [u32; 2] = [200008, 200001];

/// Where an image goes in [`render`]'s string and in hand-written prompts.
pub const IMAGE_MARKER: &str = "<img>";

/// One piece of a prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Special(Special),
    /// Text, tokenized with special-token parsing off.
    Text(String),
    /// An image: its soft-token slots.
    Image,
}

/// A rendered prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prompt {
    pub pieces: Vec<Piece>,
    /// Wrap each image's patches in `<|image_start|>`…`<|image_end|>` (a GGUF
    /// template revision does, §2.6; the reference does not).
    pub wrap_images: bool,
}

impl Prompt {
    /// The prompt as a string, images as [`IMAGE_MARKER`].
    pub fn text(&self) -> String {
        let mut s = String::new();
        for p in &self.pieces {
            match p {
                Piece::Special(t) => s.push_str(t.as_str()),
                Piece::Text(t) => s.push_str(t),
                Piece::Image if self.wrap_images => {
                    s.push_str(Special::ImageStart.as_str());
                    s.push_str(IMAGE_MARKER);
                    s.push_str(Special::ImageEnd.as_str());
                }
                Piece::Image => s.push_str(IMAGE_MARKER),
            }
        }
        s
    }

    /// Splits a hand-written prompt string: special-token strings become
    /// specials and [`IMAGE_MARKER`] an image; the rest is text. This is how the
    /// reference treats the rendered string (special matching on).
    pub fn parse(text: &str) -> Prompt {
        let mut pieces = Vec::new();
        let mut rest = text;
        loop {
            let next = Special::ALL
                .iter()
                .filter_map(|t| {
                    rest.find(t.as_str())
                        .map(|p| (p, t.as_str().len(), Piece::Special(*t)))
                })
                .chain(
                    rest.find(IMAGE_MARKER)
                        .map(|p| (p, IMAGE_MARKER.len(), Piece::Image)),
                )
                .min_by_key(|(p, _, _)| *p);
            let Some((p, n, piece)) = next else {
                break;
            };
            if p > 0 {
                pieces.push(Piece::Text(rest[..p].to_string()));
            }
            pieces.push(piece);
            rest = &rest[p + n..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Prompt {
            pieces,
            wrap_images: false,
        }
    }

    /// Number of images, in order; [`Prompt::encode`] wants one patch count each.
    pub fn image_count(&self) -> usize {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Image))
            .count()
    }

    /// The prompt with every `marker` inside its text pieces turned into an
    /// image (how a caller that renders images as a media marker, as
    /// llama.cpp's libmtmd does, places them).
    pub fn with_marker_images(&self, marker: &str) -> Prompt {
        let mut pieces = Vec::new();
        for p in &self.pieces {
            let Piece::Text(t) = p else {
                pieces.push(p.clone());
                continue;
            };
            for (i, part) in t.split(marker).enumerate() {
                if i > 0 {
                    pieces.push(Piece::Image);
                }
                if !part.is_empty() {
                    pieces.push(Piece::Text(part.to_string()));
                }
            }
        }
        Prompt {
            pieces,
            wrap_images: self.wrap_images,
        }
    }

    /// Token ids: exactly one BOS at position 0 (a leading BOS piece is that
    /// BOS, §2.1), specials by their ids, text through `encode_text` (which must
    /// not parse special tokens), image `i` as `image_tokens[i]` × `<|patch|>`.
    pub fn encode(
        &self,
        image_tokens: &[usize],
        encode_text: impl FnMut(&str) -> Vec<u32>,
    ) -> Result<Vec<u32>, ChatError> {
        if image_tokens.len() != self.image_count() {
            return Err(ChatError::Prompt(format!(
                "{} images in the prompt but {} patch counts",
                self.image_count(),
                image_tokens.len()
            )));
        }
        let runs = self.encode_runs(encode_text)?;
        let mut ids = runs[0].clone();
        for (run, &n) in runs[1..].iter().zip(image_tokens) {
            ids.extend(std::iter::repeat_n(Special::Patch.id(), n));
            ids.extend_from_slice(run);
        }
        Ok(ids)
    }

    /// The token ids between the images: `image_count() + 1` runs, image `i`
    /// going between runs `i` and `i + 1` as its rows in place of the
    /// `<|patch|>` slots of [`Prompt::encode`]. The runs carry everything
    /// else (BOS in the first; `<|image_start|>` / `<|image_end|>` around each
    /// image when [`Prompt::wrap_images`]).
    pub fn encode_runs(
        &self,
        mut encode_text: impl FnMut(&str) -> Vec<u32>,
    ) -> Result<Vec<Vec<u32>>, ChatError> {
        let mut runs = vec![vec![Special::BeginOfText.id()]];
        for (i, p) in self.pieces.iter().enumerate() {
            let run = runs.last_mut().expect("one run at least");
            match p {
                Piece::Special(Special::BeginOfText) if i == 0 => {}
                Piece::Special(Special::BeginOfText) => {
                    return Err(ChatError::Prompt(format!(
                        "a second <|begin_of_text|> at piece {i}: exactly one BOS is allowed"
                    )))
                }
                Piece::Special(t) => run.push(t.id()),
                Piece::Text(t) => run.extend(encode_text(t)),
                Piece::Image => {
                    if self.wrap_images {
                        run.push(Special::ImageStart.id());
                    }
                    let mut next = Vec::new();
                    if self.wrap_images {
                        next.push(Special::ImageEnd.id());
                    }
                    runs.push(next);
                }
            }
        }
        Ok(runs)
    }

    /// [`Prompt::encode`] with a model's tokenizer, after checking that its
    /// special tokens have the ids of §1.
    pub fn encode_with(
        &self,
        tokenizer: &hearth_tokenizer::Tokenizer,
        image_tokens: &[usize],
    ) -> Result<Vec<u32>, ChatError> {
        check_tokenizer(tokenizer)?;
        self.encode(image_tokens, |t| tokenizer.encode(t, false, false))
    }
}

/// Asserts the §1 table against a tokenizer: each special string is one token
/// with its fixed id (gpt-oss reuses these ids with other meanings).
pub fn check_tokenizer(tokenizer: &hearth_tokenizer::Tokenizer) -> Result<(), ChatError> {
    for t in Special::ALL {
        let got = tokenizer.token_id(t.as_str());
        if got != Some(t.id()) {
            return Err(ChatError::Prompt(format!(
                "tokenizer maps {} to {:?}, Muse Glimmer needs {}",
                t.as_str(),
                got,
                t.id()
            )));
        }
    }
    Ok(())
}

/// Rendering settings (the template's variables).
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// `low`, `medium` or `high` (the default); `reasoning_strength` in
    /// `chat_template_kwargs`, §2.2.
    pub reasoning_strength: String,
    /// Adds `\nCurrent date: YYYY-MM-DD.` to the synthesized system prompt (one
    /// template revision does; it breaks cross-day prefix reuse).
    pub current_date: Option<String>,
    /// End with `<|start|>assistant` (§2.5).
    pub add_generation_prompt: bool,
    /// See [`Prompt::wrap_images`].
    pub wrap_images: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            reasoning_strength: "high".to_string(),
            current_date: None,
            add_generation_prompt: true,
            wrap_images: false,
        }
    }
}

/// Renders a conversation (OpenAI `messages`) and its `tools` as one string.
pub fn render(
    messages: &Value,
    tools: Option<&Value>,
    opts: &RenderOptions,
) -> Result<String, ChatError> {
    Ok(render_prompt(messages, tools, opts)?.text())
}

const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant.\nKnowledge cutoff: 2026-01-04.";

/// §2.2 TOOL_BLOCK, up to the namespace lines.
const TOOL_BLOCK_HEAD: &str = concat!(
    "In this environment you have access to a set of tools you can use to answer the user's question.\n\n",
    "You can invoke a function by writing a \"<atem:function_calls>\" block like the following:\n",
    "<atem:function_calls>\n<atem:invoke name=\"$FUNCTION_NAME\">\n",
    "<atem:parameter name=\"$PARAMETER_NAME\">$PARAMETER_VALUE</atem:parameter>\n",
    "...\n</atem:invoke>\n</atem:function_calls>\n\n",
    "String and scalar parameters should be specified as is, while lists and objects should use JSON format. ",
    "Note that spaces for string values are not stripped. ",
    "The output is not expected to be valid XML and is parsed with regular expressions.\n",
    "Here are the functions available in JSONSchema format:\n",
    "// Tool metadata\n",
);

/// §2.2 TOOL_BLOCK, after the function schemas.
const TOOL_BLOCK_TAIL: &str = concat!(
    "\n\nHere's an example of how to call a function in the tool set:\n",
    "(If the tool namespace is not specified, invoke the function directly as ",
    "`example_function_name` rather than `example_tool_name.example_function_name`)\n\n",
    "to=example_tool_name.example_function_name\n\n",
    "<atem:function_calls>\n<atem:invoke name=\"example_tool_name.example_function_name\">\n",
    "<atem:parameter name=\"example_parameter_1\">value_1</atem:parameter>\n",
    "<atem:parameter name=\"example_parameter_2\">This is the value for the second parameter\n",
    "that can span\n\"multiple\" lines\n</atem:parameter>\n",
    "</atem:invoke>\n</atem:function_calls>",
);

/// A tool's namespace: its name up to the first `.`.
fn namespace(name: &str) -> &str {
    name.split_once('.').map_or(name, |(ns, _)| ns)
}

/// TOOL_BLOCK + `"\n\n# Valid recipients: "` + RECIPIENTS + `"."` (§2.2).
fn tool_block(tools: &ToolSet) -> String {
    let mut namespaces: Vec<&str> = Vec::new();
    for t in &tools.tools {
        let ns = namespace(&t.name);
        if !namespaces.contains(&ns) {
            namespaces.push(ns);
        }
    }
    let mut s = String::from(TOOL_BLOCK_HEAD);
    for ns in &namespaces {
        let mut line = Map::new();
        line.insert("name".into(), Value::String(ns.to_string()));
        line.insert("description".into(), Value::String(String::new()));
        s.push_str(&pyjson::to_string(&Value::Object(line)));
        s.push('\n');
    }
    s.push_str("// Function schemas");
    for t in &tools.tools {
        let mut line = Map::new();
        line.insert("name".into(), Value::String(t.name.clone()));
        line.insert("description".into(), Value::String(t.description.clone()));
        // A tool without `parameters` gets an empty schema object.
        let params = match &t.parameters {
            Value::Null => Value::Object(Map::new()),
            p => p.clone(),
        };
        line.insert("parameters".into(), params);
        s.push('\n');
        s.push_str(&pyjson::to_string(&Value::Object(line)));
    }
    s.push_str(TOOL_BLOCK_TAIL);
    s.push_str("\n\n# Valid recipients: \"self\", ");
    for ns in &namespaces {
        s.push_str(&format!("\"{ns}.*\", "));
    }
    s.push_str("\"user\".");
    s
}

/// Builds the pieces of a prompt.
struct Builder {
    pieces: Vec<Piece>,
}

impl Builder {
    fn special(&mut self, t: Special) {
        self.pieces.push(Piece::Special(t));
    }

    fn text(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if let Some(Piece::Text(t)) = self.pieces.last_mut() {
            t.push_str(s);
        } else {
            self.pieces.push(Piece::Text(s.to_string()));
        }
    }

    /// `<|start|>` header `<|message|>`
    fn open(&mut self, header: &str) {
        self.special(Special::Start);
        self.text(header);
        self.special(Special::Message);
    }

    /// A message body: a string, or a list of parts (text concatenated with no
    /// separator, images in place, §2.3).
    fn content(&mut self, index: usize, content: Option<&Value>) -> Result<(), ChatError> {
        match content {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) => {
                self.text(s);
                Ok(())
            }
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part {
                        Value::String(s) => self.text(s),
                        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
                            Some("text") | Some("input_text") | None => {
                                let t = o.get("text").and_then(Value::as_str).ok_or_else(|| {
                                    bad(index, "a text part without a string \"text\"")
                                })?;
                                self.text(t);
                            }
                            // `media_marker`: where llama.cpp-style callers put an image.
                            Some("image") | Some("image_url") | Some("input_image")
                            | Some("media_marker") => self.pieces.push(Piece::Image),
                            Some(other) => {
                                return Err(bad(
                                    index,
                                    &format!("unsupported content part {other:?}"),
                                ))
                            }
                        },
                        _ => {
                            return Err(bad(
                                index,
                                "a content part is neither a string nor an object",
                            ))
                        }
                    }
                }
                Ok(())
            }
            Some(_) => Err(bad(
                index,
                "content must be a string, a list of parts or null",
            )),
        }
    }
}

fn bad(index: usize, reason: &str) -> ChatError {
    ChatError::InvalidMessage {
        index,
        reason: reason.to_string(),
    }
}

/// Plain text of a system message's content.
fn content_text(index: usize, content: Option<&Value>) -> Result<String, ChatError> {
    let mut b = Builder { pieces: Vec::new() };
    b.content(index, content)?;
    let mut s = String::new();
    for p in b.pieces {
        match p {
            Piece::Text(t) => s.push_str(&t),
            _ => {
                return Err(bad(
                    index,
                    "images are only allowed in user and tool messages",
                ))
            }
        }
    }
    Ok(s)
}

/// The system turn's text: content, then the meta lines (§2.2).
fn system_text(content: &str, tools: &ToolSet, opts: &RenderOptions) -> String {
    // **(unverified)** ports rewrite "Reasoning effort" to "Reasoning strength".
    let mut s = content.replace("Reasoning effort", "Reasoning strength");
    if !s.to_lowercase().contains("reasoning strength") {
        s.push_str(&format!(
            "\n\nReasoning strength: {}.",
            opts.reasoning_strength
        ));
    }
    if !tools.is_empty() {
        s.push_str("\n\n");
        s.push_str(&tool_block(tools));
    }
    s
}

fn role_of(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// A call's arguments as an object: OpenAI sends a JSON string (§2.4).
fn call_arguments(index: usize, f: &Value) -> Result<Map<String, Value>, ChatError> {
    match f.get("arguments") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(Map::new()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(bad(index, "tool call arguments are not a JSON object")),
        },
        Some(_) => Err(bad(
            index,
            "tool call arguments must be an object or a JSON string",
        )),
    }
}

/// The tool name a tool result answers: its `name`, else the name of the
/// nearest earlier assistant call with id `tool_call_id` (§2.3).
fn tool_result_name(messages: &[Value], index: usize) -> Result<String, ChatError> {
    let m = &messages[index];
    if let Some(n) = m.get("name").and_then(Value::as_str) {
        return Ok(n.to_string());
    }
    let id = m
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(index, "a tool message needs \"name\" or \"tool_call_id\""))?;
    for earlier in messages[..index].iter().rev() {
        if role_of(earlier) != Some("assistant") {
            continue;
        }
        let calls = earlier.get("tool_calls").and_then(Value::as_array);
        for c in calls.into_iter().flatten() {
            if c.get("id").and_then(Value::as_str) == Some(id) {
                let f = c.get("function").unwrap_or(c);
                if let Some(n) = f.get("name").and_then(Value::as_str) {
                    return Ok(n.to_string());
                }
            }
        }
    }
    Err(bad(
        index,
        &format!("no earlier assistant tool call has id {id:?}"),
    ))
}

/// Renders a conversation as prompt pieces (§2).
pub fn render_prompt(
    messages: &Value,
    tools: Option<&Value>,
    opts: &RenderOptions,
) -> Result<Prompt, ChatError> {
    let messages = messages
        .as_array()
        .ok_or_else(|| ChatError::Prompt("messages must be an array".to_string()))?;
    let tools = match tools {
        Some(t) => ToolSet::from_json(t)?,
        None => ToolSet::default(),
    };
    let mut b = Builder { pieces: Vec::new() };
    b.special(Special::BeginOfText);

    let is_system = |m: &Value| matches!(role_of(m), Some("system" | "developer"));
    if !messages.iter().any(is_system) {
        let mut default = DEFAULT_SYSTEM.to_string();
        if let Some(date) = &opts.current_date {
            default.push_str(&format!("\nCurrent date: {date}."));
        }
        b.open("system");
        b.text(&system_text(&default, &tools, opts));
        b.special(Special::Eot);
    }

    for (i, m) in messages.iter().enumerate() {
        let role = role_of(m).ok_or_else(|| bad(i, "no string \"role\""))?;
        match role {
            // `developer` renders as a system turn (the reference template drops it).
            "system" | "developer" => {
                let text = content_text(i, m.get("content"))?;
                b.open("system");
                b.text(&system_text(&text, &tools, opts));
                b.special(Special::Eot);
            }
            "user" => {
                b.open("user");
                b.content(i, m.get("content"))?;
                b.special(Special::Eot);
            }
            "tool" => {
                let name = tool_result_name(messages, i)?;
                b.open(&format!("tool {name}"));
                b.text(&format!("<tool_output name=\"{name}\">\n"));
                b.content(i, m.get("content"))?;
                b.text("\n</tool_output>");
                b.special(Special::Eot);
            }
            "assistant" => {
                let next_is_assistant = messages.get(i + 1).and_then(role_of) == Some("assistant");
                render_assistant(&mut b, i, m, next_is_assistant)?;
            }
            other => return Err(bad(i, &format!("unknown role {other:?}"))),
        }
    }
    if opts.add_generation_prompt {
        b.special(Special::Start);
        b.text("assistant");
    }
    Ok(Prompt {
        pieces: b.pieces,
        wrap_images: opts.wrap_images,
    })
}

/// Assistant history (§2.4): reasoning, then calls or the answer.
fn render_assistant(
    b: &mut Builder,
    i: usize,
    m: &Value,
    next_is_assistant: bool,
) -> Result<(), ChatError> {
    let reasoning = ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .unwrap_or("");
    if !reasoning.is_empty() {
        b.open("assistant to=self");
        b.text(reasoning);
        b.special(Special::Eom);
    }
    let calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    if let Some(calls) = calls {
        for (j, c) in calls.iter().enumerate() {
            let f = c.get("function").unwrap_or(c);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(i, "a tool call without a string function name"))?;
            let args = call_arguments(i, f)?;
            b.open(&format!("assistant to={name}"));
            b.text(&atem::render_block([(name, &args)]));
            let last = j + 1 == calls.len();
            b.special(if last && !next_is_assistant {
                Special::Eot
            } else {
                Special::Eom
            });
        }
        return Ok(());
    }
    let recipient = m.get("recipient").and_then(Value::as_str).unwrap_or("user");
    let end_turn = m
        .get("end_turn")
        .and_then(Value::as_bool)
        .unwrap_or(recipient == "user");
    b.open(&format!("assistant to={recipient}"));
    b.content(i, m.get("content"))?;
    b.special(if end_turn { Special::Eot } else { Special::Eom });
    Ok(())
}
