//! Who may talk to the server (server-api.md §1.1). The defaults keep web
//! pages out: a page the user visits can send requests to a loopback server,
//! so
//! - the `Host` must name this server (a DNS-rebound name does not), unless
//!   listed with `--allowed-hosts`;
//! - a cross-origin `Origin` is refused unless it is a `--cors-origin`, and
//!   only those origins get CORS headers and preflight answers;
//! - JSON routes take `Content-Type: application/json` only, which a page can
//!   send cross-origin only after a preflight (routes::read_body);
//! - with an API key, every route but /health needs it.

use std::net::{IpAddr, SocketAddr};

use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The access policy, fixed at startup.
#[derive(Clone, Debug)]
pub struct Access {
    /// The address the server is bound to.
    pub bound: SocketAddr,
    /// Extra host names (or `name:port`) accepted in `Host`; `*` accepts any.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed cross-origin (CORS); `*` allows any.
    pub cors_origins: Vec<String>,
    pub api_key: Option<String>,
}

impl Access {
    /// Whether a `Host` header value names this server: `localhost`, a
    /// loopback address, the bound address (any address when bound to
    /// 0.0.0.0 or ::, as an IP literal cannot be rebound), or an
    /// `--allowed-hosts` entry. Any port: the port does not change where a
    /// name resolves, and a proxy may forward another one.
    pub fn host_allowed(&self, host: &str) -> bool {
        if self.allowed_hosts.iter().any(|h| h == "*") {
            return true;
        }
        let host = host.to_ascii_lowercase();
        let Some((name, _port)) = split_host(&host) else {
            return false;
        };
        if self
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&host) || h.eq_ignore_ascii_case(name))
        {
            return true;
        }
        if name == "localhost" {
            return true;
        }
        let ip = name.trim_start_matches('[').trim_end_matches(']');
        match ip.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound.ip() || self.bound.ip().is_unspecified(),
            Err(_) => false,
        }
    }

    /// Whether `origin` is a `--cors-origin` (exact match, or `*`).
    pub fn cors_allowed(&self, origin: &str) -> bool {
        self.cors_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }

    /// The API key check (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        [bearer, x_api_key]
            .into_iter()
            .flatten()
            .any(|k| same_bytes(k.as_bytes(), key.as_bytes()))
    }

    /// The checks before routing, in order: Host, Origin, CORS preflight (no
    /// key: browsers send none), API key. `Ok(None)` lets the request through;
    /// `Ok(Some(r))` answers a preflight.
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Option<Response>, ApiError> {
        let host = match headers.get(header::HOST).map(|h| h.to_str()) {
            Some(Ok(h)) => h,
            Some(Err(_)) => {
                return Err(ApiError::forbidden(
                    "host_not_allowed",
                    "Host header is not valid ASCII.",
                ))
            }
            None => {
                return Err(ApiError::forbidden(
                    "host_not_allowed",
                    "Host header missing.",
                ))
            }
        };
        if !self.host_allowed(host) {
            return Err(ApiError::forbidden(
                "host_not_allowed",
                format!("Host '{host}' is not allowed (start hearth serve with --allowed-hosts {} to accept it).",
                    split_host(host).map_or(host, |(n, _)| n)),
            ));
        }
        let origin = match headers.get(header::ORIGIN).map(|h| h.to_str()) {
            None => None,
            Some(Ok(o)) => Some(o),
            Some(Err(_)) => {
                return Err(ApiError::forbidden(
                    "origin_not_allowed",
                    "Origin header is not valid ASCII.",
                ))
            }
        };
        if let Some(origin) = origin {
            let same_origin =
                origin_authority(origin).is_some_and(|a| a.eq_ignore_ascii_case(host));
            if !same_origin && !self.cors_allowed(origin) {
                return Err(ApiError::forbidden(
                    "origin_not_allowed",
                    format!("Origin '{origin}' is not allowed (start hearth serve with --cors-origin {origin} to allow it)."),
                ));
            }
            if method == Method::OPTIONS
                && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
            {
                return Ok(Some(self.preflight(origin, headers)));
            }
        }
        // The health probe and the chat page (it holds no secret and asks
        // for the key itself) need no key.
        let public = path == "/health"
            || (matches!(*method, Method::GET | Method::HEAD) && crate::webui::is_public(path));
        if !public && !self.authorized(headers) {
            return Err(ApiError::unauthorized());
        }
        Ok(None)
    }

    /// The answer to a CORS preflight from an allowed origin.
    fn preflight(&self, origin: &str, headers: &HeaderMap) -> Response {
        let mut r = axum::http::StatusCode::NO_CONTENT.into_response();
        self.add_cors(origin, r.headers_mut());
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        r
    }

    /// CORS headers for a response to `origin`, when it is a `--cors-origin`.
    pub fn add_cors(&self, origin: &str, headers: &mut HeaderMap) {
        if !self.cors_allowed(origin) {
            return;
        }
        if let Ok(v) = HeaderValue::from_str(origin) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            headers.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    }
}

/// `name` and `port` of a Host value (`name`, `name:port`, `[v6]:port`).
fn split_host(host: &str) -> Option<(&str, Option<&str>)> {
    if host.is_empty() {
        return None;
    }
    if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        return match rest.strip_prefix(':') {
            Some(port) => Some((&host[..=end], Some(port))),
            None if rest.is_empty() => Some((&host[..=end], None)),
            None => None,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => Some((name, Some(port))),
        Some(_) => None,
        None => Some((host, None)),
    }
}

/// The `host[:port]` of an Origin (`scheme://host[:port]`); None for
/// `null` and anything else that is not such a URL.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    (!rest.is_empty() && !rest.contains('/')).then_some(rest)
}

/// Equality whose time does not depend on where the inputs differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(bound: &str, hosts: &[&str], cors: &[&str]) -> Access {
        Access {
            bound: bound.parse().unwrap(),
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            cors_origins: cors.iter().map(|s| s.to_string()).collect(),
            api_key: Some("k".into()),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn hosts_default_to_this_server() {
        let a = access("127.0.0.1:8000", &[], &[]);
        for ok in [
            "127.0.0.1:8000",
            "localhost:8000",
            "LOCALHOST",
            "[::1]:8000",
            "127.0.0.1",
        ] {
            assert!(a.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.com:8000",
            "evil.com",
            "192.168.1.5:8000",
            "",
            "[::1",
            "a:b:c",
            "localhost.evil.com",
        ] {
            assert!(!a.host_allowed(bad), "{bad}");
        }
        let a = access("0.0.0.0:8000", &["my.box"], &[]);
        assert!(a.host_allowed("192.168.1.5:8000") && a.host_allowed("my.box:8000"));
        assert!(!a.host_allowed("evil.com:8000"));
        assert!(access("127.0.0.1:1", &["*"], &[]).host_allowed("evil.com"));
        let a = access("127.0.0.1:8000", &["proxy.lan:443"], &[]);
        assert!(a.host_allowed("proxy.lan:443") && !a.host_allowed("proxy.lan:80"));
    }

    #[test]
    fn origins_must_be_same_origin_or_listed() {
        let a = access("127.0.0.1:8000", &[], &["https://app.example"]);
        let get = |h: &[(&'static str, &str)]| a.check(&Method::GET, "/v1/models", &headers(h));
        let key = ("authorization", "Bearer k");
        let host = ("host", "127.0.0.1:8000");
        assert!(matches!(get(&[host, key]), Ok(None)));
        assert!(matches!(
            get(&[host, key, ("origin", "http://127.0.0.1:8000")]),
            Ok(None)
        ));
        assert!(matches!(
            get(&[host, key, ("origin", "https://app.example")]),
            Ok(None)
        ));
        for bad in ["http://evil.com", "null", "http://127.0.0.1:3000"] {
            let e = get(&[host, key, ("origin", bad)]).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.code),
                (403, Some("origin_not_allowed")),
                "{bad}"
            );
        }
        let e = get(&[("host", "evil.com:8000"), key]).unwrap_err();
        assert_eq!(e.code, Some("host_not_allowed"));
        assert!(
            e.message.contains("'evil.com:8000'") && e.message.contains("--allowed-hosts evil.com")
        );
        assert_eq!(get(&[host]).unwrap_err().status.as_u16(), 401);
        assert!(matches!(get(&[host, ("x-api-key", "k")]), Ok(None)));
        assert_eq!(
            get(&[host, ("authorization", "Bearer kk")])
                .unwrap_err()
                .status
                .as_u16(),
            401
        );
        // A preflight from the CORS origin needs no key.
        let pre = a
            .check(
                &Method::OPTIONS,
                "/v1/chat/completions",
                &headers(&[
                    host,
                    ("origin", "https://app.example"),
                    ("access-control-request-method", "POST"),
                ]),
            )
            .unwrap()
            .unwrap();
        assert_eq!(pre.status().as_u16(), 204);
        assert_eq!(
            pre.headers()["access-control-allow-origin"],
            "https://app.example"
        );
    }
}
