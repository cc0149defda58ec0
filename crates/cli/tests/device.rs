//! `--device cuda` for `run` (with speculation) and `serve`: what can be
//! checked on a machine with or without a GPU. gemma3 is not on the GPU yet,
//! so these commands end (with a clear error) wherever they run.

mod common;

use common::{hearth, stderr};

/// DFlash needs hidden-state taps, which the CUDA backend does not expose:
/// refused before anything loads, naming the alternative.
#[test]
fn dflash_on_cuda_is_refused_before_loading() {
    let want = if cfg!(feature = "cuda") {
        "--spec dflash needs the target's hidden states"
    } else {
        "built without CUDA support"
    };
    for cmd in ["run", "serve"] {
        let mut args = vec![
            cmd,
            "-m",
            "smollm2-135m",
            "--device",
            "cuda",
            "--spec",
            "dflash",
            "--draft-model",
            "/nonexistent/draft.gguf",
        ];
        if cmd == "run" {
            args.extend(["-p", "hello"]);
        } else {
            args.extend(["--port", "0"]);
        }
        let out = hearth(&args);
        assert!(!out.status.success(), "{cmd}");
        let err = stderr(&out);
        assert!(err.contains(want), "{cmd}: {err}");
        if cfg!(feature = "cuda") {
            assert!(
                err.contains("--spec ngram|draft with --device cuda"),
                "{cmd}: {err}"
            );
        }
    }
}

/// `serve --device cuda` and `run --device cuda --spec ngram` are no longer
/// refused up front: they load and reach the GPU, which here is either absent
/// or cannot run gemma3; either way a clear error.
#[test]
fn cuda_serve_and_spec_reach_the_backend() {
    let runs: [&[&str]; 2] = [
        &[
            "serve",
            "-m",
            "gemma3-270m",
            "--device",
            "cuda",
            "--port",
            "0",
        ],
        &[
            "run",
            "-m",
            "gemma3-270m",
            "--device",
            "cuda",
            "--spec",
            "ngram",
            "-p",
            "hello",
            "-n",
            "4",
        ],
    ];
    for args in runs {
        let out = hearth(args);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            !err.contains("not supported yet") && !err.contains("CPU backend only"),
            "{args:?}: {err}"
        );
        if cfg!(feature = "cuda") {
            assert!(
                err.contains("CUDA is not available") || err.contains("gemma3"),
                "{args:?}: {err}"
            );
        } else {
            assert!(
                err.contains("built without CUDA support"),
                "{args:?}: {err}"
            );
        }
    }
}
