//! The scheduler thread is generic over `hearth_models::Backend`; CI
//! has no GPU, so this drives it through a second, test-only backend with the
//! CUDA backend's contract (its own state type, plain multi-row verify
//! passes, no hidden-state taps) that computes with the CPU model. The same
//! turns (a session resumed from its resident prefix, a scratch request, two
//! sessions interleaved, speculation on) must stream the same text as on the
//! CPU model itself, in exact f32 numerics (where multi-row passes compute
//! every row as a one-row pass would).

mod common;

use common::model_path;
use std::sync::{mpsc, Arc};

use hearth_engine::sampler::SamplerConfig;
use hearth_engine::scheduler::{self, Event, EventSink, Job, SchedulerStats};
use hearth_engine::session::SessionStore;
use hearth_engine::spec::factory::{DrafterFactory, MakeDrafter, SpecConfig};
use hearth_engine::spec::SpecKind;
use hearth_models::backend::testing::GpuLike;
use hearth_models::{Backend, BackendState, Model, Numerics};
use hearth_tokenizer::Tokenizer;

/// Events into a std channel (the server uses a tokio one).
struct Sink(mpsc::Sender<Event>);

impl EventSink for Sink {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// What a request streamed: (cached prompt tokens, text, completion tokens).
type Turn = (usize, String, usize);

fn job(session: Option<&str>, prompt: Vec<u32>, max_tokens: usize) -> (Job, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let job = Job {
        session: session.map(str::to_string),
        prompt: prompt.into(),
        sampling: SamplerConfig::greedy(),
        max_tokens,
        stop: Vec::new(),
        ignore_eos: false,
        constraint: None,
        logprobs: None,
        cache_salt: None,
        progress: false,
        end_tokens: Vec::new(),
        events: Box::new(Sink(tx)),
    };
    (job, rx)
}

fn collect(rx: mpsc::Receiver<Event>) -> Turn {
    let (mut cached, mut text) = (usize::MAX, String::new());
    while let Ok(e) = rx.recv() {
        match e {
            Event::Admitted { cached_tokens } => cached = cached_tokens,
            Event::Text(t) => text.push_str(&t),
            Event::Done(s) => return (cached, text, s.completion_tokens),
            Event::Failed(e) => panic!("request failed: {e:?}"),
            Event::Logprobs(_) => panic!("logprobs were not asked for"),
            Event::Progress(_) => panic!("progress was not asked for"),
        }
    }
    panic!("the engine dropped a request");
}

/// The turns of the scenario on one backend; `ngram` turns speculation on.
fn serve_turns<B: Backend + 'static>(
    backend: Arc<B>,
    target: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    ngram: bool,
) -> Vec<Turn> {
    let max_ctx = 256;
    let state_bytes = backend.new_state(max_ctx, 0).unwrap().kv_bytes();
    let mut store = SessionStore::new(4, None, state_bytes, max_ctx);
    let drafters = ngram.then(|| {
        store.set_ring_slack(3);
        let config = SpecConfig {
            kind: SpecKind::Ngram,
            n_draft: Some(3),
            ..SpecConfig::default()
        };
        let f = DrafterFactory::<B>::new(&config, target, |_| Err("no draft model".into()));
        Arc::new(f.unwrap().unwrap()) as Arc<dyn MakeDrafter>
    });
    let (engine, thread) = scheduler::spawn(
        backend,
        tok.clone(),
        store,
        Arc::new(SchedulerStats::default()),
        scheduler::SchedulerConfig {
            drafters,
            batch_invariant: false,
        },
    );
    let enc = |s: &str| tok.encode(s, true, false);
    let first = enc("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n");
    let mut turns = Vec::new();

    // Session "a", turn 1, then turn 2 extending what it holds.
    let (j, rx) = job(Some("a"), first.clone(), 20);
    engine.submit(j).unwrap();
    turns.push(collect(rx));
    let mut second = first.clone();
    second.extend(tok.encode(&turns[0].1, false, false));
    second.extend(tok.encode("\n# Now iteratively:\n", false, false));
    let (j, rx) = job(Some("a"), second, 16);
    engine.submit(j).unwrap();
    turns.push(collect(rx));

    // A scratch request and session "b" submitted together: interleaved steps.
    let (j1, rx1) = job(None, enc("fn gcd(a: u64, b: u64) -> u64 {\n"), 16);
    let (j2, rx2) = job(Some("b"), enc("SELECT name, COUNT(*) FROM orders\n"), 16);
    engine.submit(j1).unwrap();
    engine.submit(j2).unwrap();
    turns.push(collect(rx1));
    turns.push(collect(rx2));

    engine.shutdown();
    thread.join().unwrap();
    turns
}

#[test]
fn scheduler_on_a_second_backend_streams_what_the_cpu_model_streams() {
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let mut model = Model::load(model_path(file)).unwrap();
    model.set_numerics(Numerics::F32);
    let model = Arc::new(model);
    let tok = Arc::new(Tokenizer::from_gguf_path(model_path(file)).unwrap());
    let gpu_like = Arc::new(GpuLike {
        model: model.clone(),
    });

    let want = serve_turns(model.clone(), &model, &tok, false);
    assert_eq!(want.len(), 4);
    assert_eq!(want[0].0, 0, "a new session reuses nothing");
    assert!(
        want[1].0 > 0,
        "turn 2 resumes from the resident prefix: {want:?}"
    );
    assert!(want.iter().all(|t| t.2 > 0 && !t.1.is_empty()), "{want:?}");
    assert_eq!(
        serve_turns(gpu_like.clone(), &model, &tok, false),
        want,
        "plain decoding"
    );
    assert_eq!(
        serve_turns(model.clone(), &model, &tok, true),
        want,
        "speculation on the CPU model"
    );
    assert_eq!(
        serve_turns(gpu_like, &model, &tok, true),
        want,
        "speculation on the second backend"
    );
}

#[test]
fn an_end_token_ends_the_answer_before_its_text() {
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let model = Arc::new(Model::load(model_path(file)).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf_path(model_path(file)).unwrap());
    let max_ctx = 256;
    let state_bytes = Backend::new_state(&*model, max_ctx, 0).unwrap().kv_bytes();
    let store = SessionStore::new(4, None, state_bytes, max_ctx);
    let (engine, thread) = scheduler::spawn(
        model.clone(),
        tok.clone(),
        store,
        Arc::new(SchedulerStats::default()),
        scheduler::SchedulerConfig {
            drafters: None,
            batch_invariant: false,
        },
    );
    let prompt = tok.encode("def fibonacci(n):\n", true, false);
    // The tokens the model writes, then the same request ending on the 6th.
    let (mut j, rx) = job(None, prompt.clone(), 16);
    j.logprobs = Some(0);
    engine.submit(j).unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Ok(e) = rx.recv() {
        match e {
            Event::Logprobs(l) => ids.extend(l.iter().map(|t| t.token)),
            Event::Text(t) => text.push_str(&t),
            Event::Done(_) => break,
            Event::Admitted { .. } => {}
            e => panic!("{e:?}"),
        }
    }
    assert!(ids.len() >= 8, "{ids:?}");
    let end = ids[5];
    let k = ids.iter().position(|&t| t == end).unwrap();
    let (mut j, rx) = job(None, prompt, 16);
    j.end_tokens = vec![end];
    engine.submit(j).unwrap();
    let (_, got, _) = collect(rx);
    let mut d = tok.stream_decoder(true);
    let mut want: String = ids[..k].iter().map(|&t| d.push(t)).collect();
    want.push_str(&d.finish());
    assert_eq!(got, want, "the text before the end token");
    assert!(text.starts_with(&got) && got.len() < text.len());
    engine.shutdown();
    thread.join().unwrap();
}
