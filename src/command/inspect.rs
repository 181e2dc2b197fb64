//! `recorder inspect FILE [--json]`.

use std::path::Path;

use super::ExitCode;
use crate::trace::{inspect, inspect_set};

/// Prints what a trace holds; exit 1 when it is corrupt beyond a torn tail
/// (the report is still printed, up to the corruption).
pub fn run(path: &Path, json: bool) -> ExitCode {
    if path.is_dir() {
        return run_dir(path, json);
    }
    let report = match inspect::report_file(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recorder inspect: {e}");
            return ExitCode::Runtime;
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("recorder inspect: {e}");
                return ExitCode::Runtime;
            }
        }
    } else {
        print!("{report}");
    }
    match report.verdict() {
        Ok(()) => ExitCode::Success,
        Err(e) => {
            eprintln!("recorder inspect: {}: {e}", path.display());
            ExitCode::Runtime
        }
    }
}

/// `recorder inspect DIR`: a set of segments.
fn run_dir(dir: &Path, json: bool) -> ExitCode {
    let report = match inspect_set::report_dir(dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recorder inspect: {e}");
            return ExitCode::Runtime;
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("recorder inspect: {e}");
                return ExitCode::Runtime;
            }
        }
    } else {
        print!("{report}");
    }
    match report.verdict() {
        Ok(()) => ExitCode::Success,
        Err(e) => {
            eprintln!("recorder inspect: {}: {e}", dir.display());
            ExitCode::Runtime
        }
    }
}
