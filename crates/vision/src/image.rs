//! Decoding: PNG, JPEG, WebP and GIF (first frame) bytes into 8-bit RGB,
//! with limits checked before any pixel is decoded.
//!
//! Channel handling follows the reference decoder (stb_image, spec
//! `vision.md` §2): alpha is dropped without compositing, gray is replicated
//! into three channels, 16-bit samples keep their high byte, and EXIF
//! orientation is ignored. PNG decodes to the same pixels as stb_image; JPEG
//! decoders differ slightly in IDCT and chroma upsampling, so a JPEG may
//! differ from llama.cpp's pixels by a few levels.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, ImageReader};

use crate::error::ImageError;

/// An 8-bit RGB image, row-major, 3 bytes per pixel (HWC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    /// `[height, width, 3]`
    pub data: Vec<u8>,
}

/// What an input image may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    /// Encoded bytes.
    pub max_bytes: usize,
    /// Pixels per side.
    pub max_side: u32,
    /// Pixels in all (`width ≤ max_pixels / height`).
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// The spec's limits (§2): 20 MiB, 32768 per side, 64 Mi pixels.
    fn default() -> Self {
        ImageLimits {
            max_bytes: 20 << 20,
            max_side: 32768,
            max_pixels: 1 << 26,
        }
    }
}

impl ImageLimits {
    /// Checks a size against the limits.
    pub fn check(&self, width: u32, height: u32) -> Result<(), ImageError> {
        if width == 0 || height == 0 {
            return Err(ImageError::ZeroSize { width, height });
        }
        if width > self.max_side
            || height > self.max_side
            || width as u64 > self.max_pixels / height as u64
        {
            return Err(ImageError::TooLarge {
                width,
                height,
                max_side: self.max_side,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }
}

/// The container format, from the first bytes.
fn sniff(bytes: &[u8]) -> Option<(ImageFormat, &'static str)> {
    if bytes.starts_with(&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]) {
        Some((ImageFormat::Png, "PNG"))
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some((ImageFormat::Jpeg, "JPEG"))
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some((ImageFormat::Gif, "GIF"))
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some((ImageFormat::WebP, "WebP"))
    } else {
        None
    }
}

impl RgbImage {
    /// Wraps raw RGB bytes, checking the buffer size and the default limits.
    pub fn from_raw(width: u32, height: u32, data: Vec<u8>) -> Result<RgbImage, ImageError> {
        ImageLimits::default().check(width, height)?;
        let expected = width as usize * height as usize * 3;
        if data.len() != expected {
            return Err(ImageError::BadBuffer {
                width,
                height,
                len: data.len(),
                expected,
            });
        }
        Ok(RgbImage {
            width,
            height,
            data,
        })
    }

    /// Decodes an encoded image (PNG, JPEG, WebP, GIF's first frame).
    pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage, ImageError> {
        if bytes.is_empty() {
            return Err(ImageError::Empty);
        }
        if bytes.len() > limits.max_bytes {
            return Err(ImageError::TooManyBytes {
                n: bytes.len(),
                max: limits.max_bytes,
            });
        }
        let Some((format, name)) = sniff(bytes) else {
            let magic = bytes
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ");
            return Err(ImageError::UnknownFormat { magic });
        };
        let decode_err = |e: image::ImageError| ImageError::Decode {
            format: name,
            message: e.to_string(),
        };
        // The header first, without size limits (they would hide the size),
        // so oversized images are refused with their size before any pixel
        // is allocated.
        let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
            .into_dimensions()
            .map_err(decode_err)?;
        limits.check(width, height)?;
        let reader = |bytes| {
            let mut r = ImageReader::with_format(Cursor::new(bytes), format);
            let mut l = image::Limits::default();
            l.max_image_width = Some(limits.max_side);
            l.max_image_height = Some(limits.max_side);
            // RGBA at 16 bits per channel for the largest allowed image.
            l.max_alloc = Some(limits.max_pixels.saturating_mul(8));
            r.limits(l);
            r
        };
        let img = reader(bytes).decode().map_err(decode_err)?;
        Ok(to_rgb8_stb(img))
    }

    /// The pixel at (x, y).
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }
}

/// Channel conversion as stb_image does it (module docs).
fn to_rgb8_stb(img: DynamicImage) -> RgbImage {
    let (width, height) = (img.width(), img.height());
    let n = width as usize * height as usize;
    let mut data = Vec::with_capacity(n * 3);
    // Picks channels `idx` of every pixel of `src` (`stride` samples each).
    let mut take = |src: &[u8], stride: usize, idx: [usize; 3]| {
        for px in src.chunks_exact(stride) {
            data.extend(idx.iter().map(|&i| px[i]));
        }
    };
    let high = |src: &[u16]| src.iter().map(|&v| (v >> 8) as u8).collect::<Vec<u8>>();
    match img {
        DynamicImage::ImageLuma8(b) => take(b.as_raw(), 1, [0, 0, 0]),
        DynamicImage::ImageLumaA8(b) => take(b.as_raw(), 2, [0, 0, 0]),
        DynamicImage::ImageRgb8(b) => take(b.as_raw(), 3, [0, 1, 2]),
        DynamicImage::ImageRgba8(b) => take(b.as_raw(), 4, [0, 1, 2]),
        DynamicImage::ImageLuma16(b) => take(&high(b.as_raw()), 1, [0, 0, 0]),
        DynamicImage::ImageLumaA16(b) => take(&high(b.as_raw()), 2, [0, 0, 0]),
        DynamicImage::ImageRgb16(b) => take(&high(b.as_raw()), 3, [0, 1, 2]),
        DynamicImage::ImageRgba16(b) => take(&high(b.as_raw()), 4, [0, 1, 2]),
        other => take(other.to_rgb8().as_raw(), 3, [0, 1, 2]),
    }
    RgbImage {
        width,
        height,
        data,
    }
}

/// Strict base64 (spec §2, for `data:` URLs): the standard alphabet only,
/// a length that is a multiple of 4, `=` only in the final quartet, and the
/// unused low bits before the padding zero.
pub fn decode_base64(text: &[u8]) -> Result<Vec<u8>, ImageError> {
    let err = |at, problem| Err(ImageError::Base64 { at, problem });
    if text.len() % 4 != 0 {
        return err(text.len(), "length is not a multiple of 4");
    }
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let n_quads = text.len() / 4;
    for (qi, quad) in text.chunks_exact(4).enumerate() {
        let last = qi + 1 == n_quads;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 0 && !last {
            return err(qi * 4 + 4 - pad, "'=' before the final quartet");
        }
        if pad > 2 {
            return err(qi * 4 + 4 - pad, "more than two '='");
        }
        let mut acc = 0u32;
        for (i, &c) in quad[..4 - pad].iter().enumerate() {
            match value(c) {
                Some(v) => acc = acc << 6 | v as u32,
                None if c == b'=' => return err(qi * 4 + i, "'=' inside a quartet"),
                None => return err(qi * 4 + i, "not in the base64 alphabet"),
            }
        }
        match pad {
            0 => out.extend_from_slice(&acc.to_be_bytes()[1..]),
            1 => {
                if acc & 0x3 != 0 {
                    return err(qi * 4 + 2, "nonzero bits before the padding");
                }
                out.extend_from_slice(&((acc >> 2) as u16).to_be_bytes());
            }
            _ => {
                if acc & 0xf != 0 {
                    return err(qi * 4 + 1, "nonzero bits before the padding");
                }
                out.push((acc >> 4) as u8);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4648 §10 test vectors, and every way to break the spec's rules.
    #[test]
    fn strict_base64() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(
                decode_base64(enc.as_bytes()).unwrap(),
                plain.as_bytes(),
                "{enc}"
            );
        }
        assert_eq!(decode_base64(b"+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        for bad in [
            "Zg=", "Zm9vYg", "Zg==Zg==", "Z===", "Zh==", "Zm9=", "Zm-v", "Zm_v", "Zm9v\n", " Zm9v",
            "Zm=v",
        ] {
            let e = decode_base64(bad.as_bytes()).unwrap_err();
            assert!(matches!(e, ImageError::Base64 { .. }), "{bad}: {e}");
        }
    }
}
