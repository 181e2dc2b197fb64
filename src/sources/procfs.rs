//! Reading `/proc` and `/sys` for the process and system stats sources.
//!
//! The roots are parameters ([`HostPaths`]) so tests read fixture trees.
//! Parsing works on byte slices of a reused read buffer: lines and words are
//! sub-slices, numbers are parsed in place, so the periodic readers do not
//! allocate per line.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Where the host's kernel interfaces are mounted, and its clock tick rate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPaths {
    /// procfs root, normally `/proc`.
    pub proc_root: PathBuf,
    /// sysfs root, normally `/sys`.
    pub(crate) sys_root: PathBuf,
    /// `USER_HZ`: the unit of the tick counts in `/proc/stat`.
    pub(crate) user_hz: u64,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            user_hz: rustix::param::clock_ticks_per_second().max(1),
        }
    }
}

impl HostPaths {
    /// A tree rooted elsewhere (fixtures), with the given tick rate.
    pub fn at(proc_root: impl Into<PathBuf>, sys_root: impl Into<PathBuf>, user_hz: u64) -> Self {
        Self {
            proc_root: proc_root.into(),
            sys_root: sys_root.into(),
            user_hz: user_hz.max(1),
        }
    }

    /// Nanoseconds per `USER_HZ` tick.
    pub(crate) fn ns_per_tick(&self) -> u64 {
        1_000_000_000 / self.user_hz
    }
}

/// A file kept open and re-read from offset 0 on every poll, as procfs
/// sequence files allow: one `pread` loop per poll, no open/close.
#[derive(Debug)]
pub(crate) struct PolledFile {
    path: PathBuf,
    file: Option<File>,
}

impl PolledFile {
    /// Opens `path`; a file that cannot be opened reads as absent (logged once).
    pub(crate) fn open(path: PathBuf) -> Self {
        let file = match File::open(&path) {
            Ok(f) => Some(f),
            Err(e) => {
                log::debug!("{}: {e}; its counters are skipped", path.display());
                None
            }
        };
        Self { path, file }
    }

    /// Reads the whole file into `buf` (cleared first). `None` when the file
    /// is absent or a read fails; a failed file is closed and not retried.
    pub(crate) fn read<'b>(&mut self, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
        buf.clear();
        let file = self.file.as_ref()?;
        match read_at_to_end(file, buf) {
            Ok(n) if n > 0 => Some(&buf[..n]),
            Ok(_) => None,
            Err(e) => {
                buf.clear();
                log::warn!(
                    "reading {}: {e}; its counters are skipped from now on",
                    self.path.display()
                );
                self.file = None;
                None
            }
        }
    }
}

fn read_at_to_end(file: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() < 4096 {
        buf.reserve(4096);
    }
    let mut len = 0;
    loop {
        if len == buf.len() {
            let grow = buf.len().max(4096);
            buf.resize(buf.len() + grow, 0);
        }
        let n = file.read_at(&mut buf[len..], len as u64)?;
        if n == 0 {
            break;
        }
        len += n;
    }
    buf.truncate(len);
    Ok(len)
}

/// Reads a whole file into `buf` (cleared first), returning its length.
pub fn read_file(path: &Path, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.clear();
    File::open(path)?.read_to_end(buf)
}

/// Non-empty lines of `buf`.
pub(crate) fn lines(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    buf.split(|b| *b == b'\n').filter(|l| !l.is_empty())
}

/// Words of a line, split on spaces and tabs.
pub(crate) fn words(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| *b == b' ' || *b == b'\t')
        .filter(|w| !w.is_empty())
}

/// The leading decimal digits of `s` as a number (saturating), 0 when there
/// are none: `"92 kB"` → 92, like `strtoull`, which the kernel's formats suit.
pub(crate) fn parse_u64(s: &[u8]) -> u64 {
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    v
}

/// Like [`parse_u64`] with an optional leading `-` (and leading blanks).
pub(crate) fn parse_i64(s: &[u8]) -> i64 {
    let s = trim_start(s);
    match s.strip_prefix(b"-") {
        Some(rest) => (parse_u64(rest).min(i64::MAX as u64) as i64).wrapping_neg(),
        None => parse_u64(s).min(i64::MAX as u64) as i64,
    }
}

/// Parses a whole word as an `i32`, `None` if it is not exactly a number.
pub(crate) fn parse_i32_exact(s: &[u8]) -> Option<i32> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn trim_start(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(s.len());
    &s[start..]
}

/// `s` without trailing newlines.
pub(crate) fn trim_newline(mut s: &[u8]) -> &[u8] {
    while let Some(rest) = s.strip_suffix(b"\n") {
        s = rest;
    }
    s
}

/// The value of `key:` in a `/proc/PID/status`-style file, without the
/// leading blanks: `status_field(b"Uid:\t0\t0\n", b"Uid")` → `b"0\t0"`.
pub(crate) fn status_field<'a>(status: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    lines(status).find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(b":")?;
        Some(trim_start(rest))
    })
}

/// The numbers of `status_field` after the first one (the root namespace's):
/// the ids in nested PID namespaces (`NSpid:\t1234\t7` → `[7]`).
pub(crate) fn namespaced_ids(status: &[u8]) -> Vec<i32> {
    match status_field(status, b"NSpid") {
        Some(v) => words(v).skip(1).filter_map(parse_i32_exact).collect(),
        None => Vec::new(),
    }
}

/// The positive numeric names of the directories in `dir`, ascending (the
/// pids under `/proc`, the tids under `/proc/PID/task`).
pub fn numeric_dirs(dir: &Path) -> io::Result<Vec<i32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            && id > 0
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// The names in `dir` that start with `prefix` followed by a number, with that
/// number, sorted by it (`cpu0`, `cpu1`, … or `thermal_zone0`, …).
pub(crate) fn numbered_entries(dir: &Path, prefix: &str) -> Vec<(u32, String)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(prefix)?.parse::<u32>().ok()?;
            Some((n, name))
        })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_like_strtoull() {
        assert_eq!(parse_u64(b"92 kB"), 92);
        assert_eq!(parse_u64(b"x"), 0);
        assert_eq!(parse_u64(b"99999999999999999999999"), u64::MAX);
        assert_eq!(parse_i64(b"-1000\n"), -1000);
        assert_eq!(parse_i64(b" 12"), 12);
        assert_eq!(parse_i32_exact(b"12a"), None);
        assert_eq!(parse_i32_exact(b"-3"), Some(-3));
    }

    #[test]
    fn status_fields_and_namespaces() {
        let s = b"Name:\tsleep\nTgid:\t12\nNSpid:\t12275\t1\nUid:\t1000\t1001\t0\t0\n";
        assert_eq!(status_field(s, b"Name"), Some(&b"sleep"[..]));
        assert_eq!(status_field(s, b"Uid"), Some(&b"1000\t1001\t0\t0"[..]));
        assert_eq!(status_field(s, b"Ui"), None, "keys match whole");
        assert_eq!(namespaced_ids(s), vec![1]);
        assert_eq!(namespaced_ids(b"NSpid:\t5\n"), Vec::<i32>::new());
    }

    #[test]
    fn lines_and_words_skip_blanks() {
        let l: Vec<_> = lines(b"a b\n\n c\t d \n").collect();
        assert_eq!(l, vec![&b"a b"[..], &b" c\t d "[..]]);
        let w: Vec<_> = words(l[1]).collect();
        assert_eq!(w, vec![&b"c"[..], &b"d"[..]]);
        assert_eq!(trim_newline(b"x\n\n"), b"x");
    }
}
