//! Tokenizers for hearth, with token ids equal to llama.cpp's.
//!
//! [`Tokenizer::from_gguf`] builds one from GGUF metadata:
//! - `tokenizer.ggml.model = gpt2`: byte-level BPE (Qwen2.5, SmolLM2, Llama 3, ...)
//!   with the pre-tokenizer llama.cpp picks for `tokenizer.ggml.pre`;
//! - `tokenizer.ggml.model = llama`: SentencePiece-style BPE by score with byte
//!   fallback (Gemma 3, Llama 2).
//!
//! [`Tokenizer::from_hf_json`] wraps a Hugging Face `tokenizer.json` (through the
//! `tokenizers` crate) behind the same interface.
//!
//! Encoding follows llama.cpp step by step: special-token text is split out first
//! (special.rs), then each text run is pre-tokenized (pre.rs names the regexes,
//! split.rs runs them) and merged (bpe.rs by rank, spm.rs by score). Decoding
//! works on per-token byte pieces (decode.rs); [`StreamDecoder`] turns a token
//! stream into text without ever splitting a UTF-8 character.

mod bpe;
mod decode;
mod error;
mod gguf;
mod hf;
mod pre;
mod special;
mod split;
mod spm;
mod unicode;
mod unicode_data;
mod vocab;

use std::collections::BTreeSet;
use std::path::Path;

pub use decode::{DecodeOptions, Utf8Stream};
pub use error::TokenizerError;
pub use special::SpecialTokens;
pub use vocab::TokenAttr;

use bpe::BpeMerges;
use decode::clean_spaces;
use pre::PreSpec;
use special::{partition, Fragment};
use split::PreTokenizer;
use vocab::Vocab;

/// A tokenizer: vocabulary, special tokens, and the model that turns text into ids.
/// Immutable once built; share it freely (`Send + Sync`).
pub struct Tokenizer {
    vocab: Vocab,
    specials: SpecialTokens,
    /// Ids whose text is matched literally in input, longest text first.
    special_order: Vec<u32>,
    /// Bytes of each token, special tokens rendered as their text.
    pieces: Vec<Box<[u8]>>,
    model: Model,
}

// One tokenizer serves every session and thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>()
};

enum Model {
    Bpe {
        merges: BpeMerges,
        splitter: PreTokenizer,
        pre: PreSpec,
    },
    Spm {
        byte_tokens: Box<[Option<u32>; 256]>,
        add_space_prefix: bool,
    },
    Hf(Box<hf::HfModel>),
}

/// Which algorithm a tokenizer runs; for logs and model info.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// GGUF `gpt2`: byte-level BPE; `pre` is llama.cpp's pre-tokenizer type.
    ByteLevelBpe { pre: &'static str },
    /// GGUF `llama`: SentencePiece-style BPE by score.
    SentencePiece,
    /// A Hugging Face tokenizer.json.
    HuggingFace,
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(metadata: &hearth_gguf::Metadata) -> Result<Tokenizer, TokenizerError> {
        gguf::from_metadata(metadata)
    }

    /// Opens a GGUF file and builds its tokenizer.
    pub fn from_gguf_path(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let file = hearth_gguf::GgufFile::open(path)?;
        Tokenizer::from_gguf(file.metadata())
    }

    /// Loads a Hugging Face `tokenizer.json`. BOS/EOS and add-BOS/EOS come from a
    /// `tokenizer_config.json` next to it when there is one.
    pub fn from_hf_json(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        hf::load(path.as_ref())
    }

    pub fn kind(&self) -> TokenizerKind {
        match &self.model {
            Model::Bpe { pre, .. } => TokenizerKind::ByteLevelBpe { pre: pre.kind },
            Model::Spm { .. } => TokenizerKind::SentencePiece,
            Model::Hf(_) => TokenizerKind::HuggingFace,
        }
    }

    /// Text to token ids.
    ///
    /// `add_special` adds BOS and/or EOS where the model asks for them
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`). With `parse_special`,
    /// control tokens written literally in `text` (e.g. `<|im_start|>`) become
    /// their single ids; user-defined tokens always do. This is
    /// `llama_tokenize(vocab, text, add_special, parse_special)`.
    ///
    /// Infallible for GGUF tokenizers. A tokenizer.json tokenizer can fail (its
    /// regex engine may give up on pathological input); then this returns no
    /// ids, and [`Tokenizer::try_encode`] says why.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.try_encode(text, add_special, parse_special)
            .unwrap_or_default()
    }

    /// [`Tokenizer::encode`], with the `tokenizers` crate's error for tokenizer.json models.
    pub fn try_encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Model::Hf(hf) = &self.model {
            return hf
                .try_encode(text, add_special, parse_special)
                .map_err(TokenizerError::Encode);
        }
        let fragments = partition(text, &self.vocab, &self.special_order, parse_special);
        let sp = &self.specials;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && sp.add_bos {
            out.extend(sp.bos);
        }
        match &self.model {
            Model::Bpe {
                merges,
                splitter,
                pre,
            } => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => {
                            for word in splitter.split(t) {
                                merges.encode_word(&self.vocab, &word, pre.ignore_merges, &mut out);
                            }
                        }
                    }
                }
            }
            Model::Spm {
                byte_tokens,
                add_space_prefix,
            } => {
                // SentencePiece prefixes a space to text at the start and after
                // every special token (when the model adds a space prefix).
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 3);
                            if *add_space_prefix && after_special {
                                s.push('\u{2581}');
                            }
                            s.extend(t.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
                            spm::encode(&self.vocab, byte_tokens, &s, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
            Model::Hf(_) => unreachable!("handled above"),
        }
        if add_special && sp.add_eos {
            out.extend(sp.eos);
        }
        Ok(out)
    }

    /// Token ids to text, the exact inverse of `encode(text, false, true)` where
    /// the model can round-trip: special tokens rendered, nothing removed.
    /// Invalid UTF-8 (a sequence cut mid-character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Token ids to text with llama.cpp's detokenizer options.
    pub fn decode_with(&self, ids: &[u32], options: DecodeOptions) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, options)).into_owned()
    }

    /// Token ids to bytes: `llama_detokenize(ids, remove_special, unparse_special)`,
    /// including its leading-space removal (SentencePiece with a space prefix)
    /// and its space clean-up (pre-tokenizers that ask for it).
    pub fn decode_bytes(&self, ids: &[u32], options: DecodeOptions) -> Vec<u8> {
        let sp = &self.specials;
        let mut ids = ids;
        let mut strip_space = matches!(
            self.model,
            Model::Spm {
                add_space_prefix: true,
                ..
            }
        );
        if options.remove_special && sp.add_bos && !ids.is_empty() && Some(ids[0]) == sp.bos {
            strip_space = false;
            ids = &ids[1..];
        }
        if options.remove_special && sp.add_eos && ids.last().copied() == sp.eos && sp.eos.is_some()
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for &id in ids {
            let mut piece = self.piece(id, options.render_special);
            if strip_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            strip_space = false;
            out.extend_from_slice(piece);
        }
        match &self.model {
            Model::Bpe { pre, .. } if pre.clean_spaces => clean_spaces(&out),
            _ => out,
        }
    }

    /// The bytes of one token as llama.cpp renders it with special rendering on
    /// (`llama_token_to_piece(.., special = true)`). Unknown ids give nothing.
    /// Byte-level: a piece may be part of a UTF-8 character; see [`StreamDecoder`].
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.piece(id, true)
    }

    /// Like [`Tokenizer::token_to_piece`]; with `render_special` false, control
    /// and unknown tokens render as nothing.
    pub fn piece(&self, id: u32, render_special: bool) -> &[u8] {
        if !render_special
            && self
                .vocab
                .attr(id)
                .contains(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
        {
            return &[];
        }
        self.pieces.get(id as usize).map(|p| &p[..]).unwrap_or(&[])
    }

    /// A decoder for a stream of generated tokens.
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            render_special,
            utf8: Utf8Stream::new(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The token's text as stored in the vocabulary (byte-encoded for byte-level BPE).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.text(id)
    }

    /// The id of a vocabulary entry, by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.token_id(text)
    }

    pub fn token_attr(&self, id: u32) -> TokenAttr {
        self.vocab.attr(id)
    }

    /// Control or unknown tokens: the ones llama.cpp hides unless asked to render
    /// specials (user-defined tokens such as `<tool_call>` are not special here).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab
            .attr(id)
            .contains(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
    }

    pub fn bos(&self) -> Option<u32> {
        self.specials.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.specials.eos
    }

    /// Tokens that end generation: EOS, EOT (`<|im_end|>`, `<end_of_turn>`), EOM, ...
    pub fn eos_set(&self) -> &BTreeSet<u32> {
        &self.specials.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.specials.eog.contains(&id)
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }
}

/// Turns generated tokens into text as they arrive, holding back the bytes of a
/// character split across tokens. Pieces are concatenated as is: unlike
/// [`Tokenizer::decode`] there is no leading-space removal or space clean-up
/// (llama.cpp's streaming output does not do them either).
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    render_special: bool,
    utf8: Utf8Stream,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tokenizer.piece(id, self.render_special);
        self.utf8.push(piece)
    }

    /// Ends the stream; returns anything still held back (lossily).
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }
}
