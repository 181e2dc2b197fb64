//! The machine-wide 24-hour history of accepted triggers, for
//! `max_per_24_h`. It lives in the runtime directory so it survives a
//! restart of the recorder, and is updated under `flock`, so concurrent
//! sessions agree. One line per accepted trigger: `UNIX_SECONDS NAME`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

const WINDOW_SECS: u64 = 24 * 3600;
const FILE_NAME: &str = "trigger-history";

/// The trigger history in one runtime directory.
#[derive(Clone, Debug)]
pub struct TriggerHistory {
    path: PathBuf,
}

impl TriggerHistory {
    pub fn new(runtime_dir: &Path) -> Self {
        Self {
            path: runtime_dir.join(FILE_NAME),
        }
    }

    fn open(&self) -> std::io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&self.path)
    }

    fn entries(f: &mut File, now_secs: u64) -> std::io::Result<Vec<(u64, String)>> {
        let mut text = String::new();
        f.seek(SeekFrom::Start(0))?;
        f.read_to_string(&mut text)?;
        Ok(text
            .lines()
            .filter_map(|l| {
                let (t, name) = l.split_once(' ')?;
                let t: u64 = t.parse().ok()?;
                (now_secs.saturating_sub(t) < WINDOW_SECS).then(|| (t, name.to_string()))
            })
            .collect())
    }

    /// How many times `name` was accepted in the 24 hours before `now_secs`.
    pub fn count(&self, name: &str, now_secs: u64) -> std::io::Result<u32> {
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        flock(&f, FlockOperation::LockShared)?;
        let n = Self::entries(&mut f, now_secs)?
            .iter()
            .filter(|(_, n)| n == name)
            .count();
        Ok(n as u32)
    }

    /// Records an acceptance of `name` at `now_secs`, dropping entries older
    /// than 24 hours.
    pub fn record(&self, name: &str, now_secs: u64) -> std::io::Result<()> {
        let mut f = self.open()?;
        flock(&f, FlockOperation::LockExclusive)?;
        let mut entries = Self::entries(&mut f, now_secs)?;
        entries.push((now_secs, name.to_string()));
        let mut text = String::new();
        for (t, n) in &entries {
            text.push_str(&format!("{t} {n}\n"));
        }
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }
}

/// Seconds since the epoch.
pub fn now_secs() -> u64 {
    crate::clock::realtime_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_within_the_window_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = TriggerHistory::new(dir.path());
        assert_eq!(h.count("a", 1_000_000).expect("count"), 0);
        h.record("a", 1_000_000).expect("record");
        h.record("a", 1_000_100).expect("record");
        h.record("b", 1_000_100).expect("record");
        let again = TriggerHistory::new(dir.path());
        assert_eq!(again.count("a", 1_000_200).expect("count"), 2);
        // 24 h after the first entry it falls out of the window.
        assert_eq!(again.count("a", 1_000_000 + WINDOW_SECS).expect("count"), 1);
        assert_eq!(again.count("b", 1_000_200).expect("count"), 1);
    }
}
