//! Bounds on the JSON schemas a request may ask its output to follow,
//! checked before anything is compiled.
//!
//! llguidance compiles some schema shapes by recursion as deep as the shape
//! is wide (an object's properties are a right-nested sequence), and its
//! compile time and memory grow with the schema: an unbounded schema is a
//! way to take the process down or to hold a core. The limits follow
//! OpenAI's published structured-output limits in spirit (5,000 object
//! properties in all, bounded nesting and enum sizes), with room above
//! them; a schema past one is refused with a message naming the limit.
//!
//! The walk is iterative (an explicit stack), so it is itself safe on any
//! input.

use serde_json::Value;

use crate::GrammarError;

/// The most object properties in one schema (all objects together).
pub const MAX_PROPERTIES: usize = 5_000;
/// The most optional properties (those not in `required`) of one object.
/// llguidance's Earley parser holds about four items per optional property
/// in the row after the object's `{`, and refuses a row of more than 2,000
/// items mid-answer; 450 keeps that row under its limit (measured: 490
/// optional properties run, 600 fail at the first property).
pub const MAX_OPTIONAL_PROPERTIES: usize = 450;
/// The most `enum` values in one schema (all enums together).
pub const MAX_ENUM_VALUES: usize = 10_000;
/// The most alternatives under `anyOf` / `oneOf` / `allOf` in one schema.
pub const MAX_ALTERNATIVES: usize = 5_000;
/// The deepest JSON nesting of a schema document (a subschema under
/// `properties` is two levels below its parent, under `items` one).
pub const MAX_DEPTH: usize = 64;
/// The most JSON values in one schema document.
pub const MAX_VALUES: usize = 200_000;
/// The longest `pattern` or `format` regular expression, in bytes.
pub const MAX_PATTERN_BYTES: usize = 10_000;

/// What a value in a schema document is.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    /// A schema: its keywords count.
    Schema,
    /// A map from names to schemas (`properties`, `$defs`, ...).
    Names,
    /// Data (`enum`, `const`, `default` values): only size and depth count.
    Data,
}

/// Checks `schema` against the limits above; the error names the limit.
pub fn check_schema(schema: &Value) -> Result<(), GrammarError> {
    Budget::default().spend(schema)
}

/// What the schemas of one request have used of the limits so far: the
/// parameter schemas of a request's tools compile into one grammar, so they
/// share one budget (200 copies of a 3,000-property tool are one
/// 600,000-property grammar).
#[derive(Debug, Default)]
pub struct Budget {
    properties: usize,
    enum_values: usize,
    alternatives: usize,
    values: usize,
}

impl Budget {
    /// Counts `schema` against what is left; the error names the limit.
    pub fn spend(&mut self, schema: &Value) -> Result<(), GrammarError> {
        let mut stack: Vec<(&Value, usize, Role)> = vec![(schema, 1, Role::Schema)];
        while let Some((v, depth, role)) = stack.pop() {
            self.values += 1;
            if self.values > MAX_VALUES {
                return Err(GrammarError(format!(
                    "the schema has more than {MAX_VALUES} JSON values; at most {MAX_VALUES} are supported"
                )));
            }
            if depth > MAX_DEPTH {
                return Err(GrammarError(format!(
                    "the schema is nested more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH} are supported"
                )));
            }
            match v {
                Value::Object(o) => {
                    if role == Role::Schema {
                        self.keywords(o)?;
                    }
                    for (k, child) in o {
                        let role = match role {
                            Role::Data => Role::Data,
                            Role::Names => Role::Schema,
                            Role::Schema => match k.as_str() {
                                "properties" | "patternProperties" | "$defs" | "definitions"
                                | "dependentSchemas" => Role::Names,
                                "enum" | "const" | "examples" | "default" => Role::Data,
                                _ => Role::Schema,
                            },
                        };
                        stack.push((child, depth + 1, role));
                    }
                }
                Value::Array(a) => {
                    // `anyOf`'s list holds schemas, `enum`'s data: as the array's.
                    for child in a {
                        stack.push((child, depth + 1, role));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The counted keywords of one (sub)schema.
    fn keywords(&mut self, o: &serde_json::Map<String, Value>) -> Result<(), GrammarError> {
        if let Some(Value::Object(p)) = o.get("properties") {
            self.properties += p.len();
            if self.properties > MAX_PROPERTIES {
                return Err(GrammarError(format!(
                    "the schema has more than {MAX_PROPERTIES} object properties; at most {MAX_PROPERTIES} are supported"
                )));
            }
            let required = match o.get("required") {
                Some(Value::Array(r)) => r
                    .iter()
                    .filter(|k| k.as_str().is_some_and(|k| p.contains_key(k)))
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
                _ => 0,
            };
            let optional = p.len() - required;
            if optional > MAX_OPTIONAL_PROPERTIES {
                return Err(GrammarError(format!(
                    "an object of the schema has {optional} optional properties (not in `required`); at most {MAX_OPTIONAL_PROPERTIES} are supported"
                )));
            }
        }
        if let Some(Value::Array(e)) = o.get("enum") {
            self.enum_values += e.len();
            if self.enum_values > MAX_ENUM_VALUES {
                return Err(GrammarError(format!(
                    "the schema has more than {MAX_ENUM_VALUES} enum values; at most {MAX_ENUM_VALUES} are supported"
                )));
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(a)) = o.get(key) {
                self.alternatives += a.len();
            }
        }
        if self.alternatives > MAX_ALTERNATIVES {
            return Err(GrammarError(format!(
                "the schema has more than {MAX_ALTERNATIVES} anyOf/oneOf/allOf alternatives; at most {MAX_ALTERNATIVES} are supported"
            )));
        }
        for key in ["pattern", "format"] {
            if let Some(Value::String(p)) = o.get(key) {
                if p.len() > MAX_PATTERN_BYTES {
                    return Err(GrammarError(format!(
                        "a `{key}` of the schema is {} bytes long; at most {MAX_PATTERN_BYTES} are supported",
                        p.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(n: usize) -> Value {
        let p: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("k{i}"), json!({"type": "integer"})))
            .collect();
        let required: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        json!({"type": "object", "properties": p, "required": required})
    }

    #[test]
    fn schemas_within_the_limits_pass() {
        check_schema(&props(MAX_PROPERTIES)).unwrap();
        let e: Vec<Value> = (0..MAX_ENUM_VALUES).map(|i| json!(i)).collect();
        check_schema(&json!({"enum": e})).unwrap();
        check_schema(&json!(true)).unwrap();
        let mut some = props(MAX_OPTIONAL_PROPERTIES + 10);
        some["required"] = json!(["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"]);
        check_schema(&some).unwrap();
    }

    #[test]
    fn each_limit_is_named_when_passed() {
        let msg = |v: Value| check_schema(&v).unwrap_err().0;
        assert!(msg(props(MAX_PROPERTIES + 1)).contains("5000 object properties"));
        let e: Vec<Value> = (0..=MAX_ENUM_VALUES).map(|i| json!(i)).collect();
        assert!(msg(json!({"enum": e})).contains("10000 enum values"));
        let alts: Vec<Value> = (0..=MAX_ALTERNATIVES)
            .map(|_| json!({"type": "null"}))
            .collect();
        assert!(msg(json!({"anyOf": alts})).contains("alternatives"));
        let mut deep = json!({"type": "integer"});
        for _ in 0..MAX_DEPTH {
            deep = json!({"type": "array", "items": deep});
        }
        assert!(msg(deep).contains("64 levels"));
        let long = "a".repeat(MAX_PATTERN_BYTES + 1);
        assert!(msg(json!({"type": "string", "pattern": long})).contains("`pattern`"));
        let mut optional = props(MAX_OPTIONAL_PROPERTIES + 1);
        optional["required"] = json!(["nope"]);
        assert!(msg(optional).contains("451 optional properties"));
        // Nested objects count their properties together.
        let two = json!({"type": "object", "properties": {"a": props(3000), "b": props(3000)}});
        assert!(msg(two).contains("object properties"));
    }

    #[test]
    fn the_walk_survives_any_depth() {
        // Deeper than any recursive walk on a small stack could go.
        let mut v = json!(1);
        for _ in 0..200_000 {
            v = Value::Array(vec![v]);
        }
        assert!(check_schema(&v).unwrap_err().0.contains("levels"));
        // Dropping it recursively would overflow: take it apart by hand.
        let mut v = v;
        while let Value::Array(mut a) = v {
            v = a.pop().unwrap_or(Value::Null);
        }
    }
}
