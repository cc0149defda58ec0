//! Pre-tokenization: splitting text into words before BPE, exactly as llama.cpp
//! does (src/unicode.cpp, `unicode_regex_split`).
//!
//! A pre-tokenizer is a list of regexes applied in sequence; each one splits every
//! piece left by the previous one into its matches and the gaps between them.
//! llama.cpp runs the common regexes (GPT-2, llama3, qwen2, qwen3.5, newlines)
//! through hand-written splitters and everything else through std::regex on a
//! "collapsed" text in which each non-ASCII code point is replaced by one byte
//! naming its category. We do the same: [`Splitter::Custom`] reproduces the
//! hand-written splitters (including their small departures from the regex), and
//! [`Splitter::Regex`] runs the llama.cpp regex, translated from ECMAScript, on
//! the same collapsed text with `fancy-regex` (backtracking, lookarounds).

use crate::pre::custom;
use crate::unicode::{byte_to_char, Flags};
use crate::TokenizerError;

/// The hand-written splitters of llama.cpp, by the regex they stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Custom {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// llama3 (`\p{N}{1,3}`), qwen2 (`\p{N}`), qwen3.5 (qwen2 with `\p{M}` joining letters).
    Llama3 { max_digits: usize, marks: bool },
    /// `[^\n]+|[\n]+`
    Newlines,
}

#[derive(Debug)]
enum Splitter {
    Custom(Custom),
    Regex {
        regex: Box<fancy_regex::Regex>,
        collapsed: bool,
    },
}

/// Splits text into words, optionally byte-encoding each word GPT-2 style.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
    byte_encode: bool,
}

impl PreTokenizer {
    pub fn new(regexes: &[&str], byte_encode: bool) -> Result<PreTokenizer, TokenizerError> {
        let splitters = regexes
            .iter()
            .map(|r| Splitter::new(r))
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer {
            splitters,
            byte_encode,
        })
    }

    /// The words of `text`, in order; their concatenation is `text` (byte-encoded
    /// if this pre-tokenizer byte-encodes).
    pub fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let flags: Vec<Flags> = cpts.iter().map(|&c| Flags::of(c)).collect();
        let text = Text {
            cpts: &cpts,
            flags: &flags,
        };

        // Piece lengths in code points; starts as one piece, the whole text.
        let mut pieces = vec![cpts.len()];
        let mut collapsed: Option<String> = None;
        let mut wide: Option<Vec<char>> = None;
        for splitter in &self.splitters {
            pieces = match splitter {
                Splitter::Custom(kind) => {
                    let out = split_custom(&text, &pieces, *kind);
                    // llama.cpp treats an empty result as "no custom splitter" and
                    // reruns the regex generically; that only happens for empty text.
                    if out.is_empty() {
                        continue;
                    }
                    out
                }
                Splitter::Regex {
                    regex,
                    collapsed: true,
                } => {
                    let chars = collapsed.get_or_insert_with(|| collapse(&text));
                    split_regex(regex, chars, &pieces)
                }
                Splitter::Regex {
                    regex,
                    collapsed: false,
                } => {
                    let chars = wide.get_or_insert_with(|| widen(&text));
                    let s: String = chars.iter().collect();
                    split_regex(regex, &s, &pieces)
                }
            };
        }

        let mut words = Vec::with_capacity(pieces.len());
        let mut start = 0;
        for len in pieces {
            let word = &cpts[start..start + len];
            start += len;
            let mut s = String::new();
            for &cp in word {
                let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
                if self.byte_encode {
                    let mut buf = [0u8; 4];
                    for &b in c.encode_utf8(&mut buf).as_bytes() {
                        s.push(byte_to_char(b));
                    }
                } else {
                    s.push(c);
                }
            }
            words.push(s);
        }
        words
    }
}

impl Splitter {
    fn new(regex: &str) -> Result<Splitter, TokenizerError> {
        let custom = match regex {
            r if r == custom::GPT2 => Some(Custom::Gpt2),
            r if r == custom::LLAMA3 || r == custom::LLAMA3_ORIGINAL => Some(Custom::Llama3 {
                max_digits: 3,
                marks: false,
            }),
            r if r == custom::QWEN2 => Some(Custom::Llama3 {
                max_digits: 1,
                marks: false,
            }),
            r if r == custom::QWEN35 => Some(Custom::Llama3 {
                max_digits: 1,
                marks: true,
            }),
            r if r == custom::NEWLINES => Some(Custom::Newlines),
            _ => None,
        };
        if let Some(kind) = custom {
            return Ok(Splitter::Custom(kind));
        }
        let collapsed = uses_categories(regex);
        let translated =
            translate_regex(regex, collapsed).map_err(|message| TokenizerError::Regex {
                regex: regex.to_string(),
                message,
            })?;
        let regex_err = |e: fancy_regex::Error| TokenizerError::Regex {
            regex: regex.to_string(),
            message: format!("{e} (translated: {translated:?})"),
        };
        let compiled = fancy_regex::RegexBuilder::new(&translated)
            .backtrack_limit(100_000_000)
            .build()
            .map_err(regex_err)?;
        Ok(Splitter::Regex {
            regex: Box::new(compiled),
            collapsed,
        })
    }
}

/// The text being split: code points and their flags, same length.
struct Text<'a> {
    cpts: &'a [u32],
    flags: &'a [Flags],
}

/// One piece of the text, `[start, end)` in code points, with the llama.cpp
/// convention that reading past the piece gives "no code point".
struct Piece<'a> {
    text: &'a Text<'a>,
    end: usize,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> Option<u32> {
        (pos < self.end).then(|| self.text.cpts[pos])
    }
    fn flags(&self, pos: usize) -> Flags {
        if pos < self.end {
            self.text.flags[pos]
        } else {
            Flags::OUTSIDE
        }
    }
    fn is(&self, pos: usize, c: char) -> bool {
        self.cpt(pos) == Some(c as u32)
    }
    fn is_cr_or_lf(&self, pos: usize) -> bool {
        self.is(pos, '\r') || self.is(pos, '\n')
    }
    fn whitespace_run(&self, pos: usize) -> usize {
        (pos..self.end)
            .take_while(|&p| self.flags(p).is_whitespace())
            .count()
    }
}

fn split_custom(text: &Text, pieces: &[usize], kind: Custom) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        let piece = Piece {
            text,
            end: start + len,
        };
        match kind {
            Custom::Gpt2 => split_gpt2(&piece, start, &mut out),
            Custom::Llama3 { max_digits, marks } => {
                split_llama3(&piece, start, max_digits, marks, &mut out)
            }
            Custom::Newlines => split_newlines(&piece, start, &mut out),
        }
        start += len;
    }
    out
}

/// Length of a contraction (`'s 't 'm 'd 're 've 'll`) starting at `pos`, if any.
fn contraction_len(p: &Piece, pos: usize, ignore_case: bool) -> Option<usize> {
    if !p.is(pos, '\'') || pos + 1 >= p.end {
        return None;
    }
    let lower = |pos: usize| {
        let c = p.cpt(pos).and_then(char::from_u32).unwrap_or('\0');
        // llama.cpp lowercases with the full Unicode map, but only ASCII
        // letters lowercase to the ASCII letters tested here.
        if ignore_case {
            c.to_ascii_lowercase()
        } else {
            c
        }
    };
    let c1 = lower(pos + 1);
    if matches!(c1, 's' | 't' | 'm' | 'd') {
        return Some(2);
    }
    if pos + 2 < p.end && matches!((c1, lower(pos + 2)), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
        return Some(3);
    }
    None
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`,
/// plus the `|\s+` that llama.cpp's splitter implies, and a lone unmatched
/// code point becoming its own word.
fn split_gpt2(p: &Piece, start: usize, out: &mut Vec<usize>) {
    let mut pos = start;
    let mut emit = |pos: &mut usize, end: usize| {
        out.push(end - *pos);
        *pos = end;
    };
    while pos < p.end {
        if let Some(n) = contraction_len(p, pos, false) {
            let end = pos + n;
            emit(&mut pos, end);
            continue;
        }
        // ` ?X+` for one class X: letters, digits, or "other" (not space/letter/digit).
        let lead = usize::from(p.is(pos, ' '));
        let first = p.flags(pos + lead);
        let class: Option<fn(Flags) -> bool> = if first.is_letter() {
            Some(|f| f.is_letter())
        } else if first.is_number() {
            Some(|f| f.is_number())
        } else if is_other(first, false) {
            Some(|f| is_other(f, false))
        } else {
            None
        };
        if let Some(class) = class {
            let mut end = pos + lead;
            while class(p.flags(end)) {
                end += 1;
            }
            emit(&mut pos, end);
            continue;
        }
        let end = whitespace_end(p, pos, p.whitespace_run(pos));
        emit(&mut pos, end);
    }
}

/// The end of the last alternatives at `pos`, where a run of `spaces`
/// whitespace code points starts: `\s+(?!\S)` (leave the last space to
/// prefix the next word), else `\s+`, else (no whitespace) one code point.
fn whitespace_end(p: &Piece, pos: usize, spaces: usize) -> usize {
    if spaces > 1 && pos + spaces < p.end {
        pos + spaces - 1
    } else if spaces > 0 {
        pos + spaces
    } else {
        pos + 1
    }
}

/// `[^\s\p{L}\p{N}]` (with `\p{M}` excluded too when `marks`), for a code point
/// inside the piece.
fn is_other(f: Flags, marks: bool) -> bool {
    f.is_inside()
        && !(f.is_whitespace() || f.is_letter() || f.is_number() || (marks && f.is_mark()))
}

/// llama3 family: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` with N = `max_digits`;
/// `marks` lets `\p{M}` join letter runs (qwen3.5).
fn split_llama3(p: &Piece, start: usize, max_digits: usize, marks: bool, out: &mut Vec<usize>) {
    let wordish = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let mut pos = start;
    let mut emit = |pos: &mut usize, end: usize| {
        out.push(end - *pos);
        *pos = end;
    };
    while pos < p.end {
        let flags = p.flags(pos);
        if let Some(n) = contraction_len(p, pos, true) {
            let end = pos + n;
            emit(&mut pos, end);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(p.is_cr_or_lf(pos) || flags.is_number())
            && (wordish(flags) || wordish(p.flags(pos + 1)))
        {
            let mut end = pos + 1;
            while wordish(p.flags(end)) {
                end += 1;
            }
            emit(&mut pos, end);
            continue;
        }
        // `\p{N}{1,N}`: a digit run is cut every N digits.
        if flags.is_number() {
            while p.flags(pos).is_number() {
                let run = (pos..p.end).take_while(|&q| p.flags(q).is_number()).count();
                let end = pos + run.min(max_digits);
                emit(&mut pos, end);
            }
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`. llama.cpp tests the first code point for
        // being inside the piece, not the one after the optional space.
        let lead = usize::from(p.is(pos, ' '));
        let after = p.flags(pos + lead);
        let after_is_other = !(after.is_whitespace()
            || after.is_letter()
            || after.is_number()
            || (marks && after.is_mark()));
        if after_is_other && flags.is_inside() {
            let mut end = pos + lead;
            while is_other(p.flags(end), marks) {
                end += 1;
            }
            while p.is_cr_or_lf(end) {
                end += 1;
            }
            emit(&mut pos, end);
            continue;
        }
        let spaces = p.whitespace_run(pos);
        let last_newline_end = (pos..pos + spaces)
            .rev()
            .find(|&q| p.is_cr_or_lf(q))
            .map(|q| q + 1);
        // `\s*[\r\n]+`, else the whitespace alternatives.
        let end = last_newline_end.unwrap_or_else(|| whitespace_end(p, pos, spaces));
        emit(&mut pos, end);
    }
}

/// `[^\n]+|[\n]+`: alternating runs of non-newlines and newlines.
fn split_newlines(p: &Piece, start: usize, out: &mut Vec<usize>) {
    let mut pos = start;
    while pos < p.end {
        let newline = p.is(pos, '\n');
        let run = (pos..p.end)
            .take_while(|&q| p.is(q, '\n') == newline)
            .count();
        out.push(run);
        pos += run;
    }
}

// --- the generic path: llama.cpp's std::regex fallback ---

/// The Unicode categories llama.cpp's fallback understands, and the byte that
/// stands for each in the collapsed text (as a char U+00D0..U+00D5 here).
const CATEGORY_NAMES: &[(&str, u16)] = &[
    ("\\p{N}", Flags::NUMBER),
    ("\\p{L}", Flags::LETTER),
    ("\\p{P}", Flags::PUNCTUATION),
    ("\\p{M}", Flags::MARK),
    ("\\p{S}", Flags::SYMBOL),
    // llama.cpp folds the letter subcategories into \p{L}.
    ("\\p{Lu}", Flags::LETTER),
    ("\\p{Ll}", Flags::LETTER),
    ("\\p{Lt}", Flags::LETTER),
    ("\\p{Lm}", Flags::LETTER),
    ("\\p{Lo}", Flags::LETTER),
];

fn category_code(category: u16) -> Option<u32> {
    match category {
        Flags::NUMBER => Some(0xD1),
        Flags::LETTER => Some(0xD2),
        Flags::PUNCTUATION => Some(0xD3),
        Flags::MARK => Some(0xD4),
        Flags::SYMBOL => Some(0xD5),
        _ => None,
    }
}

/// The ASCII members of each category, which stay themselves in collapsed text.
fn category_ascii(category: u16) -> &'static str {
    match category {
        Flags::NUMBER => "0-9",
        Flags::LETTER => "A-Za-z",
        Flags::PUNCTUATION => "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
        Flags::SYMBOL => "\\$\\+<->\\^`\\|\\~",
        _ => "",
    }
}

fn uses_categories(regex: &str) -> bool {
    CATEGORY_NAMES.iter().any(|(name, _)| regex.contains(name))
}

/// Collapsed text: ASCII stays, non-ASCII whitespace becomes U+000B, any other
/// non-ASCII code point becomes the code of its category (U+00D0 when none).
fn collapse(text: &Text) -> String {
    text.cpts
        .iter()
        .zip(text.flags)
        .map(|(&cp, &f)| {
            let c = if cp < 0x80 {
                cp
            } else if f.is_whitespace() {
                0x0B
            } else {
                category_code(f.category()).unwrap_or(0xD0)
            };
            char::from_u32(c).unwrap_or('\u{D0}')
        })
        .collect()
}

/// Text for a regex without categories: code points as they are, except
/// non-ASCII whitespace, which becomes U+000B (std::wregex's `\s` is ASCII-only).
fn widen(text: &Text) -> Vec<char> {
    text.cpts
        .iter()
        .zip(text.flags)
        .map(|(&cp, &f)| {
            let cp = if cp > 0x7F && f.is_whitespace() {
                0x0B
            } else {
                cp
            };
            char::from_u32(cp).unwrap_or('\u{FFFD}')
        })
        .collect()
}

/// Runs `regex` over each piece: matches and the gaps between them become pieces.
fn split_regex(regex: &fancy_regex::Regex, text: &str, pieces: &[usize]) -> Vec<usize> {
    // Byte offset of every code point, so pieces (in code points) map to &str slices.
    let mut byte_at: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    byte_at.push(text.len());
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        let (b0, b1) = (byte_at[start], byte_at[start + len]);
        let piece = &text[b0..b1];
        // Code point index (within the piece) of a byte offset (within the piece).
        let cp_index =
            |byte: usize| byte_at[start..=start + len].partition_point(|&b| b < b0 + byte);
        let mut done = 0;
        for m in regex.find_iter(piece) {
            // A backtracking blow-up leaves the rest of the piece unsplit.
            let Ok(m) = m else { break };
            let (m0, m1) = (cp_index(m.start()), cp_index(m.end()));
            if m0 > done {
                out.push(m0 - done);
            }
            out.push(m1 - m0);
            done = m1;
        }
        if done < len {
            out.push(len - done);
        }
        start += len;
    }
    out
}

/// Translates one of llama.cpp's ECMAScript regexes into fancy-regex syntax.
///
/// With `collapsed`, `\p{..}` becomes its collapsed class exactly as llama.cpp
/// builds it (code char plus ASCII members). In both modes `\s`/`\S` become the
/// explicit ASCII classes std::regex uses, and characters that Rust's class
/// syntax treats specially (`[`, `&&`, `~~`, `--`) are escaped inside classes.
fn translate_regex(regex: &str, collapsed: bool) -> Result<String, String> {
    const SPACE: &str = "\\t\\n\\x0B\\x0C\\r\\x20";
    let chars: Vec<char> = regex.chars().collect();
    if collapsed && chars.iter().any(|&c| !c.is_ascii()) {
        return Err(
            "llama.cpp does not support unicode categories mixed with non-ASCII characters".into(),
        );
    }
    let mut out = String::new();
    let mut in_class = false;
    let mut class_start = false; // just after `[` or `[^`
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let was_class_start = class_start;
        class_start = false;
        if c == '\\' && i + 1 < chars.len() {
            let e = chars[i + 1];
            if e == 'p' && chars.get(i + 2) == Some(&'{') {
                let close = chars[i..].iter().position(|&c| c == '}').map(|p| i + p);
                let name: String = close
                    .map(|c| chars[i..=c].iter().collect())
                    .unwrap_or_default();
                let Some(&(_, category)) = CATEGORY_NAMES.iter().find(|(n, _)| *n == name) else {
                    return Err(format!("unsupported unicode property {name:?}"));
                };
                let code = category_code(category).expect("named categories have codes");
                let members = format!("\\x{{{code:X}}}{}", category_ascii(category));
                if in_class {
                    out.push_str(&members);
                } else {
                    out.push('[');
                    out.push_str(&members);
                    out.push(']');
                }
                i = close.unwrap_or(i) + 1;
                continue;
            }
            match (e, in_class) {
                ('s', true) => out.push_str(SPACE),
                ('s', false) => out.push_str(&format!("[{SPACE}]")),
                ('S', false) => out.push_str(&format!("[^{SPACE}]")),
                ('S', true) | ('d', _) | ('D', _) | ('w', _) | ('W', _) | ('b', _) | ('B', _) => {
                    return Err(format!("escape \\{e} is not supported by the translation"));
                }
                _ => {
                    out.push('\\');
                    out.push(e);
                }
            }
            i += 2;
            continue;
        }
        if in_class {
            match c {
                ']' if !was_class_start => {
                    in_class = false;
                    out.push(']');
                }
                '^' if was_class_start && out.ends_with('[') => {
                    out.push('^');
                    class_start = true;
                }
                '-' => {
                    if chars.get(i + 1) == Some(&'-') {
                        return Err("'--' inside a class is not supported".into());
                    }
                    out.push('-');
                }
                c if c.is_ascii_punctuation() => out.push_str(&format!("\\x{:02X}", c as u32)),
                c => out.push(c),
            }
        } else {
            if c == '[' {
                in_class = true;
                class_start = true;
            }
            out.push(c);
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(regexes: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(regexes, false).unwrap().split(text)
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        let w = words(&[custom::GPT2], "Hello world's  end 123!!\n\n x");
        assert_eq!(
            w,
            ["Hello", " world", "'s", " ", " end", " 123", "!!", "\n\n", " x"]
        );
    }

    #[test]
    fn qwen2_splits_digits_and_newlines() {
        let w = words(&[custom::QWEN2], "x = 1234;\n\n  y\tIT'S");
        assert_eq!(
            w,
            ["x", " =", " ", "1", "2", "3", "4", ";\n\n", " ", " y", "\tIT", "'S"]
        );
    }

    #[test]
    fn llama3_groups_three_digits() {
        let w = words(&[custom::LLAMA3], "1234567");
        assert_eq!(w, ["123", "456", "7"]);
    }

    #[test]
    fn collapsed_regex_splits_each_digit() {
        // smollm / starcoder: `\p{N}` first, then GPT-2.
        let w = words(&["\\p{N}", custom::GPT2], "ab 12٣");
        assert_eq!(w, ["ab", " ", "1", "2", "٣"]);
    }

    #[test]
    fn every_known_regex_translates_and_compiles() {
        for name in [
            "default",
            "llama3",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "spark2_5",
            "youtu",
            "falcon",
            "starcoder",
            "jais-2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "chameleon",
            "gpt-4o",
            "granite-embed-multi-97m",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "laguna",
            "exaone-moe",
            "minicpm5",
        ] {
            let spec = crate::pre::PreSpec::from_name(Some(name)).unwrap();
            PreTokenizer::new(spec.regexes, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn byte_encoding_maps_space_and_newline() {
        let w = PreTokenizer::new(&[custom::GPT2], true)
            .unwrap()
            .split(" a\n");
        assert_eq!(w, ["Ġa", "Ċ"]);
    }
}
