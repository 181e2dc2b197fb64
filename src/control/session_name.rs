//! `unique_session_name`: at most one live session of a user carries a
//! given name. The session holds an exclusive `flock` on a file of its own in
//! the runtime directory (`session.UID.NAME.lock`, holding its pid) for its
//! whole life; the kernel drops the lock when the process dies, so a file
//! left by a crash never blocks the next session.
//!
//! Names are per user: the directory is shared with every local user, and a
//! name held by someone else's process must not keep a root session from
//! starting. The file is opened only through [`RuntimeDir::open_own_file`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

use rustix::fs::{AtFlags, FlockOperation, flock};
use rustix::io::Errno;

use super::ControlError;
use super::runtime_dir::RuntimeDir;

/// The longest part of a file name taken from the session name as is.
const MAX_NAME_IN_FILE: usize = 160;

/// A held session name; dropping it releases the name.
#[derive(Debug)]
pub(crate) struct SessionNameLock {
    dir: RuntimeDir,
    file_name: String,
    file: File,
}

/// The lock file's name for `name` of user `uid`: characters other than
/// `[A-Za-z0-9_-]` are %-escaped; a long name is cut and an FNV-1a hash of
/// the whole name appended.
pub(crate) fn lock_file_name(uid: u32, name: &str) -> String {
    let mut esc = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            esc.push(b as char);
        } else {
            esc.push_str(&format!("%{b:02X}"));
        }
    }
    if esc.len() > MAX_NAME_IN_FILE {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut cut = MAX_NAME_IN_FILE;
        while !esc.is_char_boundary(cut) {
            cut -= 1;
        }
        esc = format!("{}~{h:016x}", &esc[..cut]);
    }
    format!("session.{uid}.{esc}.lock")
}

impl SessionNameLock {
    /// Takes `name` for this process, or says which session holds it.
    pub(crate) fn acquire(dir: &RuntimeDir, name: &str) -> Result<Self, ControlError> {
        let uid = rustix::process::geteuid().as_raw();
        let file_name = lock_file_name(uid, name);
        let path = dir.path().join(&file_name).display().to_string();
        let io = |source: std::io::Error| ControlError::RuntimeFile {
            path: path.clone(),
            source: source.into(),
        };
        // The file may be removed and recreated by the holder's exit while
        // we lock it: lock, then check the name still leads to our file.
        for _ in 0..8 {
            let mut file = dir
                .open_own_file(&file_name, true)
                .map_err(|source| ControlError::RuntimeFile {
                    path: path.clone(),
                    source,
                })?
                .ok_or_else(|| io(std::io::Error::other("not created")))?;
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) => {
                    let mut pid = String::new();
                    let _ = (&file).take(32).read_to_string(&mut pid);
                    let pid = pid.trim();
                    return Err(ControlError::NameTaken {
                        name: name.to_string(),
                        pid: if pid.is_empty() {
                            "unknown".into()
                        } else {
                            pid.chars().filter(char::is_ascii_digit).collect()
                        },
                    });
                }
                Err(e) => return Err(io(e.into())),
            }
            let held = file.metadata().map_err(io)?;
            let named = match rustix::fs::statat(dir.fd(), &file_name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(io(e.into())),
            };
            if named.st_dev as u64 != held.dev() || named.st_ino as u64 != held.ino() {
                continue;
            }
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())
                .map_err(io)?;
            return Ok(Self {
                dir: dir.clone(),
                file_name,
                file,
            });
        }
        Err(io(std::io::Error::other(
            "the lock file kept being replaced while it was being taken",
        )))
    }
}

impl SessionNameLock {
    /// The runtime directory and the lock file's name in it.
    pub(crate) fn file(&self) -> (&RuntimeDir, &str) {
        (&self.dir, &self.file_name)
    }
}

impl Drop for SessionNameLock {
    fn drop(&mut self) {
        // Unlinked while still locked: a session that opened this file
        // meanwhile sees the name no longer leads to it, and starts over.
        let _ = self.dir.remove(&self.file_name);
        let _ = flock(&self.file, FlockOperation::Unlock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::runtime_dir::open_checked;

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_checked(&t.path().join("run")).expect("dir");
        let a = SessionNameLock::acquire(&dir, "my session/1").expect("free");
        // flock locks belong to the open file: a second open in this
        // process conflicts like another process would.
        match SessionNameLock::acquire(&dir, "my session/1") {
            Err(ControlError::NameTaken { pid, .. }) => {
                assert_eq!(pid, std::process::id().to_string())
            }
            other => panic!("{other:?}"),
        }
        let b = SessionNameLock::acquire(&dir, "other").expect("another name is free");
        drop(a);
        let _again = SessionNameLock::acquire(&dir, "my session/1").expect("released");
        drop(b);
    }

    #[test]
    fn file_names_are_plain_and_bounded() {
        assert_eq!(lock_file_name(0, "a/b c"), "session.0.a%2Fb%20c.lock");
        let long = lock_file_name(7, &"x".repeat(1000));
        assert!(long.len() < 200, "{long}");
        assert_ne!(long, lock_file_name(7, &"x".repeat(999)));
        assert!(!lock_file_name(1, "../..").contains('/'));
    }
}
