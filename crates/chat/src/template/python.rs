//! Python's text forms of template values, so that minijinja prints what
//! jinja2 prints: `str()` for `{{ x }}` and `| string`, `repr()` inside
//! containers, `json.dumps` for Hugging Face's `tojson`, and `str.strip`.
//!
//! Chat templates are Python programs in all but name; a prompt that differs by
//! one byte (`true` for `True`, `1` for `1.0`) is a different prompt.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// `str(value)` as jinja2 prints it (`{{ value }}`): an undefined value is
/// empty, `None`/`True`/`False` are capitalized, floats keep `.0`, lists and
/// dicts print as their `repr`.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => {
            let mut out = String::new();
            py_repr(value, &mut out);
            out
        }
    }
}

/// The items of `value` (a sequence's elements, a map's keys), each written
/// by `item`, separated by `, `.
fn repr_items(value: &Value, out: &mut String, mut item: impl FnMut(&Value, &mut String)) {
    for (i, v) in value.try_iter().into_iter().flatten().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item(&v, out);
    }
}

/// `repr(value)` for the JSON-shaped values templates handle. Objects that are
/// not plain data (loops, macros, namespaces) fall back to minijinja's display.
fn py_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_repr(value)),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            repr_items(value, out, py_repr);
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            repr_items(value, out, |key, out| {
                py_repr(key, out);
                out.push_str(": ");
                py_repr(&value.get_item(key).unwrap_or_default(), out);
            });
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// An integer prints as is; a float as Python's `repr(float)`.
fn number_repr(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed
/// notation when the decimal exponent is in [-4, 16), else `d.ddde±XX`
/// (CPython `float_repr_style = 'short'`, `Py_DTSF_ADD_DOT_0`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the same shortest round-trip digits: "1.2345e-5".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    // Python's `decpt`: value = 0.DIGITS * 10^decpt.
    let decpt = exp + 1;
    let n = digits.len() as i32;
    let body = if (-4 < decpt) && (decpt <= 16) {
        if decpt <= 0 {
            format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
        } else if decpt < n {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        } else {
            format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = decpt - 1;
        format!(
            "{first}{frac}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    };
    format!("{sign}{body}")
}

/// Python's `repr(str)`: single quotes unless the text holds `'` and no `"`;
/// backslash escapes for the quote, `\\`, `\t\n\r`, and `\x`/`\u`/`\U` for
/// characters Python does not print (controls, separators, format characters,
/// private use).
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let cp = c as u32;
                let _ = match cp {
                    0..=0xff => write!(out, "\\x{cp:02x}"),
                    0x100..=0xffff => write!(out, "\\u{cp:04x}"),
                    _ => write!(out, "\\U{cp:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str.isprintable()` for one character, short of the unassigned code points
/// (which need Unicode tables): false for Cc, Zs (but space), Zl, Zp, Cf, Co.
fn py_printable(c: char) -> bool {
    let cp = c as u32;
    let non_printable = matches!(cp,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0xffffd | 0x100000..=0x10fffd);
    !non_printable
}

/// Python's `str.isspace()` for one character: Unicode White_Space plus the
/// information separators U+001C..U+001F, which Python also strips.
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str.strip(chars)`, `lstrip`, `rstrip`: with `chars` None, Python whitespace.
pub fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_is_space(c),
    };
    let mut s = s;
    if left {
        s = s.trim_start_matches(strip);
    }
    if right {
        s = s.trim_end_matches(strip);
    }
    s
}

/// The options of `json.dumps` that Hugging Face's `tojson` exposes.
pub struct JsonOptions {
    pub ensure_ascii: bool,
    /// Python's `indent`: None for one line; else the string per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonOptions {
    /// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
    /// from transformers' `utils/chat_template_utils.py`; positional arguments
    /// after the value bind in that order, then keyword arguments.
    pub fn from_args(args: &[Value]) -> Result<JsonOptions, Error> {
        const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
        let mut slots: [Option<Value>; 4] = Default::default();
        let (positional, kwargs) = match args.last() {
            Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
            _ => (args, None),
        };
        if positional.len() > NAMES.len() {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                "tojson takes at most 4 arguments",
            ));
        }
        for (slot, v) in slots.iter_mut().zip(positional) {
            *slot = Some(v.clone());
        }
        if let Some(kwargs) = kwargs {
            for key in kwargs.try_iter()? {
                let name = key.as_str().unwrap_or_default();
                let Some(i) = NAMES.iter().position(|n| *n == name) else {
                    return Err(Error::new(
                        ErrorKind::TooManyArguments,
                        format!("tojson got an unexpected keyword argument '{name}'"),
                    ));
                };
                slots[i] = Some(kwargs.get_item(&key)?);
            }
        }
        let given = |v: &Option<Value>| v.clone().filter(|v| !v.is_none() && !v.is_undefined());
        let indent = match given(&slots[1]) {
            None => None,
            Some(v) if v.kind() == ValueKind::String => {
                Some(v.as_str().unwrap_or_default().to_string())
            }
            Some(v) => match v.as_i64() {
                Some(n) => Some(" ".repeat(n.max(0) as usize)),
                None => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson indent must be an int or a string",
                    ))
                }
            },
        };
        let (item_separator, key_separator) = match given(&slots[2]) {
            Some(seps) => {
                let parts: Vec<Value> = seps.try_iter()?.collect();
                match parts.as_slice() {
                    [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                        a.as_str().unwrap().to_string(),
                        b.as_str().unwrap().to_string(),
                    ),
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson separators must be two strings",
                        ))
                    }
                }
            }
            None if indent.is_some() => (",".into(), ": ".into()),
            None => (", ".into(), ": ".into()),
        };
        Ok(JsonOptions {
            ensure_ascii: given(&slots[0]).is_some_and(|v| v.is_true()),
            indent,
            item_separator,
            key_separator,
            sort_keys: given(&slots[3]).is_some_and(|v| v.is_true()),
        })
    }
}

/// Python's `json.dumps(value, ...)` (the pure-Python encoder's output, which
/// the C encoder matches byte for byte).
pub fn json_dumps(value: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    dump(value, opts, 0, &mut out)?;
    Ok(out)
}

fn dump(value: &Value, opts: &JsonOptions, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&json_number(value)),
        ValueKind::String => {
            json_string(value.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(opts, depth + 1, i == 0, out);
                dump(item, opts, depth + 1, out)?;
            }
            newline_indent(opts, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                separator(opts, depth + 1, i == 0, out);
                json_string(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                dump(item, opts, depth + 1, out)?;
            }
            newline_indent(opts, depth, out);
            out.push('}');
        }
        _ => {
            let type_name = match value.kind() {
                ValueKind::Undefined => "Undefined".to_string(),
                kind => kind.to_string(),
            };
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {type_name} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn separator(opts: &JsonOptions, depth: usize, first: bool, out: &mut String) {
    if !first {
        out.push_str(&opts.item_separator);
    }
    newline_indent(opts, depth, out);
}

fn newline_indent(opts: &JsonOptions, depth: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// `json.dumps` turns dict keys into strings: str as is, numbers by repr,
/// `True` -> "true", `None` -> "null"; anything else is a TypeError.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(json_number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// JSON numbers as Python writes them: ints as is, floats by `repr`, and the
/// non-finite floats as `NaN`/`Infinity` (`allow_nan=True`).
fn json_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => "NaN".into(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.into(),
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// A JSON string literal as `json.dumps` writes it: `"` `\` and the C0
/// controls escaped (`\n` style where JSON has one, else `\u00XX`); with
/// `ensure_ascii` every non-ASCII character too, as UTF-16 `\uXXXX` units.
fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are CPython 3.11's repr().
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (1e-7, "1e-07"),
            (1.5e21, "1.5e+21"),
            (123456789.125, "123456789.125"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e100, "1e+100"),
            (2.5e-300, "2.5e-300"),
            (21.5, "21.5"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "repr({f:e})");
        }
    }

    #[test]
    fn str_and_repr_match_python() {
        let v = Value::from_serialize(
            serde_json::json!([1, 2.0, "it's", "a\"b'c", null, true, {"k": [false]}]),
        );
        assert_eq!(
            py_str(&v),
            r#"[1, 2.0, "it's", 'a"b\'c', None, True, {'k': [False]}]"#
        );
        assert_eq!(py_str(&Value::from("\u{a0}x\n")), "\u{a0}x\n");
        assert_eq!(
            py_str(&Value::from_serialize(["\u{a0}x\n\u{1}"])),
            r"['\xa0x\n\x01']"
        );
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = Value::from_serialize(
            serde_json::json!({"b": [1, 2.5, "é\u{1}\"\\"], "a": {}, "c": []}),
        );
        let dumps =
            |args: &[Value]| json_dumps(&v, &JsonOptions::from_args(args).unwrap()).unwrap();
        assert_eq!(
            dumps(&[]),
            r#"{"b": [1, 2.5, "é\u0001\"\\"], "a": {}, "c": []}"#
        );
        assert_eq!(
            dumps(&[Value::from(true)]),
            r#"{"b": [1, 2.5, "\u00e9\u0001\"\\"], "a": {}, "c": []}"#
        );
        let kw =
            |pairs: Vec<(&str, Value)>| Value::from(minijinja::value::Kwargs::from_iter(pairs));
        assert_eq!(
            dumps(&[kw(vec![("indent", Value::from(2)), ("sort_keys", Value::from(true))])]),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    \"é\\u0001\\\"\\\\\"\n  ],\n  \"c\": []\n}"
        );
        assert_eq!(
            dumps(&[kw(vec![("separators", Value::from_serialize([",", ":"]))])]),
            r#"{"b":[1,2.5,"é\u0001\"\\"],"a":{},"c":[]}"#
        );
        assert_eq!(
            json_dumps(
                &Value::from("🦀"),
                &JsonOptions::from_args(&[Value::from(true)]).unwrap()
            )
            .unwrap(),
            r#""\ud83e\udd80""#
        );
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(py_strip("\u{1f} \u{3000}x y\t\n", None, true, true), "x y");
        assert_eq!(py_strip("xxaxx", Some("x"), true, false), "axx");
        assert_eq!(py_strip("xxaxx", Some("x"), false, true), "xxa");
    }
}
