//! A store: closed segments of many sessions on many machines gathered in
//! one tree, by convention `HOST/BOOT/SESSION/NAME-NNNNNN.EXT` beside its
//! sidecar. It is read from the sidecars alone (no segment is decoded):
//! one [`Row`] per segment with what its sidecar says and whether the copy
//! matches it.
//!
//! ```text
//!  store/host-a/<boot id>/<session uuid>/trace-000000.pftrace        ─┐ ok: size and sha256
//!  store/host-a/<boot id>/<session uuid>/trace-000000.pftrace.json   ─┘     match the sidecar
//!  …/trace-000001.pftrace.json without its segment                      missing
//!  no file of index 2 while 1 and 3 are there                           missing (a gap)
//!  …/trace-000003.pftrace differing from its sidecar                    corrupt
//!  session S's segment 0 at a second path too                           duplicated (the first stays ok)
//!  …/trace-000004.pftrace without a sidecar                             no_sidecar (still being shipped?)
//! ```
//!
//! Segments still being written (`.partial`) are not rows: nothing is
//! known of them until they close.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::inspect_set::{segment_name, sha256_file};
use crate::storage::segment::names::{PARTIAL_SUFFIX, SIDECAR_SUFFIX};
use crate::storage::segment::sidecar::{Sidecar, SidecarError};

/// A sidecar is a few hundred bytes; a larger `.json` is not one.
const MAX_SIDECAR_BYTES: u64 = 1 << 20;

/// Reading a store failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: not a segment (NAME-NNNNNN.EXT) or its sidecar")]
    NotASegment(PathBuf),
}

/// A sidecar in a store that cannot be used (the row's problem).
#[derive(Debug, thiserror::Error)]
enum SidecarProblem {
    #[error("sidecar unreadable: {0}")]
    Stat(#[source] std::io::Error),
    #[error("sidecar of {0} bytes is not a sidecar")]
    TooLarge(u64),
    #[error("sidecar unreadable: {0}")]
    Read(#[source] SidecarError),
}

/// Segments of a store that are not `ok`, counted by status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("segments not ok: {}", self.parts())]
pub(crate) struct NotOk(pub BTreeMap<Status, usize>);

impl NotOk {
    fn parts(&self) -> String {
        let parts: Vec<String> = (self.0.iter())
            .map(|(s, n)| format!("{n} {}", s.name()))
            .collect();
        parts.join(", ")
    }
}

/// How a segment's copy stands against its sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// Size and sha256 match the sidecar.
    Ok,
    /// The sidecar is here but not the segment, or neither is while the
    /// session's other segments are (a gap in its indices).
    Missing,
    /// The segment differs from its sidecar, or the sidecar is unreadable.
    Corrupt,
    /// A second matching copy of a segment already listed (same session
    /// and index) at another path.
    Duplicated,
    /// A segment without its sidecar: not checkable (still being shipped,
    /// or shipped without it).
    NoSidecar,
}

impl Status {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "missing",
            Status::Corrupt => "corrupt",
            Status::Duplicated => "duplicated",
            Status::NoSidecar => "no_sidecar",
        }
    }
}

/// One segment of the store: its sidecar's account and its check. Fields
/// the sidecar would give are null when there is no readable sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    pub host: Option<String>,
    pub boot_id: Option<String>,
    pub session_uuid: Option<String>,
    pub trace_uuid: Option<String>,
    pub index: u64,
    /// BOOTTIME ns of that boot (comparable within one boot only).
    pub(crate) first_timestamp_ns: Option<u64>,
    pub(crate) last_timestamp_ns: Option<u64>,
    /// The same instants on the wall clock (ns since the epoch).
    pub first_realtime_ns: Option<u64>,
    pub last_realtime_ns: Option<u64>,
    pub packets: Option<u64>,
    pub bytes: Option<u64>,
    pub(crate) uncompressed_bytes: Option<u64>,
    pub compression: Option<String>,
    /// Bytes lost in the recorder's buffers and events lost before them.
    pub(crate) lost_bytes: Option<u64>,
    pub(crate) lost_events_upstream: Option<u64>,
    pub closed_by: Option<String>,
    pub sha256: Option<String>,
    /// The segment file, relative to the store (where it should be, when missing).
    pub path: String,
    /// Where it belongs in a store: `HOST/BOOT/SESSION/FILE`, each part
    /// made safe as a file name.
    pub store_path: Option<String>,
    pub status: Status,
    /// What is wrong, in a sentence (null when ok).
    pub problem: Option<String>,
}

/// The fields of a [`Row`], in order (what `recorder index --format` may name).
pub(crate) const FIELDS: &[&str] = &[
    "host",
    "boot_id",
    "session_uuid",
    "trace_uuid",
    "index",
    "first_timestamp_ns",
    "last_timestamp_ns",
    "first_realtime_ns",
    "last_realtime_ns",
    "packets",
    "bytes",
    "uncompressed_bytes",
    "compression",
    "lost_bytes",
    "lost_events_upstream",
    "closed_by",
    "sha256",
    "path",
    "store_path",
    "status",
    "problem",
];

/// Every segment of a store.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct StoreReport {
    pub root: PathBuf,
    pub rows: Vec<Row>,
}

/// The files of one segment in one directory.
#[derive(Debug, Default)]
struct Files {
    trace: Option<PathBuf>,
    sidecar: Option<PathBuf>,
}

/// Segment files by (directory, name, extension), then index.
type Groups = BTreeMap<(PathBuf, String, String), BTreeMap<u64, Files>>;

/// Reads the store under `root` (a tree of any depth; symbolic links are
/// not followed), or the one segment `root` names (a segment or its sidecar).
pub(crate) fn scan(root: &Path) -> Result<StoreReport, StoreError> {
    let meta = std::fs::metadata(root).map_err(|source| StoreError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    let mut groups = Groups::new();
    if meta.is_dir() {
        walk(root, &mut groups)?;
        let mut rows = rows_of(root, &groups);
        mark_gaps(root, &groups, &mut rows);
        mark_duplicates(&mut rows);
        rows.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        Ok(StoreReport {
            root: root.to_path_buf(),
            rows,
        })
    } else {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = root
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let trace_name = name.strip_suffix(SIDECAR_SUFFIX).unwrap_or(&name);
        let Some((stem, index, ext)) = segment_name(trace_name) else {
            return Err(StoreError::NotASegment(root.to_path_buf()));
        };
        let trace = dir.join(trace_name);
        let sidecar = dir.join(format!("{trace_name}{SIDECAR_SUFFIX}"));
        let regular = |p: &PathBuf| super::untrusted::is_regular(p);
        if !regular(&trace) && !regular(&sidecar) {
            // Gone, both (a budget deleted them): nothing to describe.
            return Err(StoreError::Read {
                path: trace,
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        let files = Files {
            trace: regular(&trace).then_some(trace.clone()),
            sidecar: regular(&sidecar).then_some(sidecar.clone()),
        };
        let key = (dir.to_path_buf(), stem.to_string(), ext.to_string());
        groups.entry(key).or_default().insert(index, files);
        Ok(StoreReport {
            root: dir.to_path_buf(),
            rows: rows_of(dir, &groups),
        })
    }
}

fn walk(dir: &Path, groups: &mut Groups) -> Result<(), StoreError> {
    let rd = std::fs::read_dir(dir).map_err(|source| StoreError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in rd {
        let entry = entry.map_err(|source| StoreError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            // A hook's own directory of links (`.recorder-hook.*`), or any
            // hidden one: not part of the store.
            if !entry.file_name().to_string_lossy().starts_with('.') {
                walk(&entry.path(), groups)?;
            }
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(PARTIAL_SUFFIX) {
            continue;
        }
        let (trace_name, is_sidecar) = match name.strip_suffix(SIDECAR_SUFFIX) {
            Some(t) => (t, true),
            None => (name.as_str(), false),
        };
        let Some((stem, index, ext)) = segment_name(trace_name) else {
            continue;
        };
        let files = groups
            .entry((dir.to_path_buf(), stem.to_string(), ext.to_string()))
            .or_default()
            .entry(index)
            .or_default();
        if is_sidecar {
            files.sidecar = Some(entry.path());
        } else {
            files.trace = Some(entry.path());
        }
    }
    Ok(())
}

fn relative(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// One part of a store path: what a file name may safely hold.
fn path_part(s: &str) -> String {
    let safe: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        "_".into()
    } else {
        safe
    }
}

fn read_sidecar(path: &Path) -> Result<Sidecar, SidecarProblem> {
    let (_, len) =
        super::untrusted::open_regular(path).map_err(|e| SidecarProblem::Stat(e.into()))?;
    if len > MAX_SIDECAR_BYTES {
        return Err(SidecarProblem::TooLarge(len));
    }
    let bytes = super::untrusted::read_at_most(path, MAX_SIDECAR_BYTES)
        .map_err(|e| SidecarProblem::Stat(e.into()))?;
    Sidecar::parse(path, &bytes).map_err(SidecarProblem::Read)
}

fn rows_of(root: &Path, groups: &Groups) -> Vec<Row> {
    let mut rows = Vec::new();
    for ((dir, stem, ext), by_index) in groups {
        for (index, files) in by_index {
            let file = format!("{stem}-{index:06}.{ext}");
            let path = files.trace.clone().unwrap_or_else(|| dir.join(&file));
            rows.push(row(root, *index, &file, &path, files));
        }
    }
    rows
}

fn empty_row(index: u64, path: String, status: Status, problem: String) -> Row {
    Row {
        host: None,
        boot_id: None,
        session_uuid: None,
        trace_uuid: None,
        index,
        first_timestamp_ns: None,
        last_timestamp_ns: None,
        first_realtime_ns: None,
        last_realtime_ns: None,
        packets: None,
        bytes: None,
        uncompressed_bytes: None,
        compression: None,
        lost_bytes: None,
        lost_events_upstream: None,
        closed_by: None,
        sha256: None,
        path,
        store_path: None,
        status,
        problem: Some(problem),
    }
}

fn row(root: &Path, index: u64, file: &str, path: &Path, files: &Files) -> Row {
    let rel = relative(root, path);
    let Some(car_path) = &files.sidecar else {
        return empty_row(
            index,
            rel,
            Status::NoSidecar,
            "no sidecar: not checked (still being shipped, or shipped without it)".into(),
        );
    };
    let car = match read_sidecar(car_path) {
        Ok(c) => c,
        Err(e) => return empty_row(index, rel, Status::Corrupt, e.to_string()),
    };
    let (status, problem) = if car.index != index || car.file != file {
        (
            Status::Corrupt,
            Some(format!(
                "its sidecar describes {} (index {})",
                car.file, car.index
            )),
        )
    } else if files.trace.is_none() {
        (
            Status::Missing,
            Some("the sidecar is here, the segment is not".into()),
        )
    } else {
        let size = super::untrusted::open_regular(path).map_or(0, |(_, size)| size);
        if size != car.bytes {
            (
                Status::Corrupt,
                Some(format!("{size} bytes, its sidecar says {}", car.bytes)),
            )
        } else if sha256_file(path).is_some_and(|h| h == car.sha256) {
            (Status::Ok, None)
        } else {
            (
                Status::Corrupt,
                Some("sha256 differs from its sidecar's".into()),
            )
        }
    };
    Row {
        store_path: Some(
            [&car.host, &car.boot_id, &car.session_uuid, file]
                .map(path_part)
                .join("/"),
        ),
        host: Some(car.host),
        boot_id: Some(car.boot_id),
        session_uuid: Some(car.session_uuid),
        trace_uuid: Some(car.trace_uuid),
        index,
        first_timestamp_ns: Some(car.first_timestamp_ns),
        last_timestamp_ns: Some(car.last_timestamp_ns),
        first_realtime_ns: car.first_realtime_ns,
        last_realtime_ns: car.last_realtime_ns,
        packets: Some(car.packets),
        bytes: Some(car.bytes),
        uncompressed_bytes: Some(car.uncompressed_bytes),
        compression: Some(car.compression),
        lost_bytes: Some(car.loss.bytes_overwritten + car.loss.bytes_discarded),
        lost_events_upstream: Some(car.loss.events_lost_upstream),
        closed_by: Some(car.closed_by),
        sha256: Some(car.sha256),
        path: rel,
        status,
        problem,
    }
}

/// Adds a `missing` row for each index a session skips (from 0 to its
/// highest): neither the segment nor its sidecar is anywhere in its
/// directories.
fn mark_gaps(root: &Path, groups: &Groups, rows: &mut Vec<Row>) {
    // Per session: the (directory, name, extension) groups its sidecars are in.
    let mut sessions: BTreeMap<String, BTreeSet<(PathBuf, String, String)>> = BTreeMap::new();
    let mut samples: BTreeMap<String, Row> = BTreeMap::new();
    for r in rows.iter() {
        let Some(s) = &r.session_uuid else { continue };
        let full = root.join(&r.path);
        let dir = full.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some((stem, _, ext)) = segment_name(&name) {
            sessions
                .entry(s.clone())
                .or_default()
                .insert((dir, stem.to_string(), ext.to_string()));
        }
        samples.entry(s.clone()).or_insert_with(|| r.clone());
    }
    for (session, keys) in sessions {
        // Any file of an index in the session's directories covers it.
        let covered: BTreeSet<u64> = keys
            .iter()
            .filter_map(|k| groups.get(k))
            .flat_map(|m| m.keys().copied())
            .collect();
        let Some(&last) = covered.iter().next_back() else {
            continue;
        };
        let Some((dir, stem, ext)) = keys.iter().next() else {
            continue;
        };
        let Some(sample) = samples.get(&session) else {
            continue;
        };
        for index in (0..last).filter(|i| !covered.contains(i)) {
            let file = format!("{stem}-{index:06}.{ext}");
            let mut r = empty_row(
                index,
                relative(root, &dir.join(&file)),
                Status::Missing,
                format!(
                    "neither the segment nor its sidecar is here (the session reaches index {last})"
                ),
            );
            r.host = sample.host.clone();
            r.boot_id = sample.boot_id.clone();
            r.session_uuid = sample.session_uuid.clone();
            rows.push(r);
        }
    }
}

/// Of several matching copies of one segment (session and index), the first
/// by path stays `ok`; the others are `duplicated`.
fn mark_duplicates(rows: &mut [Row]) {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[a].path.cmp(&rows[b].path));
    let mut first: BTreeMap<(String, u64), String> = BTreeMap::new();
    for i in order {
        let r = &rows[i];
        let (Status::Ok, Some(s)) = (r.status, &r.session_uuid) else {
            continue;
        };
        match first.get(&(s.clone(), r.index)) {
            Some(at) => {
                let problem = format!("a second copy of the segment at {at}");
                rows[i].status = Status::Duplicated;
                rows[i].problem = Some(problem);
            }
            None => {
                first.insert((s.clone(), r.index), r.path.clone());
            }
        }
    }
}

fn order_key(
    r: &Row,
) -> (
    Option<&String>,
    Option<&String>,
    Option<&String>,
    u64,
    &String,
) {
    (
        r.host.as_ref(),
        r.boot_id.as_ref(),
        r.session_uuid.as_ref(),
        r.index,
        &r.path,
    )
}

impl StoreReport {
    /// The rows that are not `ok`.
    pub(crate) fn problems(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.status != Status::Ok)
    }

    /// `Ok` when every segment is there and matches its sidecar, once.
    pub(crate) fn verdict(&self) -> Result<(), NotOk> {
        let mut counts: BTreeMap<Status, usize> = BTreeMap::new();
        for r in self.problems() {
            *counts.entry(r.status).or_default() += 1;
        }
        if counts.is_empty() {
            return Ok(());
        }
        Err(NotOk(counts))
    }

    /// This store's `ok` segments that `other` holds no matching copy of
    /// (same session, index and sha256): what is left to ship there.
    pub(crate) fn missing_from<'a>(&'a self, other: &StoreReport) -> Vec<&'a Row> {
        let there: BTreeSet<(&String, u64, &String)> = other
            .rows
            .iter()
            .filter(|r| r.status == Status::Ok)
            .filter_map(|r| Some((r.session_uuid.as_ref()?, r.index, r.sha256.as_ref()?)))
            .collect();
        self.rows
            .iter()
            .filter(|r| r.status == Status::Ok)
            .filter(|r| match (&r.session_uuid, &r.sha256) {
                (Some(s), Some(h)) => !there.contains(&(s, r.index, h)),
                _ => false,
            })
            .collect()
    }
}

/// A wall-clock time as people read it (UTC, to the second).
fn wall(ns: Option<u64>) -> String {
    ns.map_or_else(
        || "?".into(),
        |ns| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns),
            )
            .to_string()
        },
    )
}

/// `1 host`, `2 hosts`.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Text from a sidecar or a file name as printed for people: a store's
/// sidecars come from other machines, and a control character in them must
/// not reach the terminal.
fn shown(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

impl fmt::Display for StoreReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Sessions in order: (host, boot, session) → their rows.
        let mut sessions: BTreeMap<(String, String, String), Vec<&Row>> = BTreeMap::new();
        for r in &self.rows {
            let key = (
                r.host.clone().unwrap_or_else(|| "?".into()),
                r.boot_id.clone().unwrap_or_else(|| "?".into()),
                r.session_uuid.clone().unwrap_or_else(|| "?".into()),
            );
            sessions.entry(key).or_default().push(r);
        }
        let hosts: BTreeSet<&String> = sessions.keys().map(|k| &k.0).collect();
        let ok = self.rows.iter().filter(|r| r.status == Status::Ok).count();
        writeln!(
            f,
            "{}: {} of {} from {}; {ok} ok",
            shown(&self.root.display().to_string()),
            count(self.rows.len(), "segment"),
            count(sessions.len(), "session"),
            count(hosts.len(), "host")
        )?;
        writeln!(
            f,
            "\n  {:<20}  {:<8}  {:<8}  {:>8}  {:>12}  {:>12}  from … to (UTC)",
            "host", "boot", "session", "segments", "bytes", "lost bytes"
        )?;
        for ((host, boot, session), rows) in &sessions {
            let bytes: u64 = rows.iter().filter_map(|r| r.bytes).sum();
            let lost: u64 = rows.iter().filter_map(|r| r.lost_bytes).sum();
            let first = rows.iter().filter_map(|r| r.first_realtime_ns).min();
            let last = rows.iter().filter_map(|r| r.last_realtime_ns).max();
            writeln!(
                f,
                "  {:<20}  {:<8.8}  {:<8.8}  {:>8}  {:>12}  {:>12}  {} … {}",
                shown(host),
                shown(boot),
                shown(session),
                rows.len(),
                bytes,
                lost,
                wall(first),
                wall(last)
            )?;
        }
        let mut problems = self.problems().peekable();
        if problems.peek().is_some() {
            writeln!(f, "\nproblems:")?;
            for r in problems {
                writeln!(
                    f,
                    "  {:<10}  {}: {}",
                    r.status.name(),
                    shown(&r.path),
                    shown(r.problem.as_deref().unwrap_or(""))
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
