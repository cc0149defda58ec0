//! Small matching helpers shared by the parsers: literal prefixes that may be cut
//! off at the end of the buffer, and the hold-back length for partial markers.

/// How a literal relates to the start of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lit {
    /// The buffer starts with the literal.
    Yes,
    /// The buffer is a proper prefix of the literal: more text may complete it.
    Partial,
    No,
}

pub fn lit(s: &str, literal: &str) -> Lit {
    if s.starts_with(literal) {
        Lit::Yes
    } else if literal.starts_with(s) {
        Lit::Partial
    } else {
        Lit::No
    }
}

/// Result of matching a structured piece of markup at the start of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match<T> {
    /// Matched `len` bytes.
    Full(usize, T),
    /// Could still match once more text arrives.
    Partial,
    No,
}

/// Length of the longest suffix of `s` that is a proper, non-empty prefix of one
/// of `markers` (all ASCII). That suffix must be held back.
pub fn partial_suffix_len(s: &str, markers: &[&str]) -> usize {
    let b = s.as_bytes();
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    for n in (1..longest.min(b.len() + 1)).rev() {
        let tail = &b[b.len() - n..];
        if markers
            .iter()
            .any(|m| m.len() > n && m.as_bytes().starts_with(tail))
        {
            return n;
        }
    }
    0
}

/// The earliest occurrence in `s` of any of `markers`: (position, marker index).
pub fn find_first(s: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .enumerate()
        .filter_map(|(i, m)| s.find(m).map(|p| (p, i)))
        .min()
}

/// Byte length of the leading ASCII whitespace of `s`.
pub fn ws_len(s: &str) -> usize {
    s.len()
        - s.trim_start_matches(|c: char| c.is_ascii_whitespace())
            .len()
}

/// Byte length of the trailing ASCII whitespace of `s`.
pub fn trailing_ws_len(s: &str) -> usize {
    s.len() - s.trim_end_matches(|c: char| c.is_ascii_whitespace()).len()
}

/// Whether the text after a closing tag confirms it as structural: after optional
/// whitespace comes one of `followers`, or (at `end`) nothing. `None`: undecided,
/// wait for more text.
pub fn followed_by(rest: &str, followers: &[&str], end: bool) -> Option<bool> {
    let rest = &rest[ws_len(rest)..];
    if rest.is_empty() {
        return if end { Some(true) } else { None };
    }
    let mut partial = false;
    for f in followers {
        match lit(rest, f) {
            Lit::Yes => return Some(true),
            Lit::Partial => partial = true,
            Lit::No => {}
        }
    }
    if partial && !end {
        None
    } else {
        Some(false)
    }
}

/// JSON string contents (no quotes) for `s`: the pieces of a streamed string value.
pub fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("a str always serializes");
    quoted[1..quoted.len() - 1].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffix() {
        assert_eq!(partial_suffix_len("abc<|eo", &["<|eot|>", "<|eom|>"]), 4);
        assert_eq!(partial_suffix_len("abc<|eot|>", &["<|eot|>"]), 0);
        assert_eq!(partial_suffix_len("abc", &["<|eot|>"]), 0);
        assert_eq!(partial_suffix_len("é<", &["<x>"]), 1);
    }

    #[test]
    fn followers() {
        assert_eq!(followed_by(" \n<b", &["<b>"], false), None);
        assert_eq!(followed_by(" \n<b>", &["<b>"], false), Some(true));
        assert_eq!(followed_by(" x", &["<b>"], false), Some(false));
        assert_eq!(followed_by("  ", &["<b>"], false), None);
        assert_eq!(followed_by("  ", &["<b>"], true), Some(true));
        assert_eq!(followed_by("<b", &["<b>"], true), Some(false));
    }
}
