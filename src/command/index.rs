//! `recorder index PATH [--unshipped STORE] [--format TEMPLATE]`: the
//! segments of a store (or of one output directory, or one segment) as a
//! table, one JSON object a line, read from their sidecars and checked
//! against them. A table rather than `inspect --json`'s one document: rows
//! load as they are into pandas (`read_json(lines=True)`), DuckDB
//! (`read_json_auto`) or a shell loop, to pick segments by host and time
//! before opening any.

use std::path::Path;

use super::ExitCode;
use crate::trace::store::{self, FIELDS, Row, Status};

/// One piece of a `--format` template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field(String),
}

/// A `--format` template that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TemplateError {
    #[error("--format: an unclosed {{ in {0:?}")]
    Unclosed(String),
    #[error("--format: no field {name:?}; the fields are {}", FIELDS.join(", "))]
    UnknownField { name: String },
}

/// Parses `{field}` placeholders; unknown fields and unclosed braces are refused.
fn parse_template(t: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_string()));
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| TemplateError::Unclosed(t.to_string()))?;
        let name = &after[..close];
        if !FIELDS.contains(&name) {
            return Err(TemplateError::UnknownField {
                name: name.to_string(),
            });
        }
        pieces.push(Piece::Field(name.to_string()));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

/// A row through the template: strings bare, numbers as numbers, null empty.
fn render(pieces: &[Piece], row: &serde_json::Value) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Field(f) => match &row[f.as_str()] {
                serde_json::Value::Null => {}
                serde_json::Value::String(s) => out.push_str(s),
                v => out.push_str(&v.to_string()),
            },
        }
    }
    out
}

/// Prints the rows of `path` (only those `unshipped` lacks, when given).
/// Exit 1 when a listed row is not `ok` (after printing them all) or a
/// path cannot be read; 2 for a bad template.
pub(crate) fn run(path: &Path, unshipped: Option<&Path>, format: Option<&str>) -> ExitCode {
    let template = match format.map(parse_template).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("recorder index: {e}");
            return ExitCode::Usage;
        }
    };
    let report = match store::scan(path) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let rows: Vec<&Row> = match unshipped {
        Some(s) => match store::scan(s) {
            Ok(there) => report.missing_from(&there),
            Err(e) => return fail(e),
        },
        None => report.rows.iter().collect(),
    };
    let mut text = String::new();
    for r in &rows {
        // JSON lines keep the fields in their documented order.
        let line = match &template {
            Some(t) => serde_json::to_value(r).map(|v| render(t, &v)),
            None => serde_json::to_string(r),
        };
        let line = match line {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        text.push_str(&line);
        text.push('\n');
    }
    if let Err(code) = super::print_out(text) {
        return code;
    }
    let bad: Vec<&&Row> = rows.iter().filter(|r| r.status != Status::Ok).collect();
    if bad.is_empty() {
        ExitCode::Success
    } else {
        fail(format_args!(
            "{}: {} of {} segments not ok (see their status and problem)",
            path.display(),
            bad.len(),
            rows.len()
        ))
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("recorder index: {e}");
    ExitCode::Runtime
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_fields_and_refuse_unknown_ones() {
        let t = parse_template("s3://b/{store_path} {index}").expect("parses");
        assert_eq!(
            t,
            vec![
                Piece::Text("s3://b/".into()),
                Piece::Field("store_path".into()),
                Piece::Text(" ".into()),
                Piece::Field("index".into()),
            ]
        );
        let row = serde_json::json!({"store_path": "h/b/s/t-000001.pftrace", "index": 1});
        assert_eq!(render(&t, &row), "s3://b/h/b/s/t-000001.pftrace 1");
        let nulls = parse_template("[{host}]").expect("parses");
        assert_eq!(render(&nulls, &serde_json::json!({"host": null})), "[]");
        assert!(
            parse_template("{hostname}")
                .expect_err("refused")
                .to_string()
                .contains("no field \"hostname\"")
        );
        assert!(parse_template("{host").is_err());
    }
}
