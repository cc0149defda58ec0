//! Special tokens: the ids the model names (BOS, EOS, EOT, ...), the fix-ups
//! llama.cpp applies to token attributes by token text, the end-of-generation
//! set, and the splitting of input text around special-token text.

use std::collections::BTreeSet;

use crate::vocab::{TokenAttr, Vocab};

/// Special token ids and the add-BOS/EOS switches. `None` means "this model has none".
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
    /// Tokens that end generation: EOS, EOT, EOM and the like.
    pub eog: BTreeSet<u32>,
    /// `add_special` prepends BOS / appends EOS.
    pub add_bos: bool,
    pub add_eos: bool,
}

// Token texts llama.cpp recognises (src/llama-vocab.cpp, "auto-detect special
// tokens by text"). Where several are present, llama.cpp's pick depends on hash
// map iteration order; we take the first in list order.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss: always rendered, so llama.cpp makes them user-defined.
const ALWAYS_USER_DEFINED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Model facts that pick llama.cpp's per-model strip attributes.
pub(crate) struct ModelNames<'a> {
    pub general_name: &'a str,
    pub pre: &'a str,
    pub architecture: &'a str,
}

impl SpecialTokens {
    /// Applies llama.cpp's text-based detection and attribute fix-ups, after the
    /// ids from metadata are in place, and fills the end-of-generation set.
    pub(crate) fn detect(&mut self, vocab: &mut Vocab) {
        let find = |names: &[&str], vocab: &Vocab| names.iter().find_map(|n| vocab.token_id(n));
        let mark_control = |id: u32, vocab: &mut Vocab| {
            let a = vocab.attr(id);
            vocab.set_attr(id, a | TokenAttr::CONTROL);
        };
        for (slot, names) in [
            (&mut self.eot, EOT_NAMES),
            (&mut self.eom, EOM_NAMES),
            (&mut self.fim_pre, FIM_PRE_NAMES),
            (&mut self.fim_suf, FIM_SUF_NAMES),
            (&mut self.fim_mid, FIM_MID_NAMES),
            (&mut self.fim_pad, FIM_PAD_NAMES),
            (&mut self.fim_rep, FIM_REP_NAMES),
            (&mut self.fim_sep, FIM_SEP_NAMES),
        ] {
            if slot.is_none() {
                *slot = find(names, vocab);
                if let Some(id) = *slot {
                    mark_control(id, vocab);
                }
            }
        }

        // Control tokens named "...unused..." are unused.
        let unused: Vec<u32> = vocab
            .canonical_ids()
            .filter(|&(text, id)| vocab.attr(id).is_control() && text.contains("unused"))
            .map(|(_, id)| id)
            .collect();
        for id in unused {
            let a = vocab.attr(id);
            vocab.set_attr(id, a | TokenAttr::UNUSED);
        }

        let mut eog: BTreeSet<u32> = [self.fim_pad, self.fim_rep, self.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for name in EOG_NAMES {
            if let Some(id) = vocab.token_id(name) {
                eog.insert(id);
                mark_control(id, vocab);
            }
        }
        for name in ALWAYS_USER_DEFINED {
            if let Some(id) = vocab.token_id(name) {
                vocab.set_attr(id, TokenAttr::USER_DEFINED);
            }
        }
        eog.extend([self.eos, self.eot, self.eom].into_iter().flatten());

        let in_eog = |name: &str, vocab: &Vocab, eog: &BTreeSet<u32>| {
            vocab.token_id(name).filter(|id| eog.contains(id))
        };
        // o200k_harmony / solar-open: "<|end|>" ends a message, not generation.
        if let Some(end) = in_eog("<|end|>", vocab, &eog) {
            let has = |name: &str| in_eog(name, vocab, &eog).is_some();
            let call = has("<|call|>") || has("<|calls|>");
            if (has("<|return|>") && has("<|call|>")) || (call && has("<|flush|>")) {
                eog.remove(&end);
                vocab.set_attr(end, TokenAttr::USER_DEFINED);
            }
        }
        // gemma4 / plamo: "</s>" is an ordinary token there.
        let s_is_normal = in_eog("<|tool_response>", vocab, &eog).is_some()
            || in_eog("<|plamo:eos|>", vocab, &eog).is_some();
        if let Some(s) = in_eog("</s>", vocab, &eog).filter(|_| s_is_normal) {
            eog.remove(&s);
            vocab.set_attr(s, TokenAttr::NORMAL);
        }
        self.eog = eog;
    }
}

/// The tokens whose text is matched literally in input (control, user-defined
/// and unknown), longest text first.
pub(crate) fn special_token_order(vocab: &Vocab) -> Vec<u32> {
    let mut ids: Vec<u32> = vocab
        .iter()
        .filter(|&(id, _)| {
            vocab
                .attr(id)
                .contains(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
        })
        .map(|(id, _)| id)
        .collect();
    // llama.cpp uses an unstable sort by length; ties only matter for two
    // same-length special texts overlapping in the input.
    ids.sort_by_key(|&id| std::cmp::Reverse(vocab.text(id).map_or(0, str::len)));
    ids
}

/// llama.cpp's per-model strip attributes (set after the special-token order is built).
pub(crate) fn apply_strip_attributes(vocab: &mut Vocab, order: &[u32], names: &ModelNames) {
    let set = |vocab: &mut Vocab, text: &str, attr: TokenAttr, on: bool| {
        if let Some(id) = vocab.token_id(text) {
            let a = vocab.attr(id);
            vocab.set_attr(
                id,
                if on {
                    a | attr
                } else {
                    TokenAttr(a.0 & !attr.0)
                },
            );
        }
    };
    let name = names.general_name.to_lowercase();
    let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    if any(
        names.pre,
        &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"],
    ) || any(names.architecture, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set(vocab, "<mask>", TokenAttr::LSTRIP, true);
    } else if any(&name, &["phi-3", "phi3"]) {
        for &id in order {
            let a = vocab.attr(id);
            vocab.set_attr(id, a | TokenAttr::RSTRIP);
        }
        set(vocab, "</s>", TokenAttr::RSTRIP, true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(vocab, t, TokenAttr::RSTRIP, false);
        }
    } else if name.contains("modern-bert") {
        set(vocab, "[MASK]", TokenAttr::LSTRIP, true);
    }
}

/// A run of input: plain text still to be tokenized, or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Splits `text` around literal special-token text. Longer special texts are
/// matched first; control and unknown tokens only when `parse_special`
/// (user-defined tokens always, as in llama.cpp and HF tokenizers).
pub(crate) fn partition<'a>(
    text: &'a str,
    vocab: &Vocab,
    order: &[u32],
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text(text));
    for &id in order {
        let attr = vocab.attr(id);
        if !parse_special && attr.contains(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
            continue;
        }
        let Some(special) = vocab.text(id) else {
            continue;
        };
        if !text.contains(special) {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(mut rest) = fragment else {
                next.push(fragment);
                continue;
            };
            while let Some(at) = rest.find(special) {
                let mut left = &rest[..at];
                if attr.contains(TokenAttr::LSTRIP) {
                    left = left.trim_end_matches(is_c_space);
                }
                if !left.is_empty() {
                    next.push(Fragment::Text(left));
                }
                next.push(Fragment::Token(id));
                rest = &rest[at + special.len()..];
                if attr.contains(TokenAttr::RSTRIP) {
                    rest = rest.trim_start_matches(is_c_space);
                }
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        fragments = next;
    }
    fragments
}

/// C's `isspace` in the "C" locale.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(texts: &[(&str, TokenAttr)]) -> Vocab {
        Vocab::new(
            texts.iter().map(|(t, _)| t.to_string()).collect(),
            vec![0.0; texts.len()],
            texts.iter().map(|&(_, a)| a).collect(),
        )
    }

    #[test]
    fn partition_prefers_longer_special_text() {
        let v = vocab(&[
            ("a", TokenAttr::NORMAL),
            ("<|im|>", TokenAttr::CONTROL),
            ("<|im|><|im|>", TokenAttr::CONTROL),
            ("<u>", TokenAttr::USER_DEFINED),
        ]);
        let order = special_token_order(&v);
        let f = partition("x<|im|><|im|>y<|im|><u>", &v, &order, true);
        assert_eq!(
            f,
            [
                Fragment::Text("x"),
                Fragment::Token(2),
                Fragment::Text("y"),
                Fragment::Token(1),
                Fragment::Token(3)
            ]
        );
        // Without special parsing, user-defined tokens are still matched.
        let f = partition("x<|im|><u>", &v, &order, false);
        assert_eq!(f, [Fragment::Text("x<|im|>"), Fragment::Token(3)]);
    }
}
