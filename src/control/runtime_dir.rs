//! The machine-wide runtime directory where sessions keep their sockets,
//! their name locks and the trigger history: `$RECORDER_RUNTIME_DIR` if set,
//! else `/run/recorder` (where it exists or root can create it), else
//! `/tmp/recorder`. It is one place for every user (mode 1777, like `/tmp`):
//! a per-user directory would hide a root session from an unprivileged
//! `recorder trigger`.
//!
//! Because every user may write there, a session trusts the directory only
//! after checking it through a descriptor opened without following links
//! ([`RuntimeDir`]): owned by root or by the session's user, and, when
//! others may write to it, sticky (so nobody removes or renames what another
//! user put there). Everything the session creates is then made relative to
//! that descriptor, so no path component can be swapped afterwards; each
//! file it reopens is checked again ([`RuntimeDir::open_own_file`]).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::ControlError;
use crate::storage::create::{DirProblem, dir_problem};

/// The environment variable that overrides the runtime directory.
pub(crate) const ENV: &str = "RECORDER_RUNTIME_DIR";
const SYSTEM: &str = "/run/recorder";
const FALLBACK: &str = "/tmp/recorder";

/// The directories a client looks in, in order.
pub(crate) fn candidates() -> Vec<PathBuf> {
    match std::env::var_os(ENV) {
        Some(d) if !d.is_empty() => vec![PathBuf::from(d)],
        _ => vec![PathBuf::from(SYSTEM), PathBuf::from(FALLBACK)],
    }
}

/// A runtime directory checked for the current user, held open.
#[derive(Clone, Debug)]
pub(crate) struct RuntimeDir {
    path: PathBuf,
    fd: Arc<OwnedFd>,
}

/// Why a file in the runtime directory is not ours to use.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnFileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(
        "{name} in the runtime directory is {what}, not a file this user created: refusing to use it (remove it)"
    )]
    Foreign { name: String, what: Occupant },
}

/// What holds a name in the runtime directory that is not ours.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Occupant {
    /// An entry as `stat` sees it: its kind and owner.
    #[error("{kind} owned by uid {uid}")]
    Entry { kind: &'static str, uid: u32 },
    /// An entry `stat` refused to look at.
    #[error("an entry that cannot be examined ({0})")]
    Unexaminable(#[source] Errno),
    /// An entry swapped under the name while it was being opened.
    #[error("replaced again and again while it was being opened")]
    Churning,
}

impl RuntimeDir {
    /// The directory's path, for messages and clients.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The checked directory descriptor.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A path to `name` that resolves through the checked descriptor
    /// (`/proc/self/fd/N/name`), for calls that take no directory fd
    /// (bind(2)); the plain path where `/proc` is not mounted.
    pub(crate) fn pinned_path(&self, name: &str) -> PathBuf {
        let via = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        if via.is_dir() {
            via.join(name)
        } else {
            self.path.join(name)
        }
    }

    /// Removes the entry `name` if it is there (no error when absent).
    pub(crate) fn remove(&self, name: &str) -> std::io::Result<()> {
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens (creating it, mode 0600, when `create`) the regular file `name`
    /// that this user keeps in the directory: never through a symlink, never
    /// blocking on a FIFO, and only if it is a regular file owned by us with
    /// no other link. A root session removes an entry someone else planted
    /// under the name and starts afresh; anyone else refuses it.
    /// `Ok(None)`: absent and not created.
    pub(crate) fn open_own_file(
        &self,
        name: &str,
        create: bool,
    ) -> Result<Option<File>, OwnFileError> {
        let me = rustix::process::geteuid();
        for _ in 0..3 {
            let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
            if create {
                flags |= OFlags::CREATE;
            }
            let fd = match rustix::fs::openat(&*self.fd, name, flags, Mode::RUSR | Mode::WUSR) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if !create => return Ok(None),
                // A symlink (ELOOP), a directory (EISDIR), or something we
                // may not open: foreign.
                Err(Errno::LOOP | Errno::ACCESS | Errno::PERM | Errno::NXIO | Errno::ISDIR) => {
                    let what = describe_entry(&self.fd, name);
                    if self.clear_foreign(name, me.is_root())? {
                        continue;
                    }
                    return Err(OwnFileError::Foreign {
                        name: name.into(),
                        what,
                    });
                }
                Err(e) => return Err(std::io::Error::from(e).into()),
            };
            let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
            let ftype = FileType::from_raw_mode(st.st_mode);
            let ours =
                ftype == FileType::RegularFile && st.st_uid == me.as_raw() && st.st_nlink == 1;
            if !ours {
                let what = describe_stat(&st);
                drop(fd);
                if self.clear_foreign(name, me.is_root())? {
                    continue;
                }
                return Err(OwnFileError::Foreign {
                    name: name.into(),
                    what,
                });
            }
            // Ours: nobody else may read it (a reader could hold its lock).
            if st.st_mode & 0o077 != 0 {
                rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(std::io::Error::from)?;
            }
            // Back to blocking I/O: it is a regular file.
            let mut fl = rustix::fs::fcntl_getfl(&fd).map_err(std::io::Error::from)?;
            fl.remove(OFlags::NONBLOCK);
            rustix::fs::fcntl_setfl(&fd, fl).map_err(std::io::Error::from)?;
            return Ok(Some(File::from(fd)));
        }
        Err(OwnFileError::Foreign {
            name: name.into(),
            what: Occupant::Churning,
        })
    }

    /// Removes a planted entry when we may (root); true when removed.
    fn clear_foreign(&self, name: &str, root: bool) -> std::io::Result<bool> {
        if !root {
            return Ok(false);
        }
        log::warn!(
            "{}: removing {} left there by another user",
            self.path.join(name).display(),
            describe_entry(&self.fd, name)
        );
        let is_dir = rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        if !is_dir {
            self.remove(name)?;
            return Ok(true);
        }
        // A directory: removed when empty, else moved out of the way (its
        // owner may have filled it; nothing in it is looked at).
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(true),
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                let aside = format!(".{name}.planted.{:016x}", rand::random::<u64>());
                rustix::fs::renameat(&*self.fd, name, &*self.fd, aside.as_str())?;
                log::warn!(
                    "{}: moved to {aside} (not empty)",
                    self.path.join(name).display()
                );
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn describe_stat(st: &rustix::fs::Stat) -> Occupant {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if st.st_nlink != 1 => "a file with other hard links",
        FileType::RegularFile => "a file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Unknown => "an unknown kind of file",
    };
    Occupant::Entry {
        kind,
        uid: st.st_uid,
    }
}

fn describe_entry(dir: &OwnedFd, name: &str) -> Occupant {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => describe_stat(&st),
        Err(e) => Occupant::Unexaminable(e),
    }
}

/// Why a runtime directory is not used, explained with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnsafeRuntimeDir {
    #[error("it is a symbolic link or not a directory: remove it (rm {}) or set {ENV}", .0.display())]
    LinkOrNotDirectory(PathBuf),
    #[error("{}", explain(.path, *.me, .problem))]
    Problem {
        path: PathBuf,
        me: u32,
        problem: DirProblem,
    },
}

fn explain(path: &Path, me: u32, problem: &DirProblem) -> String {
    let shown = path.display();
    match problem {
        DirProblem::Unexaminable(e) => format!("cannot examine it: {e}"),
        DirProblem::NotADirectory => "it is not a directory".into(),
        DirProblem::ForeignOwner(uid) => format!(
            "it belongs to uid {uid}, not to root or to you (uid {me}): that user could remove this session's sockets and put fake ones in their place. Remove it (rm -r {shown}) or set {ENV} to a directory you own"
        ),
        DirProblem::WritableNotSticky(mode) => format!(
            "it is writable by other users (mode {mode:04o}) but not sticky: they could remove or replace this session's sockets. Make it sticky (chmod 1777 {shown})"
        ),
        DirProblem::Kernel(what) => format!("it is {what}: set {ENV} elsewhere"),
        DirProblem::ForeignLink(uid) => format!(
            "a symbolic link on its way belongs to uid {uid}: that user could point it anywhere. Set {ENV} to a directory reached without it"
        ),
    }
}

/// Checks an open directory for use by `me`.
fn check(path: &Path, fd: &OwnedFd, me: u32) -> Result<(), UnsafeRuntimeDir> {
    match dir_problem(fd, me) {
        None => Ok(()),
        Some(problem) => Err(UnsafeRuntimeDir::Problem {
            path: path.to_path_buf(),
            me,
            problem,
        }),
    }
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens `dir` and checks it for the current user, creating it (mode 1777)
/// when absent.
pub(crate) fn open_checked(dir: &Path) -> Result<RuntimeDir, ControlError> {
    let refused = |why: UnsafeRuntimeDir| ControlError::UnsafeRuntimeDir {
        path: dir.display().to_string(),
        why,
    };
    let io = |source: std::io::Error| ControlError::RuntimeDir {
        path: dir.display().to_string(),
        source,
    };
    let me = rustix::process::geteuid().as_raw();
    // The directories above it are walked into and checked one by one
    // (made when missing), as output directories are: a component another
    // user made or can swap is refused, never used.
    let (parent, last) = match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => (
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            },
            n,
        ),
        _ => {
            return Err(refused(UnsafeRuntimeDir::LinkOrNotDirectory(
                dir.to_path_buf(),
            )));
        }
    };
    let above = crate::storage::create::OutputDir::create(parent).map_err(|source| {
        ControlError::RuntimeParent {
            path: dir.display().to_string(),
            source,
        }
    })?;
    let open_last = || {
        rustix::fs::openat(
            above.fd(),
            last,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let fd = match open_last() {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            match rustix::fs::mkdirat(above.fd(), last, Mode::RWXU) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io(e.into())),
            }
            let fd = open_last().map_err(|e| io(e.into()))?;
            let st = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
            if st.st_uid == me {
                // World-writable and sticky: any user's session may add its
                // sockets, none may remove another's.
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o1777)).map_err(|e| io(e.into()))?;
            }
            fd
        }
        Err(Errno::LOOP | Errno::NOTDIR) => {
            return Err(refused(UnsafeRuntimeDir::LinkOrNotDirectory(
                dir.to_path_buf(),
            )));
        }
        Err(e) => return Err(io(e.into())),
    };
    check(dir, &fd, me).map_err(refused)?;
    // Can we add entries? (An unprivileged user may find a root-made 0755 dir.)
    rustix::fs::accessat(
        &fd,
        ".",
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
        AtFlags::empty(),
    )
    .map_err(|e| io(e.into()))?;
    Ok(RuntimeDir {
        path: dir.to_path_buf(),
        fd: Arc::new(fd),
    })
}

/// Opens `dir` for a client that only looks: a directory that would not be
/// safe for a session is still read (every answer is checked against the
/// peer's credentials), but `trusted` says whether stale entries may be
/// removed there.
pub(crate) fn open_for_client(dir: &Path) -> Option<(RuntimeDir, bool)> {
    let fd = open_dir(dir).ok()?;
    let me = rustix::process::geteuid().as_raw();
    let trusted = check(dir, &fd, me).is_ok();
    Some((
        RuntimeDir {
            path: dir.to_path_buf(),
            fd: Arc::new(fd),
        },
        trusted,
    ))
}

/// Why each runtime directory candidate was passed over.
#[derive(Debug)]
pub(crate) struct Tried(pub Vec<ControlError>);

impl std::fmt::Display for Tried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The directory a new session listens in, checked (and created if needed).
pub(crate) fn for_server() -> Result<RuntimeDir, ControlError> {
    let mut errors = Vec::new();
    for dir in candidates() {
        match open_checked(&dir) {
            Ok(d) => return Ok(d),
            // A directory someone tampered with is reported, never skipped
            // silently: the next candidate would hide the problem.
            Err(
                e @ (ControlError::UnsafeRuntimeDir { .. }
                | ControlError::RuntimeParent {
                    source: crate::storage::create::CreateError::Refused { .. },
                    ..
                }),
            ) => return Err(e),
            Err(e) => errors.push(e),
        }
    }
    Err(ControlError::NoRuntimeDir(Tried(errors)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_a_sticky_directory_and_refuses_unsafe_ones() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join("run");
        let rd = open_checked(&dir).expect("created");
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777);
        drop(rd);
        // Writable by others but not sticky: refused, naming the fix.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = open_checked(&dir).expect_err("refused").to_string();
        assert!(e.contains("chmod 1777"), "{e}");
        // A symlink in its place: refused.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        let e = open_checked(&link).expect_err("refused").to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }

    #[test]
    fn own_files_are_checked() {
        let t = tempfile::tempdir().expect("tempdir");
        let rd = open_checked(&t.path().join("run")).expect("dir");
        assert!(rd.open_own_file("f", false).expect("absent").is_none());
        let f = rd.open_own_file("f", true).expect("created");
        assert!(f.is_some());
        let st = std::fs::metadata(rd.path().join("f")).expect("stat");
        assert_eq!(st.permissions().mode() & 0o777, 0o600);
        // A symlink or a FIFO under the name is never followed nor blocked on.
        std::os::unix::fs::symlink("/etc/hostname", rd.path().join("l")).expect("symlink");
        rustix::fs::mkfifoat(rd.fd(), "p", Mode::from_raw_mode(0o666)).expect("mkfifo");
        std::fs::hard_link(rd.path().join("f"), rd.path().join("h")).expect("link");
        std::fs::create_dir(rd.path().join("d")).expect("mkdir");
        std::fs::create_dir_all(rd.path().join("full/x")).expect("mkdir");
        for name in ["l", "p", "h", "d", "full"] {
            match rd.open_own_file(name, true) {
                // Root removes the planted entry and creates a fresh file.
                Ok(Some(_)) if rustix::process::geteuid().is_root() => {
                    let st = std::fs::symlink_metadata(rd.path().join(name)).expect("stat");
                    assert!(st.is_file(), "{name}");
                }
                Err(OwnFileError::Foreign { .. }) => {}
                other => panic!("{name}: {other:?}"),
            }
        }
        assert_eq!(
            std::fs::read_to_string("/etc/hostname").is_ok(),
            std::path::Path::new("/etc/hostname").exists()
        );
    }
}
