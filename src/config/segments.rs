//! Rotation settings kept beside a config: `NAME.segments.toml` next to
//! `NAME.cfg` (or `NAME.pbtx`, …). Perfetto's TraceConfig has no place for
//! them, and a config stays loadable by Perfetto's own tools, so they live in
//! a small file of their own that `recorder --config NAME.cfg` and
//! `recorder config check NAME.cfg` pick up. Command-line flags override it
//! key by key.
//!
//! ```toml
//! rotate_size = "256M"        # or a number of bytes
//! rotate_period = "10m"
//! max_segments = 48
//! max_disk = "2G"
//! on_segment_closed = "rclone move --include '*' . remote:traces/"
//! hook_timeout = "2m"         # each run of it; 5m when not given
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::storage::segment::policy::{RotationPolicy, ValueError, parse_duration, parse_size};

/// The settings file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentsFileError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// TOML's error, on one line (it spans several).
    #[error("{path}: {}", source.to_string().trim_end().replace('\n', " "))]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: {key}: {source}")]
    Value {
        path: PathBuf,
        key: &'static str,
        #[source]
        source: ValueError,
    },
}

/// A size written as a number of bytes or as text (`"256M"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    rotate_size: Option<Size>,
    rotate_period: Option<String>,
    max_segments: Option<u32>,
    max_disk: Option<Size>,
    on_segment_closed: Option<String>,
    hook_timeout: Option<String>,
}

/// The settings file that belongs to `config`: the same name with the
/// extension replaced by `.segments.toml`.
pub(crate) fn adjacent_path(config: &Path) -> PathBuf {
    config.with_extension("segments.toml")
}

/// Parses settings text (`path` only names it in errors).
pub(crate) fn parse(text: &str, path: &Path) -> Result<RotationPolicy, SegmentsFileError> {
    let f: File = toml::from_str(text).map_err(|source| SegmentsFileError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let value_err = |key: &'static str, source: ValueError| SegmentsFileError::Value {
        path: path.to_path_buf(),
        key,
        source,
    };
    let size = |key: &'static str, v: Option<Size>| -> Result<Option<u64>, SegmentsFileError> {
        match v {
            None => Ok(None),
            Some(Size::Bytes(b)) => Ok(Some(b)),
            Some(Size::Text(t)) => parse_size(&t).map(Some).map_err(|m| value_err(key, m)),
        }
    };
    Ok(RotationPolicy {
        size: size("rotate_size", f.rotate_size)?,
        period: f
            .rotate_period
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|m| value_err("rotate_period", m))?,
        max_segments: f.max_segments,
        max_disk: size("max_disk", f.max_disk)?,
        on_closed: f.on_segment_closed,
        hook_timeout: f
            .hook_timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|m| value_err("hook_timeout", m))?,
    })
}

/// Loads the settings beside `config`, if there are any.
pub(crate) fn load_adjacent(
    config: &Path,
) -> Result<Option<(PathBuf, RotationPolicy)>, SegmentsFileError> {
    let path = adjacent_path(config);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SegmentsFileError::Read { path, source }),
    };
    let policy = parse(&text, &path)?;
    Ok(Some((path, policy)))
}

/// `base` with every setting `over` gives replaced (flags over the file).
pub(crate) fn overlay(base: RotationPolicy, over: RotationPolicy) -> RotationPolicy {
    RotationPolicy {
        size: over.size.or(base.size),
        period: over.period.or(base.period),
        max_segments: over.max_segments.or(base.max_segments),
        max_disk: over.max_disk.or(base.max_disk),
        on_closed: over.on_closed.or(base.on_closed),
        hook_timeout: over.hook_timeout.or(base.hook_timeout),
    }
}

/// The plan lines for `config check` (empty without rotation).
pub(crate) fn describe(p: &RotationPolicy, from: Option<&Path>) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if !p.rotates() {
        return s;
    }
    let _ = write!(s, "segments");
    if let Some(f) = from {
        let _ = write!(s, " (from {})", f.display());
    }
    let _ = writeln!(s, ":");
    let mut cut = Vec::new();
    if let Some(b) = p.size {
        cut.push(format!("once a segment reaches {b} bytes"));
    }
    if let Some(d) = p.period {
        cut.push(format!("every {}", humantime::format_duration(d)));
    }
    let _ = writeln!(
        s,
        "  cuts the output into numbered, self-contained segments {} (after a write pass; never inside a packet)",
        cut.join(" or ")
    );
    match (p.max_segments, p.max_disk) {
        (None, None) => {
            let _ = writeln!(s, "  keeps every segment");
        }
        (n, d) => {
            let mut keep = Vec::new();
            if let Some(n) = n {
                keep.push(format!("{n} segments"));
            }
            if let Some(d) = d {
                keep.push(format!("{d} bytes"));
            }
            let _ = writeln!(
                s,
                "  keeps the newest within {} (deleting the oldest closed ones, never the one being written)",
                keep.join(" and ")
            );
        }
    }
    if let Some(cmd) = &p.on_closed
        && let Ok(line) = crate::storage::segment::hook::shell_line(cmd)
    {
        let timeout = p
            .hook_timeout
            .unwrap_or(crate::storage::segment::hook::DEFAULT_TIMEOUT);
        let _ = writeln!(
            s,
            "  runs `sh -c '{line}' sh LINK` for each closed segment (LINK: a link to the segment only the recorder's user can change; stdin: the segment), in a process group of its own, killed after {}",
            humantime::format_duration(timeout)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_every_key_and_overlays_flags() {
        let p = parse(
            "rotate_size = \"256M\"\nrotate_period = \"10m\"\nmax_segments = 8\nmax_disk = 4_294_967_296\non_segment_closed = \"true\"\nhook_timeout = \"90s\"\n",
            Path::new("x.segments.toml"),
        )
        .expect("parses");
        assert_eq!(p.size, Some(256 << 20));
        assert_eq!(p.period, Some(Duration::from_secs(600)));
        assert_eq!(p.max_segments, Some(8));
        assert_eq!(p.max_disk, Some(4 << 30));
        assert_eq!(p.on_closed.as_deref(), Some("true"));
        assert_eq!(p.hook_timeout, Some(Duration::from_secs(90)));
        let o = overlay(
            p,
            RotationPolicy {
                size: Some(1 << 20),
                ..Default::default()
            },
        );
        assert_eq!(o.size, Some(1 << 20));
        assert_eq!(o.max_segments, Some(8));
        let text = describe(&o, Some(Path::new("x.segments.toml")));
        assert!(
            text.contains("from x.segments.toml") && text.contains("8 segments"),
            "{text}"
        );
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let e =
            parse("rotate_size = \"lots\"", Path::new("a.segments.toml")).expect_err("bad size");
        assert!(
            e.to_string().starts_with("a.segments.toml: rotate_size:"),
            "{e}"
        );
        let e = parse("rotate_sise = 1", Path::new("a.segments.toml")).expect_err("unknown key");
        assert!(e.to_string().contains("rotate_sise"), "{e}");
    }

    #[test]
    fn the_file_sits_beside_the_config() {
        assert_eq!(
            adjacent_path(Path::new("configs/long_trace.cfg")),
            Path::new("configs/long_trace.segments.toml")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("c.cfg");
        assert!(load_adjacent(&cfg).expect("none").is_none());
        std::fs::write(adjacent_path(&cfg), "rotate_period = \"1h\"\n").expect("write");
        let (path, p) = load_adjacent(&cfg).expect("loads").expect("present");
        assert_eq!(path, dir.path().join("c.segments.toml"));
        assert_eq!(p.period, Some(Duration::from_secs(3600)));
    }
}
