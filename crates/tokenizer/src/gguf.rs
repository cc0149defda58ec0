//! Building a tokenizer from GGUF metadata (`tokenizer.ggml.*`), following the
//! defaults and overrides of llama.cpp's vocabulary loader.

use hearth_gguf::{Metadata, Value};

use crate::bpe::BpeMerges;
use crate::decode::{build_pieces, PieceStyle};
use crate::pre::PreSpec;
use crate::special::{apply_strip_attributes, special_token_order, ModelNames, SpecialTokens};
use crate::split::PreTokenizer;
use crate::vocab::{TokenAttr, Vocab};
use crate::{spm, Model, Tokenizer, TokenizerError};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

pub(crate) fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
    let model = md
        .get(KEY_MODEL)
        .ok_or(TokenizerError::MissingKey { key: KEY_MODEL })?;
    let model = model
        .as_str()
        .ok_or_else(|| invalid(KEY_MODEL, "expected a string"))?;
    let is_bpe = match model {
        "gpt2" => true,
        "llama" => false,
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    };
    let pre_name = match md.get(KEY_PRE) {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| invalid(KEY_PRE, "expected a string"))?,
        ),
    };
    // llama.cpp only consults the pre-tokenizer name for BPE vocabularies.
    let pre = if is_bpe {
        Some(PreSpec::from_name(pre_name)?)
    } else {
        None
    };

    let texts =
        string_array(md, KEY_TOKENS)?.ok_or(TokenizerError::MissingKey { key: KEY_TOKENS })?;
    let n = texts.len();
    let scores = match number_array(md, KEY_SCORES)? {
        Some(s) if s.len() < n => return Err(too_short(KEY_SCORES, s.len(), n)),
        Some(s) => s[..n].iter().map(|&x| x as f32).collect(),
        None => vec![0.0; n],
    };
    let attrs = match integer_array(md, KEY_TOKEN_TYPE)? {
        Some(t) if t.len() < n => return Err(too_short(KEY_TOKEN_TYPE, t.len(), n)),
        Some(t) => t[..n]
            .iter()
            .map(|&x| TokenAttr::from_token_type(x))
            .collect(),
        None => vec![TokenAttr::NORMAL; n],
    };
    let mut vocab = Vocab::new(texts, scores, attrs);

    // Defaults by tokenizer family, then the metadata's ids where in range.
    let in_vocab = |id: u32| ((id as usize) < n).then_some(id);
    let mut sp = if is_bpe {
        let no_bos = pre.as_ref().is_some_and(|p| p.no_default_bos);
        SpecialTokens {
            bos: if no_bos { None } else { in_vocab(11) },
            eos: in_vocab(11),
            add_bos: pre.as_ref().is_some_and(|p| p.add_bos),
            ..Default::default()
        }
    } else {
        SpecialTokens {
            bos: in_vocab(1),
            eos: in_vocab(2),
            unk: in_vocab(0),
            add_bos: true,
            ..Default::default()
        }
    };
    // An out-of-range id is ignored (llama.cpp warns and keeps the default).
    let set_id = |slot: &mut Option<u32>, key: &str| {
        if let Some(id) = md
            .get_u64(key)
            .and_then(|id| u32::try_from(id).ok())
            .and_then(in_vocab)
        {
            *slot = Some(id);
        }
    };
    for (key, slot) in [
        ("tokenizer.ggml.bos_token_id", &mut sp.bos),
        ("tokenizer.ggml.eos_token_id", &mut sp.eos),
        ("tokenizer.ggml.eot_token_id", &mut sp.eot),
        ("tokenizer.ggml.eom_token_id", &mut sp.eom),
        ("tokenizer.ggml.unknown_token_id", &mut sp.unk),
        ("tokenizer.ggml.seperator_token_id", &mut sp.sep),
        ("tokenizer.ggml.padding_token_id", &mut sp.pad),
        ("tokenizer.ggml.mask_token_id", &mut sp.mask),
        ("tokenizer.ggml.fim_pre_token_id", &mut sp.fim_pre),
        ("tokenizer.ggml.fim_suf_token_id", &mut sp.fim_suf),
        ("tokenizer.ggml.fim_mid_token_id", &mut sp.fim_mid),
        ("tokenizer.ggml.fim_pad_token_id", &mut sp.fim_pad),
        ("tokenizer.ggml.fim_rep_token_id", &mut sp.fim_rep),
        ("tokenizer.ggml.fim_sep_token_id", &mut sp.fim_sep),
    ] {
        set_id(slot, key);
    }
    // Deprecated spellings, read after (and so overriding) the current ones.
    set_id(&mut sp.fim_pre, "tokenizer.ggml.prefix_token_id");
    set_id(&mut sp.fim_suf, "tokenizer.ggml.suffix_token_id");
    set_id(&mut sp.fim_mid, "tokenizer.ggml.middle_token_id");
    if let Some(b) = md.get_bool(KEY_ADD_BOS) {
        sp.add_bos = b;
    }
    if let Some(b) = md.get_bool(KEY_ADD_EOS) {
        sp.add_eos = b;
    }
    sp.detect(&mut vocab);

    let special_order = special_token_order(&vocab);
    let pieces = build_pieces(
        &vocab,
        if is_bpe {
            PieceStyle::ByteLevel
        } else {
            PieceStyle::SentencePiece
        },
    );
    let names = ModelNames {
        general_name: md.get_str("general.name").unwrap_or(""),
        pre: pre_name.unwrap_or(""),
        architecture: md.get_str("general.architecture").unwrap_or(""),
    };
    apply_strip_attributes(&mut vocab, &special_order, &names);

    let add_space_prefix = md.get_bool(KEY_ADD_SPACE_PREFIX).unwrap_or(!is_bpe);
    let model = match pre {
        Some(pre) => {
            let merges = string_array(md, KEY_MERGES)?
                .ok_or(TokenizerError::MissingKey { key: KEY_MERGES })?;
            let merges = BpeMerges::new(&vocab, merges.iter().map(String::as_str));
            let splitter = PreTokenizer::new(pre.regexes, true)?;
            Model::Bpe {
                merges,
                splitter,
                pre,
            }
        }
        None => Model::Spm {
            byte_tokens: Box::new(spm::byte_tokens(&vocab)),
            add_space_prefix,
        },
    };
    Ok(Tokenizer {
        vocab,
        specials: sp,
        special_order,
        pieces,
        model,
    })
}

fn invalid(key: &'static str, problem: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidKey {
        key,
        problem: problem.into(),
    }
}

fn too_short(key: &'static str, got: usize, want: usize) -> TokenizerError {
    invalid(key, format!("{got} entries for {want} tokens"))
}

fn array<'a>(md: &'a Metadata, key: &'static str) -> Result<Option<&'a [Value]>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| {
            invalid(
                key,
                format!("expected an array, found {}", v.value_type().name()),
            )
        }),
    }
}

/// The array at `key`, every entry converted by `entry` (`what` names the
/// expected kind in the error for an entry it rejects).
fn typed_array<T>(
    md: &Metadata,
    key: &'static str,
    what: &str,
    entry: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    let Some(items) = array(md, key)? else {
        return Ok(None);
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| entry(v).ok_or_else(|| invalid(key, format!("entry {i} is not {what}"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn string_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    typed_array(md, key, "a string", |v| v.as_str().map(str::to_string))
}

fn number_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<f64>>, TokenizerError> {
    typed_array(md, key, "a number", Value::as_f64)
}

fn integer_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<i64>>, TokenizerError> {
    typed_array(md, key, "an integer", Value::as_i64)
}
