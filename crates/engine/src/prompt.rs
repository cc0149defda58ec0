//! A prompt as the model takes it: token ids, with runs of precomputed
//! embedding rows (encoded images) at some positions.
//!
//! Every position has an id, so the session's prefix reuse and the turn's
//! bookkeeping stay id-based: an image position holds [`IMAGE_ID`] (outside
//! every vocabulary, like llama.cpp's `LLAMA_TOKEN_NULL` in its server's
//! prompt cache), and the image itself is a [`ImageSpan`] naming its rows and
//! their content digest. Two prompts share a position only when their ids
//! agree and, at image positions, the same image (digest) starts at the same
//! place ([`Prompt::common_prefix`]).

use std::sync::Arc;

use hearth_models::Input;

/// The id an image position carries in a prompt's ids.
pub const IMAGE_ID: u32 = u32::MAX;

/// An encoded image: the rows that take `n` positions of a prompt.
#[derive(Debug)]
pub struct ImageRows {
    /// Identity of the rows (e.g. sha256 of the image's pixels and the
    /// encoder's rules): equal digests mean equal rows.
    pub digest: [u8; 32],
    /// [n, dim] f32.
    pub rows: Vec<f32>,
    pub n: usize,
}

/// An image placed in a prompt at positions `start..start + image.n`.
#[derive(Clone, Debug)]
pub struct ImageSpan {
    pub start: usize,
    pub image: Arc<ImageRows>,
}

impl ImageSpan {
    pub fn end(&self) -> usize {
        self.start + self.image.n
    }
}

/// Token ids plus the images placed among them.
#[derive(Clone, Debug, Default)]
pub struct Prompt {
    /// One id per position ([`IMAGE_ID`] at image positions).
    pub ids: Vec<u32>,
    /// In position order, not overlapping.
    pub images: Vec<ImageSpan>,
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Prompt {
        Prompt {
            ids,
            images: Vec::new(),
        }
    }
}

impl Prompt {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn push_tokens(&mut self, ids: &[u32]) {
        self.ids.extend_from_slice(ids);
    }

    /// Appends an image: `image.n` positions.
    pub fn push_image(&mut self, image: Arc<ImageRows>) {
        let start = self.ids.len();
        self.ids.extend(std::iter::repeat_n(IMAGE_ID, image.n));
        self.images.push(ImageSpan { start, image });
    }

    /// Positions taken by images.
    pub fn image_positions(&self) -> usize {
        self.images.iter().map(|s| s.image.n).sum()
    }

    /// The model input for positions `at..` up to `end` at most, cut at the
    /// next boundary between tokens and an image (a forward pass takes one
    /// kind, as llama.cpp's mtmd helper decodes text and image chunks in
    /// separate batches). Returns the input and where it ends.
    pub fn input(&self, at: usize, end: usize, dim: usize) -> (Input<'_>, usize) {
        let end = self.chunk_end(at, end);
        if let Some(s) = self.images.iter().find(|s| s.start <= at && at < s.end()) {
            let rows = &s.image.rows[(at - s.start) * dim..(end - s.start) * dim];
            return (Input::Rows(rows), end);
        }
        (Input::Tokens(&self.ids[at..end]), end)
    }

    /// Where a pass starting at `at` and asked to end at `end` ends: at the
    /// prompt's end or the next boundary between tokens and an image.
    pub fn chunk_end(&self, at: usize, end: usize) -> usize {
        let end = end.min(self.ids.len());
        if let Some(s) = self.images.iter().find(|s| s.start <= at && at < s.end()) {
            return end.min(s.end());
        }
        self.images
            .iter()
            .map(|s| s.start)
            .filter(|&st| st > at)
            .fold(end, usize::min)
    }

    /// Length of the longest common prefix with resident `ids` holding
    /// `images`: ids equal, and every image starting inside the prefix is
    /// the same image at the same place in both.
    pub fn common_prefix(&self, ids: &[u32], images: &[ImageSpan]) -> usize {
        let mut common = common_prefix(ids, &self.ids);
        for s in &self.images {
            if s.start >= common {
                break;
            }
            let same = images
                .iter()
                .any(|r| r.start == s.start && r.image.digest == s.image.digest);
            if !same {
                common = s.start;
                break;
            }
        }
        common
    }
}

/// Length of the longest common prefix.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tag: u8, n: usize, dim: usize) -> Arc<ImageRows> {
        Arc::new(ImageRows {
            digest: [tag; 32],
            rows: (0..n * dim).map(|i| i as f32).collect(),
            n,
        })
    }

    #[test]
    fn inputs_stop_at_image_boundaries() {
        let mut p = Prompt::default();
        p.push_tokens(&[1, 2, 3]);
        p.push_image(image(7, 4, 2));
        p.push_tokens(&[4, 5]);
        assert_eq!(p.len(), 9);
        let (i, end) = p.input(0, usize::MAX, 2);
        assert!(matches!(i, Input::Tokens(&[1, 2, 3])));
        assert_eq!(end, 3);
        let (i, end) = p.input(4, 6, 2);
        assert!(matches!(i, Input::Rows(r) if r == [2.0, 3.0, 4.0, 5.0]));
        assert_eq!(end, 6);
        let (i, end) = p.input(6, usize::MAX, 2);
        assert!(matches!(i, Input::Rows(r) if r.len() == 2));
        assert_eq!(end, 7);
        let (i, end) = p.input(7, usize::MAX, 2);
        assert!(matches!(i, Input::Tokens(&[4, 5])));
        assert_eq!(end, 9);
    }

    #[test]
    fn common_prefix_compares_images_by_digest() {
        let mut a = Prompt::default();
        a.push_tokens(&[1, 2]);
        a.push_image(image(7, 3, 1));
        a.push_tokens(&[4]);
        let mut same = a.clone();
        same.push_tokens(&[9]);
        assert_eq!(same.common_prefix(&a.ids, &a.images), 6);
        let mut other = Prompt::default();
        other.push_tokens(&[1, 2]);
        other.push_image(image(8, 3, 1));
        other.push_tokens(&[4]);
        assert_eq!(other.common_prefix(&a.ids, &a.images), 2);
        let text: Prompt = vec![1, 2, 3].into();
        assert_eq!(text.common_prefix(&a.ids, &a.images), 2);
    }
}
