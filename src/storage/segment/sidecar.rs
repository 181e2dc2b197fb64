//! The JSON written beside each closed segment, for whatever ships or
//! indexes segments without opening them: where and when it was recorded,
//! what it holds, what was lost in it and why, and its sha256.
//!
//! It is written to a temporary name, fdatasync'd and renamed, so a reader
//! never sees half a sidecar; a segment whose sidecar is present is closed.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::policy::RotateReason;
use crate::storage::create::OutputDir;

/// Format version of the sidecar.
pub(crate) const SIDECAR_VERSION: u32 = 1;

/// What was lost while a segment was the one being written, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SegmentLoss {
    /// RING_BUFFER reused chunks nobody had read.
    pub bytes_overwritten: u64,
    pub packets_overwritten: u64,
    /// DISCARD refused packets while full.
    pub bytes_discarded: u64,
    pub packets_discarded: u64,
    /// Packets too big for their buffer.
    pub packets_refused: u64,
    /// Events sources lost before they reached a buffer (ftrace: the
    /// kernel overwrote or dropped them before they were read). Absent in
    /// sidecars written before it existed.
    #[serde(default)]
    pub events_lost_upstream: u64,
    /// One sentence per kind of loss, with what to change; empty when nothing was lost.
    pub why: Vec<String>,
}

impl SegmentLoss {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes_overwritten == 0
            && self.bytes_discarded == 0
            && self.packets_overwritten == 0
            && self.packets_discarded == 0
            && self.packets_refused == 0
            && self.events_lost_upstream == 0
    }
}

/// A sidecar that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SidecarError {
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "made by `Sidecar::read`, which only tests use")
    )]
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The sidecar of one segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Sidecar {
    pub version: u32,
    /// The segment's file name (in the same directory).
    pub file: String,
    pub index: u64,
    /// The machine: `uname -n`, and the kernel's boot id (timestamps are
    /// CLOCK_BOOTTIME of that boot).
    pub host: String,
    pub boot_id: String,
    /// The recording session (the same in every segment of the set).
    pub session_uuid: String,
    /// The segment's own trace UUID (its `trace_uuid` packet).
    pub trace_uuid: String,
    /// BOOTTIME ns when the segment was opened and when its last write pass
    /// ended (its service packets carry these times; data read in its first
    /// pass may be up to one write period older).
    pub(crate) first_timestamp_ns: u64,
    pub(crate) last_timestamp_ns: u64,
    /// The same two instants on the wall clock (REALTIME ns since the
    /// epoch, read with BOOTTIME when the segment closed), so segments of
    /// different machines can be placed on one time line. Absent in
    /// sidecars written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_realtime_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_realtime_ns: Option<u64>,
    /// TracePackets in it (inside compressed packets, when compressed).
    pub packets: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// Bytes of its packets before compression (equal to `bytes` without).
    pub(crate) uncompressed_bytes: u64,
    /// `zstd` with its level, or `none`.
    pub compression: String,
    pub loss: SegmentLoss,
    /// Why it was cut (`size`, `period`), or how the session ended
    /// (`end`, or `write_failed` when the output failed: then it holds the
    /// passes written before the failure).
    pub closed_by: String,
    /// sha256 of the file, hex.
    pub sha256: String,
}

impl Sidecar {
    /// How a rotation reason reads in `closed_by`.
    pub(crate) fn closed_by_rotation(r: RotateReason) -> &'static str {
        match r {
            RotateReason::Size => "size",
            RotateReason::Period => "period",
            RotateReason::Requested => "requested",
        }
    }

    /// Writes `self` as `name` in `dir` atomically: a temporary file made
    /// there, fdatasync, rename. Returns its size and identity.
    pub(crate) fn write_atomically(
        &self,
        dir: &OutputDir,
        name: &str,
    ) -> std::io::Result<(u64, crate::storage::create::FileId)> {
        let (tmp, fd) = dir.create_temp(name).map_err(std::io::Error::other)?;
        let result = (|| {
            let id = crate::storage::create::file_id(&fd)?;
            let mut f = std::fs::File::from(fd);
            let mut text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
            text.push(b'\n');
            f.write_all(&text)?;
            f.sync_data()?;
            dir.rename(&tmp, name).map_err(std::io::Error::other)?;
            Ok((text.len() as u64, id))
        })();
        if result.is_err() {
            let _ = dir.remove(&tmp);
        }
        result
    }

    /// Reads a sidecar the recorder wrote itself (tests, tools on its own
    /// directory). Readers of shared directories read the bytes with
    /// `trace::untrusted` and parse them with [`Sidecar::parse`].
    #[cfg(test)]
    pub(crate) fn read(path: &Path) -> Result<Sidecar, SidecarError> {
        let bytes = std::fs::read(path).map_err(|source| SidecarError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &bytes)
    }

    /// A sidecar from its bytes (untrusted: any file in the directory);
    /// `path` names it in errors.
    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Sidecar, SidecarError> {
        serde_json::from_slice(bytes).map_err(|source| SidecarError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A UUID as people write it.
pub(crate) fn uuid_text(msb: i64, lsb: i64) -> String {
    let b: Vec<u8> = msb
        .to_be_bytes()
        .into_iter()
        .chain(lsb.to_be_bytes())
        .collect();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// This machine's name and boot id (empty when unreadable).
pub(crate) fn host_and_boot_id() -> (String, String) {
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    (host, boot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.json");
        let s = Sidecar {
            version: SIDECAR_VERSION,
            file: "t-000000.pftrace".into(),
            index: 0,
            host: "h".into(),
            boot_id: "b".into(),
            session_uuid: uuid_text(1, 2),
            trace_uuid: uuid_text(1, 3),
            first_timestamp_ns: 5,
            last_timestamp_ns: 9,
            first_realtime_ns: Some(1_000_005),
            last_realtime_ns: Some(1_000_009),
            packets: 3,
            bytes: 100,
            uncompressed_bytes: 100,
            compression: "none".into(),
            loss: SegmentLoss::default(),
            closed_by: "size".into(),
            sha256: "00".into(),
        };
        let od = OutputDir::open(dir.path()).expect("dir");
        s.write_atomically(&od, "s.json").expect("writes");
        assert_eq!(Sidecar::read(&path).expect("reads"), s);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.json")]);
        // A sidecar from before the wall-clock fields still reads.
        let mut old = serde_json::to_value(&s).expect("json");
        if let Some(o) = old.as_object_mut() {
            o.remove("first_realtime_ns");
            o.remove("last_realtime_ns");
        }
        std::fs::write(&path, old.to_string()).expect("write");
        let read = Sidecar::read(&path).expect("reads");
        assert_eq!(
            (read.first_realtime_ns, read.last_realtime_ns),
            (None, None)
        );
        std::fs::write(&path, b"{").expect("write");
        assert!(Sidecar::read(&path).is_err());
    }

    #[test]
    fn uuid_text_is_the_usual_form() {
        assert_eq!(
            uuid_text(0x0123_4567_89ab_cdef, -1),
            "01234567-89ab-cdef-ffff-ffffffffffff"
        );
    }
}
