//! Session files (`POST /v1/sessions/{id}/save` and `/restore`,
//! `hearth serve --session-dir DIR`): a session's resident token ids and its
//! KV state, tied to the model that computed them.
//!
//! ```text
//! magic "HEARTHSESSION\x01" (14 bytes)
//! model fingerprint: sha256 of the GGUF's header, metadata and tensor index (32)
//! n_ids u64 LE, then n_ids u32 LE token ids
//! n_state u64 LE, then the backend's state bytes
//! sha256 of everything above (32)
//! ```

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 14] = b"HEARTHSESSION\x01";

/// What identifies a model for its sessions: the GGUF bytes before the
/// tensor data (everything that decides its shapes and tokenizer).
pub fn fingerprint(gguf_head: &[u8]) -> [u8; 32] {
    Sha256::digest(gguf_head).into()
}

pub fn encode(model: &[u8; 32], ids: &[u32], state: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 32 + 16 + ids.len() * 4 + state.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(model);
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(state);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// The ids and state bytes of a session file, after checking it is one,
/// undamaged, and from this model; the error says which check failed.
pub fn decode(model: &[u8; 32], data: &[u8]) -> Result<(Vec<u32>, Vec<u8>), String> {
    if data.len() < MAGIC.len() + 32 + 16 + 32 || &data[..MAGIC.len()] != MAGIC {
        return Err("not a hearth session file".into());
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err("the session file is damaged (checksum mismatch)".into());
    }
    let mut at = MAGIC.len();
    if &body[at..at + 32] != model {
        return Err("the session file was saved with a different model".into());
    }
    at += 32;
    let word = |at: usize| -> Result<usize, String> {
        body.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or_else(|| "the session file is truncated".to_string())
    };
    let n = word(at)?;
    at += 8;
    let ids_end = n
        .checked_mul(4)
        .and_then(|b| b.checked_add(at))
        .filter(|&e| e <= body.len())
        .ok_or("the session file is truncated")?;
    let ids = body[at..ids_end]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    at = ids_end;
    let m = word(at)?;
    at += 8;
    if at.checked_add(m) != Some(body.len()) {
        return Err("the session file's state length does not match its size".into());
    }
    Ok((ids, body[at..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_check() {
        let fp = fingerprint(b"model");
        let file = encode(&fp, &[1, 2, 3], b"state");
        assert_eq!(
            decode(&fp, &file).unwrap(),
            (vec![1, 2, 3], b"state".to_vec())
        );
        let other = fingerprint(b"other");
        assert!(decode(&other, &file)
            .unwrap_err()
            .contains("different model"));
        let mut bad = file.clone();
        bad[40] ^= 1;
        assert!(decode(&fp, &bad).unwrap_err().contains("damaged"));
        assert!(decode(&fp, b"GGUF....")
            .unwrap_err()
            .contains("not a hearth session"));
        assert!(decode(&fp, &file[..file.len() - 1]).is_err());
    }
}
