//! Image parts of chat messages (`{"type": "image_url", "image_url": {"url":
//! "data:image/png;base64,..."}}`): checked, decoded and replaced by
//! llama.cpp's media marker parts, so the prompt places each image where its
//! part was (`Prompter::chat_runs`: a GGUF template sees the parts joined as
//! llama-server joins them; the built-in Muse Glimmer format keeps them as
//! parts, §2.3). `data:` URLs are taken; http(s) URLs only with
//! `--allow-image-urls` (fetched here, with a time and size limit), since a
//! server that fetches what clients name can be pointed at hosts only it can
//! reach. Errors are 400s naming the part.

use hearth_vision::prompt::MEDIA_MARKER;
use hearth_vision::{decode_base64, ImageLimits, RgbImage};
use serde_json::{json, Value};

use crate::error::ApiError;

fn bad(at: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid("invalid_image", format!("{at}: {message}"))
}

/// Whether any message has an image part.
pub fn has_images(messages: &Value) -> bool {
    messages.as_array().into_iter().flatten().any(|m| {
        m.get("content")
            .and_then(Value::as_array)
            .is_some_and(|parts| {
                parts
                    .iter()
                    .any(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
            })
    })
}

/// The messages with every image part replaced by a media marker part
/// (`{"type": "media_marker", "text": "<__media__>"}`), and the decoded
/// images in order.
pub fn extract(messages: &Value, allow_urls: bool) -> Result<(Value, Vec<RgbImage>), ApiError> {
    let mut messages = messages.clone();
    let mut images = Vec::new();
    for (i, m) in messages.as_array_mut().into_iter().flatten().enumerate() {
        let Some(Value::Array(parts)) = m.get_mut("content") else {
            continue;
        };
        for (j, p) in parts.iter_mut().enumerate() {
            match p.get("type").and_then(Value::as_str) {
                Some("text") if p.get("text").is_some_and(Value::is_string) => {}
                Some("text") => {
                    return Err(ApiError::invalid_request(format!(
                        "messages[{i}].content[{j}].text must be a string."
                    )))
                }
                Some("image_url") => {
                    let at = format!("messages[{i}].content[{j}].image_url");
                    images.push(decode_part(&at, p.get("image_url"), allow_urls)?);
                    *p = json!({"type": "media_marker", "text": MEDIA_MARKER});
                }
                _ => {
                    return Err(ApiError::invalid_request(format!(
                        "messages[{i}].content[{j}] must be a text or image_url part."
                    )))
                }
            }
        }
    }
    Ok((messages, images))
}

/// An `image_url` value (an object with `url`, or the URL string) to pixels.
fn decode_part(at: &str, v: Option<&Value>, allow_urls: bool) -> Result<RgbImage, ApiError> {
    let url = match v {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(bad(at, "'url' must be a string")),
        },
        _ => return Err(bad(at, "must be an object with a 'url' string")),
    };
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        if !allow_urls {
            return Err(bad(
                at,
                "remote image URLs are not fetched by this server (start it with --allow-image-urls to allow that); send the image inline as a data: URL (data:image/png;base64,...)",
            ));
        }
        let bytes = fetch(url).map_err(|e| bad(at, e))?;
        return RgbImage::decode(&bytes, &ImageLimits::default()).map_err(|e| bad(at, e));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(bad(
            at,
            "only data: URLs are accepted (data:image/png;base64,...)",
        ));
    };
    let Some((media, payload)) = rest.split_once(',') else {
        return Err(bad(at, "a data: URL needs a ',' before its payload"));
    };
    if !media.ends_with(";base64") {
        return Err(bad(at, "the data: URL must be base64-encoded (';base64,')"));
    }
    let bytes = decode_base64(payload.as_bytes()).map_err(|e| bad(at, e))?;
    RgbImage::decode(&bytes, &ImageLimits::default()).map_err(|e| bad(at, e))
}

/// GETs an image URL: 10 s to connect, 30 s to read, at most the decoder's
/// byte limit (one more byte read means too large).
fn fetch(url: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let max = ImageLimits::default().max_bytes;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(30))
        .redirects(3)
        .user_agent(concat!("hearth/", env!("CARGO_PKG_VERSION")))
        .build();
    let resp = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("fetching the image URL: HTTP {code}"),
        other => format!("fetching the image URL: {other}"),
    })?;
    let mut bytes = Vec::new();
    resp.into_reader()
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the image URL: {e}"))?;
    if bytes.len() > max {
        return Err(format!(
            "the image at the URL is over the limit of {max} bytes"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_parts_name_the_part() {
        let msgs = |url: &str| {
            json!([{"role": "system", "content": "s"},
                   {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
        };
        for (url, what) in [
            ("https://example.com/a.png", "remote image URLs"),
            ("data:image/png;base64,%%%%", "bad base64"),
            ("data:image/png;base64,", "image is empty"),
            ("data:image/png;base64,aGVsbG8gd29ybGQh", "not a PNG, JPEG"),
            ("data:image/png,abc", "base64-encoded"),
            ("file:///etc/passwd", "only data: URLs"),
        ] {
            let e = extract(&msgs(url), false).unwrap_err();
            assert!(
                e.message.starts_with("messages[1].content[0].image_url: ")
                    && e.message.contains(what),
                "{url}: {}",
                e.message
            );
        }
    }

    #[test]
    fn image_parts_become_markers_in_place() {
        let b64 = base64_encode(&image_png());
        let m = json!([{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}},
            {"type": "text", "text": "what?"}]}]);
        let (out, images) = extract(&m, false).unwrap();
        assert_eq!(images.len(), 1);
        assert_eq!((images[0].width, images[0].height), (1, 1));
        assert_eq!(out[0]["content"][1]["type"], "media_marker");
        // What a template sees: llama-server's joining, no newline next to a marker.
        let joined = hearth_chat::template::llama_cpp_messages(&out);
        assert_eq!(joined[0]["content"], format!("look{MEDIA_MARKER}what?"));
    }

    /// With --allow-image-urls an http URL is fetched (a one-shot local
    /// server here) and decodes to the same pixels as the data: URL; a 404 and
    /// a body that is no image are 400s naming the part.
    #[test]
    fn image_urls_are_fetched_only_when_allowed() {
        use std::io::{Read, Write};
        let serve = |status: &'static str, body: Vec<u8>| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                c.write_all(head.as_bytes()).unwrap();
                c.write_all(&body).unwrap();
            });
            format!("http://127.0.0.1:{port}/a.png")
        };
        let msgs = |url: &str| json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]);
        let url = serve("200 OK", image_png());
        let (_, images) = extract(&msgs(&url), true).unwrap();
        let (_, inline) = extract(
            &msgs(&format!(
                "data:image/png;base64,{}",
                base64_encode(&image_png())
            )),
            false,
        )
        .unwrap();
        assert_eq!(images[0].data, inline[0].data);
        for (status, body, what) in [
            ("404 Not Found", b"nope".to_vec(), "HTTP 404"),
            ("200 OK", b"hello world!".to_vec(), "not a PNG, JPEG"),
        ] {
            let url = serve(status, body);
            let e = extract(&msgs(&url), true).unwrap_err();
            assert!(
                e.message.starts_with("messages[0].content[0].image_url: ")
                    && e.message.contains(what),
                "{}",
                e.message
            );
        }
        let e = extract(&msgs("http://127.0.0.1:9/x.png"), false).unwrap_err();
        assert!(e.message.contains("--allow-image-urls"), "{}", e.message);
    }

    /// A 1x1 red PNG.
    fn image_png() -> Vec<u8> {
        decode_base64(b"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC").unwrap()
    }

    fn base64_encode(b: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in b.chunks(3) {
            let n = c.iter().fold(0u32, |acc, &x| acc << 8 | x as u32) << (8 * (3 - c.len()));
            for k in 0..4 {
                if k <= c.len() {
                    s.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
}
