//! Opening files `recorder inspect` and `recorder index` read from
//! directories anyone may have written to (a shared store, a segments
//! directory in `/tmp`): a regular file only, opened without blocking (a
//! FIFO planted at a segment's name is refused at once, never waited on),
//! and never through a symbolic link another user may have planted — one in
//! a directory others may write, owned by anyone but root or this user.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("it is {0}, not a regular file: not read")]
    NotRegular(&'static str),
    #[error("it is a symbolic link of uid {0} in a directory other users may write: not followed")]
    PlantedLink(u32),
}

impl From<Errno> for UntrustedError {
    fn from(e: Errno) -> Self {
        UntrustedError::Io(e.into())
    }
}

impl From<UntrustedError> for io::Error {
    fn from(e: UntrustedError) -> Self {
        match e {
            UntrustedError::Io(e) => e,
            e => io::Error::other(e),
        }
    }
}

/// `path` opened for reading, with its size: a regular file, reached
/// through a final symbolic link only when the link belongs to root or to
/// this user or its directory is writable by nobody else.
pub(crate) fn open_regular(path: &Path) -> Result<(File, u64), UntrustedError> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd: OwnedFd = match rustix::fs::open(path, flags | OFlags::NOFOLLOW, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => {
            let link = rustix::fs::lstat(path)?;
            let me = rustix::process::geteuid().as_raw();
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let shared = rustix::fs::stat(dir).map_or(true, |st| st.st_mode & 0o022 != 0);
            if shared && link.st_uid != 0 && link.st_uid != me {
                return Err(UntrustedError::PlantedLink(link.st_uid));
            }
            rustix::fs::open(path, flags, Mode::empty())?
        }
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(UntrustedError::NotRegular(match kind {
            FileType::Fifo => "a FIFO",
            FileType::Directory => "a directory",
            FileType::Socket => "a socket",
            FileType::CharacterDevice | FileType::BlockDevice => "a device",
            _ => "not a plain file",
        }));
    }
    // A regular file: plain blocking reads from here on.
    rustix::io::ioctl_fionbio(&fd, false)?;
    Ok((File::from(fd), st.st_size as u64))
}

/// Whether `path` is a regular file [`open_regular`] would open.
pub(crate) fn is_regular(path: &Path) -> bool {
    open_regular(path).is_ok()
}

/// The whole of `path` (as [`open_regular`] opens it), when it holds at most
/// `max` bytes.
pub(crate) fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>, UntrustedError> {
    use std::io::Read;
    let (f, size) = open_regular(path)?;
    if size > max {
        return Err(UntrustedError::Io(io::Error::other(format!(
            "{size} bytes, more than the {max} expected"
        ))));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    f.take(max + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A FIFO at `path`, only its owner's.
    pub(crate) fn make_fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
    }

    #[test]
    fn only_regular_files_never_blocking() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("f");
        std::fs::write(&f, b"abc").expect("write");
        let (_, size) = open_regular(&f).expect("regular");
        assert_eq!(size, 3);
        let fifo = d.path().join("p");
        make_fifo(&fifo);
        assert!(matches!(
            open_regular(&fifo),
            Err(UntrustedError::NotRegular("a FIFO"))
        ));
        assert!(open_regular(d.path()).is_err());
        // Our own link is followed.
        std::os::unix::fs::symlink(&f, d.path().join("l")).expect("ln");
        assert!(open_regular(&d.path().join("l")).is_ok());
        assert_eq!(read_at_most(&f, 3).expect("read"), b"abc");
        assert!(read_at_most(&f, 2).is_err());
    }
}
