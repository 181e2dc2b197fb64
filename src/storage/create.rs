//! The one way the recorder creates a file: relative to a directory
//! descriptor checked once ([`OutputDir::open`]), with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, so that a name another user planted (a
//! symlink, a hard link, a FIFO) is never opened for writing.
//!
//! ```text
//!  OutputDir::open(DIR)   owned by root or by us; if others may write, sticky
//!  create_new(NAME)       O_EXCL: a taken name is an error (the caller decides)
//!  replace(NAME)          O_EXCL on a fresh temporary name, then renamed over
//!                         NAME: whatever was there (a link, another file) is
//!                         unlinked, never written through
//!  open_stream(PATH)      only a FIFO, device or socket `-o` names itself
//! ```
//!
//! Every check happens before anything is opened for writing, so a refusal
//! touches nothing. After a privilege drop the same operations go to the
//! broker ([`crate::privilege::broker`]), which performs them with this module on
//! its own copy of the directory descriptor.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Creating a file failed, or its directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("cannot open the directory {path}: {source}")]
    OpenDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to write in {path}: {why}")]
    Refused {
        path: PathBuf,
        #[source]
        why: UnsafeDir,
    },
    #[error("{path}: already exists")]
    Exists { path: PathBuf },
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{name:?} is not a plain file name")]
    BadName { name: String },
    /// The privileged broker did it for this process and refused or
    /// failed (its typed reason).
    #[error("the privileged broker refused or failed: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A file operation done by someone else (the broker) on a registered
/// directory, after this process gave up the rights to do it itself.
pub trait Delegate: Send + Sync + std::fmt::Debug {
    fn create(&self, dir: u32, name: &str, replace: bool) -> Result<OwnedFd, CreateError>;
    fn rename(&self, dir: u32, from: &str, to: &str) -> Result<(), CreateError>;
    fn remove(&self, dir: u32, name: &str) -> Result<(), CreateError>;
}

/// A directory checked for writing, held open.
#[derive(Clone, Debug)]
pub struct OutputDir {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    delegate: Option<(Arc<dyn Delegate>, u32)>,
}

const FILE_MODE: u32 = 0o600;

impl OutputDir {
    /// Opens `path` (never through a symlink at its last component) and
    /// checks it: owned by root or by this user, and sticky if others may
    /// write to it. The error says how to fix a refused directory.
    pub fn open(path: &Path) -> Result<Self, CreateError> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CreateError::OpenDir {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
        Self::from_fd(path, fd)
    }

    /// A directory already open (passed by another process), checked as
    /// [`OutputDir::open`] checks.
    pub fn from_fd(path: &Path, fd: OwnedFd) -> Result<Self, CreateError> {
        let me = rustix::process::geteuid().as_raw();
        check_dir(path, &fd, me).map_err(|why| CreateError::Refused {
            path: path.to_path_buf(),
            why,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            fd: Arc::new(fd),
            delegate: None,
        })
    }

    /// The directory holding `file` and the file's name in it.
    pub fn of_file(file: &Path) -> Result<(Self, String), CreateError> {
        let (dir, name) = split(file)?;
        Ok((Self::open(&dir)?, name))
    }

    /// From now on, creations, renames and removals go to `delegate` under
    /// the id it registered this directory as.
    pub fn delegate_to(&mut self, delegate: Arc<dyn Delegate>, id: u32) {
        self.delegate = Some((delegate, id));
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `name`'s path, for messages and hooks.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates `name`, which must not exist (`Exists` when it does, whatever
    /// it is). Mode 0600, read-write.
    pub fn create_new(&self, name: &str) -> Result<OwnedFd, CreateError> {
        check_name(name)?;
        if let Some((d, id)) = &self.delegate {
            return d.create(*id, name, false);
        }
        self.create_new_local(name)
    }

    fn create_new_local(&self, name: &str) -> Result<OwnedFd, CreateError> {
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&*self.fd, name, flags, Mode::from_raw_mode(FILE_MODE)) {
            Ok(fd) => {
                // The umask may have narrowed the mode; never widened it.
                let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE));
                Ok(fd)
            }
            Err(Errno::EXIST) => Err(CreateError::Exists {
                path: self.join(name),
            }),
            Err(e) => Err(CreateError::Create {
                path: self.join(name),
                source: e.into(),
            }),
        }
    }

    /// Creates a new file under `name`, replacing whatever entry was there
    /// (a file, a symlink, a hard link) without opening it: the new file is
    /// made under a temporary name and renamed over `name`.
    pub fn replace(&self, name: &str) -> Result<OwnedFd, CreateError> {
        check_name(name)?;
        if let Some((d, id)) = &self.delegate {
            return d.create(*id, name, true);
        }
        let (tmp, fd) = self.create_temp(name)?;
        if let Err(e) = self.rename_local(&tmp, name) {
            let _ = self.remove_local(&tmp);
            return Err(e);
        }
        Ok(fd)
    }

    /// A new file under a temporary name for `name` (`.NAME.tmp`, or with a
    /// random part when another entry holds that name).
    pub fn create_temp(&self, name: &str) -> Result<(String, OwnedFd), CreateError> {
        check_name(name)?;
        let mut tmp = format!(".{name}.tmp");
        for _ in 0..8 {
            match self.create_new(&tmp) {
                Ok(fd) => return Ok((tmp, fd)),
                Err(CreateError::Exists { .. }) => {
                    tmp = format!(".{name}.{:016x}.tmp", rand::random::<u64>());
                }
                Err(e) => return Err(e),
            }
        }
        Err(CreateError::Exists {
            path: self.join(&tmp),
        })
    }

    /// Renames `from` to `to` in this directory (replacing the entry `to`).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), CreateError> {
        check_name(from)?;
        check_name(to)?;
        if let Some((d, id)) = &self.delegate {
            return d.rename(*id, from, to);
        }
        self.rename_local(from, to)
    }

    fn rename_local(&self, from: &str, to: &str) -> Result<(), CreateError> {
        rustix::fs::renameat(&*self.fd, from, &*self.fd, to).map_err(|e| CreateError::Create {
            path: self.join(to),
            source: e.into(),
        })
    }

    /// Removes the entry `name` (never what a link points to); absent is fine.
    pub fn remove(&self, name: &str) -> Result<(), CreateError> {
        check_name(name)?;
        if let Some((d, id)) = &self.delegate {
            return d.remove(*id, name);
        }
        self.remove_local(name)
    }

    fn remove_local(&self, name: &str) -> Result<(), CreateError> {
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(CreateError::Create {
                path: self.join(name),
                source: e.into(),
            }),
        }
    }

    /// Makes renames and creations in the directory durable (no privilege
    /// needed: the descriptor is held).
    pub fn sync(&self) -> std::io::Result<()> {
        rustix::fs::fsync(&*self.fd).map_err(Into::into)
    }

    /// The size of `name` (0 when it cannot be examined).
    pub fn size_of(&self, name: &str) -> u64 {
        rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_or(0, |st| st.st_size as u64)
    }

    /// Whether `name` is an entry of the directory (any kind).
    pub fn has(&self, name: &str) -> bool {
        rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }
}

/// Checks, before anything is opened, the directory files will be made in:
/// `dir` itself, or, when it does not exist yet (it will be created), its
/// nearest existing ancestor.
pub fn check_ahead(dir: &Path) -> Result<(), CreateError> {
    let mut at = dir;
    loop {
        match rustix::fs::lstat(at) {
            Ok(_) => return OutputDir::open(at).map(drop),
            Err(Errno::NOENT) => match at.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(p) => at = p,
                None => return OutputDir::open(Path::new(".")).map(drop),
            },
            Err(e) => {
                return Err(CreateError::OpenDir {
                    path: at.to_path_buf(),
                    source: e.into(),
                });
            }
        }
    }
}

/// Whether `path` names a FIFO, device or socket [`open_stream`] would open.
pub fn is_named_stream(path: &Path) -> bool {
    stream_stat(path).is_some()
}

fn stream_stat(path: &Path) -> Option<rustix::fs::Stat> {
    let lst = rustix::fs::lstat(path).ok()?;
    let me = rustix::process::geteuid().as_raw();
    let st = match FileType::from_raw_mode(lst.st_mode) {
        FileType::Symlink if lst.st_uid == 0 || lst.st_uid == me => rustix::fs::stat(path).ok()?,
        FileType::Symlink => return None,
        _ => lst,
    };
    // A FIFO or device someone else put there is not one the user named.
    let ours = |uid: u32| uid == 0 || uid == me;
    (is_stream_type(st.st_mode) && ours(st.st_uid)).then_some(st)
}

/// Writes `bytes` as a new file at `path` (replacing the entry there), or
/// into the FIFO or device `path` names: for small outputs such as
/// `config convert -o`.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CreateError> {
    let fd = match open_stream(path)? {
        Some(fd) => fd,
        None => {
            let (dir, name) = OutputDir::of_file(path)?;
            dir.replace(&name)?
        }
    };
    std::io::Write::write_all(&mut std::fs::File::from(fd), bytes).map_err(|source| {
        CreateError::Create {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// A FIFO, character device or socket at `path` that the user named
/// explicitly (`-o /dev/null`, `-o FIFO`), opened for writing as before;
/// `None` when `path` is anything else (then it is created as a file).
/// Only one that belongs to root or to us, reached through a symlink only
/// when the link does too (the kernel's protected_symlinks and
/// protected_fifos rules): what another user planted is never opened.
pub fn open_stream(path: &Path) -> Result<Option<OwnedFd>, CreateError> {
    if stream_stat(path).is_none() {
        return Ok(None);
    }
    rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
        .map(Some)
        .map_err(|e| CreateError::Create {
            path: path.to_path_buf(),
            source: e.into(),
        })
}

/// Whether `fd` is written as a stream (a FIFO, character device or
/// socket), not a file of offsets.
pub fn is_stream(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| is_stream_type(st.st_mode))
}

fn is_stream_type(mode: u32) -> bool {
    matches!(
        FileType::from_raw_mode(mode),
        FileType::Fifo | FileType::CharacterDevice | FileType::Socket
    )
}

/// `file`'s directory (`.` when it has none) and its last component.
pub fn split(file: &Path) -> Result<(PathBuf, String), CreateError> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| CreateError::BadName {
            name: file.display().to_string(),
        })?
        .to_string();
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    Ok((dir, name))
}

/// A plain name inside a directory: no `/`, not `.` or `..`, not empty, no NUL.
pub fn check_name(name: &str) -> Result<(), CreateError> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 255
    {
        return Err(CreateError::BadName { name: name.into() });
    }
    Ok(())
}

/// Why a directory is not safe for `me` to make files in, when it is not:
/// one rule for output directories and the runtime directory alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirProblem {
    Unexaminable(String),
    NotADirectory,
    /// Another user owns it: they could swap its entries for links.
    ForeignOwner(u32),
    /// Others may write it and it is not sticky: they could replace our
    /// entries (the mode).
    WritableNotSticky(u32),
}

/// The problem with the open directory `fd` for `me`, if any: it must be
/// a directory owned by root or `me`, and sticky if others may write it.
pub fn dir_problem(fd: &OwnedFd, me: u32) -> Option<DirProblem> {
    let st = match rustix::fs::fstat(fd) {
        Ok(st) => st,
        Err(e) => return Some(DirProblem::Unexaminable(e.to_string())),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Some(DirProblem::NotADirectory);
    }
    if st.st_uid != 0 && st.st_uid != me {
        return Some(DirProblem::ForeignOwner(st.st_uid));
    }
    let mode = st.st_mode & 0o7777;
    (mode & 0o022 != 0 && mode & 0o1000 == 0).then_some(DirProblem::WritableNotSticky(mode))
}

/// An output directory `me` may not write in: its problem, explained with
/// the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.explain())]
pub struct UnsafeDir {
    pub path: PathBuf,
    pub me: u32,
    pub problem: DirProblem,
}

impl UnsafeDir {
    fn explain(&self) -> String {
        let (shown, me) = (self.path.display(), self.me);
        match &self.problem {
            DirProblem::Unexaminable(e) => format!("cannot examine it: {e}"),
            DirProblem::NotADirectory => "it is not a directory".into(),
            DirProblem::ForeignOwner(uid) => format!(
                "it belongs to uid {uid}, not to root or to you (uid {me}): that user could replace the trace's files with links. Write to a directory you own (or chown {me} {shown})"
            ),
            DirProblem::WritableNotSticky(mode) => format!(
                "it is writable by other users (mode {mode:04o}) but not sticky: they could replace the trace's files. Make it sticky (chmod +t {shown}) or write elsewhere"
            ),
        }
    }
}

/// Checks an open directory for writing by `me`.
pub fn check_dir(path: &Path, fd: &OwnedFd, me: u32) -> Result<(), UnsafeDir> {
    match dir_problem(fd, me) {
        None => Ok(()),
        Some(problem) => Err(UnsafeDir {
            path: path.to_path_buf(),
            me,
            problem,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir_with_mode(mode: u32) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).expect("chmod");
        d
    }

    #[test]
    fn refuses_writable_dirs_that_are_not_sticky() {
        let d = dir_with_mode(0o777);
        let e = OutputDir::open(d.path()).expect_err("refused");
        assert!(e.to_string().contains("chmod +t"), "{e}");
        let d = dir_with_mode(0o1777);
        OutputDir::open(d.path()).expect("sticky is fine");
    }

    #[test]
    fn create_new_never_follows_or_opens_what_is_there() {
        let d = dir_with_mode(0o700);
        let target = d.path().join("target");
        std::fs::write(&target, b"keep").expect("write");
        std::os::unix::fs::symlink(&target, d.path().join("link")).expect("symlink");
        let od = OutputDir::open(d.path()).expect("open");
        assert!(matches!(
            od.create_new("link"),
            Err(CreateError::Exists { .. })
        ));
        // replace: the link is swapped for a new file, the target untouched.
        let fd = od.replace("link").expect("replace");
        rustix::io::write(&fd, b"new").expect("write");
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        assert_eq!(std::fs::read(d.path().join("link")).expect("read"), b"new");
        let meta = std::fs::symlink_metadata(d.path().join("link")).expect("meta");
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A planted temporary name is skipped, not used.
        std::os::unix::fs::symlink(&target, d.path().join(".x.tmp")).expect("symlink");
        let (tmp, _fd) = od.create_temp("x").expect("temp");
        assert_ne!(tmp, ".x.tmp");
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
    }

    #[test]
    fn names_are_plain() {
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        check_name("trace-000001.pftrace.partial").expect("plain");
    }

    #[test]
    fn streams_only_when_named() {
        let d = dir_with_mode(0o700);
        assert!(open_stream(&d.path().join("absent")).expect("ok").is_none());
        std::fs::write(d.path().join("f"), b"").expect("write");
        assert!(open_stream(&d.path().join("f")).expect("ok").is_none());
        assert!(open_stream(Path::new("/dev/null")).expect("ok").is_some());
    }
}
