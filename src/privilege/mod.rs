//! Least privilege for root sessions: a privilege drop after set-up, with a
//! small privileged broker for the few later operations that need root.
//!
//! ```text
//!  recorder (root) ── fork, still single-threaded ──► broker (root; ignores SIGINT/SIGTERM)
//!     │ set-up as root: config, output, rings, sockets bound (not served),
//!     │   sources prepared (tracefs set up, tracing off, descriptors held)
//!     │ register with the broker: segment and snapshot directories (fds),
//!     │   leftover sockets, tracefs teardown, the hook command; seal
//!     │ drop: setgroups([]), setresgid/setresuid to the service user,
//!     │   capabilities cleared (bounding set too), no_new_privs, not dumpable
//!     ▼
//!  recorder (service user): reads other users' bytes; new files, renames,
//!     deletions and hooks by request over a SOCK_SEQPACKET pair (fds by
//!     SCM_RIGHTS); at the end "teardown"; its end closing (exit, crash,
//!     SIGKILL) makes the broker undo what is left and exit — after saving
//!     the buffers to the trace if it closed without "teardown" ([`rescue`])
//! ```
//!
//! A session started by another user does not drop: it already reads
//! others' bytes with no more than its own rights. It forks a *keeper*
//! instead ([`start_keeper`]): the broker's loop, run with the session's
//! own rights, for one job: if the recorder dies while recording, write
//! what its buffers held to its trace ([`rescue`]). The root broker does
//! the same for a root session.

pub(crate) mod broker;
pub mod rescue;
pub(crate) mod user;
pub(crate) mod wire;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::user::ServiceUser;
use self::wire::{Reply, Request};
use crate::sources::ftrace::remote::{FtraceRequest, Prepared, RemoteError, RemoteTracefs};
use crate::storage::create::{CreateError, Delegate};
use crate::storage::segment::RemoteHooks;
use crate::storage::segment::hook::HookCounts;
use crate::trace::salvage::SavedBy;

/// The split failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrivilegeError {
    #[error("cannot choose the service user: {0}")]
    User(#[source] user::UserError),
    #[error("cannot start the privileged broker: {0}")]
    Start(#[source] std::io::Error),
    #[error("the privileged broker: {0}")]
    Broker(#[source] BrokerError),
    #[error("cannot give up root: {0}")]
    Drop(#[source] std::io::Error),
}

/// A request to the broker failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerError {
    #[error("broker lock poisoned")]
    Poisoned,
    #[error(transparent)]
    Message(#[from] wire::MessageError),
    /// The broker's reason, as it sent it.
    #[error("{0}")]
    Refused(#[source] wire::Refusal),
    #[error("unexpected reply {0:?}")]
    Unexpected(Box<Reply>),
    /// The hook names a directory index that was never registered.
    #[error("unexpected reply the hook's directory {0} was not registered")]
    HookDir(usize),
}

impl BrokerError {
    fn unexpected(r: Reply) -> Self {
        Self::Unexpected(Box::new(r))
    }
}

impl From<BrokerError> for RemoteError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Refused(why) => RemoteError::Refused(Box::new(why)),
            other => RemoteError::Channel(Box::new(other)),
        }
    }
}

/// The recorder's end of the broker's socket.
#[derive(Debug)]
pub(crate) struct Broker {
    sock: Mutex<OwnedFd>,
}

impl Broker {
    /// One request, its reply (and descriptor).
    fn call(
        &self,
        req: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Reply, Option<OwnedFd>), BrokerError> {
        let sock = self.sock.lock().map_err(|_| BrokerError::Poisoned)?;
        wire::send(sock.as_fd(), req, fd)?;
        let (reply, fd) = wire::recv::<Reply>(sock.as_fd())?;
        match reply {
            Reply::Refused(why) => Err(BrokerError::Refused(why)),
            r => Ok((r, fd)),
        }
    }

    fn done(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> Result<(), PrivilegeError> {
        self.call(req, fd).map(drop).map_err(PrivilegeError::Broker)
    }

    /// Hands the broker the session's `unique_session_name` lock file
    /// (`name` in the runtime directory `dir`), to remove at the end: the
    /// service user cannot unlink root's file in the sticky directory.
    /// Before the drop only.
    pub(crate) fn register_name_lock(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<(), PrivilegeError> {
        self.done(&Request::RegisterNameLock { name: name.into() }, Some(dir))
    }

    /// Tells the broker, as early as possible (before anything is set
    /// up), the recorder's pid and the sockets the session may leave: if it
    /// dies during its set-up (SIGKILL), the broker still removes its
    /// tracefs instances, kprobes and whichever of these sockets nobody
    /// listens on. Before the drop only.
    pub(crate) fn register_early(
        &self,
        pid: u32,
        leftovers: &[(BorrowedFd<'_>, String)],
    ) -> Result<(), PrivilegeError> {
        self.done(&Request::RegisterRecorder { pid }, None)?;
        for (dir, name) in leftovers {
            self.done(
                &Request::RegisterLeftover { name: name.clone() },
                Some(*dir),
            )?;
        }
        Ok(())
    }

    /// A tracefs instance for `request`, charged to `uid`.
    fn prepare_ftrace(&self, uid: u32, request: &FtraceRequest) -> Result<Prepared, BrokerError> {
        let sock = self.sock.lock().map_err(|_| BrokerError::Poisoned)?;
        let req = Request::PrepareFtrace {
            uid,
            request: request.clone(),
        };
        wire::send(sock.as_fd(), &req, None)?;
        // The whole answer is read under the lock: the reply, the formats,
        // the descriptors.
        let recv = || wire::recv_many::<Reply>(sock.as_fd());
        let (key, mut info, formats) = match recv()? {
            (Reply::Ftrace { key, info, formats }, _) => (key, info, formats),
            (Reply::Refused(why), _) => return Err(BrokerError::Refused(why)),
            (r, _) => return Err(BrokerError::unexpected(r)),
        };
        for _ in 0..formats {
            match recv()? {
                (Reply::Format(g, n, text), _) => info.formats.push((g, n, text)),
                (r, _) => return Err(BrokerError::unexpected(r)),
            }
        }
        let mut fds = Vec::with_capacity(info.fd_count());
        while fds.len() < info.fd_count() {
            match recv()? {
                (Reply::Fds, got) if !got.is_empty() => fds.extend(got),
                (r, _) => return Err(BrokerError::unexpected(r)),
            }
        }
        Ok(Prepared { key, info, fds })
    }

    /// Undoes the tracefs changes and removes leftover sockets now (the end
    /// of the session), waiting until done.
    pub(crate) fn teardown(&self) {
        if let Err(e) = self.call(&Request::Teardown, None) {
            log::warn!("privileged broker teardown: {e}");
        }
    }
}

impl RemoteTracefs for Broker {
    fn prepare(&self, uid: u32, request: &FtraceRequest) -> Result<Prepared, RemoteError> {
        self.prepare_ftrace(uid, request).map_err(RemoteError::from)
    }

    fn release(&self, key: u64) {
        if let Err(e) = self.call(&Request::ReleaseFtrace { key }, None) {
            log::warn!("privileged broker: releasing ftrace instance {key}: {e}");
        }
    }
}

impl Delegate for Broker {
    fn create(&self, dir: u32, name: &str, replace: bool) -> Result<OwnedFd, CreateError> {
        let req = Request::Create {
            dir,
            name: name.into(),
            replace,
        };
        match self.call(&req, None) {
            Ok((Reply::File, Some(fd))) => Ok(fd),
            Ok((Reply::Exists, _)) => Err(CreateError::Exists { path: name.into() }),
            Ok((r, _)) => Err(CreateError::Broker(Box::new(BrokerError::unexpected(r)))),
            Err(e) => Err(CreateError::Broker(Box::new(e))),
        }
    }

    fn rename(&self, dir: u32, from: &str, to: &str) -> Result<(), CreateError> {
        let req = Request::Rename {
            dir,
            from: from.into(),
            to: to.into(),
        };
        self.call(&req, None)
            .map(drop)
            .map_err(|e| CreateError::Broker(Box::new(e)))
    }

    fn remove(&self, dir: u32, name: &str) -> Result<(), CreateError> {
        let req = Request::Remove {
            dir,
            name: name.into(),
        };
        self.call(&req, None)
            .map(drop)
            .map_err(|e| CreateError::Broker(Box::new(e)))
    }
}

impl RemoteHooks for Broker {
    fn submit(&self, index: u64, file: &str, sidecar: &str) {
        let req = Request::SegmentClosed {
            file: file.into(),
            sidecar: sidecar.into(),
            index,
        };
        if let Err(e) = self.call(&req, None) {
            log::warn!("--on-segment-closed for segment {index}: {e}");
        }
    }

    fn counts(&self) -> HookCounts {
        match self.call(&Request::HookCounts, None) {
            Ok((Reply::Hooks { counts, .. }, _)) => counts,
            _ => HookCounts::default(),
        }
    }

    fn deleted(&self) -> Vec<u64> {
        match self.call(&Request::HookCounts, None) {
            Ok((Reply::Hooks { deleted, .. }, _)) => deleted,
            _ => Vec::new(),
        }
    }

    fn finish(&self, grace: Duration) -> (HookCounts, Option<String>) {
        let req = Request::FinishHooks {
            grace_ms: grace.as_millis() as u64,
        };
        match self.call(&req, None) {
            Ok((
                Reply::Hooks {
                    counts, last_error, ..
                },
                _,
            )) => (counts, last_error),
            Ok((r, _)) => (
                HookCounts::default(),
                Some(format!("unexpected reply {r:?}")),
            ),
            Err(e) => (HookCounts::default(), Some(e.to_string())),
        }
    }
}

/// A root session's plan: its broker, and whom to become.
#[derive(Debug)]
pub(crate) struct Privileges {
    pub broker: Arc<Broker>,
    pub user: ServiceUser,
}

/// Forks the broker when running as root (and `RECORDER_USER` is not
/// `root`). Call while the process is single-threaded. For a session going
/// to the background, `detached_stderr` is where the broker's stderr goes
/// (`Some(None)`: /dev/null), so that it holds no terminal or pipe.
pub(crate) fn start(
    detached_stderr: Option<Option<BorrowedFd<'_>>>,
) -> Result<Option<Privileges>, PrivilegeError> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let Some(user) = user::choose().map_err(PrivilegeError::User)? else {
        log::info!("{}=root: this session keeps root", user::ENV);
        return Ok(None);
    };
    fork(user, detached_stderr, false).map(Some)
}

/// Forks an unprivileged session's keeper: the broker's loop with the
/// session's own rights, which saves the session's buffers to its trace if
/// the recorder dies (see [`rescue`]). Call while the process is
/// single-threaded; register with [`Broker::register`].
pub(crate) fn start_keeper(
    detached_stderr: Option<Option<BorrowedFd<'_>>>,
) -> Result<Arc<Broker>, PrivilegeError> {
    let (mine, theirs) = wire::pair().map_err(PrivilegeError::Start)?;
    match crate::sys::privdrop::fork_keeper().map_err(PrivilegeError::Start)? {
        crate::sys::privdrop::Fork::Child => {
            drop(mine);
            run_broker(theirs, detached_stderr, false, SavedBy::Keeper)
        }
        crate::sys::privdrop::Fork::Parent { child } => {
            drop(theirs);
            log::debug!("keeper: pid {child} (saves the buffers if the recorder dies)");
            Ok(Arc::new(Broker {
                sock: Mutex::new(mine),
            }))
        }
    }
}

/// `recorder serve`'s broker, forked as root before the service drops to
/// `user`: besides the teardown it prepares a tracefs instance per served
/// session on request ([`crate::sources::ftrace::remote`]). Call while the
/// process is single-threaded.
pub(crate) fn start_for_serve(user: ServiceUser) -> Result<Privileges, PrivilegeError> {
    fork(user, None, true)
}

fn fork(
    user: ServiceUser,
    detached_stderr: Option<Option<BorrowedFd<'_>>>,
    prepares_ftrace: bool,
) -> Result<Privileges, PrivilegeError> {
    let (mine, theirs) = wire::pair().map_err(PrivilegeError::Start)?;
    match crate::sys::privdrop::fork_broker().map_err(PrivilegeError::Start)? {
        crate::sys::privdrop::Fork::Child => {
            drop(mine);
            run_broker(theirs, detached_stderr, prepares_ftrace, SavedBy::Broker)
        }
        crate::sys::privdrop::Fork::Parent { child } => {
            drop(theirs);
            log::info!(
                "privileged broker: pid {child}; the session will run as uid {} ({})",
                user.uid,
                user.why
            );
            Ok(Privileges {
                broker: Arc::new(Broker {
                    sock: Mutex::new(mine),
                }),
                user,
            })
        }
    }
}

/// The broker's life, in the forked child: never returns.
fn run_broker(
    sock: OwnedFd,
    detached_stderr: Option<Option<BorrowedFd<'_>>>,
    prepares_ftrace: bool,
    by: SavedBy,
) -> ! {
    if let Err(e) = crate::sys::privdrop::ignore_stop_signals() {
        log::warn!("broker: {e}");
    }
    // Nothing to read; and a pipe on stdout (`-o -`) must see its end when
    // the recorder exits, not when the broker does.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        match detached_stderr {
            Some(Some(log)) => {
                let _ = rustix::stdio::dup2_stderr(log);
            }
            Some(None) => {
                let _ = rustix::stdio::dup2_stderr(&null);
            }
            None => {}
        }
    }
    broker::serve(sock, prepares_ftrace, by);
    std::process::exit(0)
}

/// What the recorder registers with the broker before it drops.
#[derive(Default)]
pub(crate) struct Registration<'a> {
    /// Directories files are made in after the drop, with their names'
    /// prefixes and the session's files already there; each gets the id it
    /// is to use.
    pub dirs: Vec<(BorrowedFd<'a>, Vec<String>, Vec<String>)>,
    /// Sockets to remove at the end: (directory, name).
    pub leftovers: Vec<(BorrowedFd<'a>, String)>,
    pub(crate) teardowns: Vec<crate::sources::ftrace::tracefs::TracefsTeardown>,
    /// The `--on-segment-closed` command, the segments' directory (an
    /// index into `dirs`) and the command's timeout.
    pub hook: Option<(String, usize, Duration)>,
    /// Saved if the recorder dies: each shared buffer's file by index, the
    /// trace file (with its name and the recorder's pid), the ring
    /// directory and its files, the tracefs recording directories.
    pub rings: Vec<(u32, BorrowedFd<'a>)>,
    pub(crate) save_to: Option<(BorrowedFd<'a>, String, u32)>,
    /// Or, for a segmented session, its segments' directory and names.
    pub(crate) save_to_segments: Option<(
        BorrowedFd<'a>,
        crate::storage::segment::names::SegmentNames,
        u32,
    )>,
    pub(crate) ring_files: Option<(BorrowedFd<'a>, Vec<String>)>,
    pub drains: Vec<crate::sources::ftrace::Leftover>,
}

impl Privileges {
    /// Registers what the broker will do, seals, and gives up root for the
    /// whole process. Returns the registered directories' ids, in order.
    pub(crate) fn drop_now(&self, reg: Registration<'_>) -> Result<Vec<u32>, PrivilegeError> {
        let ids = self.broker.register(reg)?;
        give_up_root(&self.user)?;
        Ok(ids)
    }
}

impl Broker {
    /// `recorder serve`: what is saved of served session `session` if the
    /// service dies while it records — what `reg` says of its buffers'
    /// files, its trace file and its ftrace leftovers (the rest of `reg` is
    /// the main job's). Undone by [`Broker::served_saved`].
    pub(crate) fn save_served(
        &self,
        session: u64,
        reg: Registration<'_>,
    ) -> Result<(), PrivilegeError> {
        let Some((to, label, _pid)) = reg.save_to else {
            return Ok(());
        };
        for (index, fd) in reg.rings {
            self.done(&Request::SaveServedRing { session, index }, Some(fd))?;
        }
        self.done(&Request::SaveServedTo { session, label }, Some(to))?;
        for leftover in reg.drains {
            self.done(&Request::SaveServedDrain { session, leftover }, None)?;
        }
        Ok(())
    }

    /// Served session `session` is done: nothing of it is saved any more.
    pub(crate) fn served_saved(&self, session: u64) -> Result<(), PrivilegeError> {
        self.done(&Request::ServedSaved { session }, None)
    }

    /// Registers what the broker (or keeper) will do, and seals: nothing
    /// more can be registered. Returns the registered directories' ids, in
    /// order.
    pub(crate) fn register(&self, reg: Registration<'_>) -> Result<Vec<u32>, PrivilegeError> {
        let b = self;
        let mut ids = Vec::with_capacity(reg.dirs.len());
        for (fd, prefixes, files) in reg.dirs {
            match b.call(&Request::RegisterDir { prefixes, files }, Some(fd)) {
                Ok((Reply::Registered(id), _)) => ids.push(id),
                Ok((r, _)) => {
                    return Err(PrivilegeError::Broker(BrokerError::unexpected(r)));
                }
                Err(e) => return Err(PrivilegeError::Broker(e)),
            }
        }
        for (fd, name) in reg.leftovers {
            b.done(&Request::RegisterLeftover { name }, Some(fd))?;
        }
        for teardown in reg.teardowns {
            b.done(&Request::RegisterTeardown { teardown }, None)?;
        }
        if let Some((command, dir, timeout)) = reg.hook {
            let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            let Some(&dir) = ids.get(dir) else {
                return Err(PrivilegeError::Broker(BrokerError::HookDir(dir)));
            };
            b.done(
                &Request::RegisterHook {
                    command,
                    dir,
                    timeout_ms,
                },
                None,
            )?;
        }
        for (index, fd) in reg.rings {
            b.done(&Request::RegisterRing { index }, Some(fd))?;
        }
        if let Some((fd, label, pid)) = reg.save_to {
            b.done(&Request::RegisterSaveTo { label, pid }, Some(fd))?;
        }
        if let Some((fd, names, pid)) = reg.save_to_segments {
            let req = Request::RegisterSaveToSegments {
                dir: names.dir,
                stem: names.stem,
                ext: names.ext,
                pid,
            };
            b.done(&req, Some(fd))?;
        }
        if let Some((fd, names)) = reg.ring_files {
            b.done(&Request::RegisterRingFiles { names }, Some(fd))?;
        }
        for leftover in reg.drains {
            b.done(&Request::RegisterDrain { leftover }, None)?;
        }
        b.done(&Request::Seal, None)?;
        Ok(ids)
    }
}

/// The drop itself; checked afterwards (uid and capabilities).
pub(crate) fn give_up_root(user: &ServiceUser) -> Result<(), PrivilegeError> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let err = |e: rustix::io::Errno| PrivilegeError::Drop(e.into());
    // The bounding set first: dropping from it needs CAP_SETPCAP.
    for cap in 0..64u32 {
        let Some(set) = CapabilitySet::from_bits(1u64 << cap) else {
            break;
        };
        match rustix::thread::remove_capability_from_bounding_set(set) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(err(e)),
        }
    }
    crate::sys::privdrop::set_ids(user.uid, user.gid).map_err(PrivilegeError::Drop)?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(err)?;
    rustix::thread::clear_ambient_capability_set().map_err(err)?;
    rustix::thread::set_no_new_privs(true).map_err(err)?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(err)?;
    let caps = rustix::thread::capabilities(None).map_err(err)?;
    let uid = rustix::process::getuid().as_raw();
    let euid = rustix::process::geteuid().as_raw();
    if uid == 0 || euid == 0 || !caps.effective.is_empty() || !caps.permitted.is_empty() {
        return Err(PrivilegeError::Drop(std::io::Error::other(
            "still privileged after the drop",
        )));
    }
    // Threads started before (the control worker, source readers) changed
    // uid with this one and lost every capability; they carry no_new_privs
    // from the fork of the broker (privdrop P4). Checked, not assumed.
    crate::sys::privdrop::check_every_thread().map_err(PrivilegeError::Drop)?;
    log::info!(
        "gave up root: now uid {} gid {}, no capabilities, no_new_privs ({} threads)",
        user.uid,
        user.gid,
        crate::sys::privdrop::thread_count()
    );
    Ok(())
}
