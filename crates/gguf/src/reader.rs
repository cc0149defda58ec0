//! Zero-copy GGUF reader: the header is parsed into owned metadata and a tensor
//! index; tensor data stays in the mmap and is handed out as borrowed views.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{GgufError, Problem};
use crate::types::GgmlType;
use crate::value::{Metadata, Value, ValueType};

pub const GGUF_MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Metadata arrays may nest; deeper than this is treated as corrupt.
const MAX_ARRAY_DEPTH: usize = 8;

/// Where one tensor lives and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml `ne`: innermost (contiguous) dimension first. A weight of logical
    /// shape [out, in] is stored as `[in, out]`.
    pub shape: Vec<u64>,
    /// Offset of the first byte relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size in bytes (validated not to overflow when the file was opened).
    pub fn n_bytes(&self) -> u64 {
        self.ty
            .bytes_for(self.n_elements())
            .expect("validated at open")
    }

    /// Number of rows: product of every dimension but the first.
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// A tensor's bytes, borrowed from the file mapping.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Bytes per row (`ne[0]` elements).
    pub fn row_bytes(&self) -> usize {
        self.info
            .ty
            .bytes_for(self.info.row_len())
            .expect("validated at open") as usize
    }

    /// The bytes of row `i`.
    pub fn row(&self, i: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[i * rb..(i + 1) * rb]
    }
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the mapping is read-only. As with every mmap-based loader, the
        // file must not be truncated by another process while it is mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Bytes::Mapped(map))
    }

    /// Parses an in-memory GGUF image; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(label.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<GgufFile, GgufError> {
        let header = {
            let mut cur = Cursor {
                buf: bytes.as_slice(),
                pos: 0,
                path: &path,
            };
            parse_header(&mut cur)?
        };
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path,
            bytes,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes (the mapping).
    pub fn raw_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn file_size(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture")
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Zero-copy view of a tensor's bytes.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::NoSuchTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        Ok(self.view(info))
    }

    /// Like [`GgufFile::tensor`] but `None` when absent.
    pub fn get_tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensor_info(name).map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        let start = (self.data_offset + info.offset) as usize;
        let end = start + info.n_bytes() as usize;
        TensorView {
            info,
            data: &self.bytes.as_slice()[start..end],
        }
    }
}

struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

fn parse_header(cur: &mut Cursor<'_>) -> Result<Header, GgufError> {
    let magic = cur.u32("magic")?;
    if magic != GGUF_MAGIC {
        return Err(cur.err_at("magic", 0, Problem::BadMagic(magic)));
    }
    let version = cur.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(cur.err_at("version", 4, Problem::UnknownVersion(version)));
    }
    // Every tensor info needs at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_tensors = cur.count("tensor_count", 24)?;
    // Every KV needs at least 8 (key len) + 4 (type) + 1 byte.
    let n_kv = cur.count("metadata_kv_count", 13)?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key_at = cur.pos;
        let key = cur.string(&format!("metadata[{i}].key"))?;
        if metadata.contains(&key) {
            return Err(cur.err_at(
                &format!("metadata key '{key}'"),
                key_at,
                Problem::Duplicate("metadata key".into()),
            ));
        }
        let field = format!("metadata '{key}'");
        let ty = cur.value_type(&field)?;
        let value = cur.value(&field, ty, 0)?;
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(cur.err_at(
                    "metadata 'general.alignment'",
                    cur.pos,
                    Problem::Invalid(format!(
                        "alignment {v} is not a power of two in 1..=1048576"
                    )),
                ))
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut seen = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let at = cur.pos;
        let name = cur.string(&format!("tensor[{i}].name"))?;
        let field = format!("tensor '{name}'");
        if seen.insert(name.clone(), i).is_some() {
            return Err(cur.err_at(&field, at, Problem::Duplicate("tensor name".into())));
        }
        let dims_at = cur.pos;
        let n_dims = cur.u32(&format!("{field} n_dims"))? as usize;
        if n_dims > MAX_DIMS {
            return Err(cur.err_at(
                &field,
                dims_at,
                Problem::Invalid(format!("{n_dims} dimensions (max {MAX_DIMS})")),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            shape.push(cur.u64(&format!("{field} ne[{d}]"))?);
        }
        let type_at = cur.pos;
        let type_id = cur.u32(&format!("{field} type"))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| {
            cur.err_at(
                &format!("{field} type"),
                type_at,
                Problem::UnknownTensorType(type_id),
            )
        })?;
        let n_elements = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        // Every partial product (the row count ne[1]*ne[2]*..., say) must fit
        // too, also when another dimension is 0 and the element count is 0.
        let dims_fit = shape
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_some();
        let size_ok = dims_fit
            && n_elements.and_then(|n| ty.bytes_for(n)).is_some()
            && shape
                .first()
                .is_none_or(|&ne0| ne0 % ty.block_size() as u64 == 0);
        if !size_ok {
            return Err(cur.err_at(
                &format!("{field} shape"),
                dims_at,
                Problem::Invalid(format!(
                    "shape {shape:?} is not a whole number of {ty} blocks or overflows"
                )),
            ));
        }
        let off_at = cur.pos;
        let offset = cur.u64(&format!("{field} offset"))?;
        if offset % alignment != 0 {
            return Err(cur.err_at(
                &format!("{field} offset"),
                off_at,
                Problem::Invalid(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )),
            ));
        }
        tensors.push(TensorInfo {
            name,
            ty,
            shape,
            offset,
        });
    }

    let data_offset = cur.pos.div_ceil(alignment) * alignment;
    let file_len = cur.buf.len() as u64;
    let data_len = file_len.saturating_sub(data_offset);
    if n_tensors > 0 && data_offset > file_len {
        return Err(cur.err_at(
            "data section",
            cur.pos,
            Problem::Truncated {
                needed: data_offset - cur.pos,
                available: file_len - cur.pos,
            },
        ));
    }
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes());
        if end.is_none_or(|end| end > data_len) {
            return Err(cur.err_at(
                &format!("tensor '{}' data", t.name),
                data_offset.saturating_add(t.offset),
                Problem::OutOfRange {
                    start: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    len: data_len,
                },
            ));
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// A bounds-checked little-endian reader over the header bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err_at(&self, field: &str, offset: u64, problem: Problem) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            offset,
            problem,
        }
    }

    fn remaining(&self) -> u64 {
        self.buf.len() as u64 - self.pos
    }

    fn take(&mut self, field: &str, n: u64) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err_at(
                field,
                self.pos,
                Problem::Truncated {
                    needed: n,
                    available: self.remaining(),
                },
            ));
        }
        let start = self.pos as usize;
        self.pos += n;
        Ok(&self.buf[start..start + n as usize])
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(field, N as u64)?
            .try_into()
            .expect("length checked"))
    }

    fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A u64 count of items that each take at least `min_item_bytes`; rejects
    /// counts that cannot possibly fit in the rest of the file before anything
    /// is allocated for them.
    fn count(&mut self, field: &str, min_item_bytes: u64) -> Result<u64, GgufError> {
        let at = self.pos;
        let n = self.u64(field)?;
        let available = self.remaining();
        if n.checked_mul(min_item_bytes)
            .is_none_or(|need| need > available)
        {
            return Err(self.err_at(
                field,
                at,
                Problem::CountTooLarge {
                    count: n,
                    available,
                },
            ));
        }
        Ok(n)
    }

    fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let len = self.count(&format!("{field} length"), 1)?;
        let at = self.pos;
        let bytes = self.take(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err_at(field, at, Problem::InvalidUtf8))
    }

    fn value_type(&mut self, field: &str) -> Result<ValueType, GgufError> {
        let at = self.pos;
        let id = self.u32(&format!("{field} type"))?;
        ValueType::from_id(id)
            .ok_or_else(|| self.err_at(&format!("{field} type"), at, Problem::UnknownValueType(id)))
    }

    fn value(&mut self, field: &str, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => {
                let at = self.pos;
                match self.array::<1>(field)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(self.err_at(
                            field,
                            at,
                            Problem::Invalid(format!("bool byte {b} is neither 0 nor 1")),
                        ))
                    }
                }
            }
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err_at(field, self.pos, Problem::TooDeep(MAX_ARRAY_DEPTH)));
                }
                let elem = self.value_type(&format!("{field} element"))?;
                // Strings and arrays take at least 8 bytes (their own length/count).
                let min = elem.scalar_size().unwrap_or(8) as u64;
                let n = self.count(&format!("{field} count"), min)?;
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    items.push(self.value(&format!("{field}[{i}]"), elem, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}
