//! `hearth serve`: the OpenAI-compatible HTTP server (one model load, many
//! sessions). Loopback only unless told otherwise.

use std::path::Path;
use std::sync::Arc;
#[cfg(feature = "cuda")]
use std::sync::OnceLock;

use anyhow::{Context, Result};

use hearth_engine::sampler::SamplerConfig;
use hearth_engine::spec::SpecKind;
use hearth_models::{Backend, Model};
use hearth_server::scheduler::MakeDrafter;
use hearth_server::{ServerOptions, SpecOptions};

use super::spec::SpecArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Model name (see `hearth pull --list`) or .gguf path [default: qwen2.5-coder-0.5b, pulled on first use]
    #[arg(short, long)]
    pub model: Option<String>,
    /// Address to listen on (a non-loopback address exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 = any free port; the URL line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model id clients send [default: the packaged name, or the file name without .gguf].
    #[arg(long)]
    pub model_id: Option<String>,
    /// Context size per session (prompt + generation), in tokens.
    #[arg(
        short = 'c',
        long = "max-context",
        alias = "ctx-size",
        default_value_t = 4096
    )]
    pub max_context: usize,
    /// KV states held at once, the anonymous scratch session included; the
    /// least recently used idle session is evicted beyond this.
    #[arg(long, default_value_t = 8)]
    pub max_sessions: usize,
    /// Also bound the sessions' total KV cache memory (MiB).
    #[arg(long, value_name = "MIB")]
    pub kv_budget_mib: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Tool-call format: auto, atem, hermes, qwen3-xml, harmony, muse-glimmer or plain.
    #[arg(long, default_value = "auto")]
    pub tool_parser: String,
    /// Largest request body accepted (MiB); larger ones get 413.
    #[arg(long, value_name = "MIB", default_value_t = 16)]
    pub max_body_mib: usize,
    /// Reject prompt + max_tokens over the context (400) instead of clamping max_tokens.
    #[arg(long)]
    pub strict_context: bool,
    /// Worker threads [default: all cores].
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// llama.cpp's -ngl, accepted: hearth places layers by --device (cpu: all
    /// on the CPU; cuda: all on the GPU).
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N",
          value_parser = crate::cli_args::parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<crate::cli_args::GpuLayers>,
    /// Backend: cpu or cuda (weights and every session's KV cache on the GPU).
    #[arg(long, value_enum, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(args: Args) -> Result<()> {
    crate::device::check(args.device)?;
    crate::cli_args::note_gpu_layers(args.n_gpu_layers, args.device);
    args.spec.check(args.device)?;
    crate::init_threads(args.threads)?;
    let path = crate::registry::resolve_model(args.model.as_deref())?;
    crate::limits::check_context(&path, args.max_context, args.max_sessions, args.device)?;
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| default_model_id(args.model.as_deref(), &path));
    let mut options = ServerOptions {
        model_path: path,
        model_id,
        host: args.host,
        port: args.port,
        max_ctx: args.max_context,
        max_sessions: args.max_sessions,
        kv_budget_bytes: args.kv_budget_mib.map(|m| m.saturating_mul(1024 * 1024)),
        api_key: args.api_key.filter(|k| !k.is_empty()),
        tool_parser: args.tool_parser,
        max_body_bytes: args.max_body_mib.saturating_mul(1024 * 1024),
        strict_context: args.strict_context,
        spec: None,
    };
    #[cfg(feature = "cuda")]
    if args.device == crate::device::Device::Cuda {
        // The draft model (--spec draft) goes on the target's GPU, which
        // opens when the server loads the target.
        let gpu: Arc<OnceLock<Arc<hearth_cuda::Gpu>>> = Arc::default();
        let draft_gpu = gpu.clone();
        options.spec = spec_options(&args.spec, move |p| {
            let gpu = draft_gpu
                .get()
                .context("the GPU is opened with the target")?
                .clone();
            crate::cuda::upload(gpu, Arc::new(Model::load_unpacked(p)?))
        });
        let load = move |path: &Path| {
            // The GPU copies the file's blocks itself: no CPU repacking for it.
            let model = Arc::new(Model::load_unpacked(path).map_err(|e| e.to_string())?);
            let gm = crate::cuda::load(model.clone()).map_err(|e| format!("{e:#}"))?;
            let _ = gpu.set(gm.gpu.clone());
            Ok((model, Arc::new(gm)))
        };
        return hearth_server::run_on(options, load).context("hearth serve");
    }
    options.spec = spec_options(&args.spec, |p| Ok(Model::load(p)?));
    hearth_server::run(options).context("hearth serve")
}

/// The server's speculation: the drafter's models load once the target is
/// loaded (a draft model through `load_draft`, onto the target's backend);
/// each session then gets its own drafter.
fn spec_options<B: Backend + 'static>(
    args: &SpecArgs,
    load_draft: impl Fn(&Path) -> Result<B> + Send + Sync + 'static,
) -> Option<SpecOptions> {
    if args.spec == SpecKind::None
        && args.draft_model.is_none()
        && args.block_length.is_none()
        && args.n_draft.is_none()
    {
        return None;
    }
    let args = args.clone();
    let kind = args.spec.as_str().to_string();
    let prepare = move |target: &Arc<Model>| -> Result<(MakeDrafter, usize), String> {
        let factory = args
            .factory(target, &load_draft)
            .map_err(|e| format!("{e:#}"))?
            .ok_or("speculation is off")?;
        let n_draft = args.n_draft(&factory);
        let target = target.clone();
        let args = args.clone();
        let make: MakeDrafter = Arc::new(move |max_ctx: usize, sampling: &SamplerConfig| {
            factory
                .make(&args, &target, max_ctx, sampling)
                .map(|s| s.drafter)
                .map_err(|e| format!("{e:#}"))
        });
        Ok((make, n_draft))
    };
    Some(SpecOptions {
        kind,
        prepare: Arc::new(prepare),
    })
}

/// A packaged name as given (or the default's), else the file stem.
fn default_model_id(arg: Option<&str>, path: &Path) -> String {
    match arg {
        Some(a) if !Path::new(a).is_file() => a.to_string(),
        None => crate::registry::registry().default.clone(),
        _ => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    }
}
