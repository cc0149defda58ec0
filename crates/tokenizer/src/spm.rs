//! SentencePiece-style BPE by score (`tokenizer.ggml.model = llama`: LLaMA 1/2,
//! Gemma), as llama.cpp implements it (`llm_tokenizer_spm_session`).
//!
//! The text arrives with spaces already escaped to U+2581. Start from its
//! characters; repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring vocabulary entry (leftmost among equal scores); then emit each
//! final symbol's token, or byte-fallback tokens `<0xXX>` for a character that is
//! not in the vocabulary.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// Byte-fallback token of each byte: `<0xXX>`, else the one-byte string itself.
pub(crate) fn byte_tokens(vocab: &Vocab) -> [Option<u32>; 256] {
    let mut table = [None; 256];
    for (b, slot) in table.iter_mut().enumerate() {
        *slot = vocab.token_id(&format!("<0x{b:02X}>")).or_else(|| {
            let s = char::from_u32(b as u32).filter(|_| b < 128)?.to_string();
            vocab.token_id(&s)
        });
    }
    table
}

/// Appends the tokens of `text` (spaces already escaped) to `out`.
pub(crate) fn encode(
    vocab: &Vocab,
    byte_tokens: &[Option<u32>; 256],
    text: &str,
    out: &mut Vec<u32>,
) {
    // Symbols are contiguous byte ranges of `text`; merged-away symbols are empty.
    let mut start: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = start.len();
    if n == 0 {
        return;
    }
    let mut end: Vec<usize> = start[1..].iter().copied().chain([text.len()]).collect();
    let mut next: Vec<usize> = (1..=n)
        .map(|i| if i == n { usize::MAX } else { i })
        .collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();

    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>,
                start: &[usize],
                end: &[usize],
                left: usize,
                right: usize| {
        if left == usize::MAX || right == usize::MAX {
            return;
        }
        let joined = &text[start[left]..end[right]];
        if let Some(id) = vocab.token_id(joined) {
            queue.push(Bigram {
                score: vocab.score(id),
                left,
                right,
                size: joined.len(),
            });
        }
    };
    for i in 1..n {
        push(&mut queue, &start, &end, i - 1, i);
    }

    // The hot loop: best score first, leftmost among equals.
    while let Some(b) = queue.pop() {
        let left_len = end[b.left] - start[b.left];
        let right_len = end[b.right] - start[b.right];
        // Stale if either side was merged into something else since.
        if left_len == 0 || right_len == 0 || left_len + right_len != b.size {
            continue;
        }
        end[b.left] = end[b.right];
        start[b.right] = end[b.right]; // now empty
        let after = next[b.right];
        next[b.left] = after;
        if after != usize::MAX {
            prev[after] = b.left;
        }
        push(&mut queue, &start, &end, prev[b.left], b.left);
        push(&mut queue, &start, &end, b.left, after);
    }

    // Every merged symbol is a vocabulary entry by construction; only single
    // characters can be missing, and those fall back to their bytes.
    let mut i = 0;
    while i != usize::MAX {
        let piece = &text[start[i]..end[i]];
        match vocab.token_id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_tokens[b as usize])),
        }
        i = next[i];
    }
}

/// A mergeable adjacent pair; the heap yields the highest score, then the lowest `left`.
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Compared as C++ does (-0.0 == 0.0); scores are never NaN.
        let by_score = self
            .score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}
