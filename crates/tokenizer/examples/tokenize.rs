//! Tokenize text with a GGUF's (or tokenizer.json's) tokenizer, like llama-tokenize.
//!
//!     cargo run --release -p hearth-tokenizer --example tokenize -- MODEL.gguf "text" [--no-parse-special]
//!
//! Prints the ids, each piece, and load / encode timings with throughput.

use std::time::Instant;

use hearth_tokenizer::Tokenizer;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(text)) = (args.first(), args.get(1)) else {
        eprintln!("usage: tokenize MODEL.gguf|tokenizer.json TEXT [--no-parse-special]");
        std::process::exit(2);
    };
    let parse_special = !args.iter().any(|a| a == "--no-parse-special");

    let t0 = Instant::now();
    let tok = if path.ends_with(".json") {
        Tokenizer::from_hf_json(path)
    } else {
        Tokenizer::from_gguf_path(path)
    };
    let tok = tok.unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    let load = t0.elapsed();

    let add_special = tok.special_tokens().add_bos || tok.special_tokens().add_eos;
    let t1 = Instant::now();
    let ids = tok.encode(text, add_special, parse_special);
    let encode = t1.elapsed();

    println!("{ids:?}");
    for &id in &ids {
        println!(
            "{id:>7} -> {:?}",
            String::from_utf8_lossy(tok.token_to_piece(id))
        );
    }
    eprintln!(
        "{:?}, vocab {}: load {:.1} ms, encode {} bytes -> {} tokens in {:.3} ms ({:.1} MB/s)",
        tok.kind(),
        tok.vocab_size(),
        load.as_secs_f64() * 1e3,
        text.len(),
        ids.len(),
        encode.as_secs_f64() * 1e3,
        text.len() as f64 / encode.as_secs_f64() / 1e6
    );
}
