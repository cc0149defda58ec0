//! GGUF reader/writer against files written and read by the independent `gguf`
//! Python package (scripts/fixtures/make_gguf_fixtures.py), plus corruption tests.

use std::path::PathBuf;

use hearth_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Problem, Value, ValueType};
use rand::{Rng, SeedableRng};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf")
        .join(name)
}

fn small_bytes() -> Vec<u8> {
    std::fs::read(fixture("small.gguf")).unwrap()
}

fn json_matches(v: &Value, want: &Json) -> bool {
    match (v, want) {
        (Value::String(s), Json::String(w)) => s == w,
        (Value::Bool(b), Json::Bool(w)) => b == w,
        (Value::F32(x), Json::Number(w)) => *x as f64 == w.as_f64().unwrap(),
        (Value::F64(x), Json::Number(w)) => *x == w.as_f64().unwrap(),
        (Value::Array(_, items), Json::Array(w)) => {
            items.len() == w.len() && items.iter().zip(w).all(|(a, b)| json_matches(a, b))
        }
        (v, Json::Number(w)) => match (w.as_i64(), w.as_u64()) {
            (Some(i), _) => v.as_i64() == Some(i),
            (None, Some(u)) => v.as_u64() == Some(u),
            _ => false,
        },
        _ => false,
    }
}

#[test]
fn reads_what_gguf_py_wrote() {
    let f = GgufFile::open(fixture("small.gguf")).unwrap();
    let want: Json =
        serde_json::from_str(&std::fs::read_to_string(fixture("small.json")).unwrap()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    let type_names = [
        ("UINT8", ValueType::U8),
        ("INT8", ValueType::I8),
        ("UINT16", ValueType::U16),
        ("INT16", ValueType::I16),
        ("UINT32", ValueType::U32),
        ("INT32", ValueType::I32),
        ("FLOAT32", ValueType::F32),
        ("BOOL", ValueType::Bool),
        ("STRING", ValueType::String),
        ("ARRAY", ValueType::Array),
        ("UINT64", ValueType::U64),
        ("INT64", ValueType::I64),
        ("FLOAT64", ValueType::F64),
    ];
    for (key, w) in want["metadata"].as_object().unwrap() {
        let v = f
            .metadata()
            .get(key)
            .unwrap_or_else(|| panic!("missing key {key}"));
        let ty = type_names
            .iter()
            .find(|(n, _)| *n == w["type"].as_str().unwrap())
            .unwrap()
            .1;
        assert_eq!(v.value_type(), ty, "{key}");
        if key == "t.arr_nested" {
            // gguf-py's contents() flattens nested arrays; the script wrote [[1, 2], [3]].
            let outer = v.as_array().unwrap();
            let inner: Vec<Vec<i64>> = outer
                .iter()
                .map(|a| {
                    a.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_i64().unwrap())
                        .collect()
                })
                .collect();
            assert_eq!(inner, vec![vec![1, 2], vec![3]]);
        } else {
            assert!(
                json_matches(v, &w["value"]),
                "{key}: {v:?} vs {}",
                w["value"]
            );
        }
    }
    // gguf-py's writer drops empty arrays, so the file must not have one.
    assert!(f.metadata().get("t.arr_empty").is_none());

    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(f.tensors().len(), tensors.len());
    for w in tensors {
        let name = w["name"].as_str().unwrap();
        let t = f.tensor(name).unwrap();
        assert_eq!(t.info.ty.name(), w["type"].as_str().unwrap());
        // gguf-py reports shapes in ggml ne order too.
        let shape: Vec<u64> = w["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(t.info.shape, shape, "{name}");
        assert_eq!(
            f.data_offset() + t.info.offset,
            w["offset"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            format!("{:x}", Sha256::digest(t.data)),
            w["sha256"].as_str().unwrap(),
            "{name}"
        );
    }
}

/// Re-writing gguf-py's file with our writer gives the same bytes: the writer
/// follows the same layout rules (order, padding, alignment) as the reference.
#[test]
fn writer_reproduces_gguf_py_bytes() {
    let original = small_bytes();
    let f = GgufFile::from_bytes("small.gguf", original.clone()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.set(k, v.clone());
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape).unwrap();
    }
    let mut sink = w.begin(Vec::new()).unwrap();
    for t in f.tensors() {
        let data = f.tensor(&t.name).unwrap().data;
        // Write in two chunks to exercise streaming.
        let (a, b) = data.split_at(data.len() / 2);
        sink.write(&t.name, a).unwrap();
        sink.write(&t.name, b).unwrap();
    }
    let out = sink.finish().unwrap();
    assert_eq!(out, original);
}

/// Our own writer/reader round trip for what gguf-py cannot write (regression guard).
#[test]
fn writer_round_trips_empty_and_nested_arrays() {
    let mut w = GgufWriter::new();
    w.set("e", Value::Array(ValueType::String, vec![]));
    let inner =
        |xs: &[u32]| Value::Array(ValueType::U32, xs.iter().map(|&x| Value::U32(x)).collect());
    let nested = Value::Array(
        ValueType::Array,
        vec![inner(&[1, 2]), inner(&[]), inner(&[3])],
    );
    w.set("n", nested.clone());
    let bytes = w.begin(Vec::new()).unwrap().finish().unwrap();
    let f = GgufFile::from_bytes("rt.gguf", bytes).unwrap();
    assert_eq!(
        f.metadata().get("e"),
        Some(&Value::Array(ValueType::String, vec![]))
    );
    assert_eq!(f.metadata().get("n"), Some(&nested));
}

#[test]
fn writer_rejects_misuse() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", GgmlType::F32, &[4]).unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[32, 2]).unwrap();
    assert!(w.add_tensor("a", GgmlType::F32, &[4]).is_err());
    assert!(w.add_tensor("c", GgmlType::Q4_K, &[100]).is_err());
    let mut sink = w.begin(Vec::new()).unwrap();
    assert!(sink.write("b", &[0; 68]).is_err(), "out of order");
    assert!(sink.write("a", &[0; 20]).is_err(), "too long");
    sink.write("a", &[0; 16]).unwrap();
    sink.write("b", &[0; 34]).unwrap();
    assert!(sink.finish().is_err(), "b incomplete");
}

fn format_problem(e: GgufError) -> (String, u64, Problem) {
    match e {
        GgufError::Format {
            field,
            offset,
            problem,
            path,
        } => {
            assert!(
                path.to_string_lossy().contains("small"),
                "error names the file"
            );
            (field, offset, problem)
        }
        other => panic!("expected a format error, got {other}"),
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = small_bytes();
    let f = GgufFile::from_bytes("small.gguf", bytes.clone()).unwrap();
    // gguf-py pads the file after the last tensor; a file missing only that
    // padding still holds every tensor in full and is accepted.
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes())
        .max()
        .unwrap() as usize;
    for len in data_end..=bytes.len() {
        assert!(GgufFile::from_bytes("small.gguf", bytes[..len].to_vec()).is_ok());
    }
    for len in 0..data_end {
        let err = match GgufFile::from_bytes("small.gguf", bytes[..len].to_vec()) {
            Ok(_) => panic!("truncation to {len} bytes was accepted"),
            Err(e) => e,
        };
        let msg = err.to_string();
        let (field, offset, problem) = format_problem(err);
        // Header errors point inside the file; a tensor whose data is cut off
        // is reported at the offset where its data starts.
        if !matches!(problem, Problem::OutOfRange { .. }) {
            assert!(
                offset <= len as u64,
                "len {len}: offset {offset} beyond the file ({msg})"
            );
        }
        assert!(!field.is_empty());
        assert!(
            matches!(
                problem,
                Problem::Truncated { .. }
                    | Problem::CountTooLarge { .. }
                    | Problem::OutOfRange { .. }
            ),
            "len {len}: {msg}"
        );
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let bytes = small_bytes();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6767_7566);
    let (mut ok, mut rejected) = (0, 0);
    for _ in 0..5000 {
        let mut b = bytes.clone();
        for _ in 0..rng.gen_range(1..=4) {
            let i = rng.gen_range(0..b.len());
            b[i] = rng.gen();
        }
        match GgufFile::from_bytes("small.gguf", b) {
            Ok(f) => {
                ok += 1;
                // Whatever was accepted must be safe to use.
                for t in f.tensors() {
                    let v = f.tensor(&t.name).unwrap();
                    assert_eq!(v.data.len() as u64, t.n_bytes());
                }
                for (_, v) in f.metadata().iter() {
                    let _ = v.to_string();
                }
            }
            Err(e) => {
                rejected += 1;
                let _ = e.to_string();
            }
        }
    }
    // Most flips land in tensor data (accepted) or in the header (rejected); both occur.
    assert!(ok > 0 && rejected > 0, "ok {ok} rejected {rejected}");
}

fn patched(at: usize, with: &[u8]) -> Result<GgufFile, GgufError> {
    let mut b = small_bytes();
    b[at..at + with.len()].copy_from_slice(with);
    GgufFile::from_bytes("small.gguf", b)
}

/// Byte position of the tensor info of `name` (its name length field).
fn tensor_info_at(name: &str) -> usize {
    let b = small_bytes();
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    b.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn specific_corruptions_name_field_and_offset() {
    let (field, offset, p) = format_problem(patched(0, b"GGUX").err().unwrap());
    assert_eq!((field.as_str(), offset), ("magic", 0));
    assert!(matches!(p, Problem::BadMagic(_)));

    for v in [1u32, 4, 0xffff_ffff] {
        let (field, offset, p) = format_problem(patched(4, &v.to_le_bytes()).err().unwrap());
        assert_eq!(
            (field.as_str(), offset, p),
            ("version", 4, Problem::UnknownVersion(v))
        );
    }

    let (field, offset, p) = format_problem(patched(8, &u64::MAX.to_le_bytes()).err().unwrap());
    assert_eq!((field.as_str(), offset), ("tensor_count", 8));
    assert!(matches!(p, Problem::CountTooLarge { .. }));
    let (field, _, p) = format_problem(patched(16, &(1u64 << 60).to_le_bytes()).err().unwrap());
    assert_eq!(field, "metadata_kv_count");
    assert!(matches!(p, Problem::CountTooLarge { .. }));

    // tensor info: name len (8) + name + n_dims (4) + ne (8 each) + type (4) + offset (8)
    let at = tensor_info_at("f32.weight");
    let type_at = at + 8 + 10 + 4 + 2 * 8;
    let (field, offset, p) = format_problem(patched(type_at, &77u32.to_le_bytes()).err().unwrap());
    assert_eq!(
        (field.as_str(), offset as usize),
        ("tensor 'f32.weight' type", type_at)
    );
    assert_eq!(p, Problem::UnknownTensorType(77));

    let (field, _, p) = format_problem(
        patched(type_at + 4, &(1u64 << 40).to_le_bytes())
            .err()
            .unwrap(),
    );
    assert_eq!(field, "tensor 'f32.weight' data");
    assert!(matches!(p, Problem::OutOfRange { .. }));

    // A dimension so large the element count overflows.
    let (field, _, _) = format_problem(
        patched(at + 8 + 10 + 4, &u64::MAX.to_le_bytes())
            .err()
            .unwrap(),
    );
    assert_eq!(field, "tensor 'f32.weight' shape");

    // Found by fuzzing (fuzz/gguf_reader): a zero dimension made the element
    // count 0, so huge other dimensions passed, and the row count
    // (ne[1]*ne[2]) overflowed when asked for.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes()); // version
    b.extend_from_slice(&1u64.to_le_bytes()); // tensor_count
    b.extend_from_slice(&0u64.to_le_bytes()); // metadata_kv_count
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b't');
    b.extend_from_slice(&3u32.to_le_bytes());
    for ne in [0u64, 1 << 40, 1 << 40] {
        b.extend_from_slice(&ne.to_le_bytes());
    }
    b.extend_from_slice(&0u32.to_le_bytes()); // f32
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    b.resize(b.len().next_multiple_of(32), 0);
    let (field, _, _) = format_problem(
        GgufFile::from_bytes("small-zero-dim.gguf", b.clone())
            .err()
            .unwrap(),
    );
    assert_eq!(field, "tensor 't' shape");
    // The same with dimensions whose product fits opens, and has no rows' data.
    b[45..53].copy_from_slice(&(1u64 << 20).to_le_bytes()); // ne[1]
    let f = GgufFile::from_bytes("small-zero-dim.gguf", b).unwrap();
    assert_eq!(
        (f.tensors()[0].n_rows(), f.tensors()[0].n_bytes()),
        (1 << 60, 0)
    );

    // Misaligned offset.
    let (field, _, _) = format_problem(patched(type_at + 4, &3u64.to_le_bytes()).err().unwrap());
    assert_eq!(field, "tensor 'f32.weight' offset");
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let err = GgufFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(matches!(err, GgufError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
}
