//! Shared helpers for the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

/// The built `recorder` binary.
pub fn recorder_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_recorder"))
}

/// Whether kernel features are required (CI): a test that would skip fails.
pub fn kernel_required() -> bool {
    std::env::var_os("RECORDER_REQUIRE_KERNEL").is_some_and(|v| v == "1")
}

/// Skips (returns true) when `missing` is Some, unless kernel features are
/// required, in which case it panics with the reason.
pub fn skip_unless(missing: Option<String>) -> bool {
    match missing {
        None => false,
        Some(why) if kernel_required() => panic!("RECORDER_REQUIRE_KERNEL=1 but: {why}"),
        Some(why) => {
            eprintln!("skipped: {why}");
            true
        }
    }
}

/// Why root-only tests cannot run, if they cannot.
pub fn need_root() -> Option<String> {
    if rustix::process::geteuid().is_root() {
        None
    } else {
        Some("needs root".to_string())
    }
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared Perfetto test configs, if present.
pub fn perfetto_test_configs() -> Option<PathBuf> {
    let p = repo_root().join("../shared/perfetto-test-configs");
    p.is_dir().then_some(p)
}
