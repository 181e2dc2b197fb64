//! `recorder inspect FILE [--json]`.

use std::path::Path;

use crate::cli::{EXIT_OK, EXIT_RUNTIME};
use crate::trace::{inspect, inspect_set};

/// Prints what a trace holds; exit 1 when it is corrupt beyond a torn tail
/// (the report is still printed, up to the corruption).
pub fn run(path: &Path, json: bool) -> u8 {
    if path.is_dir() {
        return run_dir(path, json);
    }
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

/// `recorder inspect DIR`: a set of segments.
fn run_dir(dir: &Path, json: bool) -> u8 {
    let report = match inspect_set::report_dir(dir) {
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
            eprintln!("recorder inspect: {}: {e}", dir.display());
            EXIT_RUNTIME
        }
    }
}
