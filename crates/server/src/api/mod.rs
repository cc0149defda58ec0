//! The wire formats of the APIs the server speaks, as typed request structs
//! (serde derive). Each dialect's module only maps its format in: a request
//! body becomes the one internal request shape every front door shares (the
//! chat completions body that [`crate::request::parse_chat`] validates into a
//! [`crate::request::ChatRequest`]: value ranges, sessions, structured
//! output, the context check). Rendering, generation and the stream-out
//! machinery are shared too; only the answer's shape is the dialect's.
//!
//! Errors keep naming the field: [`from_body`] reports serde's failures with
//! the path where they happened (`messages[2].content[0].source: missing
//! field \`data\``), and each module's conversion names its own.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

pub mod anthropic;
pub mod ollama;
pub mod responses;

/// A request body (already read as a JSON object) as the dialect's typed
/// request; a field of the wrong type or a missing one is a 400 that names
/// its path.
pub fn from_body<T: DeserializeOwned>(body: &Map<String, Value>) -> Result<T, ApiError> {
    let v = Value::Object(body.clone());
    serde_path_to_error::deserialize(&v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        ApiError::invalid_request(match path.as_str() {
            "." => inner,
            _ => format!("{path}: {inner}"),
        })
    })
}

/// A field's error: `path: what`.
pub fn bad(path: impl fmt::Display, what: impl fmt::Display) -> ApiError {
    ApiError::invalid_request(format!("{path}: {what}"))
}

/// A field that is either a string or an array of `T` (message content: a
/// plain text or content blocks). Unlike an untagged enum it keeps the
/// element's error and path (`content[3].type: unknown variant …`).
#[derive(Debug, Clone)]
pub enum TextOr<T> {
    Text(String),
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = TextOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(TextOr::Text(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(TextOr::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(x) = seq.next_element()? {
                    out.push(x);
                }
                Ok(TextOr::List(out))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Deserialize, Debug)]
    #[serde(tag = "type", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Block {
        Text { text: String },
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Body {
        n: u32,
        content: TextOr<Block>,
    }

    fn err(v: Value) -> String {
        from_body::<Body>(v.as_object().unwrap())
            .unwrap_err()
            .message
    }

    #[test]
    fn errors_name_the_field_path() {
        assert_eq!(err(json!({"content": "x"})), "missing field `n`");
        assert!(err(json!({"n": "1", "content": "x"})).starts_with("n: invalid type: string"));
        let e = err(json!({"n": 1, "content": [{"type": "text", "text": "a"}, {"type": "video"}]}));
        assert!(
            e.starts_with("content[1].type: unknown variant `video`"),
            "{e}"
        );
        let e = err(json!({"n": 1, "content": 5}));
        assert_eq!(
            e,
            "content: invalid type: integer `5`, expected a string or an array of content blocks"
        );
        let ok: Body = from_body(json!({"n": 1, "content": "hi"}).as_object().unwrap()).unwrap();
        assert!(matches!(ok.content, TextOr::Text(ref s) if s == "hi"));
    }
}
