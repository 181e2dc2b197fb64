//! `recorder inspect FILE|DIR|STORE [--json]`.

use std::fmt::Display;
use std::path::Path;

use serde::Serialize;

use super::ExitCode;
use crate::trace::{inspect, inspect_set, store};

/// Prints what a trace (or a directory of segments) holds; exit 1 when it is
/// corrupt beyond a torn tail (the report is still printed, up to the
/// corruption).
pub(crate) fn run(path: &Path, json: bool) -> ExitCode {
    if path.is_dir() {
        match inspect_set::report_dir(path) {
            Ok(r) => print_report(path, &r, json, r.verdict()),
            // No segments here: a store holds them in directories below.
            Err(empty @ inspect_set::SetError::Empty(_)) => match store::scan(path) {
                Ok(r) if r.rows.is_empty() => fail(empty),
                Ok(r) => print_report(path, &r, json, r.verdict()),
                Err(e) => fail(e),
            },
            Err(e) => fail(e),
        }
    } else {
        match inspect::report_file(path) {
            Ok(r) => print_report(path, &r, json, r.verdict()),
            Err(e) => fail(e),
        }
    }
}

fn print_report<R: Serialize + Display>(
    path: &Path,
    report: &R,
    json: bool,
    verdict: Result<(), impl Display>,
) -> ExitCode {
    let printed = if json {
        match serde_json::to_string_pretty(report) {
            Ok(s) => super::print_out(format_args!("{s}\n")),
            Err(e) => return fail(e),
        }
    } else {
        super::print_out(report)
    };
    if let Err(code) = printed {
        return code;
    }
    match verdict {
        Ok(()) => ExitCode::Success,
        Err(e) => fail(format_args!("{}: {e}", path.display())),
    }
}

fn fail(e: impl Display) -> ExitCode {
    eprintln!("recorder inspect: {e}");
    ExitCode::Runtime
}
