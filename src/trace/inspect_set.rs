//! `recorder inspect DIR`: a whole set of segments at once. Each segment is
//! inspected on its own (it must be a complete trace), checked against its
//! sidecar (size, sha256), and the set is read across its cuts: missing
//! indices, the time between one segment's last packet and the next one's
//! first, `for_testing` counters that skip or repeat at a cut, and the loss
//! in each segment.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::inspect::{InspectReport, report_file};
use crate::storage::segment::names::SegmentNames;
use crate::storage::segment::sidecar::Sidecar;

/// One segment of the set.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SegmentSeen {
    pub index: u64,
    pub path: PathBuf,
    /// Still under its `.partial` name (being written, or the session died).
    pub partial: bool,
    pub bytes: u64,
    pub packets: u64,
    /// Bytes of the packets, decompressed (equal to `bytes` when uncompressed).
    pub(crate) uncompressed_bytes: u64,
    pub(crate) first_timestamp: Option<u64>,
    pub(crate) last_timestamp: Option<u64>,
    /// Packets marked `previous_packet_dropped` in it.
    pub(crate) packets_after_loss: u64,
    /// The sidecar's account of loss (bytes), and why.
    pub(crate) sidecar_lost_bytes: Option<u64>,
    /// Events its sources lost before their buffers, per the sidecar.
    pub(crate) sidecar_lost_events_upstream: Option<u64>,
    pub(crate) sidecar_loss_why: Vec<String>,
    /// Whether it has a sidecar, and whether size and sha256 match it.
    pub sidecar: bool,
    pub(crate) sidecar_matches: Option<bool>,
    /// Its own problem, if it is not a valid trace.
    pub error: Option<String>,
    /// `for_testing` counters per sequence: (first, last).
    #[serde(skip)]
    counters: BTreeMap<u32, (u64, u64)>,
}

/// Something between two neighbouring segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Cut {
    /// The segments on either side.
    pub before: u64,
    pub after: u64,
    /// Segments missing between them (deleted by a budget, or lost).
    pub missing_segments: u64,
    /// ns from the last timestamped packet of one to the first of the next.
    pub(crate) time_gap_ns: Option<i64>,
    /// for_testing counters skipped (`missing`) or repeated at the cut, per sequence.
    pub counters_missing: u64,
    pub counters_repeated: u64,
}

/// The whole set.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SetReport {
    pub dir: PathBuf,
    pub name: String,
    pub segments: Vec<SegmentSeen>,
    pub cuts: Vec<Cut>,
    pub bytes: u64,
    pub(crate) uncompressed_bytes: u64,
    pub packets: u64,
}

/// Inspecting a directory failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetError {
    #[error("cannot read {dir}: {source}")]
    Read {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: no segments (NAME-NNNNNN.EXT files) here")]
    Empty(PathBuf),
}

/// Why a set of segments fails inspection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SetFault {
    /// The segment is not a valid trace (as its report tells).
    #[error("segment {index}: {error}")]
    Segment {
        index: u64,
        /// The report's words: a [`SegmentSeen`] keeps its error as text,
        /// as it is printed as JSON.
        error: String,
    },
    #[error("segment {0}: size or sha256 differs from its sidecar")]
    SidecarMismatch(u64),
    #[error("packets repeated across the cut between segments {before} and {after}")]
    Repeated { before: u64, after: u64 },
}

/// Segment files by (stem, extension): (index, path) each.
type Sets = BTreeMap<(String, String), Vec<(u64, PathBuf)>>;

/// The sets of segments in `dir`.
fn sets_in(dir: &Path) -> Result<Sets, SetError> {
    let rd = std::fs::read_dir(dir).map_err(|source| SetError::Read {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut sets = Sets::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let trace_name = name.strip_suffix(".partial").unwrap_or(&name);
        let Some((stem, index, ext)) = segment_name(trace_name) else {
            continue;
        };
        sets.entry((stem.to_string(), ext.to_string()))
            .or_default()
            .push((index, entry.path()));
    }
    Ok(sets)
}

/// `NAME-NNNNNN.EXT` (six digits or more) as (NAME, index, EXT); None for
/// any other name, sidecars (`….json`) and temporary files included.
pub(crate) fn segment_name(file_name: &str) -> Option<(&str, u64, &str)> {
    let (stem_idx, ext) = file_name.rsplit_once('.')?;
    let (stem, idx) = stem_idx.rsplit_once('-')?;
    if ext == "json" || ext == "tmp" || idx.len() < 6 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem, idx.parse().ok()?, ext))
}

/// The sha256 of a file, hex; None when it cannot be read.
pub(crate) fn sha256_file(path: &Path) -> Option<String> {
    let (mut f, _) = super::untrusted::open_regular(path).ok()?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).ok()?;
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn seen(index: u64, path: &Path, names: &SegmentNames) -> SegmentSeen {
    let partial = path.to_string_lossy().ends_with(".partial");
    let mut s = SegmentSeen {
        index,
        path: path.to_path_buf(),
        partial,
        bytes: super::untrusted::open_regular(path).map_or(0, |(_, size)| size),
        packets: 0,
        uncompressed_bytes: 0,
        first_timestamp: None,
        last_timestamp: None,
        packets_after_loss: 0,
        sidecar_lost_bytes: None,
        sidecar_lost_events_upstream: None,
        sidecar_loss_why: Vec::new(),
        sidecar: false,
        sidecar_matches: None,
        error: None,
        counters: BTreeMap::new(),
    };
    match report_file(path) {
        Ok(r) => {
            absorb(&mut s, &r);
            if let Err(e) = r.verdict() {
                s.error = Some(e.to_string());
            }
        }
        Err(e) => {
            s.error = Some(e.to_string());
        }
    }
    let car_path = names.sidecar(index);
    if !partial
        && let Ok(bytes) = super::untrusted::read_at_most(&car_path, 1 << 20)
        && let Ok(car) = Sidecar::parse(&car_path, &bytes)
    {
        s.sidecar = true;
        s.sidecar_lost_bytes = Some(car.loss.bytes_overwritten + car.loss.bytes_discarded);
        s.sidecar_lost_events_upstream = Some(car.loss.events_lost_upstream);
        s.sidecar_loss_why = car.loss.why.clone();
        let matches = car.bytes == s.bytes && sha256_file(path).is_some_and(|h| h == car.sha256);
        s.sidecar_matches = Some(matches);
    }
    s
}

fn absorb(s: &mut SegmentSeen, r: &InspectReport) {
    s.packets = r.packets;
    s.uncompressed_bytes = r.compressed.map_or(r.packet_bytes, |c| {
        r.packet_bytes - c.bytes + c.uncompressed_bytes
    });
    s.first_timestamp = r
        .by_sequence
        .values()
        .filter_map(|q| q.first_timestamp)
        .min();
    s.last_timestamp = r
        .by_sequence
        .values()
        .filter_map(|q| q.last_timestamp)
        .max();
    s.packets_after_loss = r.losses;
    for (id, q) in &r.by_sequence {
        if let Some(t) = &q.for_testing {
            s.counters.insert(*id, (t.first, t.last));
        }
    }
}

/// Inspects every segment of the set in `dir` (the largest set, when the
/// directory holds several names).
pub(crate) fn report_dir(dir: &Path) -> Result<SetReport, SetError> {
    let sets = sets_in(dir)?;
    let Some(((stem, ext), mut files)) = sets.into_iter().max_by_key(|(_, v)| v.len()) else {
        return Err(SetError::Empty(dir.to_path_buf()));
    };
    files.sort();
    let names = SegmentNames {
        dir: dir.to_path_buf(),
        stem: stem.clone(),
        ext: ext.clone(),
    };
    let mut r = SetReport {
        dir: dir.to_path_buf(),
        name: format!("{stem}-NNNNNN.{ext}"),
        ..Default::default()
    };
    for (index, path) in &files {
        let s = seen(*index, path, &names);
        r.bytes += s.bytes;
        r.uncompressed_bytes += s.uncompressed_bytes;
        r.packets += s.packets;
        r.segments.push(s);
    }
    for w in r.segments.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let mut cut = Cut {
            before: a.index,
            after: b.index,
            missing_segments: b.index.saturating_sub(a.index + 1),
            time_gap_ns: match (a.last_timestamp, b.first_timestamp) {
                (Some(x), Some(y)) => Some(y as i64 - x as i64),
                _ => None,
            },
            counters_missing: 0,
            counters_repeated: 0,
        };
        if cut.missing_segments == 0 {
            for (seq, (_, last)) in &a.counters {
                if let Some((first, _)) = b.counters.get(seq) {
                    if *first <= *last {
                        cut.counters_repeated += last - first + 1;
                    } else {
                        cut.counters_missing += first - last - 1;
                    }
                }
            }
        }
        r.cuts.push(cut);
    }
    Ok(r)
}

impl SetReport {
    /// `Ok` when every segment is a valid trace matching its sidecar and no
    /// counter repeats across a cut.
    pub(crate) fn verdict(&self) -> Result<(), SetFault> {
        for s in &self.segments {
            if let Some(e) = &s.error {
                return Err(SetFault::Segment {
                    index: s.index,
                    error: e.clone(),
                });
            }
            if s.sidecar_matches == Some(false) {
                return Err(SetFault::SidecarMismatch(s.index));
            }
        }
        if let Some(c) = self.cuts.iter().find(|c| c.counters_repeated > 0) {
            return Err(SetFault::Repeated {
                before: c.before,
                after: c.after,
            });
        }
        Ok(())
    }
}

impl fmt::Display for SetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} segments ({}), {} bytes holding {} bytes of packets ({:.2}x), {} packets",
            self.dir.display(),
            self.segments.len(),
            self.name,
            self.bytes,
            self.uncompressed_bytes,
            self.uncompressed_bytes as f64 / self.bytes.max(1) as f64,
            self.packets
        )?;
        writeln!(
            f,
            "\n  index  {:>12}  {:>10}  {:>8}  {:>14}  sidecar",
            "bytes", "packets", "ratio", "after loss"
        )?;
        for s in &self.segments {
            let car = match (s.sidecar, s.sidecar_matches, s.partial) {
                (_, _, true) => "partial (being written, or the session died)".to_string(),
                (true, Some(true), _) => "ok".to_string(),
                (true, _, _) => "MISMATCH".to_string(),
                (false, _, _) => "missing".to_string(),
            };
            write!(
                f,
                "  {:>5}  {:>12}  {:>10}  {:>7.2}x  {:>14}  {car}",
                s.index,
                s.bytes,
                s.packets,
                s.uncompressed_bytes as f64 / s.bytes.max(1) as f64,
                s.packets_after_loss
            )?;
            let mut lost = Vec::new();
            if let Some(b) = s.sidecar_lost_bytes.filter(|l| *l > 0) {
                lost.push(format!("{b} bytes"));
            }
            if let Some(e) = s.sidecar_lost_events_upstream.filter(|l| *l > 0) {
                lost.push(format!("{e} events upstream"));
            }
            if !lost.is_empty() {
                write!(
                    f,
                    "  lost {}: {}",
                    lost.join(", "),
                    s.sidecar_loss_why.join("; ")
                )?;
            }
            if let Some(e) = &s.error {
                write!(f, "  ERROR: {e}")?;
            }
            writeln!(f)?;
        }
        if !self.cuts.is_empty() {
            writeln!(f, "\ncuts:")?;
            for c in &self.cuts {
                write!(f, "  {} → {}:", c.before, c.after)?;
                if c.missing_segments > 0 {
                    write!(f, " {} segment(s) missing", c.missing_segments)?;
                }
                if let Some(g) = c.time_gap_ns {
                    write!(f, " {:.3} s between packets", g as f64 / 1e9)?;
                }
                if c.counters_missing > 0 {
                    write!(f, ", {} for_testing packets missing", c.counters_missing)?;
                }
                if c.counters_repeated > 0 {
                    write!(f, ", {} for_testing packets REPEATED", c.counters_repeated)?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}
