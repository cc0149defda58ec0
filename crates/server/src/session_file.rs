//! Session files (`POST /v1/sessions/{id}/save` and `/restore`,
//! `hearth serve --session-dir DIR`): a session's resident token ids and its
//! KV state, tied to the model that computed them.
//!
//! ```text
//! magic "HEARTHSESSION\x01" (14 bytes; "\x02" when it holds images,
//!   "\x03" when it holds ring checkpoints)
//! model fingerprint: sha256 of the GGUF's header, metadata and tensor index (32)
//! n_ids u64 LE, then n_ids u32 LE token ids
//! versions 2 and 3: n_images u64 LE, then per image start u64 LE, n u64 LE,
//!   digest (32): the image positions start..start+n (ids u32::MAX there)
//! version 3: n_checkpoints u64 LE, then per checkpoint (oldest first) pos
//!   u64 LE, n u64 LE, n bytes: the backend's sliding-window rings at pos
//! n_state u64 LE, then the backend's state bytes
//! sha256 of everything above (32)
//! ```

use hearth_engine::session::{SavedCheckpoint, SavedImage, SavedSession, SessionSpill};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 14] = b"HEARTHSESSION\x01";
/// A session file that holds images (an image section after the ids).
const MAGIC_IMAGES: &[u8; 14] = b"HEARTHSESSION\x02";
/// A session file that holds ring checkpoints (a checkpoint section after
/// the image section).
const MAGIC_CHECKPOINTS: &[u8; 14] = b"HEARTHSESSION\x03";
/// Bytes of one image record: start, n, digest.
const IMAGE_RECORD: usize = 8 + 8 + 32;
/// Magic, model fingerprint and the id count: what comes before the ids.
const HEAD: usize = MAGIC.len() + 32 + 8;
/// The smallest file: no ids, no state.
const MIN_LEN: u64 = (HEAD + 8 + 32) as u64;
/// State bytes read per step while a second thread hashes the step before.
const CHUNK: usize = 4 << 20;

/// The file name of session `id` in a session directory: the id itself
/// when it is made of ASCII letters, digits, `-` and `_`; otherwise every
/// other byte is `%XX` (so an id never names a path outside the directory,
/// and two ids never share a file).
pub fn file_name(id: &str) -> String {
    let mut out = String::with_capacity(id.len() + 9);
    for b in id.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out.push_str(".hsession");
    out
}

/// Evicted sessions kept in `DIR/.evicted` (`hearth serve --session-dir`):
/// written when the store evicts a named session, read back (and deleted)
/// on its next request. Files left by an earlier run are removed at start
/// (their sessions ended with that process, as resident ones do).
pub struct DirSpill {
    dir: PathBuf,
    model: [u8; 32],
    kept: HashSet<String>,
}

impl DirSpill {
    pub fn new(session_dir: &Path, model: [u8; 32]) -> io::Result<DirSpill> {
        let dir = session_dir.join(".evicted");
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "hsession" || x == "tmp") {
                std::fs::remove_file(p)?;
            }
        }
        Ok(DirSpill {
            dir,
            model,
            kept: HashSet::new(),
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(file_name(id))
    }
}

impl SessionSpill for DirSpill {
    fn put(&mut self, id: &str, saved: SavedSession) -> Result<(), String> {
        let path = self.path(id);
        write_file(&path, &self.model, &saved)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        self.kept.insert(id.to_string());
        Ok(())
    }

    fn take(&mut self, id: &str) -> Option<Result<SavedSession, String>> {
        if !self.kept.remove(id) {
            return None;
        }
        let path = self.path(id);
        let out = read_file(&path, &self.model).map_err(|e| match e {
            ReadError::Io(e) => format!("reading {}: {e}", path.display()),
            ReadError::Invalid(m) => m,
        });
        let _ = std::fs::remove_file(&path);
        Some(out)
    }

    fn forget(&mut self, id: &str) -> bool {
        let kept = self.kept.remove(id);
        if kept {
            let _ = std::fs::remove_file(self.path(id));
        }
        kept
    }

    fn forget_all(&mut self) -> usize {
        let ids: Vec<String> = self.kept.drain().collect();
        for id in &ids {
            let _ = std::fs::remove_file(self.path(id));
        }
        ids.len()
    }
}

/// Sessions shared by every replica that mounts one `--session-dir`
/// (`hearth serve --shared-sessions`), in `DIR/.shared`: every session is
/// written there as each of its turns ends (and when evicted), and
/// whichever replica gets a conversation's next turn without holding it
/// continues it from there. Named sessions are found by id (here, or saved
/// with `/v1/sessions/{id}/save` in DIR itself); anonymous ones (no id: a
/// gateway forwards none) by their tokens: the kept conversation of the
/// same tenant (`cache_salt`) whose ids the new prompt repeats the most of.
///
/// Files are written by a thread of their own (the engine only copies the
/// state), whole, and renamed into place: a reader never sees half of one;
/// of two replicas writing one session the last rename wins, and either
/// file is a consistent prefix of the conversation. They are read back only
/// after their checksum and model fingerprint are checked. A file is not
/// removed when a replica takes it: a later turn prefills only what follows
/// the prefix the file holds, so a stale file costs prefill time, never a
/// wrong reply.
pub struct SharedSpill {
    dir: PathBuf,
    /// DIR itself (explicitly saved sessions).
    saved: PathBuf,
    model: [u8; 32],
    /// Anonymous files' ids, by name, with the length and mtime they were
    /// read at (a file renamed over is read again).
    ids: std::collections::HashMap<String, (u64, std::time::SystemTime, Vec<u32>)>,
    /// Named sessions this process wrote (forget_all drops those only).
    kept: HashSet<String>,
    writes: Option<std::sync::mpsc::Sender<Pending>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// A file for the writer thread: where, the tenant prefix of an anonymous
/// one (its older prefixes are then removed), what.
struct Pending {
    path: PathBuf,
    tenant: Option<String>,
    saved: SavedSession,
}

/// Most anonymous conversations kept; past it the oldest files go.
const MAX_SHARED_ANONYMOUS: usize = 1024;

/// A short hex tag of `bytes` for file names.
fn tag(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `a-SALT-`: the start of tenant `salt`'s anonymous file names.
fn tenant(salt: Option<&str>) -> String {
    let key = match salt {
        Some(s) => format!("salt:{s}"),
        None => "nosalt".to_string(),
    };
    format!("a-{}-", tag(key.as_bytes()))
}

/// The anonymous files in `dir` whose names start with `prefix`, with
/// their length and mtime.
fn listed(dir: &Path, prefix: &str) -> Vec<(String, PathBuf, u64, std::time::SystemTime)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(prefix) || !name.ends_with(".hsession") {
                return None;
            }
            let meta = e.metadata().ok()?;
            let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            Some((name, e.path(), meta.len(), mtime))
        })
        .collect()
}

/// The writer thread's work on one file: written whole; for an anonymous
/// conversation, its files at a prefix of these ids removed (superseded)
/// and the oldest past [`MAX_SHARED_ANONYMOUS`] too.
fn write_pending(model: &[u8; 32], dir: &Path, p: Pending) {
    if let Err(e) = write_file(&p.path, model, &p.saved) {
        eprintln!("--shared-sessions: writing {}: {e}", p.path.display());
        return;
    }
    let Some(prefix) = p.tenant else { return };
    let ids = &p.saved.ids;
    for (_, path, _, _) in listed(dir, &prefix) {
        if path == p.path {
            continue;
        }
        if let Ok(old) = read_ids(&path, model) {
            if old.len() < ids.len() && ids[..old.len()] == old[..] {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let mut all = listed(dir, "a-");
    if all.len() > MAX_SHARED_ANONYMOUS {
        all.sort_by_key(|f| f.3);
        for (_, path, _, _) in &all[..all.len() - MAX_SHARED_ANONYMOUS] {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl SharedSpill {
    pub fn new(session_dir: &Path, model: [u8; 32]) -> io::Result<SharedSpill> {
        let dir = session_dir.join(".shared");
        std::fs::create_dir_all(&dir)?;
        let (tx, rx) = std::sync::mpsc::channel::<Pending>();
        let wdir = dir.clone();
        let writer = std::thread::Builder::new()
            .name("hearth-session-writer".into())
            .spawn(move || {
                for p in rx {
                    write_pending(&model, &wdir, p);
                }
            })?;
        Ok(SharedSpill {
            dir,
            saved: session_dir.to_path_buf(),
            model,
            ids: Default::default(),
            kept: HashSet::new(),
            writes: Some(tx),
            writer: Some(writer),
        })
    }

    fn named(&self, id: &str) -> PathBuf {
        self.dir.join(format!("n-{}", file_name(id)))
    }

    fn queue(&self, p: Pending) -> Result<(), String> {
        self.writes
            .as_ref()
            .and_then(|w| w.send(p).ok())
            .ok_or_else(|| "the session writer has stopped".to_string())
    }

    /// Tenant `salt`'s anonymous files with their ids.
    fn anonymous(&mut self, salt: Option<&str>) -> Vec<(PathBuf, Vec<u32>)> {
        let mut out = Vec::new();
        for (name, path, len, mtime) in listed(&self.dir, &tenant(salt)) {
            let ids = match self.ids.get(&name) {
                Some((l, m, ids)) if *l == len && *m == mtime => ids.clone(),
                _ => match read_ids(&path, &self.model) {
                    Ok(ids) => {
                        self.ids.insert(name, (len, mtime, ids.clone()));
                        ids
                    }
                    Err(_) => continue,
                },
            };
            out.push((path, ids));
        }
        out
    }

    fn read(&self, path: &Path) -> Result<SavedSession, String> {
        read_file(path, &self.model).map_err(|e| match e {
            ReadError::Io(e) => format!("reading {}: {e}", path.display()),
            ReadError::Invalid(m) => format!("{}: {m}", path.display()),
        })
    }
}

impl Drop for SharedSpill {
    /// The files queued are written before the server exits.
    fn drop(&mut self) {
        drop(self.writes.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl SessionSpill for SharedSpill {
    fn put(&mut self, id: &str, saved: SavedSession) -> Result<(), String> {
        self.queue(Pending {
            path: self.named(id),
            tenant: None,
            saved,
        })?;
        self.kept.insert(id.to_string());
        Ok(())
    }

    fn take(&mut self, id: &str) -> Option<Result<SavedSession, String>> {
        let saved = self.saved.join(file_name(id));
        [self.named(id), saved]
            .into_iter()
            .find(|p| p.is_file())
            .map(|p| self.read(&p))
    }

    fn forget(&mut self, id: &str) -> bool {
        self.kept.remove(id);
        std::fs::remove_file(self.named(id)).is_ok()
    }

    fn forget_all(&mut self) -> usize {
        let ids: Vec<String> = self.kept.drain().collect();
        ids.iter()
            .filter(|id| std::fs::remove_file(self.named(id)).is_ok())
            .count()
    }

    fn keeps_anonymous(&self) -> bool {
        true
    }

    fn put_anonymous(&mut self, salt: Option<&str>, saved: SavedSession) -> Result<(), String> {
        let bytes: Vec<u8> = saved.ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        let prefix = tenant(salt);
        self.queue(Pending {
            path: self.dir.join(format!("{prefix}{}.hsession", tag(&bytes))),
            tenant: Some(prefix),
            saved,
        })
    }

    fn take_anonymous(
        &mut self,
        salt: Option<&str>,
        ids: &[u32],
    ) -> Option<Result<SavedSession, String>> {
        let best = self
            .anonymous(salt)
            .into_iter()
            .map(|(p, kept)| {
                let n = hearth_engine::prompt::common_prefix(&kept, ids);
                (p, n, kept.len())
            })
            .filter(|&(_, n, len)| {
                n > 0 && n as f64 >= hearth_engine::session::ANONYMOUS_SIMILARITY * len as f64
            })
            .max_by_key(|&(_, n, _)| n)?;
        let out = self.read(&best.0);
        if out.is_err() {
            // Damaged (or from another model): never offered again.
            let _ = std::fs::remove_file(&best.0);
        }
        Some(out)
    }
}

/// The token ids of session file `path` (its header only), after checking
/// it is one and from this model; the state is not read (nor its checksum
/// checked: [`read_file`] does that before anything is restored).
pub fn read_ids(path: &Path, model: &[u8; 32]) -> Result<Vec<u32>, ReadError> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len < MIN_LEN {
        return invalid("not a hearth session file");
    }
    let mut head = vec![0u8; HEAD];
    file.read_exact(&mut head)?;
    if ![&MAGIC[..], &MAGIC_IMAGES[..], &MAGIC_CHECKPOINTS[..]].contains(&&head[..MAGIC.len()]) {
        return invalid("not a hearth session file");
    }
    if &head[MAGIC.len()..MAGIC.len() + 32] != model {
        return invalid("the session file was saved with a different model");
    }
    let n = le_u64(&head[HEAD - 8..]);
    if n.checked_mul(4).is_none_or(|b| b > len - MIN_LEN) {
        return invalid("the session file is damaged (its lengths do not match its size)");
    }
    let mut raw = vec![0u8; n as usize * 4];
    file.read_exact(&mut raw)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

/// What identifies a model for its sessions: the GGUF bytes before the
/// tensor data (everything that decides its shapes and tokenizer).
pub fn fingerprint(gguf_head: &[u8]) -> [u8; 32] {
    Sha256::digest(gguf_head).into()
}

/// Everything before the state bytes: magic, model, ids, images (versions
/// 2 and 3), checkpoints (version 3), the state's length.
fn header(model: &[u8; 32], saved: &SavedSession) -> Vec<u8> {
    let SavedSession {
        ids,
        images,
        checkpoints,
        state,
    } = saved;
    let cp_len: usize = checkpoints.iter().map(|c| 16 + c.state.len()).sum();
    let mut out =
        Vec::with_capacity(HEAD + ids.len() * 4 + 24 + images.len() * IMAGE_RECORD + cp_len);
    out.extend_from_slice(match (images.is_empty(), checkpoints.is_empty()) {
        (true, true) => MAGIC,
        (false, true) => MAGIC_IMAGES,
        (_, false) => MAGIC_CHECKPOINTS,
    });
    out.extend_from_slice(model);
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    if !images.is_empty() || !checkpoints.is_empty() {
        out.extend_from_slice(&(images.len() as u64).to_le_bytes());
        for im in images {
            out.extend_from_slice(&(im.start as u64).to_le_bytes());
            out.extend_from_slice(&(im.n as u64).to_le_bytes());
            out.extend_from_slice(&im.digest);
        }
    }
    if !checkpoints.is_empty() {
        out.extend_from_slice(&(checkpoints.len() as u64).to_le_bytes());
        for c in checkpoints {
            out.extend_from_slice(&(c.pos as u64).to_le_bytes());
            out.extend_from_slice(&(c.state.len() as u64).to_le_bytes());
            out.extend_from_slice(&c.state);
        }
    }
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out
}

/// Writes a session file to `out` in one pass over the state: the bytes go
/// out as they are (no copy of the state is made) while a second thread
/// hashes them for the trailing checksum. Returns the bytes written.
pub fn write_to<W: Write>(out: &mut W, model: &[u8; 32], saved: &SavedSession) -> io::Result<u64> {
    let state = &saved.state[..];
    let head = header(model, saved);
    let sum = std::thread::scope(|s| {
        let hasher = s.spawn(|| {
            let mut h = Sha256::new();
            h.update(&head);
            h.update(state);
            h.finalize()
        });
        let wrote = out.write_all(&head).and_then(|_| out.write_all(state));
        let sum = hasher.join().expect("the session file's hashing thread");
        wrote.map(|_| sum)
    })?;
    out.write_all(&sum)?;
    Ok((head.len() + state.len() + sum.len()) as u64)
}

/// Writes session file `path` (through a temporary file renamed over it, so
/// a reader never sees half a file); the bytes written.
///
/// Renaming over an existing file frees the old file's pages and blocks
/// inside the rename (~0.15 s for a 181 MB file on ext4), so a second link
/// keeps the old file through the rename and a background thread deletes it.
pub fn write_file(path: &Path, model: &[u8; 32], saved: &SavedSession) -> io::Result<u64> {
    static REPLACED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // The temporary file is this process's and this write's own, so two
    // replicas writing one session at once never mix their bytes: each
    // renames a whole file over it, and the last rename wins.
    let k = REPLACED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("hsession.{}-{k}.tmp", std::process::id()));
    let n = match write_to(&mut std::fs::File::create(&tmp)?, model, saved) {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let old = path.with_extension(format!("hsession.old-{}-{k}", std::process::id()));
    let kept = std::fs::hard_link(path, &old).is_ok();
    let renamed = std::fs::rename(&tmp, path);
    if kept {
        std::thread::spawn(move || std::fs::remove_file(old));
    }
    renamed.map(|_| n)
}

/// Why a session file was not read.
#[derive(Debug)]
pub enum ReadError {
    /// Reading failed (the file is missing, unreadable, shorter than it said).
    Io(io::Error),
    /// Not a session file, damaged, or saved with another model.
    Invalid(String),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// The little-endian u64 in `b` (8 bytes).
fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

fn invalid<T>(m: &str) -> Result<T, ReadError> {
    Err(ReadError::Invalid(m.to_string()))
}

/// Reads a session file of `len` bytes from `inp`: its ids, images and
/// state bytes, after checking it is one, undamaged, and from this model
/// (the error says which check failed). The state is read once, into the
/// vector returned, while a second thread hashes what was read before.
pub fn read_from<R: Read>(
    inp: &mut R,
    len: u64,
    model: &[u8; 32],
) -> Result<SavedSession, ReadError> {
    if len < MIN_LEN {
        return invalid("not a hearth session file");
    }
    let mut head = vec![0u8; HEAD];
    inp.read_exact(&mut head)?;
    let (with_images, with_checkpoints) = match &head[..MAGIC.len()] {
        m if m == MAGIC => (false, false),
        m if m == MAGIC_IMAGES => (true, false),
        m if m == MAGIC_CHECKPOINTS => (true, true),
        _ => return invalid("not a hearth session file"),
    };
    let sizes_wrong = "the session file is damaged (its lengths do not match its size)";
    let n_ids = le_u64(&head[HEAD - 8..]);
    // Bytes after the fixed head that must still fit the file.
    let room = len - MIN_LEN + 8;
    let mut take = |head: &mut Vec<u8>, n: Option<u64>| -> Result<(), ReadError> {
        let used = (head.len() - HEAD) as u64;
        let n = n
            .filter(|&n| used.checked_add(n).is_some_and(|t| t <= room))
            .ok_or_else(|| ReadError::Invalid(sizes_wrong.into()))?;
        let at = head.len();
        head.resize(at + n as usize, 0);
        inp.read_exact(&mut head[at..])?;
        Ok(())
    };
    // The ids, then (version 2) the image count and records, then the state length.
    take(&mut head, n_ids.checked_mul(4))?;
    let ids_end = head.len();
    let mut images_at = head.len();
    let mut n_images = 0u64;
    if with_images {
        take(&mut head, Some(8))?;
        n_images = le_u64(&head[head.len() - 8..]);
        images_at = head.len();
        take(&mut head, n_images.checked_mul(IMAGE_RECORD as u64))?;
    }
    // (pos, offset of its bytes in `head`, length)
    let mut checkpoints_at = Vec::new();
    if with_checkpoints {
        take(&mut head, Some(8))?;
        let n = le_u64(&head[head.len() - 8..]);
        for _ in 0..n {
            take(&mut head, Some(16))?;
            let pos = le_u64(&head[head.len() - 16..head.len() - 8]);
            let len = le_u64(&head[head.len() - 8..]);
            let at = head.len();
            take(&mut head, Some(len))?;
            checkpoints_at.push((pos, at, len as usize));
        }
    }
    take(&mut head, Some(8))?;
    let n_state = le_u64(&head[head.len() - 8..]);
    let before_state = (head.len() - HEAD) as u64;
    if n_state != room - before_state {
        return invalid(sizes_wrong);
    }
    let mut state = vec![0u8; n_state as usize];
    let mut sum = [0u8; 32];
    let hashed = std::thread::scope(|s| -> Result<_, ReadError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(4);
        let hasher = s.spawn(move || {
            let mut h = Sha256::new();
            rx.into_iter().for_each(|b| h.update(b));
            h.finalize()
        });
        fn shared(b: &mut [u8]) -> &[u8] {
            b
        }
        let _ = tx.send(&head);
        for chunk in state.chunks_mut(CHUNK) {
            inp.read_exact(chunk)?;
            let _ = tx.send(shared(chunk));
        }
        drop(tx);
        inp.read_exact(&mut sum)?;
        Ok(hasher.join().expect("the session file's hashing thread"))
    })?;
    if hashed.as_slice() != sum {
        return invalid("the session file is damaged (checksum mismatch)");
    }
    if &head[MAGIC.len()..MAGIC.len() + 32] != model {
        return invalid("the session file was saved with a different model");
    }
    let ids = head[HEAD..ids_end]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let mut images = Vec::with_capacity(n_images as usize);
    for r in
        head[images_at..images_at + n_images as usize * IMAGE_RECORD].chunks_exact(IMAGE_RECORD)
    {
        let (start, n) = (le_u64(&r[..8]), le_u64(&r[8..16]));
        let (Ok(start), Ok(n)) = (usize::try_from(start), usize::try_from(n)) else {
            return invalid("the session file's image positions are out of range");
        };
        images.push(SavedImage {
            start,
            n,
            digest: r[16..].try_into().expect("32 bytes"),
        });
    }
    let mut checkpoints = Vec::with_capacity(checkpoints_at.len());
    for (pos, at, len) in checkpoints_at {
        let Ok(pos) = usize::try_from(pos) else {
            return invalid("the session file's checkpoint positions are out of range");
        };
        checkpoints.push(SavedCheckpoint {
            pos,
            state: head[at..at + len].to_vec(),
        });
    }
    Ok(SavedSession {
        ids,
        images,
        checkpoints,
        state,
    })
}

/// Reads session file `path` ([`read_from`]).
pub fn read_file(path: &Path, model: &[u8; 32]) -> Result<SavedSession, ReadError> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    read_from(&mut file, len, model)
}

/// A session file in memory ([`write_to`]).
pub fn encode(model: &[u8; 32], saved: &SavedSession) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + saved.ids.len() * 4 + 8 + saved.state.len() + 32);
    write_to(&mut out, model, saved).expect("writing to memory");
    out
}

/// The ids and state bytes of a session file in memory ([`read_from`]).
pub fn decode(model: &[u8; 32], data: &[u8]) -> Result<SavedSession, String> {
    read_from(&mut &data[..], data.len() as u64, model).map_err(|e| match e {
        ReadError::Invalid(m) => m,
        ReadError::Io(e) => format!("the session file is truncated ({e})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(ids: &[u32], state: &[u8]) -> SavedSession {
        SavedSession {
            ids: ids.to_vec(),
            state: state.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_and_every_check() {
        let fp = fingerprint(b"model");
        let file = encode(&fp, &saved(&[1, 2, 3], b"state"));
        assert_eq!(decode(&fp, &file).unwrap(), saved(&[1, 2, 3], b"state"));
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
        assert!(decode(&fp, &file[..10])
            .unwrap_err()
            .contains("not a hearth session"));
        // No ids, no state.
        let empty = encode(&fp, &saved(&[], b""));
        assert_eq!(decode(&fp, &empty).unwrap(), saved(&[], b""));
        // An id count past the end.
        let mut long = file.clone();
        long[46..54].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&fp, &long).unwrap_err().contains("lengths"));
    }

    #[test]
    fn states_over_many_read_chunks_round_trip_and_damage_anywhere_is_caught() {
        let fp = fingerprint(b"model");
        let state: Vec<u8> = (0..2 * CHUNK + 12345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let ids: Vec<u32> = (0..1000).collect();
        let file = encode(&fp, &saved(&ids, &state));
        assert_eq!(file.len(), HEAD + 4000 + 8 + state.len() + 32);
        // The layout the module documents, the checksum over all before it.
        let body = &file[..file.len() - 32];
        assert_eq!(&file[file.len() - 32..], Sha256::digest(body).as_slice());
        assert_eq!(&body[HEAD + 4000 + 8..], &state[..]);
        assert_eq!(decode(&fp, &file).unwrap(), saved(&ids, &state));
        for at in [HEAD + 5, file.len() / 2, file.len() - 40, file.len() - 1] {
            let mut bad = file.clone();
            bad[at] ^= 0x10;
            assert!(decode(&fp, &bad).unwrap_err().contains("damaged"), "{at}");
        }
    }

    /// A session holding images: version 2, the image records between the
    /// ids and the state, round trip exact; damaged or impossible counts refused.
    #[test]
    fn images_round_trip_in_version_2() {
        let fp = fingerprint(b"model");
        let img = u32::MAX;
        let s = SavedSession {
            ids: vec![1, img, img, img, 2, img, img, 3],
            images: vec![
                SavedImage {
                    start: 1,
                    n: 3,
                    digest: [7; 32],
                },
                SavedImage {
                    start: 5,
                    n: 2,
                    digest: [9; 32],
                },
            ],
            state: b"kv bytes".to_vec(),
            ..Default::default()
        };
        let file = encode(&fp, &s);
        assert_eq!(&file[..MAGIC.len()], MAGIC_IMAGES);
        assert_eq!(file.len(), HEAD + 32 + 8 + 2 * IMAGE_RECORD + 8 + 8 + 32);
        assert_eq!(decode(&fp, &file).unwrap(), s);
        // An image count past the end.
        let mut long = file.clone();
        let at = HEAD + 32;
        long[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&fp, &long).unwrap_err().contains("lengths"));
        let mut bad = file.clone();
        bad[at + 8 + 20] ^= 1;
        assert!(decode(&fp, &bad).unwrap_err().contains("damaged"));
    }

    /// A session holding ring checkpoints: version 3 (the image section, even
    /// empty, then the checkpoints), round trip exact; an impossible
    /// checkpoint length is refused, damage caught.
    #[test]
    fn checkpoints_round_trip_in_version_3() {
        let fp = fingerprint(b"model");
        let cp = |pos: usize, b: &[u8]| SavedCheckpoint {
            pos,
            state: b.to_vec(),
        };
        let s = SavedSession {
            ids: vec![1, 2, 3, 4, 5],
            checkpoints: vec![cp(2, b"rings at 2"), cp(5, b"rings at five")],
            state: b"kv bytes".to_vec(),
            ..Default::default()
        };
        let file = encode(&fp, &s);
        assert_eq!(&file[..MAGIC.len()], MAGIC_CHECKPOINTS);
        let cps = 8 + (16 + 10) + (16 + 13);
        assert_eq!(file.len(), HEAD + 20 + 8 + cps + 8 + 8 + 32);
        assert_eq!(decode(&fp, &file).unwrap(), s);
        // With images too.
        let mut both = s.clone();
        both.ids[1] = u32::MAX;
        both.images = vec![SavedImage {
            start: 1,
            n: 1,
            digest: [3; 32],
        }];
        assert_eq!(decode(&fp, &encode(&fp, &both)).unwrap(), both);
        // A checkpoint length past the end.
        let mut long = file.clone();
        let at = HEAD + 20 + 8 + 8 + 8;
        assert_eq!(le_u64(&long[at..at + 8]), 10);
        long[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        assert!(decode(&fp, &long).unwrap_err().contains("lengths"));
        let mut bad = file.clone();
        bad[at + 8 + 3] ^= 1;
        assert!(decode(&fp, &bad).unwrap_err().contains("damaged"));
    }

    #[test]
    fn file_names_stay_in_their_directory() {
        assert_eq!(file_name("s1"), "s1.hsession");
        assert_eq!(file_name("agent_A-2"), "agent_A-2.hsession");
        assert_eq!(file_name("../x"), "%2E%2E%2Fx.hsession");
        assert_eq!(file_name(".hidden"), "%2Ehidden.hsession");
        assert_ne!(file_name("a.b"), file_name("a%2Eb"));
    }

    #[test]
    fn the_spill_keeps_evicted_sessions_until_taken_or_forgotten() {
        let dir = std::env::temp_dir().join(format!("hearth-spill-{}", std::process::id()));
        let fp = fingerprint(b"model");
        let stale = dir.join(".evicted").join("old.hsession");
        std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
        std::fs::write(&stale, b"from an earlier run").unwrap();
        let mut spill = DirSpill::new(&dir, fp).unwrap();
        assert!(!stale.exists(), "an earlier run's files are removed");
        let s = saved(&[1, 2, 3], b"kv");
        spill.put("a/../b", s.clone()).unwrap();
        assert!(dir.join(".evicted").join(file_name("a/../b")).exists());
        assert!(spill.take("other").is_none());
        assert_eq!(spill.take("a/../b").unwrap().unwrap(), s);
        assert!(spill.take("a/../b").is_none(), "taken once");
        assert_eq!(std::fs::read_dir(dir.join(".evicted")).unwrap().count(), 0);
        spill.put("c", s.clone()).unwrap();
        assert!(spill.forget("c") && !spill.forget("c"));
        // A damaged file: an error, and it is gone.
        spill.put("d", s.clone()).unwrap();
        let p = dir.join(".evicted").join("d.hsession");
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 40] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        assert!(spill.take("d").unwrap().unwrap_err().contains("damaged"));
        assert!(!p.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two replicas on one dir: what one keeps, the other finds (named by
    /// id, anonymous by the prompt it continues, within its tenant only);
    /// a conversation kept again at a longer prefix replaces the shorter
    /// file; a damaged file is refused and removed.
    #[test]
    fn shared_sessions_cross_replicas_by_id_and_by_prompt() {
        let dir = std::env::temp_dir().join(format!("hearth-shared-{}", std::process::id()));
        let fp = fingerprint(b"model");
        let shared = dir.join(".shared");
        let files = |prefix: &str| -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&shared)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy();
                    n.starts_with(prefix) && n.ends_with(".hsession")
                })
                .collect();
            v.sort();
            v
        };
        {
            let mut a = SharedSpill::new(&dir, fp).unwrap();
            a.put("s1", saved(&[1, 2, 3], b"named")).unwrap();
            a.put_anonymous(None, saved(&[10, 11, 12, 13], b"turn 1"))
                .unwrap();
            a.put_anonymous(Some("tenant-b"), saved(&[10, 11, 12, 13], b"other tenant"))
                .unwrap();
            a.put_anonymous(None, saved(&[10, 11, 12, 13, 14, 15], b"turn 2"))
                .unwrap();
            // Dropped: its writes are done.
        }
        assert_eq!(files("a-").len(), 2, "the turn-1 file is superseded");
        let mut b = SharedSpill::new(&dir, fp).unwrap();
        assert_eq!(b.take("s1").unwrap().unwrap().state, b"named");
        assert!(b.take("s2").is_none());
        // A session saved explicitly (`/v1/sessions/{id}/save`) in DIR itself.
        write_file(&dir.join(file_name("s 3")), &fp, &saved(&[7, 8], b"saved")).unwrap();
        assert_eq!(b.take("s 3").unwrap().unwrap().state, b"saved");
        // The longest kept prefix of the new prompt, this tenant's.
        let got = b
            .take_anonymous(None, &[10, 11, 12, 13, 14, 15, 16, 17])
            .unwrap()
            .unwrap();
        assert_eq!(got.state, b"turn 2");
        let other = b
            .take_anonymous(Some("tenant-b"), &[10, 11, 12, 13, 99])
            .unwrap()
            .unwrap();
        assert_eq!(other.state, b"other tenant");
        assert!(b
            .take_anonymous(Some("tenant-c"), &[10, 11, 12, 13])
            .is_none());
        // Less than half of the kept conversation repeated: not continued.
        assert!(b.take_anonymous(None, &[10, 11, 99]).is_none());
        // A damaged file: refused and removed.
        let p = files("a-")
            .into_iter()
            .find(|p| read_ids(p, &fp).unwrap().len() == 6)
            .unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 40] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        let e = b
            .take_anonymous(None, &[10, 11, 12, 13, 14, 15])
            .unwrap()
            .unwrap_err();
        assert!(e.contains("damaged"), "{e}");
        assert!(!p.exists());
        assert!(b.forget("s1") && b.take("s1").is_none());
        drop(b);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
