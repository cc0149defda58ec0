//! `hearth template`: render a conversation into the exact prompt a model sees.

use std::io::Write;

use anyhow::{bail, Context, Result};
use hearth_chat::detect::OutputFormat;
use hearth_chat::prompter::{Prompter, Renderer};
use hearth_chat::template::{decode_tool_call_arguments, gguf_special_tokens, ChatTemplate};
use hearth_gguf::GgufFile;
use serde_json::{Map, Value};

#[derive(clap::Args)]
#[command(after_help = r#"Examples:
  echo '[{"role":"user","content":"hi"}]' | hearth template -m qwen2.5-coder-0.5b --messages -
  hearth template -m gemma3-270m --messages request.json      a chat request's messages and tools
  hearth template --format muse-glimmer --messages chat.json --tools tools.json
  hearth template --template chat_template.jinja --messages chat.json --kwargs '{"enable_thinking":false}'"#)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or path to a .gguf file; its chat
    /// template and BOS/EOS tokens are used (default: the default model).
    #[arg(help_heading = "Template", short, long, conflicts_with = "format")]
    pub model: Option<String>,
    /// Use a built-in prompt format instead of a model's template: muse-glimmer.
    #[arg(help_heading = "Template", long)]
    pub format: Option<String>,
    /// Render this chat_template.jinja instead of the model's template (BOS/EOS
    /// still come from -m when given, else they are empty).
    #[arg(help_heading = "Template", long, conflicts_with = "format")]
    pub template: Option<String>,
    /// JSON file ("-" for stdin): a messages array, or a chat request object
    /// with "messages" (and optionally "tools", "chat_template_kwargs").
    #[arg(help_heading = "Conversation", long)]
    pub messages: String,
    /// JSON file with an OpenAI `tools` array.
    #[arg(help_heading = "Conversation", long)]
    pub tools: Option<String>,
    /// Extra template variables as a JSON object (chat_template_kwargs).
    #[arg(help_heading = "Conversation", long)]
    pub kwargs: Option<String>,
    /// Do not end with the assistant turn's opening (add_generation_prompt=false).
    #[arg(help_heading = "Rendering", long)]
    pub no_generation_prompt: bool,
    /// Pass tool-call `arguments` strings as given instead of decoding JSON
    /// strings into objects (the decoding is what hearth's server does).
    #[arg(help_heading = "Rendering", long)]
    pub raw_arguments: bool,
}

pub fn run(args: Args) -> Result<()> {
    let input = read_json(&args.messages)?;
    let (messages, request_tools, request_kwargs) = match input {
        Value::Array(_) => (input, None, None),
        Value::Object(mut req) => {
            let Some(messages) = req.remove("messages") else {
                bail!(
                    "{}: expected a messages array or an object with \"messages\"",
                    args.messages
                )
            };
            (
                messages,
                req.remove("tools"),
                req.remove("chat_template_kwargs"),
            )
        }
        _ => bail!(
            "{}: expected a messages array or an object with \"messages\"",
            args.messages
        ),
    };
    let tools = match &args.tools {
        Some(path) => Some(read_json(path)?),
        None => request_tools.filter(|t| !t.is_null()),
    };
    let kwargs = match (&args.kwargs, request_kwargs) {
        (Some(text), _) => {
            serde_json::from_str::<Value>(text).context("--kwargs is not valid JSON")?
        }
        (None, Some(k)) => k,
        (None, None) => Value::Object(Map::new()),
    };
    let Value::Object(kwargs) = kwargs else {
        bail!("kwargs must be a JSON object")
    };
    let messages = if args.raw_arguments {
        messages
    } else {
        decode_tool_call_arguments(&messages)
    };
    let add_generation_prompt = !args.no_generation_prompt;
    let prompt =
        prompter(&args)?.render(&messages, tools.as_ref(), add_generation_prompt, &kwargs)?;
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The prompter `run` and `serve` use for the model (-m), or one over a given
/// template file or built-in format.
fn prompter(args: &Args) -> Result<Prompter> {
    let output = OutputFormat::Plain;
    match (args.format.as_deref(), &args.template, &args.model) {
        (Some("muse-glimmer" | "muse_glimmer"), _, _) => {
            Ok(Prompter::with_renderer(Renderer::MuseGlimmer, output))
        }
        (Some(other), _, _) => {
            bail!("unknown --format '{other}' (built-in formats: muse-glimmer)")
        }
        (None, Some(t), None) => Ok(Prompter::with_renderer(
            Renderer::Jinja(Box::new(ChatTemplate::from_file(t, "", "")?)),
            output,
        )),
        (None, template, model) => {
            let path = crate::store::resolve_model(model.as_deref())?;
            let file = GgufFile::open(&path)?;
            match template {
                None => Prompter::from_gguf(&file, None, "auto")
                    .with_context(|| format!("chat format of {}", path.display())),
                Some(t) => {
                    let (bos, eos) = gguf_special_tokens(&file);
                    Ok(Prompter::with_renderer(
                        Renderer::Jinja(Box::new(ChatTemplate::from_file(t, &bos, &eos)?)),
                        output,
                    ))
                }
            }
        }
    }
}

fn read_json(path: &str) -> Result<Value> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?
    };
    serde_json::from_str(&text).with_context(|| format!("{path} is not valid JSON"))
}
