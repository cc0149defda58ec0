//! The session file path of `POST /v1/sessions/{id}/save` and `/restore`
//! without the server: a synthetic state shaped like smollm2-135m's at
//! 7,838 positions (30 layers, 3 KV heads of 64, f16, 8192 slots: ~181 MB),
//! saved to bytes, written as a session file, read back and loaded, with
//! each stage timed. The whole server path (with the engine thread and HTTP)
//! is bench/session-save.py.
//!
//! Run: cargo run --profile ci -p hearth-server --example session_file_bench [REPS]
//! (the file goes under $TMPDIR).

use hearth_models::{CacheLayout, KvDtype, KvTypes, LayerKvCache, State};
use hearth_server::session_file;
use sha2::{Digest, Sha256};
use std::time::Instant;

fn main() {
    let (layers, heads, hd, slots, pos) = (30, 3, 64, 8192, 7838);
    let types = KvTypes {
        k: KvDtype::F16,
        v: KvDtype::F16,
    };
    let mut state = State {
        pos: 0,
        max_ctx: slots,
        caches: (0..layers)
            .map(|_| LayerKvCache::new(CacheLayout::Flat, types, heads, hd, slots))
            .collect(),
    };
    let row = heads * hd;
    let mut x = 1u32;
    let kv: Vec<f32> = (0..pos * row)
        .map(|_| {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect();
    for c in &mut state.caches {
        c.write(0, &kv, &kv);
    }
    state.pos = pos;
    let dir = std::env::temp_dir().join(format!("hearth-sfb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.hsession");
    let fp = [7u8; 32];
    let ids: Vec<u32> = (0..pos as u32).collect();
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    for _ in 0..reps {
        let t = Instant::now();
        let bytes = state.save();
        let t_snap = t.elapsed();
        let t = Instant::now();
        let saved = hearth_engine::session::SavedSession {
            ids: ids.clone(),
            state: bytes,
            ..Default::default()
        };
        let n = session_file::write_file(&path, &fp, &saved).unwrap();
        let t_write = t.elapsed();
        drop(saved);
        let t = Instant::now();
        let st = session_file::read_file(&path, &fp).unwrap().state;
        let t_read = t.elapsed();
        let t = Instant::now();
        state.load(&st).unwrap();
        let t_load = t.elapsed();
        let t = Instant::now();
        let _ = Sha256::digest(&st);
        let t_sha = t.elapsed();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:.1} MB | save: snapshot {:.0} ms + hash&write {:.0} ms = {:.0} ms | restore: read&hash {:.0} ms + load {:.0} ms = {:.0} ms | sha256 alone {:.0} ms",
            n as f64 / 1e6,
            ms(t_snap),
            ms(t_write),
            ms(t_snap + t_write),
            ms(t_read),
            ms(t_load),
            ms(t_read + t_load),
            ms(t_sha)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
