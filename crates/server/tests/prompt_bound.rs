//! The early context check (routes::check_prompt_bytes) refuses a prompt of
//! B bytes when B / max_token_bytes already fills the context. That is only
//! sound if no tokenizer ever encodes B bytes into fewer tokens; checked here
//! against the packaged models' real tokenizers (byte-level BPE: SmolLM2,
//! Qwen2.5; SentencePiece: Gemma 3) on texts built to pack many bytes into
//! few tokens: long runs of spaces, newlines, repeated characters, special
//! token markers, multi-byte UTF-8, code.

use hearth_models::packaged::model_path;
use hearth_server::max_token_bytes;
use hearth_tokenizer::Tokenizer;

fn texts() -> Vec<String> {
    let mut out = vec![
        " ".repeat(5000),
        "\n".repeat(3000),
        "\t".repeat(2000),
        "=".repeat(4000),
        "-".repeat(4000),
        "a".repeat(4000),
        "0".repeat(4000),
        "word ".repeat(1000),
        "<|im_start|>user\nhi<|im_end|>\n".repeat(200),
        "<start_of_turn>user\nhi<end_of_turn>\n".repeat(200),
        "日本語のテキスト。".repeat(300),
        "🙂🙃".repeat(500),
        "    def f(self):\n        return self.x\n".repeat(200),
    ];
    // Runs of every length up to 300 of a space and of a newline.
    for n in [1, 2, 3, 7, 15, 16, 31, 63, 64, 127, 128, 255, 256, 300] {
        out.push(format!("x{}y", " ".repeat(n)));
        out.push(format!("x{}y", "\n".repeat(n)));
    }
    out
}

#[test]
fn no_tokenizer_packs_more_bytes_per_token_than_its_longest_token() {
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let tok = Tokenizer::from_gguf_path(model_path(file)).unwrap();
        let max = max_token_bytes(&tok);
        assert!(max >= 4, "{file}: longest token {max} bytes");
        eprintln!("{file}: longest token text {max} bytes");
        for text in texts() {
            for add_special in [false, true] {
                let n = tok.encode(&text, add_special, true).len();
                let bound = text.len().div_ceil(max);
                assert!(
                    n >= bound,
                    "{file}: {} bytes gave {n} tokens, under the bound {bound} (longest token {max} bytes); text starts {:?}",
                    text.len(),
                    &text.chars().take(20).collect::<String>()
                );
            }
        }
    }
}
