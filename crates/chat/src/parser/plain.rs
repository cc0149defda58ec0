//! No structure: everything is content.

use super::driver::{Ctx, Machine};

pub(crate) struct PlainParser;

impl Machine for PlainParser {
    fn feed(&mut self, text: &str, cx: &mut Ctx) {
        cx.content(text)
    }
    fn finish(&mut self, _cx: &mut Ctx) {}
}
