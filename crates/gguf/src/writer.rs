//! Streaming GGUF writer. The header (metadata and every tensor's info) is
//! written first, then tensor data in declaration order, so a model larger
//! than memory can be produced a tensor (or a chunk) at a time.

use std::io::Write;

use crate::error::GgufError;
use crate::reader::{TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Metadata, Value};

/// Collects metadata and tensor declarations, then writes the header.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    data_len: u64,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.insert(key, value);
        self
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .get_u64("general.alignment")
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Declares a tensor; its data must later be written in declaration order.
    /// `shape` is ggml `ne` order (innermost first).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
    ) -> Result<(), GgufError> {
        let name = name.into();
        if shape.len() > MAX_DIMS || shape.is_empty() {
            return Err(GgufError::Write(format!(
                "tensor '{name}': {} dims",
                shape.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Write(format!("duplicate tensor '{name}'")));
        }
        let n: u64 = shape.iter().product();
        let bytes = ty
            .bytes_for(n)
            .filter(|_| shape[0].is_multiple_of(ty.block_size() as u64))
            .ok_or_else(|| {
                GgufError::Write(format!(
                    "tensor '{name}': shape {shape:?} is not whole {ty} blocks"
                ))
            })?;
        let offset = self.data_len.div_ceil(self.alignment()) * self.alignment();
        self.data_len = offset + bytes;
        self.tensors.push(TensorInfo {
            name,
            ty,
            shape: shape.to_vec(),
            offset,
        });
        Ok(())
    }

    /// Writes the header and returns a sink for the tensor data.
    pub fn begin<W: Write>(self, mut w: W) -> Result<TensorSink<W>, GgufError> {
        let alignment = self.alignment();
        if !alignment.is_power_of_two() {
            return Err(GgufError::Write(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = (h.len() as u64).div_ceil(alignment) * alignment;
        h.resize(padded as usize, 0);
        w.write_all(&h).map_err(io)?;
        Ok(TensorSink {
            w,
            tensors: self.tensors,
            alignment,
            next: 0,
            written_in_current: 0,
            pos: 0,
        })
    }
}

/// Receives tensor data, in declaration order, possibly in several chunks per tensor.
pub struct TensorSink<W: Write> {
    w: W,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Index of the tensor currently being written.
    next: usize,
    written_in_current: u64,
    /// Bytes written into the data section so far.
    pos: u64,
}

impl<W: Write> TensorSink<W> {
    /// Appends `data` to tensor `name`, which must be the tensor being written
    /// (or the next one, once the current one is complete).
    pub fn write(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        let Some(cur) = self.tensors.get(self.next) else {
            return Err(GgufError::Write(format!(
                "tensor '{name}': all declared tensors are complete"
            )));
        };
        if cur.name != name {
            return Err(GgufError::Write(format!(
                "expected data for tensor '{}', got '{name}'",
                cur.name
            )));
        }
        let (offset, size) = (cur.offset, cur.n_bytes());
        if self.written_in_current == 0 {
            let pad = offset - self.pos;
            self.w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
            self.pos = offset;
        }
        if self.written_in_current + data.len() as u64 > size {
            return Err(GgufError::Write(format!(
                "tensor '{name}': more than its {size} bytes written"
            )));
        }
        self.w.write_all(data).map_err(io)?;
        self.written_in_current += data.len() as u64;
        self.pos += data.len() as u64;
        if self.written_in_current == size {
            self.next += 1;
            self.written_in_current = 0;
        }
        Ok(())
    }

    /// Checks every tensor was written in full, pads the data section to the
    /// alignment (as llama.cpp's writers do) and flushes.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(t) = self.tensors.get(self.next) {
            return Err(GgufError::Write(format!(
                "tensor '{}' was not written in full",
                t.name
            )));
        }
        let pad = self.pos.div_ceil(self.alignment) * self.alignment - self.pos;
        self.w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        self.w.flush().map_err(io)?;
        Ok(self.w)
    }
}

fn io(e: std::io::Error) -> GgufError {
    GgufError::Write(e.to_string())
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(*x as u8),
        Value::String(s) => put_str(h, s),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Array(elem, items) => {
            h.extend_from_slice(&(*elem as u32).to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
    }
}
