//! `recorder inspect FILE [--json]`.

use std::path::Path;

use crate::cli::{EXIT_OK, EXIT_RUNTIME};
use crate::trace::inspect;

/// Prints what a trace holds; exit 1 when it is corrupt beyond a torn tail
/// (the report is still printed, up to the corruption).
pub fn run(path: &Path, json: bool) -> u8 {
    let report = match inspect::report_file(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recorder inspect: {e}");
            return EXIT_RUNTIME;
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("recorder inspect: {e}");
                return EXIT_RUNTIME;
            }
        }
    } else {
        print!("{report}");
    }
    match report.verdict() {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("recorder inspect: {}: {e}", path.display());
            EXIT_RUNTIME
        }
    }
}
