//! JSON text as Python's `json.dumps(v, ensure_ascii=False)` writes it, which is
//! what chat templates' `tojson` produces (spec §2): `", "` and `": "`
//! separators, keys in insertion order, non-ASCII unescaped, floats in Python
//! `repr` form (`3.0`, `1e-05`, `1e+16`).

use serde_json::{Number, Value};

pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        // Python's escapes for ensure_ascii=False are serde_json's: \" \\ \b \f \n
        // \r \t, other controls as lowercase \u00XX, everything else verbatim.
        Value::String(s) => out.push_str(&serde_json::to_string(s).expect("a str serializes")),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(k).expect("a str serializes"));
                out.push_str(": ");
                write(x, out);
            }
            out.push('}');
        }
    }
}

/// A JSON number as Python prints it: integers in decimal, floats as `repr`.
pub fn number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    python_float_repr(n.as_f64().unwrap_or(f64::NAN))
}

/// Python's `repr(float)`: the shortest round-trip digits, positional when the
/// decimal exponent is in [-4, 16), else `d.ddde±XX`.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f == 0.0 {
        return format!("{sign}0.0");
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let m = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_repr() {
        // Expected strings are CPython 3 `repr` outputs.
        for (f, want) in [
            (3.0, "3.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn dumps() {
        let v = json!({"b": [1, 2.0, "é\n\u{1}"], "a": {"x": null, "y": true}});
        assert_eq!(
            to_string(&v),
            r#"{"b": [1, 2.0, "é\n\u0001"], "a": {"x": null, "y": true}}"#
        );
    }
}
