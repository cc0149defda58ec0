//! The chat page `hearth serve` opens on (`GET /`): one HTML file, one
//! script and one stylesheet, embedded in the binary at compile time
//! (`crates/server/webui/`). The assets are named by a hash of their bytes
//! (`/ui/app-HASH.js`) and cached for good; the page itself is never cached,
//! so a new binary's page always loads its own assets.
//!
//! The page talks only to this server's own API (same origin; the Host and
//! Origin checks apply to it as to any client). It loads without the API
//! key (it holds no secret) and asks for the key when the server has one.
//! A Content-Security-Policy allows nothing but this origin: no inline
//! script, no request elsewhere, no plugins, no framing.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../webui/index.html");
const SCRIPT: &str = include_str!("../webui/app.js");
const STYLE: &str = include_str!("../webui/app.css");

/// The policy every page response carries.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's routes (GET and HEAD), public: no API key needed.
pub fn is_public(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// The hash that names this build's assets (FNV-1a over both, 64 bits).
fn asset_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in SCRIPT.bytes().chain(STYLE.bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{:012x}", h >> 16)
    })
}

/// The page with its asset names filled in.
fn index_html() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| INDEX.replace("{{HASH}}", asset_hash()))
}

/// Bytes of the page and its assets (the README's figure; a test checks it).
pub fn total_bytes() -> usize {
    index_html().len() + SCRIPT.len() + STYLE.len()
}

fn respond(body: &'static str, content_type: &'static str, cache: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

async fn page() -> Response {
    respond(index_html(), "text/html; charset=utf-8", "no-cache")
}

async fn asset(Path(file): Path<String>) -> Response {
    let hash = asset_hash();
    let immutable = "public, max-age=31536000, immutable";
    if file == format!("app-{hash}.js") {
        respond(SCRIPT, "text/javascript; charset=utf-8", immutable)
    } else if file == format!("app-{hash}.css") {
        respond(STYLE, "text/css; charset=utf-8", immutable)
    } else {
        crate::error::ApiError::not_found(&format!("/ui/{file}")).into_response()
    }
}

/// `/` and `/ui/{file}` (merged into the hub's router unless `--no-webui`).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(page))
        .route("/ui/{file}", get(asset))
}
