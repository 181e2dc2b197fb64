//! The 24-hour history of accepted triggers, for `max_per_24_h`. It lives
//! in the runtime directory so it survives a restart of the recorder, one
//! file per user (`trigger-history.UID`: a user's sessions share it, no
//! other user can write to it), updated under `flock` so concurrent sessions
//! agree. One line per accepted trigger: `UNIX_SECONDS NAME`.
//!
//! The directory is shared with every local user, so the file is opened
//! only through [`RuntimeDir::open_own_file`] (no symlink, no FIFO, only a
//! mode-0600 regular file of ours), read up to [`MAX_FILE_BYTES`], kept under
//! that size by dropping the oldest entries, and locked without waiting
//! longer than [`LOCK_WAIT`]: a trigger never waits on this file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};

use super::runtime_dir::{OwnFileError, RuntimeDir};

const WINDOW_SECS: u64 = 24 * 3600;
/// The most the file holds; older entries go first when it would grow past.
pub(crate) const MAX_FILE_BYTES: usize = 256 * 1024;
/// How long a lookup or an update waits for another session's lock.
pub(crate) const LOCK_WAIT: Duration = Duration::from_millis(200);

/// Errors of the history (the session warns and goes on without it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum HistoryError {
    #[error("{0}")]
    File(#[from] OwnFileError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("still locked by another session after {} ms", LOCK_WAIT.as_millis())]
    Locked,
}

/// The trigger history of the current user in one runtime directory.
#[derive(Clone, Debug)]
pub(crate) struct TriggerHistory {
    dir: RuntimeDir,
    name: String,
    /// The file opened once, for a session that gives up root after its
    /// set-up (the file stays root's).
    held: Option<std::sync::Arc<File>>,
}

/// Releases the lock on a descriptor that stays open elsewhere.
struct Unlock<'a>(&'a File);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

impl TriggerHistory {
    /// The history file of the current user in `dir`.
    pub(crate) fn new(dir: &RuntimeDir) -> Self {
        Self {
            dir: dir.clone(),
            name: format!("trigger-history.{}", rustix::process::geteuid().as_raw()),
            held: None,
        }
    }

    /// Opens (creating) the file now and keeps it: from here on lookups and
    /// updates use this descriptor, so they work after a privilege drop.
    pub(crate) fn hold_open(&mut self) -> Result<(), HistoryError> {
        let f = self
            .dir
            .open_own_file(&self.name, true)?
            .ok_or_else(|| std::io::Error::other("the history file was not created"))?;
        self.held = Some(std::sync::Arc::new(f));
        Ok(())
    }

    fn file(&self, create: bool) -> Result<Option<File>, HistoryError> {
        match &self.held {
            Some(f) => Ok(Some(f.try_clone()?)),
            None => Ok(self.dir.open_own_file(&self.name, create)?),
        }
    }

    fn lock(f: &File, op: FlockOperation) -> Result<(), HistoryError> {
        let t0 = Instant::now();
        loop {
            match flock(f, op) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
            if t0.elapsed() >= LOCK_WAIT {
                return Err(HistoryError::Locked);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn entries(f: &mut File, now_secs: u64) -> std::io::Result<Vec<(u64, String)>> {
        let mut raw = Vec::new();
        f.seek(SeekFrom::Start(0))?;
        f.take(MAX_FILE_BYTES as u64).read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
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
    pub(crate) fn count(&self, name: &str, now_secs: u64) -> Result<u32, HistoryError> {
        let Some(mut f) = self.file(false)? else {
            return Ok(0);
        };
        Self::lock(&f, FlockOperation::NonBlockingLockShared)?;
        let g = f.try_clone()?;
        let _unlock = Unlock(&g);
        let n = Self::entries(&mut f, now_secs)?
            .iter()
            .filter(|(_, n)| n == name)
            .count();
        Ok(n as u32)
    }

    /// Records an acceptance of `name` at `now_secs`, dropping entries older
    /// than 24 hours (and the oldest ones beyond [`MAX_FILE_BYTES`]).
    pub(crate) fn record(&self, name: &str, now_secs: u64) -> Result<(), HistoryError> {
        let mut f = self
            .file(true)?
            .ok_or_else(|| std::io::Error::other("the history file was not created"))?;
        Self::lock(&f, FlockOperation::NonBlockingLockExclusive)?;
        let g = f.try_clone()?;
        let _unlock = Unlock(&g);
        let mut entries = Self::entries(&mut f, now_secs)?;
        entries.push((now_secs, name.to_string()));
        let lines: Vec<String> = entries.iter().map(|(t, n)| format!("{t} {n}\n")).collect();
        let mut total: usize = lines.iter().map(String::len).sum();
        let mut skip = 0;
        while total > MAX_FILE_BYTES && skip < lines.len() {
            total -= lines[skip].len();
            skip += 1;
        }
        let text: String = lines[skip..].concat();
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }
}

/// Seconds since the epoch.
pub(crate) fn now_secs() -> u64 {
    crate::clock::realtime_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::runtime_dir::open_checked;

    #[test]
    fn counts_within_the_window_and_survives_reopen() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_checked(&t.path().join("run")).expect("dir");
        let h = TriggerHistory::new(&dir);
        assert_eq!(h.count("a", 1_000_000).expect("count"), 0);
        h.record("a", 1_000_000).expect("record");
        h.record("a", 1_000_100).expect("record");
        h.record("b", 1_000_100).expect("record");
        let again = TriggerHistory::new(&dir);
        assert_eq!(again.count("a", 1_000_200).expect("count"), 2);
        // 24 h after the first entry it falls out of the window.
        assert_eq!(again.count("a", 1_000_000 + WINDOW_SECS).expect("count"), 1);
        assert_eq!(again.count("b", 1_000_200).expect("count"), 1);
    }

    #[test]
    fn stays_bounded_and_never_waits_long_for_a_lock() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_checked(&t.path().join("run")).expect("dir");
        let h = TriggerHistory::new(&dir);
        let long = "n".repeat(250);
        for i in 0..1100 {
            h.record(&long, 1_000_000 + i).expect("record");
        }
        let len = std::fs::metadata(dir.path().join(&h.name))
            .expect("stat")
            .len();
        assert!(len as usize <= MAX_FILE_BYTES, "{len}");
        assert!(h.count(&long, 1_002_000).expect("count") > 900);
        // Someone holds the lock: the lookup gives up after LOCK_WAIT.
        let f = dir
            .open_own_file(&h.name, false)
            .expect("open")
            .expect("exists");
        flock(&f, FlockOperation::LockExclusive).expect("lock");
        let t0 = Instant::now();
        assert!(matches!(h.count("x", 1), Err(HistoryError::Locked)));
        assert!(t0.elapsed() < LOCK_WAIT * 10);
    }
}
