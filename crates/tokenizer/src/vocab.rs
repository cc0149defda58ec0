//! The vocabulary: token texts, scores and attributes, and text -> id lookup.

use std::collections::HashMap;

/// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type`
/// and then adjusts them by token text (special.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenAttr(pub u16);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    /// From a GGUF `tokenizer.ggml.token_type` value
    /// (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub fn from_token_type(t: i64) -> TokenAttr {
        match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        }
    }

    pub fn contains(self, any_of: TokenAttr) -> bool {
        self.0 & any_of.0 != 0
    }
    pub fn with(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | other.0)
    }
}

/// `is_X()`: whether the attributes include flag `X`.
macro_rules! attr_tests {
    ($($name:ident => $flag:ident),* $(,)?) => {
        impl TokenAttr {
            $(
                pub fn $name(self) -> bool {
                    self.contains(Self::$flag)
                }
            )*
        }
    };
}

attr_tests! {
    is_normal => NORMAL,
    is_control => CONTROL,
    is_user_defined => USER_DEFINED,
    is_unknown => UNKNOWN,
    is_unused => UNUSED,
    is_byte => BYTE,
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        self.with(rhs)
    }
}

#[derive(Debug)]
pub(crate) struct Vocab {
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    /// Text -> id; for duplicate texts the last id wins, as in llama.cpp.
    ids: HashMap<String, u32>,
    /// Tokens whose text is exactly one ASCII byte.
    ascii: [Option<u32>; 128],
}

impl Vocab {
    /// Empty token texts become `[EMPTY_<id>]`, as llama.cpp renames them.
    pub fn new(texts: Vec<String>, scores: Vec<f32>, attrs: Vec<TokenAttr>) -> Vocab {
        debug_assert!(texts.len() == scores.len() && texts.len() == attrs.len());
        let texts: Vec<String> = texts
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t
                }
            })
            .collect();
        let mut ids = HashMap::with_capacity(texts.len());
        let mut ascii = [None; 128];
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
            if t.len() == 1 && t.as_bytes()[0] < 128 {
                ascii[t.as_bytes()[0] as usize] = Some(i as u32);
            }
        }
        Vocab {
            texts,
            scores,
            attrs,
            ids,
            ascii,
        }
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token whose text is the single byte `b` (only ASCII can be a one-byte string).
    pub fn single_byte_token(&self, b: u8) -> Option<u32> {
        self.ascii.get(b as usize).copied().flatten()
    }

    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    pub fn attr(&self, id: u32) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }

    pub fn set_attr(&mut self, id: u32, attr: TokenAttr) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a = attr;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &str)> {
        self.texts
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u32, t.as_str()))
    }

    /// The id that llama.cpp's text -> id map holds for `text` (last duplicate wins).
    pub fn canonical_ids(&self) -> impl Iterator<Item = (&str, u32)> {
        self.ids.iter().map(|(t, &id)| (t.as_str(), id))
    }
}
