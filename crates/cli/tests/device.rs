//! `--device cuda` for `run` (with speculation) and `serve`: what can be
//! checked on a machine with or without a GPU. gemma3 is not on the GPU yet,
//! so these commands end (with a clear error) wherever they run.

mod common;

use common::{hearth, stderr};

/// `serve --device cuda` and `run --device cuda --spec ngram|dflash` are
/// not refused up front: they load and reach the GPU, which here is either
/// absent or cannot run gemma3; either way a clear error.
#[test]
fn cuda_serve_and_spec_reach_the_backend() {
    let runs: [&[&str]; 3] = [
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
        &[
            "run",
            "-m",
            "gemma3-270m",
            "--device",
            "cuda",
            "--spec",
            "dflash",
            "--draft-model",
            "/nonexistent/draft.gguf",
            "-p",
            "hello",
        ],
    ];
    for args in runs {
        let out = hearth(args);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            !err.contains("not supported yet")
                && !err.contains("CPU backend only")
                && !err.contains("does not expose"),
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
