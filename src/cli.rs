//! Command-line surface (clap derive) and exit codes. No logic lives here.

use std::process::ExitCode;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: a runtime failure (I/O error, full disk, tracefs refused).
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code: bad usage or a config error.
pub const EXIT_USAGE: u8 = 2;

pub fn main() -> ExitCode {
    ExitCode::from(EXIT_OK)
}
