//! OpenAI error objects: `{"error":{"message","type","code"}}` with an HTTP
//! status (server-api.md §2).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            code,
            message: message.into(),
        }
    }

    /// 400 invalid_request_error with no code (malformed body, wrong types).
    pub fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    /// 400 invalid_request_error with a code.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some(code),
            message,
        )
    }

    pub fn model_not_found(asked: &str, served: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("Model '{asked}' not found. This server serves '{served}'."),
        )
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.",
        )
    }

    /// 403: a request the safe defaults refuse (foreign Host or Origin).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            Some(code),
            message,
        )
    }

    /// 415: a JSON route's body sent with another content type.
    pub fn unsupported_media_type(got: Option<&str>) -> ApiError {
        let got = got.map_or("none".to_string(), |g| format!("'{g}'"));
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            Some("unsupported_media_type"),
            format!("Content-Type must be 'application/json' (got {got})."),
        )
    }

    /// 408: the body did not arrive within the body read timeout.
    pub fn request_timeout(secs: f64) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!("The request body did not arrive within {secs} s."),
        )
    }

    pub fn session_not_found(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("session_not_found"),
            format!("No session '{id}'."),
        )
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("Request body exceeds the {limit}-byte limit."),
        )
    }

    pub fn capacity(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "capacity_error",
            Some("capacity_exhausted"),
            message,
        )
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            format!("No route for {path}."),
        )
    }

    /// 500 server_error: generation, worker or session-op failure.
    /// A panic while handling one request (caught: the server carries on).
    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            format!(
                "Internal error while handling this request ({detail}); the server carries on."
            ),
        )
    }

    pub fn server(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            None,
            format!("Generation failed: {detail}"),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            message,
        )
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
    }
}

/// Seconds a client is asked to wait after a 429 (sessions free up as
/// generations end).
const RETRY_AFTER_SECS: &str = "1";

impl IntoResponse for ApiError {
    /// The error object, with `WWW-Authenticate` on 401 (RFC 6750 §3) and
    /// `Retry-After` on 429 (RFC 6585 §4).
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        // Kept with the response, so an API with another error shape
        // (crate::anthropic::reshape_errors) can answer in its own.
        r.extensions_mut().insert(self.clone());
        let extra = match self.status {
            StatusCode::UNAUTHORIZED => Some((header::WWW_AUTHENTICATE, "Bearer")),
            StatusCode::TOO_MANY_REQUESTS => Some((header::RETRY_AFTER, RETRY_AFTER_SECS)),
            _ => None,
        };
        if let Some((name, value)) = extra {
            r.headers_mut()
                .insert(name, header::HeaderValue::from_static(value));
        }
        r
    }
}
