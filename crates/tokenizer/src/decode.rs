//! Token ids back to text: per-token pieces, whole-sequence detokenization with
//! llama.cpp's space clean-up, and a streaming decoder for generation.

use crate::unicode::char_to_byte;
use crate::vocab::{TokenAttr, Vocab};

/// How a vocabulary's token texts map to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PieceStyle {
    /// GPT-2 byte-level BPE: each character of a normal token stands for one byte.
    ByteLevel,
    /// SentencePiece: U+2581 is a space; `<0xXX>` byte tokens are raw bytes.
    SentencePiece,
}

/// The bytes of every token as llama.cpp renders it with `special = true`:
/// control, unknown and user-defined tokens as their text, normal tokens
/// decoded, byte tokens as their byte, anything else (unused) as nothing.
pub(crate) fn build_pieces(vocab: &Vocab, style: PieceStyle) -> Vec<Box<[u8]>> {
    vocab
        .iter()
        .map(|(id, text)| {
            let attr = vocab.attr(id);
            let bytes: Vec<u8> = if attr
                .contains(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED)
            {
                text.as_bytes().to_vec()
            } else if attr.is_normal() {
                match style {
                    PieceStyle::SentencePiece => text.replace('\u{2581}', " ").into_bytes(),
                    PieceStyle::ByteLevel => byte_level_decode(text),
                }
            } else if attr.is_byte() {
                // `<0xXX>`
                text.get(3..5)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .map(|b| vec![b])
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            bytes.into_boxed_slice()
        })
        .collect()
}

/// Undoes GPT-2 byte encoding. A character outside the byte map is rendered the
/// way llama.cpp does: `[UNK_BYTE_0x<its utf-8 hex><whole token text>]`.
pub(crate) fn byte_level_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// Options of [`crate::Tokenizer::decode_with`], named after llama.cpp's
/// `llama_detokenize(remove_special, unparse_special)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Drop a leading BOS / trailing EOS that `add_special` would have added.
    pub remove_special: bool,
    /// Render control tokens (EOS, `<|im_end|>`, ...) as their text; when false
    /// they render as nothing. User-defined tokens always render.
    pub render_special: bool,
}

impl Default for DecodeOptions {
    /// The exact inverse of `encode(text, false, true)`: specials rendered, nothing removed.
    fn default() -> Self {
        DecodeOptions {
            remove_special: false,
            render_special: true,
        }
    }
}

/// llama.cpp's detokenizer clean-up (`clean_spaces`): drop the space before
/// `?!.,`, around a lone `'`, and before `'s 'm 're 've`.
pub(crate) fn clean_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1: " ?", " !", " .", " ,"
    let mut t1: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            t1.pop();
        }
        t1.push(x);
    }
    // Pass 2: " ' " -> "'"
    let mut src = t1;
    let mut t2: Vec<u8> = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            t2.pop();
            // llama.cpp blanks the following space (so it is not a space for
            // the next comparison either) and skips it.
            src[i + 1] = 0;
            i += 1;
        }
        t2.push(x);
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it).
    let mut t3: Vec<u8> = Vec::with_capacity(t2.len());
    for (i, &x) in t2.iter().enumerate() {
        if i > 0 && t2[i - 1] == b' ' && x == b'\'' && i + 1 < t2.len() {
            let x1 = t2[i + 1];
            let x2 = t2.get(i + 2).copied();
            if matches!(x1, b's' | b'm')
                || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e')))
            {
                t3.pop();
            }
        }
        t3.push(x);
    }
    t3
}

/// Incremental UTF-8 assembly for streaming generation: feed token pieces,
/// get text back as soon as it is complete. A partial multi-byte character is
/// held back until its remaining bytes arrive; invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Utf8Stream {
        Utf8Stream::default()
    }

    /// Appends `bytes`; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Ends the stream: whatever is still held back, lossily.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_spaces_matches_llama_cpp_rules() {
        assert_eq!(clean_spaces(b"Hello , world !"), b"Hello, world!");
        assert_eq!(clean_spaces(b"a ' b"), b"a'b");
        assert_eq!(
            clean_spaces(b"it 's I 'm we 're you 've don 't I 'd we 'll"),
            b"it's I'm we're you've don 't I 'd we 'll"
        );
    }

    #[test]
    fn stream_holds_back_partial_characters() {
        let mut s = Utf8Stream::new();
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.push(&[0xFF, b'b']), "\u{FFFD}b");
        assert_eq!(s.push(&[0xF0, 0x9F]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn byte_level_pieces() {
        assert_eq!(byte_level_decode("Ġhello"), b" hello");
        assert_eq!(byte_level_decode("Ċ"), b"\n");
        assert_eq!(byte_level_decode("ä¸Ń"), "中".as_bytes());
    }
}
