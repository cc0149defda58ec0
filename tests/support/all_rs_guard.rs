//! Shared by every crate's `tests/all.rs` (included with `#[path]`): each
//! `tests/*.rs` file must be a module of that one test binary, else it would
//! never run.

/// Panics naming the first file of `<manifest_dir>/tests` that `all_rs`
/// (the text of that crate's tests/all.rs) does not list as a module.
pub fn check_every_test_file_is_listed(manifest_dir: &str, all_rs: &str) {
    let dir = std::path::Path::new(manifest_dir).join("tests");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".rs") && name != "all.rs" {
            let stem = name.trim_end_matches(".rs");
            assert!(
                all_rs.contains(&format!("#[path = \"{name}\"]\nmod {stem};")),
                "tests/{name} is not a module of tests/all.rs"
            );
        }
    }
}
