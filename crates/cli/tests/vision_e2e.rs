//! Images end to end against llama.cpp 11434 (tests/fixtures/vision/e2e,
//! scripts/fixtures/make_vision_e2e_fixtures.py): a synthetic Muse Glimmer text model
//! and a synthetic mmproj (re-synthesized here, checked byte-identical by
//! sha256), `llama-mtmd-cli --temp 0 -n 32 --jinja` per image, for 3 images.
//!
//! 1. The tower: with llama.cpp's rules and numerics (`Numerics::LlamaCpp`,
//!    in the order of the build that made the fixture, read from its
//!    system_info) hearth's image rows are llama.cpp's (recorded by the
//!    script through libmtmd) bit for bit.
//! 2. The text side: hearth's text model fed those rows gives llama-mtmd-cli's
//!    32 greedy tokens: the prompt rendering, the `<|image_start|>`/
//!    `<|image_end|>` framing, the rows' positions, the embedding RMSNorm over
//!    image rows and the chunking are llama.cpp's. The smallest top-2 gap along
//!    each path must exceed 1e-4 (hearth's and llama.cpp's text arithmetic
//!    differ in summation orders only, an estimated ~1e-6..1e-5 here).
//! 3. `hearth run --image --image-rules llama-cpp-exact` (the CLI, whose tower takes
//!    the order of this machine's native build) prints llama-mtmd-cli's reply.
//!    (On a machine whose native build differs from the fixture's the rows
//!    differ by llama.cpp's own AVX2/AVX-512 difference, ~1e-4; the replies
//!    of both llama.cpp builds were checked equal.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use hearth_chat::prompter::{ImageFraming, Prompter};
use hearth_engine::prompt::{ImageRows, Prompt};
use hearth_models::Backend;
use hearth_models::{Logits, Model};
use hearth_tokenizer::Tokenizer;
use hearth_vision::prompt::{ImageInput, MEDIA_MARKER};
use hearth_vision::{ImageLimits, MmProj, Numerics, RefIsa, RgbImage, Rules};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/vision/e2e"
);

fn hearth() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The fixture's record (e2e.json) and a fresh temporary directory.
fn setup(tag: &str) -> (Value, PathBuf) {
    let fx =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/e2e.json")).unwrap())
            .unwrap();
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    (fx, dir)
}

/// `hearth synth FLAGS -o dir/name`, checked against the fixture's sha256.
fn synth(dir: &Path, name: &str, flags: &Value, sha: &Value) -> PathBuf {
    let out = dir.join(name);
    let st = hearth()
        .arg("synth")
        .args(strings(flags))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let got = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
    assert_eq!(
        got,
        sha.as_str().unwrap(),
        "{name}: not the bytes llama.cpp ran"
    );
    out
}

/// The logits of each greedy step of `prompt`: the prompt's segments fed as
/// `hearth run` feeds them, then `forced` tokens (or the argmax when `None`)
/// one at a time. Returns (tokens, logits per step).
fn greedy(
    model: &Model,
    prompt: &Prompt,
    n: usize,
    forced: Option<&[u32]>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let dim = model.config.dim;
    let mut state = model.new_state(512);
    let mut at = 0;
    let mut logits = Vec::new();
    while at < prompt.len() {
        let (input, end) = prompt.input(at, usize::MAX, dim);
        let want = if end == prompt.len() {
            Logits::Last
        } else {
            Logits::None
        };
        logits = model
            .forward_input(&mut state, input, want, &[], &mut Vec::new())
            .unwrap();
        at = end;
    }
    let (mut tokens, mut steps) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = match forced {
            Some(f) => f[i],
            None => argmax(&logits).0 as u32,
        };
        steps.push(logits);
        tokens.push(t);
        logits = model.forward(&mut state, &[t], Logits::Last).unwrap();
    }
    (tokens, steps)
}

/// (index, top-2 gap) of the largest logit.
fn argmax(l: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::MIN, f32::MIN);
    for (i, &v) in l.iter().enumerate() {
        if v > best.1 {
            best = (i, v, best.1);
        } else if v > best.2 {
            best.2 = v;
        }
    }
    (best.0, best.1 - best.2)
}

#[test]
fn hearth_run_image_matches_llama_mtmd_cli() {
    let (fx, dir) = setup("hearth-vision-e2e");
    let text = synth(
        &dir,
        "text.gguf",
        &fx["text_synth_flags"],
        &fx["text_sha256"],
    );
    let mmproj = synth(
        &dir,
        "mmproj.gguf",
        &fx["mmproj_synth_flags"],
        &fx["mmproj_sha256"],
    );
    let prompt = fx["prompt"].as_str().unwrap();
    let n = fx["n_predict"].as_u64().unwrap() as usize;

    let model = Model::load(&text).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.file().metadata()).unwrap());
    let prompter = Prompter::from_gguf(model.file(), Some(tokenizer.clone()), "auto").unwrap();
    let mm = MmProj::load(&mmproj, Some(model.config.dim)).unwrap();
    // llama.cpp's rules in the arithmetic of the build that made the fixture.
    let info = fx["llama_cpp"]["system_info"].as_str().unwrap();
    let isa = if info.contains("AVX512 = 1") {
        RefIsa::Avx512
    } else {
        RefIsa::Avx2
    };
    let rules = Rules {
        numerics: Numerics::LlamaCpp(Some(isa)),
        ..Rules::LLAMA_CPP
    };
    let input = ImageInput::new(mm, rules, &tokenizer);
    let messages = json!([{"role": "user", "content": format!("{MEDIA_MARKER}{prompt}")}]);
    let runs = prompter
        .chat_runs(&messages, None, &Map::new(), MEDIA_MARKER)
        .unwrap();
    // The file's own template: libmtmd's framing.
    assert_eq!(runs.framing, ImageFraming::Mtmd);
    let runs = runs.runs;

    for rec in fx["images"].as_array().unwrap() {
        let name = rec["image"].as_str().unwrap();
        let want = rec["llama_mtmd_cli_text"].as_str().unwrap();
        let path = format!("{FIXTURES}/{name}");

        // The CLI, as a user runs it.
        let out = hearth()
            .args(["run", "-m"])
            .arg(&text)
            .arg("--mmproj")
            .arg(&mmproj)
            .args([
                "--image",
                &path,
                "--image-rules",
                "llama-cpp-exact",
                "-p",
                prompt,
            ])
            .args(["--temp", "0", "-n", &n.to_string(), "-t", "2"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains("encoded in"),
            "{name}: no encode timing: {stderr}"
        );

        let img =
            RgbImage::decode(&std::fs::read(&path).unwrap(), &ImageLimits::default()).unwrap();
        let ours = input.encode(&img).unwrap().rows;
        let bytes = std::fs::read(format!(
            "{FIXTURES}/{}",
            rec["llama_rows"].as_str().unwrap()
        ))
        .unwrap();
        let theirs: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        // 1. The tower: llama.cpp's rows to the bit.
        assert_eq!(theirs.len(), ours.rows.len(), "{name}: row count");
        let differ = theirs
            .iter()
            .zip(&ours.rows)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} values differ from llama.cpp's",
            theirs.len()
        );
        let theirs = Arc::new(ImageRows {
            digest: [0; 32],
            rows: theirs,
            n: ours.n,
        });

        // 2. The text side: llama.cpp's rows give its 32 tokens exactly, and
        // hearth's own rows (the same) the same path.
        let (tokens, their_logits) = greedy(&model, &input.prompt(&runs, &[theirs]), n, None);
        assert_eq!(tokenizer.decode(&tokens), want, "{name}: llama.cpp's rows");
        let min_gap = their_logits
            .iter()
            .map(|l| argmax(l).1)
            .fold(f32::MAX, f32::min);
        assert!(
            min_gap > 1e-4,
            "{name}: top-2 gap {min_gap:.2e} is float noise"
        );
        let (own, _) = greedy(&model, &input.prompt(&runs, &[ours]), n, None);
        assert_eq!(own, tokens, "{name}: hearth's rows");

        // 3. The CLI (its tower in the native build's order): llama-mtmd-cli's reply.
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{name}: CLI");
        eprintln!(
            "{name}: {} image tokens, rows bit-identical to llama.cpp's; 32/32 tokens equal (smallest top-2 gap {min_gap:.3e})",
            rec["n_tokens"]
        );
    }

    // Clear errors, no panics.
    let fail = |args: &[&std::ffi::OsStr]| -> String {
        let out = hearth().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        err
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    let (t, m) = (text.as_os_str(), mmproj.as_os_str());
    let png = format!("{FIXTURES}/square_56x56.png");
    let run = [os("run"), os("-p"), os("hi"), os("-n"), os("1"), os("-m")];
    let with = |extra: &[std::ffi::OsString]| -> Vec<std::ffi::OsString> {
        run.iter()
            .cloned()
            .chain([t.to_os_string()])
            .chain(extra.iter().cloned())
            .collect()
    };
    let args = with(&[os("--image"), os(&png)]);
    let err = fail(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    assert!(err.contains("--image needs --mmproj"), "{err}");
    let missing = dir.join("missing.png");
    let args = with(&[
        os("--mmproj"),
        m.to_os_string(),
        os("--image"),
        missing.clone().into(),
    ]);
    let err = fail(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    assert!(err.contains("missing.png"), "{err}");
    let truncated = dir.join("truncated.png");
    let bytes = std::fs::read(&png).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let args = with(&[
        os("--mmproj"),
        m.to_os_string(),
        os("--image"),
        truncated.into(),
    ]);
    let err = fail(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    assert!(
        err.contains("truncated.png") && err.contains("could not be decoded"),
        "{err}"
    );
    let args = with(&[os("--mmproj"), t.to_os_string(), os("--image"), os(&png)]);
    let err = fail(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    assert!(err.contains("--mmproj"), "{err}");
    let args = with(&[
        os("--mmproj"),
        m.to_os_string(),
        os("--image"),
        os(&png),
        os("--device"),
        os("cuda"),
    ]);
    let err = fail(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    assert!(err.contains("CPU only") || err.contains("cuda"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A projector whose rows are not the text model's width is refused by name
/// (smollm2-135m is 576 wide; the fixture's mmproj writes 256).
#[test]
fn projector_width_must_be_the_text_width() {
    let (fx, dir) = setup("hearth-vision-width");
    let mmproj = synth(
        &dir,
        "mmproj.gguf",
        &fx["mmproj_synth_flags"],
        &fx["mmproj_sha256"],
    );
    let png = format!("{FIXTURES}/square_56x56.png");
    let out = hearth()
        .args([
            "run",
            "-m",
            "smollm2-135m",
            "-p",
            "hi",
            "-n",
            "1",
            "--mmproj",
        ])
        .arg(&mmproj)
        .args(["--image", &png])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains("576") && err.contains("256"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Muse Glimmer file without a chat template renders with the built-in
/// format, which places each image as the model's reference does (spec
/// chat-format.md §2.6): its rows exactly where `Prompt::encode` (checked
/// against the spec's golden prompts in hearth-chat) puts the N bare
/// `<|patch|>` slots, with no `<|image_start|>`/`<|image_end|>`, several
/// images per message; `wrap_images` gives the wrapped revision. The CLI
/// takes that path (its prompt length is the bare one).
#[test]
fn built_in_format_places_images_as_bare_patches() {
    use hearth_chat::muse_glimmer::{self, RenderOptions, Special};
    use hearth_engine::prompt::IMAGE_ID;

    let (fx, dir) = setup("hearth-vision-builtin");
    let text = dir.join("text.gguf");
    let st = hearth()
        .args(["synth", "--arch", "muse-glimmer", "--muse-specials"])
        .args(["--layers", "1", "--seed", "3", "-o"])
        .arg(&text)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let mmproj = synth(
        &dir,
        "mmproj.gguf",
        &fx["mmproj_synth_flags"],
        &fx["mmproj_sha256"],
    );
    let model = Model::load(&text).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.file().metadata()).unwrap());
    muse_glimmer::check_tokenizer(&tokenizer).unwrap();
    let prompter = Prompter::from_gguf(model.file(), Some(tokenizer.clone()), "auto").unwrap();
    assert!(prompter
        .describe()
        .starts_with("built-in Muse Glimmer format"));
    let input = ImageInput::new(
        MmProj::load(&mmproj, Some(model.config.dim)).unwrap(),
        Rules::REFERENCE,
        &tokenizer,
    );
    let names = ["square_56x56.png", "wide_200x130.png"];
    let rows: Vec<Arc<ImageRows>> = names
        .iter()
        .map(|n| {
            let bytes = std::fs::read(format!("{FIXTURES}/{n}")).unwrap();
            let img = RgbImage::decode(&bytes, &ImageLimits::default()).unwrap();
            input.encode(&img).unwrap().rows
        })
        .collect();
    let counts: Vec<usize> = rows.iter().map(|r| r.n).collect();

    for wrap in [false, true] {
        // As the server holds a request: media-marker parts; as `run` writes
        // one: the marker in the text. Both render the same.
        let parts = json!([{"role": "user", "content": [
            {"type": "text", "text": "Compare "},
            {"type": "media_marker", "text": MEDIA_MARKER},
            {"type": "text", "text": " with "},
            {"type": "media_marker", "text": MEDIA_MARKER},
            {"type": "text", "text": "."}]}]);
        let string = json!([{"role": "user",
            "content": format!("Compare {MEDIA_MARKER} with {MEDIA_MARKER}.")}]);
        let mut kwargs = Map::new();
        if wrap {
            kwargs.insert("wrap_images".into(), json!(true));
        }
        let mut prompts = Vec::new();
        for messages in [&parts, &string] {
            let runs = prompter
                .chat_runs(messages, None, &kwargs, MEDIA_MARKER)
                .unwrap();
            assert_eq!(runs.framing, ImageFraming::InRuns);
            prompts.push(input.place(&runs, &rows));
        }
        assert_eq!(prompts[0].ids, prompts[1].ids, "wrap {wrap}");
        let got = &prompts[0];

        // The reference placement: image parts as `<|patch|>` runs.
        let images = json!([{"role": "user", "content": [
            {"type": "text", "text": "Compare "}, {"type": "image"},
            {"type": "text", "text": " with "}, {"type": "image"},
            {"type": "text", "text": "."}]}]);
        let opts = RenderOptions {
            wrap_images: wrap,
            ..RenderOptions::default()
        };
        let want = muse_glimmer::render_prompt(&images, None, &opts)
            .unwrap()
            .encode_with(&tokenizer, &counts)
            .unwrap();
        assert_eq!(got.len(), want.len(), "wrap {wrap}");
        let patch = Special::Patch.id();
        for (i, (&g, &w)) in got.ids.iter().zip(&want).enumerate() {
            match w == patch {
                true => assert_eq!(g, IMAGE_ID, "wrap {wrap}: position {i}"),
                false => assert_eq!(g, w, "wrap {wrap}: position {i}"),
            }
        }
        // Each image's rows start at its first slot, in order.
        let starts: Vec<usize> = (0..want.len())
            .filter(|&i| want[i] == patch && (i == 0 || want[i - 1] != patch))
            .collect();
        assert_eq!(got.images.len(), 2);
        for (k, s) in got.images.iter().enumerate() {
            assert_eq!((s.start, s.image.n), (starts[k], counts[k]), "wrap {wrap}");
            assert!(Arc::ptr_eq(&s.image, &rows[k]));
        }
        let framing = [Special::ImageStart.id(), Special::ImageEnd.id()];
        let framed = got.ids.iter().filter(|i| framing.contains(i)).count();
        assert_eq!(framed, if wrap { 4 } else { 0 }, "wrap {wrap}");
    }

    // The CLI: the bare prompt's length (the llama.cpp framing would add 2).
    let stats = dir.join("stats.json");
    let png = format!("{FIXTURES}/{}", names[0]);
    let out = hearth()
        .args(["run", "-m"])
        .arg(&text)
        .arg("--mmproj")
        .arg(&mmproj)
        .args(["--image", &png, "-p", "Describe.", "-n", "2", "-t", "2"])
        .arg("--stats-json")
        .arg(&stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let one = json!([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Describe."}]}]);
    let want = muse_glimmer::render_prompt(&one, None, &RenderOptions::default())
        .unwrap()
        .encode_with(&tokenizer, &counts[..1])
        .unwrap();
    assert_eq!(stats["prompt_tokens"], json!(want.len()));
    let _ = std::fs::remove_dir_all(&dir);
}
