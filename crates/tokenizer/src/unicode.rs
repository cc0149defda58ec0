//! Code point classification and the GPT-2 byte-to-unicode mapping.
//!
//! Categories come from llama.cpp's own table ([`crate::unicode_data`]) so that
//! `\p{L}`, `\p{N}`, `\s` etc. mean exactly what they mean in llama.cpp's
//! pre-tokenizers, whatever Unicode version Rust ships.

use crate::unicode_data::{CATEGORY_RANGES, WHITESPACE};

/// Category bits of one code point, plus a whitespace bit.
/// `Flags::OUTSIDE` (all zero) stands for "past the end of the text": every
/// real code point has at least one category bit (unassigned ones are "undefined",
/// 0x01; separators 0x08 and controls 0x80 are the others not named here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const NUMBER: u16 = 0x0002; // \p{N}
    pub const LETTER: u16 = 0x0004; // \p{L}
    pub const MARK: u16 = 0x0010; // \p{M}
    pub const PUNCTUATION: u16 = 0x0020; // \p{P}
    pub const SYMBOL: u16 = 0x0040; // \p{S}
    pub const CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100; // \s

    pub const OUTSIDE: Flags = Flags(0);

    pub fn of(cp: u32) -> Flags {
        // Table entries are range starts; find the last start <= cp.
        let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cp);
        let category = if i == 0 {
            0
        } else {
            CATEGORY_RANGES[i - 1].1 as u16
        };
        let space = if WHITESPACE.binary_search(&cp).is_ok() {
            Flags::WHITESPACE
        } else {
            0
        };
        Flags(category | space)
    }

    pub fn is_inside(self) -> bool {
        self.0 != 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

const fn is_printable_byte(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes
/// map to themselves, the other 68 bytes to U+0100.. in byte order.
const BYTE_TO_CP: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut next = 256;
    let mut b = 0;
    while b < 256 {
        if is_printable_byte(b) {
            table[b as usize] = b;
        } else {
            table[b as usize] = next;
            next += 1;
        }
        b += 1;
    }
    table
};

/// Inverse of [`BYTE_TO_CP`] over U+0000..U+0143; -1 where no byte maps.
const CP_TO_BYTE: [i16; 324] = {
    let mut table = [-1i16; 324];
    let mut b = 0;
    while b < 256 {
        table[BYTE_TO_CP[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// The printable character GPT-2 byte-level BPE uses for `byte`.
pub(crate) fn byte_to_char(byte: u8) -> char {
    // All targets are below U+0144, so the conversion cannot fail.
    char::from_u32(BYTE_TO_CP[byte as usize]).unwrap_or('\0')
}

/// Inverse of [`byte_to_char`]: `None` for characters outside the map.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match CP_TO_BYTE.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_llama_cpp_table() {
        assert!(Flags::of('a' as u32).is_letter());
        assert!(Flags::of('7' as u32).is_number());
        assert!(Flags::of(' ' as u32).is_whitespace());
        assert!(Flags::of(0x3000).is_whitespace());
        assert!(Flags::of(0x0301).is_mark());
        assert!(Flags::of('中' as u32).is_letter());
        assert!(Flags::of(0x10FFFF).is_inside());
        assert_eq!(Flags::of('!' as u32).category(), Flags::PUNCTUATION);
        assert_eq!(Flags::of('+' as u32).category(), Flags::SYMBOL);
    }

    #[test]
    fn byte_map_round_trips() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }
}
