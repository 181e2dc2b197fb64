//! Where the segments of one session live and how they are named.
//!
//! ```text
//!  -o DIR/            DIR/trace-000000.pftrace, DIR/trace-000001.pftrace, …
//!  -o DIR/run.pftrace DIR/run-000000.pftrace,   DIR/run-000001.pftrace,   …
//!  while written      DIR/run-000001.pftrace.partial
//!  beside each        DIR/run-000001.pftrace.json   (the sidecar)
//! ```
//!
//! Six digits keep the names sorting in order for a million segments (the
//! index keeps counting past that; names just grow a digit).

use std::path::{Path, PathBuf};

/// The file names of one session's segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentNames {
    pub dir: PathBuf,
    pub(crate) stem: String,
    pub ext: String,
}

/// The suffix of a segment still being written.
pub(crate) const PARTIAL_SUFFIX: &str = ".partial";
/// The suffix of a segment's sidecar.
pub(crate) const SIDECAR_SUFFIX: &str = ".json";

impl SegmentNames {
    /// Names from `-o`: a directory (existing, or given with a trailing `/`)
    /// holds `trace-NNNNNN.pftrace`; a file path `DIR/NAME.EXT` becomes
    /// `DIR/NAME-NNNNNN.EXT`.
    pub(crate) fn from_output(out: &Path) -> Self {
        let as_dir = out.as_os_str().to_string_lossy().ends_with('/') || out.is_dir();
        if as_dir {
            return Self {
                dir: out.to_path_buf(),
                stem: "trace".into(),
                ext: "pftrace".into(),
            };
        }
        let dir = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let stem = out
            .file_stem()
            .map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
        let ext = out
            .extension()
            .map_or_else(|| "pftrace".into(), |s| s.to_string_lossy().into_owned());
        Self { dir, stem, ext }
    }

    /// The closed segment's file name.
    pub(crate) fn file_name(&self, index: u64) -> String {
        format!("{}-{index:06}.{}", self.stem, self.ext)
    }

    /// The file name while it is written.
    pub(crate) fn partial_name(&self, index: u64) -> String {
        format!("{}{PARTIAL_SUFFIX}", self.file_name(index))
    }

    /// The sidecar's file name.
    pub(crate) fn sidecar_name(&self, index: u64) -> String {
        format!("{}{SIDECAR_SUFFIX}", self.file_name(index))
    }

    /// The closed segment's path.
    pub(crate) fn path(&self, index: u64) -> PathBuf {
        self.dir.join(self.file_name(index))
    }

    /// The path while it is written.
    pub(crate) fn partial(&self, index: u64) -> PathBuf {
        self.dir.join(self.partial_name(index))
    }

    /// The sidecar's path.
    pub(crate) fn sidecar(&self, index: u64) -> PathBuf {
        self.dir.join(self.sidecar_name(index))
    }

    /// The index of a file of this set (closed, partial or sidecar), if it is one.
    pub(crate) fn index_of(&self, file_name: &str) -> Option<u64> {
        let rest = file_name.strip_prefix(&self.stem)?.strip_prefix('-')?;
        let digits_end = rest.find(|c: char| !c.is_ascii_digit())?;
        let (digits, tail) = rest.split_at(digits_end);
        if digits.len() < 6 {
            return None;
        }
        let tail = tail.strip_prefix('.')?.strip_prefix(self.ext.as_str())?;
        if tail.is_empty() || tail == PARTIAL_SUFFIX || tail == SIDECAR_SUFFIX {
            digits.parse().ok()
        } else {
            None
        }
    }

    /// Files of this set among `entries` (a directory's names), as paths,
    /// sorted.
    pub(crate) fn existing_among(&self, entries: &[String]) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = entries
            .iter()
            .filter(|n| self.index_of(n).is_some())
            .map(|n| self.dir.join(n))
            .collect();
        found.sort();
        found
    }

    /// Files of this set already in the directory (sorted), so a new session
    /// does not mix its segments with an earlier one's.
    #[cfg(test)]
    pub(crate) fn existing(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut found = Vec::new();
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(e),
        };
        for entry in rd {
            let entry = entry?;
            let name = entry.file_name();
            if self.index_of(&name.to_string_lossy()).is_some() {
                found.push(entry.path());
            }
        }
        found.sort();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_a_directory_and_from_a_file() {
        let d = SegmentNames::from_output(Path::new("/tmp/out/"));
        assert_eq!(d.path(3), Path::new("/tmp/out/trace-000003.pftrace"));
        assert_eq!(
            d.partial(3),
            Path::new("/tmp/out/trace-000003.pftrace.partial")
        );
        assert_eq!(
            d.sidecar(12),
            Path::new("/tmp/out/trace-000012.pftrace.json")
        );
        let f = SegmentNames::from_output(Path::new("/x/run.perfetto-trace"));
        assert_eq!(f.path(0), Path::new("/x/run-000000.perfetto-trace"));
        let bare = SegmentNames::from_output(Path::new("t"));
        assert_eq!(bare.path(1_234_567), Path::new("./t-1234567.pftrace"));
    }

    #[test]
    fn recognises_its_own_files_only() {
        let n = SegmentNames::from_output(Path::new("/d/run.pftrace"));
        assert_eq!(n.index_of("run-000007.pftrace"), Some(7));
        assert_eq!(n.index_of("run-000007.pftrace.partial"), Some(7));
        assert_eq!(n.index_of("run-000007.pftrace.json"), Some(7));
        assert_eq!(n.index_of("run-1234567.pftrace"), Some(1_234_567));
        for other in [
            "run.pftrace",
            "run-7.pftrace",
            "run-000007.pftrace.bak",
            "runx-000007.pftrace",
            "run-000007.json",
            "other-000001.pftrace",
        ] {
            assert_eq!(n.index_of(other), None, "{other}");
        }
    }

    #[test]
    fn lists_existing_files_of_the_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = SegmentNames::from_output(&dir.path().join("s.pftrace"));
        assert!(n.existing().expect("lists").is_empty());
        std::fs::write(n.path(2), b"").expect("write");
        std::fs::write(n.sidecar(2), b"{}").expect("write");
        std::fs::write(dir.path().join("unrelated.pftrace"), b"").expect("write");
        assert_eq!(n.existing().expect("lists"), vec![n.path(2), n.sidecar(2)]);
    }
}
