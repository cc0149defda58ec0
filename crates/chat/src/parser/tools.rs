//! The request's tools as the parsers need them: registered names (§4.6
//! normalization, §4.5 unknown names) and each parameter's declared type (§4.3
//! coercion).

use serde_json::{Map, Value};

use super::ChatError;

/// One function tool: name, description and JSON-schema `parameters`.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// The `parameters` schema as sent; `Value::Null` when absent.
    pub parameters: Value,
}

/// The registered tools of one request, in the order the client sent them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<ToolDef>,
}

/// A parameter's declared JSON-schema type, as far as coercion cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    String,
    Boolean,
    Integer,
    Number,
    /// Anything else (`array`, `object`, a type list, an undeclared key, an
    /// unknown tool): JSON if it parses, else the raw text. `nullable`: the
    /// schema's type is or includes `"null"`.
    Other {
        nullable: bool,
    },
}

impl ToolSet {
    /// Reads an OpenAI `tools` array (`[{"type": "function", "function": {...}}]`),
    /// also accepting bare function objects and `{"tools": [...]}`.
    pub fn from_json(v: &Value) -> Result<ToolSet, ChatError> {
        let list = match v {
            Value::Array(a) => a,
            Value::Object(o) if o.get("tools").is_some_and(Value::is_array) => {
                o["tools"].as_array().expect("checked")
            }
            Value::Null => return Ok(ToolSet::default()),
            _ => {
                return Err(ChatError::InvalidTools(
                    "expected an array of tools".to_string(),
                ))
            }
        };
        let mut tools = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ChatError::InvalidTools(format!("tool {i} has no string \"name\""))
            })?;
            tools.push(ToolDef {
                name: name.to_string(),
                description: f
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                parameters: f.get("parameters").cloned().unwrap_or(Value::Null),
            });
        }
        Ok(ToolSet { tools })
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    fn get(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// §4.6: the registered name a written name refers to, and whether it is
    /// registered. Exact match; else `X.X` → `X`; else `X.Y` → `X` when `X` is
    /// registered and no registered name starts with `X.`. Never by last segment.
    /// With no tools registered every name is accepted as written.
    pub fn normalize(&self, name: &str) -> (String, bool) {
        if self.is_empty() {
            return (name.to_string(), true);
        }
        if self.get(name).is_some() {
            return (name.to_string(), true);
        }
        if let Some((x, y)) = name.split_once('.') {
            if self.get(x).is_some() {
                let prefix = format!("{x}.");
                if y == x || !self.tools.iter().any(|t| t.name.starts_with(&prefix)) {
                    return (x.to_string(), true);
                }
            }
        }
        (name.to_string(), false)
    }

    /// The declared type of `tool`'s parameter `key` (`properties[key].type`).
    pub fn param_type(&self, tool: &str, key: &str) -> ParamType {
        let ty = self
            .get(tool)
            .and_then(|t| t.parameters.get("properties"))
            .and_then(|p| p.get(key))
            .and_then(|p| p.get("type"));
        match ty {
            Some(Value::String(s)) => match s.as_str() {
                "string" => ParamType::String,
                "boolean" => ParamType::Boolean,
                "integer" => ParamType::Integer,
                "number" => ParamType::Number,
                "null" => ParamType::Other { nullable: true },
                _ => ParamType::Other { nullable: false },
            },
            Some(Value::Array(a)) => ParamType::Other {
                nullable: a.iter().any(|t| t == "null"),
            },
            _ => ParamType::Other { nullable: false },
        }
    }
}

/// §4.3 type coercion of one raw parameter value. `raw` is the value as written
/// (for Qwen3 XML after its one-newline strip). `null_words`: Qwen3 XML's extra
/// rule, `null`/`None` → null where the schema allows null.
pub fn coerce_value(raw: &str, ty: ParamType, null_words: bool) -> Value {
    let v = raw.trim();
    let fallback = || Value::String(raw.to_string());
    match ty {
        ParamType::String => fallback(),
        ParamType::Boolean => match v.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => fallback(),
        },
        ParamType::Integer => {
            let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return fallback();
            }
            let unsigned = v.strip_prefix('+').unwrap_or(v);
            // Beyond 64 bits there is no exact JSON number without serde_json's
            // arbitrary_precision; keep the text rather than round.
            if let Ok(i) = unsigned.parse::<i64>() {
                Value::from(i)
            } else if let Ok(u) = unsigned.parse::<u64>() {
                Value::from(u)
            } else {
                fallback()
            }
        }
        ParamType::Number => {
            if !is_decimal_number(v) {
                return fallback();
            }
            match v.parse::<f64>() {
                Ok(f) if f.is_finite() => {
                    serde_json::Number::from_f64(f).map_or_else(fallback, Value::Number)
                }
                _ => fallback(),
            }
        }
        ParamType::Other { nullable } => {
            if null_words && nullable && (v == "null" || v == "None") {
                return Value::Null;
            }
            // serde_json rejects NaN/Infinity and out-of-range numbers (1e999),
            // anywhere in the value: those stay raw text.
            serde_json::from_str::<Value>(v).unwrap_or_else(|_| fallback())
        }
    }
}

/// `[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?`
fn is_decimal_number(v: &str) -> bool {
    let b = v.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let int = digits(&mut i);
    if int > 0 {
        if i < b.len() && b[i] == b'.' {
            i += 1;
            digits(&mut i);
        }
    } else {
        if i >= b.len() || b[i] != b'.' {
            return false;
        }
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Arguments object under construction: keys in order of first appearance,
/// duplicates last-wins (§4.2).
pub(crate) type Args = Map<String, Value>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coercion_table() {
        use ParamType::*;
        assert_eq!(
            coerce_value("  a b.txt\n", String, false),
            json!("  a b.txt\n")
        );
        assert_eq!(coerce_value("042", Integer, false), json!(42));
        assert_eq!(coerce_value("+5", Integer, false), json!(5));
        assert_eq!(coerce_value("10.0", Integer, false), json!("10.0"));
        assert_eq!(coerce_value("1_000", Integer, false), json!("1_000"));
        assert_eq!(coerce_value("False", Boolean, false), json!(false));
        assert_eq!(coerce_value("1", Boolean, false), json!("1"));
        assert_eq!(coerce_value("1e999", Number, false), json!("1e999"));
        assert_eq!(coerce_value("3", Number, false), json!(3.0));
        assert_eq!(coerce_value(".5e1", Number, false), json!(5.0));
        assert_eq!(coerce_value("NaN", Number, false), json!("NaN"));
        assert_eq!(coerce_value("5.", Number, false), json!(5.0));
        let other = Other { nullable: false };
        assert_eq!(
            coerce_value("[\"x\", \"y\"]", other, false),
            json!(["x", "y"])
        );
        assert_eq!(coerce_value("fast", other, false), json!("fast"));
        assert_eq!(coerce_value("[1e999]", other, false), json!("[1e999]"));
        let nullable = Other { nullable: true };
        assert_eq!(coerce_value("None", nullable, true), Value::Null);
        assert_eq!(coerce_value("None", nullable, false), json!("None"));
    }

    #[test]
    fn normalization() {
        let t = ToolSet::from_json(&json!([
            {"type": "function", "function": {"name": "read"}},
            {"name": "bash"},
            {"name": "weather.get"},
            {"name": "weather"},
        ]))
        .unwrap();
        assert_eq!(t.normalize("read"), ("read".into(), true));
        assert_eq!(t.normalize("read.read"), ("read".into(), true));
        assert_eq!(t.normalize("read.filePath"), ("read".into(), true));
        assert_eq!(t.normalize("weather.set"), ("weather.set".into(), false));
        assert_eq!(t.normalize("calendar.get"), ("calendar.get".into(), false));
        assert_eq!(t.normalize(""), ("".into(), false));
    }
}
