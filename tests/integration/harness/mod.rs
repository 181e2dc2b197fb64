//! What every feature file of the integration tests stands on: the needs a
//! test states with `require!` (skip, or fail where CI requires them), the
//! one deadline every wait goes through, recording runs and served
//! sessions of the built binary, other users, SDK apps, and the decoders
//! and oracles that read traces back. Feature files use these and never
//! each other.

#![allow(dead_code)]

#[macro_use]
pub mod need;

pub mod apps;
pub mod consumer_port;
pub mod decode;
pub mod flight;
pub mod ftrace;
pub mod run;
pub mod serve;
pub mod trace_processor;
pub mod users;
pub mod wait;

use std::path::PathBuf;

pub use apps::*;
pub use decode::*;
pub use flight::*;
pub use need::{is_root, kernel_required, on_path, peers_required};
pub use run::*;
pub use serve::{Serve, Traced, sched_switches};
pub use users::*;
pub use wait::*;

/// The built `recorder` binary.
pub fn recorder_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_recorder"))
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test configs the repository carries (`tests/fixtures/configs`),
/// covering the fields the tests check in Perfetto's.
pub fn own_test_configs() -> PathBuf {
    repo_root().join("tests/fixtures/configs")
}
