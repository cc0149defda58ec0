//! Spec chat-format.md §6: the golden Muse Glimmer prompt cases, tokenizer level.
//!
//! `ids = [200000] + encode(prompt)`, special strings → their ids, `<img>` → N ×
//! 200092. The data (docs/spec/data/muse-glimmer-prompt-golden.json, embedded
//! below and compared with the shared copy when it is present) gives each case's
//! token count, the positions of its special-token runs and the sha256 of its
//! ids, but no tokenizer.json. So:
//!
//! - `golden_structure` checks everything that does not depend on the model's
//!   BPE: BOS handling, special-token splitting and ids, image expansion, and
//!   that the text between specials lines up with the gaps between the golden
//!   runs. The text encoder there is a stand-in whose per-text token counts are
//!   read off the golden gaps; they are checked for consistency across cases
//!   and against §1/§6's statements (`user`, `assistant`, `system` are one token,
//!   ` to=self` two), which is the independent part. A regression guard for the
//!   rest.
//! - `golden_ids_with_real_tokenizer` runs the full check (ids_sha256) with the
//!   real tokenizer.json when HEARTH_MUSE_GLIMMER_TOKENIZER points at it (its
//!   sha256 must be the pinned one); without it the test says so and passes.

use std::collections::BTreeMap;

use hearth_chat::muse_glimmer::{self, Piece, Prompt, RenderOptions, Special, IMAGE_MARKER};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const GOLDEN: &str = r#"{"comment": "Regenerate with tests/gen_prompt_golden.py. Commits that change these numbers must say why.", "tokenizer_sha256": "c9dbee66967b58f31a7c27f723c3760da3526ccd0427578e8905b0abb0031c4d", "cases": {
  "harmony_multi_turn": {"prompt": "<|start|>system<|message|>You are a helpful AI assistant.<|eot|><|start|>user<|message|>Hi.<|eot|><|start|>assistant<|message|>Hello.<|eot|><|start|>user<|message|>And again?<|eot|><|start|>assistant", "num_tokens": 33, "num_soft_tokens": 0, "ids_sha256": "2f61b1b3483b9324e99fb2a51317960c1972eaa8d2bac7ad1d5fcf1782c6c304",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [11, 200008, 1], [12, 200022, 1], [14, 200023, 1], [17, 200008, 1], [18, 200022, 1], [20, 200023, 1], [23, 200008, 1], [24, 200022, 1], [26, 200023, 1], [30, 200008, 1], [31, 200022, 1]]},
  "harmony_reasoning_then_answer": {"prompt": "<|start|>assistant to=self<|message|>Thinking.<|eom|><|start|>assistant<|message|>Answer.<|eot|>", "num_tokens": 16, "num_soft_tokens": 0, "ids_sha256": "b0b15fbc6ff88f37de110f5ea626bcbbd6372bd987abf2f54c9abc56cf6a02e9",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [5, 200023, 1], [9, 200007, 1], [10, 200022, 1], [12, 200023, 1], [15, 200008, 1]]},
  "harmony_single_turn": {"prompt": "<|start|>user<|message|>What is 17 * 23?<|eot|><|start|>assistant", "num_tokens": 15, "num_soft_tokens": 0, "ids_sha256": "9c48a3a06773b9db3748feddcf6d9f2940fa51ec25cf149ad48d2bcf861836af",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [12, 200008, 1], [13, 200022, 1]]},
  "harmony_with_system": {"prompt": "<|start|>system<|message|>You are a helpful AI assistant.<|eot|><|start|>user<|message|>Name three primes.<|eot|><|start|>assistant", "num_tokens": 22, "num_soft_tokens": 0, "ids_sha256": "8153652af10601ff43368325ab9cc02977991559579a57e1e82ed3191e9222b3",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [11, 200008, 1], [12, 200022, 1], [14, 200023, 1], [19, 200008, 1], [20, 200022, 1]]},
  "image_large": {"prompt": "<|start|>user<|message|>Describe this image: <img><|eot|><|start|>assistant", "num_tokens": 268, "num_soft_tokens": 256, "ids_sha256": "506abf60a1505f948ee5842b6f0c7ef88e3ae200e888804419a6a5e2d31647d4",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [9, 200092, 256], [265, 200008, 1], [266, 200022, 1]]},
  "image_small": {"prompt": "<|start|>user<|message|>Describe this image: <img><|eot|><|start|>assistant", "num_tokens": 16, "num_soft_tokens": 4, "ids_sha256": "0335689d8708398a95c51637c63c75411308d7619b028945074927210aca8830",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [9, 200092, 4], [13, 200008, 1], [14, 200022, 1]]},
  "readme_minimal_user": {"prompt": "<|start|>user<|message|>What is the meaning of life?<|eot|><|start|>assistant", "num_tokens": 14, "num_soft_tokens": 0, "ids_sha256": "f155e8ffe8ef139f05ddfb2906424f988d52d6707035a70e674ede1ddc4b65eb",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [11, 200008, 1], [12, 200022, 1]]},
  "readme_target_only": {"prompt": "<|start|>system<|message|>You are a helpful assistant.<|eot|><|start|>user<|message|>What is the meaning of life?<|eot|><|start|>assistant", "num_tokens": 24, "num_soft_tokens": 0, "ids_sha256": "ffb960a85bd36683430209f378193c1425820187e4833fbec3b0b03fce3dfdbd",
    "special_runs": [[0, 200000, 1], [1, 200022, 1], [3, 200023, 1], [10, 200008, 1], [11, 200022, 1], [13, 200023, 1], [21, 200008, 1], [22, 200022, 1]]},
  "text_plain": {"prompt": "The meaning of life is", "num_tokens": 6, "num_soft_tokens": 0, "ids_sha256": "7494d47019eb24fc44194578794b9abf3ebb36652d45e142bfec377b47d20d4c",
    "special_runs": [[0, 200000, 1]]}
}}"#;

const SHARED_COPY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/spec/data/muse-glimmer-prompt-golden.json"
);

struct Case {
    name: String,
    prompt: String,
    num_tokens: usize,
    num_soft_tokens: usize,
    ids_sha256: String,
    /// (position, id, run length)
    special_runs: Vec<(usize, u32, usize)>,
}

fn golden() -> (Value, Vec<Case>) {
    let data: Value = serde_json::from_str(GOLDEN).unwrap();
    let cases = data["cases"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, c)| Case {
            name: name.clone(),
            prompt: c["prompt"].as_str().unwrap().to_string(),
            num_tokens: c["num_tokens"].as_u64().unwrap() as usize,
            num_soft_tokens: c["num_soft_tokens"].as_u64().unwrap() as usize,
            ids_sha256: c["ids_sha256"].as_str().unwrap().to_string(),
            special_runs: c["special_runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    let r: Vec<u64> = r
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap())
                        .collect();
                    (r[0] as usize, r[1] as u32, r[2] as usize)
                })
                .collect(),
        })
        .collect();
    (data, cases)
}

#[test]
fn embedded_golden_matches_the_shared_file() {
    let (embedded, _) = golden();
    match std::fs::read_to_string(SHARED_COPY) {
        Ok(text) => {
            let shared: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                shared, embedded,
                "the spec's golden data changed: update the embedded copy"
            );
        }
        Err(_) => eprintln!("{SHARED_COPY} not found; using the embedded copy"),
    }
}

/// Runs of equal special ids in `ids`: (position, id, length), as the golden data lists them.
fn special_runs(ids: &[u32]) -> Vec<(usize, u32, usize)> {
    let mut runs: Vec<(usize, u32, usize)> = Vec::new();
    for (pos, &id) in ids.iter().enumerate() {
        if id < 200000 {
            continue;
        }
        match runs.last_mut() {
            Some((p, i, n)) if *i == id && *p + *n == pos => *n += 1,
            _ => runs.push((pos, id, 1)),
        }
    }
    runs
}

fn sha256_of_ids(ids: &[u32]) -> String {
    let s: Vec<String> = ids.iter().map(u32::to_string).collect();
    Sha256::digest(s.join(",").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The text pieces of a case's prompt and the golden number of tokens of each:
/// the gap between consecutive special runs.
fn text_token_counts(case: &Case) -> Vec<(String, usize)> {
    let prompt = Prompt::parse(&case.prompt);
    let mut runs = case.special_runs.iter();
    let bos = runs.next().unwrap();
    assert_eq!(*bos, (0, 200000, 1), "{}: BOS first", case.name);
    let mut pos = 1;
    let mut out = Vec::new();
    let mut pending_text: Option<String> = None;
    let close_gap = |at: usize,
                     pos: &mut usize,
                     pending: &mut Option<String>,
                     out: &mut Vec<(String, usize)>| {
        match pending.take() {
            Some(t) => {
                assert!(
                    at > *pos,
                    "{}: text {t:?} has no tokens before position {at}",
                    case.name
                );
                out.push((t, at - *pos));
            }
            None => assert_eq!(
                at, *pos,
                "{}: tokens with no text before position {at}",
                case.name
            ),
        }
    };
    for piece in &prompt.pieces {
        match piece {
            Piece::Text(t) => {
                assert!(pending_text.is_none(), "two text pieces in a row");
                pending_text = Some(t.clone());
            }
            Piece::Special(s) => {
                let &(at, id, n) = runs
                    .next()
                    .unwrap_or_else(|| panic!("{}: more specials than runs", case.name));
                close_gap(at, &mut pos, &mut pending_text, &mut out);
                assert_eq!(
                    (id, n),
                    (s.id(), 1),
                    "{}: special {:?} at {at}",
                    case.name,
                    s
                );
                pos = at + 1;
            }
            Piece::Image => {
                let &(at, id, n) = runs.next().unwrap();
                close_gap(at, &mut pos, &mut pending_text, &mut out);
                assert_eq!(
                    (id, n),
                    (Special::Patch.id(), case.num_soft_tokens),
                    "{}: image",
                    case.name
                );
                pos = at + n;
            }
        }
    }
    assert!(
        runs.next().is_none(),
        "{}: more runs than specials",
        case.name
    );
    close_gap(case.num_tokens, &mut pos, &mut pending_text, &mut out);
    out
}

#[test]
fn golden_structure() {
    let (_, cases) = golden();
    assert_eq!(cases.len(), 9);
    // Token counts of each distinct text, which must agree across cases.
    let mut table: BTreeMap<String, usize> = BTreeMap::new();
    for case in &cases {
        for (text, n) in text_token_counts(case) {
            let seen = *table.entry(text.clone()).or_insert(n);
            assert_eq!(
                seen, n,
                "{}: {text:?} is {n} tokens here, {seen} elsewhere",
                case.name
            );
        }
    }
    // §1 / §6: role names are one token; " to=self" is two.
    for role in ["user", "assistant", "system"] {
        assert_eq!(table.get(role), Some(&1), "{role}");
    }
    assert_eq!(table.get("assistant to=self"), Some(&3));

    // Now the real path: Prompt::encode with a text encoder that knows only
    // those counts (placeholder id 1), and the golden numbers come out.
    for case in &cases {
        let prompt = Prompt::parse(&case.prompt);
        let images = vec![case.num_soft_tokens; prompt.image_count()];
        let ids = prompt
            .encode(&images, |t| {
                assert!(
                    !t.contains("<|"),
                    "special text reached the text encoder: {t:?}"
                );
                vec![1; table[t]]
            })
            .unwrap();
        assert_eq!(ids.len(), case.num_tokens, "{}", case.name);
        assert_eq!(special_runs(&ids), case.special_runs, "{}", case.name);
        assert_eq!(
            ids.iter().filter(|&&i| i == 200000).count(),
            1,
            "{}: one BOS",
            case.name
        );
        // An image costs exactly N tokens: the image cases differ only in N.
        if case.num_soft_tokens > 0 {
            let one_patch = prompt.encode(&[1], |t| vec![1; table[t]]).unwrap();
            assert_eq!(ids.len() - one_patch.len(), case.num_soft_tokens - 1);
        }
        // The prompt string survives the split.
        assert_eq!(prompt.text(), case.prompt);
    }
}

#[test]
fn golden_ids_with_real_tokenizer() {
    let Ok(path) = std::env::var("HEARTH_MUSE_GLIMMER_TOKENIZER") else {
        eprintln!("HEARTH_MUSE_GLIMMER_TOKENIZER not set: ids_sha256 not checked");
        return;
    };
    let (data, cases) = golden();
    let bytes = std::fs::read(&path).unwrap();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        sha,
        data["tokenizer_sha256"].as_str().unwrap(),
        "{path} is not the pinned tokenizer.json"
    );
    let tok = hearth_tokenizer::Tokenizer::from_hf_json(&path).unwrap();
    muse_glimmer::check_tokenizer(&tok).unwrap();
    for case in &cases {
        let prompt = Prompt::parse(&case.prompt);
        let ids = prompt
            .encode_with(&tok, &vec![case.num_soft_tokens; prompt.image_count()])
            .unwrap();
        assert_eq!(ids.len(), case.num_tokens, "{}", case.name);
        assert_eq!(special_runs(&ids), case.special_runs, "{}", case.name);
        assert_eq!(sha256_of_ids(&ids), case.ids_sha256, "{}", case.name);
    }
}

/// An independent reading of §6's rule on a whole rendered string: special
/// strings are one token each, any other byte one token (a byte-level stand-in
/// for the BPE, which does not change the comparison below).
fn count_with_special_matching(s: &str) -> usize {
    let specials: Vec<&str> = Special::ALL.iter().map(|t| t.as_str()).collect();
    let mut n = 0;
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(t) = specials.iter().find(|t| rest.starts_with(**t)) {
            n += 1;
            rest = &rest[t.len()..];
        } else {
            n += 1;
            rest = &rest[rest.chars().next().unwrap().len_utf8()..];
        }
    }
    n
}

#[test]
fn prompt_tokens_are_one_bos_plus_the_rendered_text() {
    // §6: usage.prompt_tokens for [{"role":"user","content":"Say ok."}] =
    // 1 + len(encode(render minus literal BOS)).
    let messages = json!([{"role": "user", "content": "Say ok."}]);
    let opts = RenderOptions::default();
    let prompt = muse_glimmer::render_prompt(&messages, None, &opts).unwrap();
    let text = muse_glimmer::render(&messages, None, &opts).unwrap();
    let bytes = |t: &str| vec![7u32; t.len()];
    let ids = prompt.encode(&[], bytes).unwrap();
    let minus_bos = text
        .strip_prefix("<|begin_of_text|>")
        .expect("the template emits a literal BOS");
    assert_eq!(ids.len(), 1 + count_with_special_matching(minus_bos));
    assert_eq!(ids[0], 200000);
    assert_eq!(ids.iter().filter(|&&i| i == 200000).count(), 1);
}

#[test]
fn images_bos_and_content_safety() {
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "Describe "},
        {"type": "text", "text": "this image: "},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": " and <|eot|> this"},
        {"type": "image"},
    ]}]);
    let mut opts = RenderOptions::default();
    let prompt = muse_glimmer::render_prompt(&messages, None, &opts).unwrap();
    assert_eq!(prompt.image_count(), 2);
    let text = prompt.text();
    assert!(text.contains(&format!("<|start|>user<|message|>Describe this image: {IMAGE_MARKER} and <|eot|> this{IMAGE_MARKER}<|eot|>")));
    // §2.7: `<|eot|>` written by the user is text, not a control token.
    let mut seen_text = Vec::new();
    let ids = prompt
        .encode(&[4, 256], |t| {
            seen_text.push(t.to_string());
            vec![1]
        })
        .unwrap();
    assert!(seen_text.iter().any(|t| t.contains("<|eot|>")));
    let eots = ids.iter().filter(|&&i| i == 200008).count();
    assert_eq!(eots, 2, "system and user turn ends only");
    assert_eq!(ids.iter().filter(|&&i| i == 200092).count(), 260);
    assert!(
        prompt.encode(&[4], |_| vec![1]).is_err(),
        "one count per image"
    );
    // The wrapped revision adds start/end around each image.
    opts.wrap_images = true;
    let wrapped = muse_glimmer::render_prompt(&messages, None, &opts).unwrap();
    let wids = wrapped.encode(&[4, 256], |_| vec![1]).unwrap();
    assert_eq!(wids.len(), ids.len() + 4);
    assert_eq!(wids.iter().filter(|&&i| i == 200080).count(), 2);
    // Exactly one BOS: a second one is refused.
    let twice = Prompt::parse("<|begin_of_text|>a<|begin_of_text|>b");
    assert!(twice.encode(&[], |_| vec![1]).is_err());
    let once = Prompt::parse("<|begin_of_text|>a");
    assert_eq!(once.encode(&[], |_| vec![1]).unwrap(), vec![200000, 1]);
}
