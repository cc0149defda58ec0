//! Byte-level BPE merging of one pre-tokenized word (GPT-2 style vocabularies).
//!
//! The algorithm is llama.cpp's (`llm_tokenizer_bpe_session`): start from the
//! word's characters, repeatedly apply the adjacent pair with the lowest merge
//! rank (leftmost first among equal ranks), then emit each final symbol's token,
//! or its single-byte tokens when the symbol is not in the vocabulary.
//!
//! Symbols are identified by "symbol ids": vocabulary ids for strings in the
//! vocabulary, and ids past the vocabulary for merge operands that are not
//! tokens themselves, so a merge lookup is a hash of two integers.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::vocab::Vocab;

/// No symbol id: the string is neither a token nor a merge operand, so it can
/// never take part in a merge.
const NO_SYMBOL: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct BpeMerges {
    /// Merge operands that are not vocabulary tokens, numbered from the vocabulary size.
    extra_symbols: HashMap<String, u32>,
    /// `(left, right)` symbol ids -> (rank, symbol id of the merged string).
    merges: HashMap<(u32, u32), (u32, u32)>,
}

impl BpeMerges {
    /// `merges` are `"left right"` strings in rank order. As in llama.cpp, the
    /// split is at the first space after the first byte, and the first
    /// occurrence of a pair keeps its rank.
    pub fn new<'a>(vocab: &Vocab, merges: impl IntoIterator<Item = &'a str>) -> BpeMerges {
        let mut extra_symbols: HashMap<String, u32> = HashMap::new();
        let symbol = |s: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(id) = vocab.token_id(s) {
                return id;
            }
            let next = vocab.len() as u32 + extra.len() as u32;
            *extra.entry(s.to_string()).or_insert(next)
        };
        let mut pairs = Vec::new();
        for (rank, merge) in merges.into_iter().enumerate() {
            let space = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            let (left, right) = match space {
                Some(p) => (&merge[..p], &merge[p + 1..]),
                None => ("", ""),
            };
            let l = symbol(left, &mut extra_symbols);
            let r = symbol(right, &mut extra_symbols);
            pairs.push((l, r, rank as u32, format!("{left}{right}")));
        }
        let mut merges = HashMap::with_capacity(pairs.len());
        for (l, r, rank, joined) in pairs {
            let result = vocab
                .token_id(&joined)
                .or_else(|| extra_symbols.get(&joined).copied())
                .unwrap_or(NO_SYMBOL);
            merges.entry((l, r)).or_insert((rank, result));
        }
        BpeMerges {
            extra_symbols,
            merges,
        }
    }

    fn symbol_id(&self, vocab: &Vocab, s: &str) -> u32 {
        vocab
            .token_id(s)
            .or_else(|| self.extra_symbols.get(s).copied())
            .unwrap_or(NO_SYMBOL)
    }

    fn lookup(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        if left == NO_SYMBOL || right == NO_SYMBOL {
            return None;
        }
        self.merges.get(&(left, right)).copied()
    }

    /// Appends the tokens of one (byte-encoded) word to `out`.
    pub fn encode_word(&self, vocab: &Vocab, word: &str, ignore_merges: bool, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if ignore_merges {
            if let Some(id) = vocab.token_id(word) {
                out.push(id);
                return;
            }
        }

        // One symbol per character; merged symbols cover contiguous byte ranges.
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (start, c) in word.char_indices() {
            let end = start + c.len_utf8();
            symbols.push(Symbol {
                start,
                end,
                id: self.symbol_id(vocab, &word[start..end]),
            });
        }
        let n = symbols.len();
        // Neighbour links; usize::MAX marks "none".
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n)
            .map(|i| if i == n { usize::MAX } else { i })
            .collect();

        let mut queue: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Reverse<Candidate>>,
                    symbols: &[Symbol],
                    left: usize,
                    right: usize| {
            if left == usize::MAX || right == usize::MAX {
                return;
            }
            let (l, r) = (symbols[left].id, symbols[right].id);
            if let Some((rank, merged)) = self.lookup(l, r) {
                queue.push(Reverse(Candidate {
                    rank,
                    left,
                    right,
                    left_id: l,
                    right_id: r,
                    merged,
                }));
            }
        };
        for i in 1..n {
            push(&mut queue, &symbols, i - 1, i);
        }

        // The hot loop: lowest rank first, leftmost among equals.
        while let Some(Reverse(c)) = queue.pop() {
            let (l, r) = (&symbols[c.left], &symbols[c.right]);
            // Stale if either side has been merged since this pair was queued.
            if l.is_empty() || r.is_empty() || l.id != c.left_id || r.id != c.right_id {
                continue;
            }
            let end = r.end;
            symbols[c.left].end = end;
            symbols[c.left].id = c.merged;
            symbols[c.right].end = symbols[c.right].start; // now empty
            let after = next[c.right];
            next[c.left] = after;
            if after != usize::MAX {
                prev[after] = c.left;
            }
            push(&mut queue, &symbols, prev[c.left], c.left);
            push(&mut queue, &symbols, c.left, after);
        }

        let mut i = 0;
        while i != usize::MAX {
            let s = &symbols[i];
            let text = &word[s.start..s.end];
            match vocab.token_id(text) {
                Some(id) => out.push(id),
                // Not a token: fall back to single-byte tokens. Like llama.cpp this
                // looks up each raw byte of the (byte-encoded) text, so only ASCII
                // bytes can be found.
                None => out.extend(text.bytes().filter_map(|b| vocab.single_byte_token(b))),
            }
            i = next[i];
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    end: usize,
    id: u32,
}

impl Symbol {
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A mergeable adjacent pair, ordered by (rank, left position).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        (self.rank, self.left) == (other.rank, other.left)
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.rank, self.left).cmp(&(other.rank, other.left))
    }
}
