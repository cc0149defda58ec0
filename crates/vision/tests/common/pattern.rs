//! The spec's synthetic test image (vision.md §12.2); also used by
//! examples/encode.rs.

use hearth_vision::RgbImage;

/// The `w`×`h` pattern: red and blue from x and y, green a bright block in
/// the top-left third.
pub fn pattern(w: u32, h: u32) -> RgbImage {
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let g = if x < w / 3 && y < h / 2 { 255 } else { 16 };
            data.extend([
                ((37 * x + 11 * y) % 256) as u8,
                g,
                ((x * x + 3 * y * y) % 256) as u8,
            ]);
        }
    }
    RgbImage::from_raw(w, h, data).expect("valid size")
}
