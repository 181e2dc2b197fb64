//! The one way the recorder creates a file: relative to a directory
//! descriptor checked once ([`OutputDir::open`]), with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, so that a name another user planted (a
//! symlink, a hard link, a FIFO) is never opened for writing.
//!
//! ```text
//!  OutputDir::open(DIR)   walked into from `/` one component at a time
//!                         (openat, never following a link another user
//!                         owns); every directory on the way, DIR included,
//!                         owned by root or by us and, if others may write
//!                         it, sticky; the ancestors held by descriptor
//!  OutputDir::create(DIR) the same, making the missing components (0755)
//!                         relative to their parent's descriptor
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

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
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
pub(crate) trait Delegate: Send + Sync + std::fmt::Debug {
    fn create(&self, dir: u32, name: &str, replace: bool) -> Result<OwnedFd, CreateError>;
    fn rename(&self, dir: u32, from: &str, to: &str) -> Result<(), CreateError>;
    fn remove(&self, dir: u32, name: &str) -> Result<(), CreateError>;
}

/// A directory checked for writing, held open.
#[derive(Clone, Debug)]
pub struct OutputDir {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    /// The directories walked through to reach it, held so that the path
    /// that was checked stays the path that is used.
    _ancestors: Arc<[OwnedFd]>,
    delegate: Option<(Arc<dyn Delegate>, u32)>,
}

/// A file's identity: (device, inode).
pub(crate) type FileId = (u64, u64);

/// The identity of the open file `fd`.
pub(crate) fn file_id(fd: impl AsFd) -> std::io::Result<FileId> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

const FILE_MODE: u32 = 0o600;
/// Directories the recorder makes on the way to an output.
const DIR_MODE: u32 = 0o755;
/// Symbolic links followed on the way to a directory, at most (the
/// kernel's own limit).
const MAX_LINKS: u32 = 40;

impl OutputDir {
    /// Opens `path` by walking into it from `/` one component at a time
    /// ([`walk`]): every directory on the way, `path` included, must belong
    /// to root or to this user and be sticky if others may write to it; a
    /// symbolic link on the way is followed only if it belongs to root or
    /// to this user. The error says how to fix a refused directory.
    pub fn open(path: &Path) -> Result<Self, CreateError> {
        Self::walked(path, false)
    }

    /// As [`OutputDir::open`], making the components that do not exist yet
    /// (mode 0755) relative to their parent's descriptor, each checked as
    /// it is entered: a component another user made first is refused.
    pub fn create(path: &Path) -> Result<Self, CreateError> {
        Self::walked(path, true)
    }

    fn walked(path: &Path, create: bool) -> Result<Self, CreateError> {
        match walk(path, create)? {
            Walk::Found { fd, ancestors } => {
                refuse_kernel_dir(path, &fd)?;
                Ok(Self {
                    path: path.to_path_buf(),
                    fd: Arc::new(fd),
                    _ancestors: ancestors.into(),
                    delegate: None,
                })
            }
            Walk::Missing => Err(CreateError::OpenDir {
                path: path.to_path_buf(),
                source: std::io::ErrorKind::NotFound.into(),
            }),
        }
    }

    /// A directory already open (passed by another process), checked as
    /// [`OutputDir::open`] checks the directory itself.
    pub(crate) fn from_fd(path: &Path, fd: OwnedFd) -> Result<Self, CreateError> {
        let me = rustix::process::geteuid().as_raw();
        check_dir(path, &fd, me).map_err(|why| CreateError::Refused {
            path: path.to_path_buf(),
            why,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            fd: Arc::new(fd),
            _ancestors: Arc::new([]),
            delegate: None,
        })
    }

    /// The directory holding `file` and the file's name in it.
    pub(crate) fn of_file(file: &Path) -> Result<(Self, String), CreateError> {
        let (dir, name) = split(file)?;
        Ok((Self::open(&dir)?, name))
    }

    /// From now on, creations, renames and removals go to `delegate` under
    /// the id it registered this directory as.
    pub(crate) fn delegate_to(&mut self, delegate: Arc<dyn Delegate>, id: u32) {
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
    pub(crate) fn create_temp(&self, name: &str) -> Result<(String, OwnedFd), CreateError> {
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

    /// The names of the directory's entries (not `.` or `..`), read
    /// through the descriptor.
    pub fn entries(&self) -> std::io::Result<Vec<String>> {
        let fd = rustix::fs::openat(
            &*self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy();
            if name != "." && name != ".." {
                names.push(name.into_owned());
            }
        }
        Ok(names)
    }

    /// Whether `name` is an entry of the directory (any kind).
    pub fn has(&self, name: &str) -> bool {
        rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Whether `name` is (still) the file `id`.
    pub fn holds(&self, name: &str, id: FileId) -> bool {
        holds(self.fd(), name, id)
    }

    /// `name` opened for reading when it is the regular file `id` (never
    /// through a link, never blocking on a FIFO); `None` when it is gone
    /// or anything else.
    pub(crate) fn open_if(&self, name: &str, id: FileId) -> std::io::Result<Option<OwnedFd>> {
        open_if(self.fd(), name, id)
    }

    /// Removes `name` while it is the file `id`; false when it is not (gone,
    /// or another entry: left alone). Done here, not by a delegate: for the
    /// process that made the file (a hook runner, the broker).
    pub(crate) fn remove_if(&self, name: &str, id: FileId) -> std::io::Result<bool> {
        if !self.holds(name, id) {
            return Ok(false);
        }
        // In a directory that is ours, or sticky, nobody else can swap the
        // entry between the check and the unlink.
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the directory's path still leads to this directory (the
    /// path others are given, a hook's, is this one).
    pub(crate) fn path_leads_here(&self) -> bool {
        let here = rustix::fs::fstat(&*self.fd).map(|st| (st.st_dev, st.st_ino));
        let there = rustix::fs::stat(&self.path).map(|st| (st.st_dev, st.st_ino));
        matches!((here, there), (Ok(a), Ok(b)) if a == b)
    }

    /// A new directory of this user's alone (mode 0700) in this one, named
    /// `.BASE.RANDOM`: where a hook's links are made.
    pub(crate) fn make_private_dir(&self, base: &str) -> std::io::Result<PrivateDir> {
        let me = rustix::process::geteuid().as_raw();
        for _ in 0..8 {
            let name = format!(".{base}.{:016x}", rand::random::<u64>());
            match rustix::fs::mkdirat(&*self.fd, name.as_str(), Mode::RWXU) {
                Ok(()) => {}
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
            let fd = rustix::fs::openat(
                &*self.fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let st = rustix::fs::fstat(&fd)?;
            if st.st_uid != me || st.st_mode & 0o077 != 0 {
                return Err(std::io::Error::other(format!(
                    "{}: not a directory of this user's alone",
                    self.join(&name).display()
                )));
            }
            return Ok(PrivateDir {
                parent: self.clone(),
                name,
                fd,
            });
        }
        Err(Errno::EXIST.into())
    }
}

/// A directory of one user's alone (mode 0700) inside an [`OutputDir`]:
/// nobody else can add, swap or remove its entries, so a path through it
/// keeps leading to what was linked there.
#[derive(Debug)]
pub(crate) struct PrivateDir {
    parent: OutputDir,
    name: String,
    fd: OwnedFd,
}

impl PrivateDir {
    pub(crate) fn path(&self) -> PathBuf {
        self.parent.join(&self.name)
    }

    /// Links the entry `name` of `from` (itself, never what a symbolic
    /// link there points to) here under the same name.
    pub(crate) fn link_from(&self, from: &OutputDir, name: &str) -> rustix::io::Result<()> {
        check_name(name).map_err(|_| Errno::INVAL)?;
        let link = || rustix::fs::linkat(from.fd(), name, &self.fd, name, AtFlags::empty());
        match link() {
            Err(Errno::EXIST) => {
                self.unlink(name);
                link()
            }
            r => r,
        }
    }

    /// Whether `name` here is the file `id`.
    pub(crate) fn holds(&self, name: &str, id: FileId) -> bool {
        holds(self.fd.as_fd(), name, id)
    }

    /// As [`OutputDir::open_if`], here.
    pub(crate) fn open_if(&self, name: &str, id: FileId) -> std::io::Result<Option<OwnedFd>> {
        open_if(self.fd.as_fd(), name, id)
    }

    /// Removes the entry `name` here, if any.
    pub(crate) fn unlink(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
    }

    /// Removes the directory (when empty: what a command left there stays).
    pub(crate) fn remove(self) {
        if let Err(e) =
            rustix::fs::unlinkat(self.parent.fd(), self.name.as_str(), AtFlags::REMOVEDIR)
        {
            log::debug!("{}: not removed: {e}", self.path().display());
        }
    }
}

/// Whether `st` is the regular file `id`, and this user's: a file of
/// someone else's that took a freed inode number is not it.
fn is_the_file(st: &rustix::fs::Stat, id: FileId) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && (st.st_dev, st.st_ino) == id
        && st.st_uid == rustix::process::geteuid().as_raw()
}

fn holds(dir: BorrowedFd<'_>, name: &str, id: FileId) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| is_the_file(&st, id))
}

fn open_if(dir: BorrowedFd<'_>, name: &str, id: FileId) -> std::io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP | Errno::NXIO | Errno::ACCESS | Errno::PERM) => {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    Ok(is_the_file(&st, id).then_some(fd))
}

/// Checks, before anything is opened, the directory files will be made in:
/// `dir` itself, or, when it does not exist yet (it will be created), its
/// nearest existing ancestor — with every directory above it, as
/// [`OutputDir::open`] walks them.
pub(crate) fn check_ahead(dir: &Path) -> Result<(), CreateError> {
    match walk(dir, false)? {
        Walk::Found { fd, .. } => refuse_kernel_dir(dir, &fd),
        Walk::Missing => Ok(()),
    }
}

/// Files are never made in a directory of the kernel's ([`system_dir`]).
fn refuse_kernel_dir(path: &Path, fd: &OwnedFd) -> Result<(), CreateError> {
    match system_dir(fd) {
        None => Ok(()),
        Some(what) => Err(CreateError::Refused {
            path: path.to_path_buf(),
            why: UnsafeDir {
                path: path.to_path_buf(),
                me: rustix::process::geteuid().as_raw(),
                problem: DirProblem::Kernel(what),
            },
        }),
    }
}

/// Where a [`walk`] ended.
pub(crate) enum Walk {
    /// The directory, and the ones above it (outermost first).
    Found {
        fd: OwnedFd,
        ancestors: Vec<OwnedFd>,
    },
    /// The directory does not exist (and was not to be made); every
    /// directory above it was checked.
    Missing,
}

/// The one safe way to a directory under paths others may write: from `/`
/// (or the working directory's path, for a relative one), one component at
/// a time with `openat(O_NOFOLLOW|O_DIRECTORY)` relative to the directory
/// before it, checking each directory entered as files are checked
/// ([`dir_problem`]: root's or ours, sticky if others may write it). A
/// symbolic link is followed only if it belongs to root or to us (its
/// target walked the same way); `..` steps back to the directory held
/// before. With `create`, a missing component is made (mode 0755) relative
/// to its parent's descriptor and then entered and checked like any other:
/// one another user made first is refused, never used.
pub(crate) fn walk(path: &Path, create: bool) -> Result<Walk, CreateError> {
    let me = rustix::process::geteuid().as_raw();
    let abs = std::path::absolute(path).map_err(|source| CreateError::OpenDir {
        path: path.to_path_buf(),
        source,
    })?;
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_components(&mut todo, &abs, false);
    let open_root = || {
        rustix::fs::open(
            "/",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CreateError::OpenDir {
            path: "/".into(),
            source: e.into(),
        })
    };
    let refused = |at: &Path, why: UnsafeDir| CreateError::Refused {
        path: at.to_path_buf(),
        why,
    };
    let mut cur = open_root()?;
    let mut shown = PathBuf::from("/");
    check_dir(&shown, &cur, me).map_err(|why| refused(&shown, why))?;
    // The directories above `cur`, with their paths (for `..`).
    let mut above: Vec<(OwnedFd, PathBuf)> = Vec::new();
    let (mut links, mut made) = (0u32, 0u32);
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if let Some((fd, p)) = above.pop() {
                cur = fd;
                shown = p;
            }
            continue;
        }
        let next = shown.join(&name);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&cur, name.as_os_str(), flags, Mode::empty()) {
            Ok(fd) => {
                check_dir(&next, &fd, me).map_err(|why| refused(&next, why))?;
                above.push((
                    std::mem::replace(&mut cur, fd),
                    std::mem::replace(&mut shown, next),
                ));
            }
            Err(Errno::NOENT) if !create => return Ok(Walk::Missing),
            Err(Errno::NOENT) if made < 1024 => {
                made += 1;
                match rustix::fs::mkdirat(&cur, name.as_os_str(), Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => {
                        return Err(CreateError::Create {
                            path: next,
                            source: e.into(),
                        });
                    }
                }
                // Entered and checked like any other: made by someone
                // else in between, it is refused.
                todo.push_front(name);
            }
            Err(Errno::LOOP | Errno::NOTDIR) => {
                let st = rustix::fs::statat(&cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| CreateError::OpenDir {
                        path: next.clone(),
                        source: e.into(),
                    })?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                    let why = UnsafeDir {
                        path: next.clone(),
                        me,
                        problem: DirProblem::NotADirectory,
                    };
                    return Err(refused(&next, why));
                }
                if st.st_uid != 0 && st.st_uid != me {
                    let why = UnsafeDir {
                        path: next.clone(),
                        me,
                        problem: DirProblem::ForeignLink(st.st_uid),
                    };
                    return Err(refused(&next, why));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(CreateError::OpenDir {
                        path: path.to_path_buf(),
                        source: Errno::LOOP.into(),
                    });
                }
                let target =
                    rustix::fs::readlinkat(&cur, name.as_os_str(), Vec::new()).map_err(|e| {
                        CreateError::OpenDir {
                            path: next.clone(),
                            source: e.into(),
                        }
                    })?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    above.clear();
                    cur = open_root()?;
                    shown = PathBuf::from("/");
                }
                push_components(&mut todo, &target, true);
            }
            Err(e) => {
                return Err(CreateError::OpenDir {
                    path: next,
                    source: e.into(),
                });
            }
        }
    }
    Ok(Walk::Found {
        fd: cur,
        ancestors: above.into_iter().map(|(fd, _)| fd).collect(),
    })
}

/// `path`'s components to walk (names and `..`), at the back of `todo`, or
/// at its front (a link's target, walked before what followed the link).
fn push_components(todo: &mut VecDeque<OsString>, path: &Path, front: bool) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    if front {
        for p in parts.into_iter().rev() {
            todo.push_front(p);
        }
    } else {
        todo.extend(parts);
    }
}

/// Whether `path` names a FIFO, device or socket [`open_stream`] would open,
/// or one of this process's descriptors ([`descriptor_path`]).
pub(crate) fn is_named_stream(path: &Path) -> bool {
    descriptor_path(path).is_some() || stream_stat(path).is_some()
}

/// Links followed when looking for a descriptor path, at most.
const MAX_DESCRIPTOR_HOPS: usize = 8;

/// The descriptor of this process that `path` names, if it names one:
/// `/dev/stdout` (1), `/dev/stderr` (2), `/dev/stdin` (0), `/dev/fd/N`,
/// `/proc/self/fd/N`, `/proc/thread-self/fd/N`, `/proc/PID/fd/N` of this
/// process — directly or through symbolic links that belong to root or to
/// this user. Such a path is written through the descriptor, never
/// replaced by a file (`-o /dev/stdout > file` writes into `file`).
pub(crate) fn descriptor_path(path: &Path) -> Option<i32> {
    let me = rustix::process::geteuid().as_raw();
    let pid = std::process::id().to_string();
    let mut at = std::path::absolute(path).ok()?;
    for _ in 0..=MAX_DESCRIPTOR_HOPS {
        if let Some(fd) = names_descriptor(&at, &pid) {
            return Some(fd);
        }
        let st = rustix::fs::lstat(&at).ok()?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Symlink
            || (st.st_uid != 0 && st.st_uid != me)
        {
            return None;
        }
        let target = PathBuf::from(OsStr::from_bytes(
            rustix::fs::readlink(&at, Vec::new()).ok()?.as_bytes(),
        ));
        at = match at.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    None
}

/// The descriptor `path` names by its text alone.
fn names_descriptor(path: &Path, pid: &str) -> Option<i32> {
    let text = path.to_str()?;
    match text {
        "/dev/stdin" => return Some(0),
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => {}
    }
    let n = ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"]
        .iter()
        .find_map(|p| text.strip_prefix(p))
        .or_else(|| {
            text.strip_prefix("/proc/")?
                .strip_prefix(pid)?
                .strip_prefix("/fd/")
        })?;
    n.parse().ok()
}

/// Why a file may not be made in `dir` whatever its owner says: a
/// directory of the kernel's (`/dev` itself, `/proc`, `/sys`, devpts), not a
/// place for a trace. A name there (`/dev/stdout`, `/dev/sda`) is never
/// replaced.
pub(crate) fn system_dir(dir: &OwnedFd) -> Option<String> {
    const PROC: i64 = 0x9fa0;
    const SYSFS: i64 = 0x6265_6572;
    const DEVPTS: i64 = 0x1cd1;
    const CGROUP2: i64 = 0x6367_7270;
    const DEBUGFS: i64 = 0x6462_6720;
    const TRACEFS: i64 = 0x7472_6163;
    if let Ok(fs) = rustix::fs::fstatfs(dir) {
        #[allow(clippy::unnecessary_cast)]
        let kind = fs.f_type as i64;
        if [PROC, SYSFS, DEVPTS, CGROUP2, DEBUGFS, TRACEFS].contains(&kind) {
            return Some(format!("on a kernel file system (type {kind:#x})"));
        }
    }
    let dev = std::fs::metadata("/dev").ok()?;
    let here = rustix::fs::fstat(dir).ok()?;
    use std::os::unix::fs::MetadataExt;
    ((here.st_dev, here.st_ino) == (dev.dev(), dev.ino()))
        .then(|| "/dev, the devices' directory".to_string())
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
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CreateError> {
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
pub(crate) fn open_stream(path: &Path) -> Result<Option<OwnedFd>, CreateError> {
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
pub(crate) fn is_stream(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| is_stream_type(st.st_mode))
}

fn is_stream_type(mode: u32) -> bool {
    matches!(
        FileType::from_raw_mode(mode),
        FileType::Fifo | FileType::CharacterDevice | FileType::Socket
    )
}

/// `file`'s directory (`.` when it has none) and its last component.
pub(crate) fn split(file: &Path) -> Result<(PathBuf, String), CreateError> {
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

/// The directory `file` is in, opened (read-only, close-on-exec), and its
/// name there: what the broker is handed to act on that name later.
pub(crate) fn open_parent(file: &Path) -> Option<(OwnedFd, String)> {
    let (dir, name) = split(file).ok()?;
    let fd = rustix::fs::open(
        &dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    Some((fd, name))
}

/// A plain name inside a directory: no `/`, not `.` or `..`, not empty, no NUL.
pub(crate) fn check_name(name: &str) -> Result<(), CreateError> {
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
    /// A symbolic link on the way belongs to another user (its uid): they
    /// could point it anywhere.
    ForeignLink(u32),
    /// A directory of the kernel's (`/dev`, `/proc`, `/sys`): what it is.
    Kernel(String),
}

/// The problem with the open directory `fd` for `me`, if any: it must be
/// a directory owned by root or `me`, and sticky if others may write it.
pub(crate) fn dir_problem(fd: &OwnedFd, me: u32) -> Option<DirProblem> {
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
            DirProblem::ForeignLink(uid) => format!(
                "it is a symbolic link belonging to uid {uid}, not to root or to you (uid {me}): that user could point it anywhere. Name the directory it leads to, or remove the link"
            ),
            DirProblem::Kernel(what) => format!(
                "it is {what}, not a place for files: nothing there is made or replaced (to write to stdout, use -o -)"
            ),
        }
    }
}

/// Checks an open directory for writing by `me`.
pub(crate) fn check_dir(path: &Path, fd: &OwnedFd, me: u32) -> Result<(), UnsafeDir> {
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

    fn chown(p: &Path, uid: u32) {
        rustix::fs::chownat(
            rustix::fs::CWD,
            p,
            Some(rustix::process::Uid::from_raw(uid)),
            Some(rustix::process::Gid::from_raw(uid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("chown");
    }

    #[test]
    fn the_walk_makes_missing_directories_and_follows_only_our_links() {
        let d = dir_with_mode(0o755);
        let made = d.path().join("a/b/../c/./d");
        let od = OutputDir::create(&made).expect("made");
        assert!(d.path().join("a/c/d").is_dir());
        assert!(!d.path().join("a/b").exists() || d.path().join("a/b").is_dir());
        od.create_new("x").expect("file");
        assert!(d.path().join("a/c/d/x").is_file());
        // A link of ours on the way is followed, relative or absolute.
        std::os::unix::fs::symlink("a/c", d.path().join("rel")).expect("ln");
        std::os::unix::fs::symlink(d.path().join("a/c"), d.path().join("abs")).expect("ln");
        for via in ["rel/d", "abs/d"] {
            let o = OutputDir::open(&d.path().join(via)).expect(via);
            assert!(o.has("x"), "{via}");
        }
        // Missing, not made: the nearest existing directory is checked.
        check_ahead(&d.path().join("a/new/er")).expect("checked");
        assert!(!d.path().join("a/new").exists());
        assert!(OutputDir::open(&d.path().join("a/new")).is_err());
        // A loop of links ends.
        std::os::unix::fs::symlink("loop", d.path().join("loop")).expect("ln");
        assert!(OutputDir::open(&d.path().join("loop/x")).is_err());
    }

    #[test]
    fn the_walk_refuses_what_another_user_made_or_links_on_the_way() {
        if !rustix::process::geteuid().is_root() {
            return; // needs chown
        }
        let d = dir_with_mode(0o755);
        let shared = d.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        // Another user made `a` first: `-o shared/a/b/` is refused, and
        // nothing is made inside it.
        std::fs::create_dir(shared.join("a")).expect("mkdir");
        chown(&shared.join("a"), 65534);
        let e = OutputDir::create(&shared.join("a/b")).expect_err("refused");
        assert!(
            matches!(&e, CreateError::Refused { path, why } if path.ends_with("shared/a") && why.problem == DirProblem::ForeignOwner(65534)),
            "{e}"
        );
        assert!(!shared.join("a/b").exists());
        assert!(check_ahead(&shared.join("a/b")).is_err());
        // Their link on the way (to a directory of ours) is not followed.
        let ours = d.path().join("ours");
        std::fs::create_dir(&ours).expect("mkdir");
        std::os::unix::fs::symlink(&ours, shared.join("l")).expect("ln");
        chown(&shared.join("l"), 65534);
        let e = OutputDir::open(&shared.join("l")).expect_err("refused");
        assert!(
            e.to_string()
                .contains("symbolic link belonging to uid 65534"),
            "{e}"
        );
        // A writable directory that is not sticky, above the output.
        let open = d.path().join("open");
        std::fs::create_dir_all(open.join("in")).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = OutputDir::open(&open.join("in")).expect_err("refused");
        assert!(e.to_string().contains("chmod +t"), "{e}");
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
