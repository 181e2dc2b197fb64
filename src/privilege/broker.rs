//! The broker: the root side of the split. Forked while the recorder is
//! still single-threaded, it keeps root and does, on request, the few
//! things the unprivileged recorder cannot: make, rename and remove files
//! in the directories registered before the drop, run the
//! `--on-segment-closed` command as the invoking user, and undo the tracefs
//! changes. When the recorder's end of the socket closes (its normal exit,
//! a crash, SIGKILL) it undoes what is left and exits.
//!
//! Every request is checked: registrations only before `Seal`; names plain
//! (no `/`, not `..`) and starting with a prefix registered for that
//! directory, so a compromised recorder cannot use it to write elsewhere.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use super::message::{self, MessageError, Operation, Refusal, Reply, Request};
use crate::sources::ftrace::remote::FtraceRequest;
use crate::sources::ftrace::tracefs::{Tracefs, TracefsTeardown};
use crate::sources::ftrace::{
    FtraceOptions, FtraceSource, VecOutput, default_buffer_size_kb, mem_total_kb,
};
use crate::storage::create::{self, CreateError, OutputDir};
use crate::storage::segment::hook::{HookJob, HookRunner};

/// A directory the recorder may have files made in.
struct Registered {
    dir: OutputDir,
    prefixes: Vec<String>,
}

#[derive(Default)]
struct State {
    dirs: Vec<Registered>,
    /// Sockets to remove at the end: (directory, name).
    leftovers: Vec<(OwnedFd, String)>,
    /// The session's name lock: (directory, name, the pid it holds).
    name_locks: Vec<(OwnedFd, String, String)>,
    teardowns: Vec<TracefsTeardown>,
    hooks: Option<(HookRunner, PathBuf)>,
    sealed: bool,
    /// `recorder serve`'s broker: the instances it prepared for sessions.
    served: Option<ServedInstances>,
}

/// Instances a uid's sessions may hold at once.
pub const MAX_INSTANCES_PER_UID: usize = 4;
/// Instances all sessions together may hold.
pub const MAX_INSTANCES: usize = 16;
/// Kernel buffer memory a uid's instances may hold, all CPUs (KiB).
pub const MAX_BUFFER_KB_PER_UID: u64 = 256 * 1024;

/// Tracefs instances prepared for `recorder serve`'s sessions.
#[derive(Default)]
struct ServedInstances {
    live: HashMap<u64, ServedInstance>,
    next: u64,
}

struct ServedInstance {
    uid: u32,
    /// Buffer memory charged to the uid (KiB, all CPUs).
    kb: u64,
    teardown: TracefsTeardown,
}

/// A reply and the descriptor sent with it.
type Answer = (Reply, Option<OwnedFd>);

fn done() -> Answer {
    (Reply::Done, None)
}

/// A refusal; its reason crosses the wire typed.
fn refused(why: Refusal) -> Answer {
    (Reply::Refused(why), None)
}

/// Serves requests on `sock` until the other end closes, then cleans up.
/// Runs in the forked child; returns when it is time to exit.
/// `prepares_ftrace`: `recorder serve`'s broker, which prepares tracefs
/// instances for sessions on request.
pub fn serve(sock: OwnedFd, prepares_ftrace: bool) {
    let mut st = State {
        served: prepares_ftrace.then(ServedInstances::default),
        ..State::default()
    };
    loop {
        let (req, fd) = match message::recv::<Request>(sock.as_fd()) {
            Ok(r) => r,
            Err(MessageError::Closed) => break,
            Err(e) => {
                // A malformed request is answered, not fatal: the other end
                // is the only one that can send here.
                log::warn!("broker: {e}");
                let why = Refusal::Unreadable(e.to_string());
                if message::send(sock.as_fd(), &Reply::Refused(why), None).is_err() {
                    break;
                }
                continue;
            }
        };
        if let Request::PrepareFtrace { uid, request } = &req {
            if st.reply_prepared(sock.as_fd(), *uid, request).is_err() {
                break;
            }
            continue;
        }
        let (reply, out) = st.handle(req, fd);
        let sent = message::send(sock.as_fd(), &reply, out.as_ref().map(AsFd::as_fd));
        if sent.is_err() {
            break;
        }
    }
    st.clean_up(crate::storage::segment::HOOK_GRACE);
}

impl State {
    /// One request's reply (and descriptor): each kind is answered by a
    /// function of its own below.
    fn handle(&mut self, req: Request, fd: Option<OwnedFd>) -> Answer {
        let registration = matches!(
            req,
            Request::RegisterDir { .. }
                | Request::RegisterLeftover { .. }
                | Request::RegisterNameLock { .. }
                | Request::RegisterTeardown { .. }
                | Request::RegisterHook { .. }
        );
        if registration && self.sealed {
            return refused(Refusal::Sealed);
        }
        match req {
            Request::RegisterDir { prefixes } => self.register_dir(prefixes, fd),
            Request::RegisterLeftover { name } => self.register_leftover(name, fd),
            Request::RegisterNameLock { name } => self.register_name_lock(name, fd),
            Request::RegisterTeardown { teardown } => {
                self.teardowns.push(teardown);
                done()
            }
            Request::RegisterHook {
                command,
                dir,
                timeout_ms,
            } => self.register_hook(command, dir, timeout_ms),
            Request::Seal => {
                self.sealed = true;
                done()
            }
            Request::Create { dir, name, replace } => self.create(dir, &name, replace),
            Request::Rename { dir, from, to } => self.rename(dir, &from, &to),
            Request::Remove { dir, name } => self.remove(dir, &name),
            Request::SegmentClosed {
                file,
                sidecar,
                index,
            } => self.segment_closed(&file, &sidecar, index),
            Request::HookCounts => self.hook_counts(),
            Request::FinishHooks { grace_ms } => self.finish_hooks(grace_ms),
            Request::PrepareFtrace { .. } => refused(Refusal::NotHere),
            Request::ReleaseFtrace { key } => self.release_ftrace(key),
            Request::Teardown => {
                self.tear_down(true);
                done()
            }
        }
    }

    fn register_dir(&mut self, prefixes: Vec<String>, fd: Option<OwnedFd>) -> Answer {
        let Some(fd) = fd else {
            return refused(Refusal::NoDescriptor);
        };
        if let Some(p) = prefixes.iter().find(|p| create::check_name(p).is_err()) {
            return refused(Refusal::NotPlainName(p.clone()));
        }
        let path = dir_path(&fd);
        let dir = match OutputDir::from_fd(&path, fd) {
            Ok(d) => d,
            Err(e) => return refused(Refusal::system(Operation::RegisterDir(path), &e)),
        };
        self.dirs.push(Registered { dir, prefixes });
        (Reply::Registered(self.dirs.len() as u32 - 1), None)
    }

    fn register_leftover(&mut self, name: String, fd: Option<OwnedFd>) -> Answer {
        let Some(fd) = fd else {
            return refused(Refusal::NoDescriptor);
        };
        if create::check_name(&name).is_err() {
            return refused(Refusal::NotPlainName(name));
        }
        self.leftovers.push((fd, name));
        done()
    }

    fn register_name_lock(&mut self, name: String, fd: Option<OwnedFd>) -> Answer {
        let Some(fd) = fd else {
            return refused(Refusal::NoDescriptor);
        };
        if create::check_name(&name).is_err()
            || !(name.starts_with("session.") && name.ends_with(".lock"))
        {
            return refused(Refusal::NotNameLock(name));
        }
        // Its pid now, while the session holds it: at the end the file is
        // removed only if it still names this session.
        match lock_holder(&fd, &name) {
            Ok(pid) => {
                self.name_locks.push((fd, name, pid));
                done()
            }
            Err(e) => refused(Refusal::system(Operation::ReadNameLock(name), &e)),
        }
    }

    fn register_hook(&mut self, command: String, dir: PathBuf, timeout_ms: u64) -> Answer {
        match HookRunner::start(command, Duration::from_millis(timeout_ms)) {
            Ok(r) => {
                self.hooks = Some((r, dir));
                done()
            }
            Err(e) => refused(Refusal::system(Operation::StartHooks, &e)),
        }
    }

    fn create(&self, dir: u32, name: &str, replace: bool) -> Answer {
        let d = match self.allowed(dir, &[name]) {
            Ok(d) => d,
            Err(why) => return refused(why),
        };
        let r = if replace {
            d.replace(name)
        } else {
            d.create_new(name)
        };
        match r {
            Ok(fd) => (Reply::File, Some(fd)),
            Err(CreateError::Exists { .. }) => (Reply::Exists, None),
            Err(e) => refused(Refusal::system(Operation::Create(name.into()), &e)),
        }
    }

    fn rename(&self, dir: u32, from: &str, to: &str) -> Answer {
        match self.allowed(dir, &[from, to]).map(|d| d.rename(from, to)) {
            Err(why) => refused(why),
            Ok(Err(e)) => {
                let op = Operation::Rename {
                    from: from.into(),
                    to: to.into(),
                };
                refused(Refusal::system(op, &e))
            }
            Ok(Ok(())) => done(),
        }
    }

    fn remove(&self, dir: u32, name: &str) -> Answer {
        match self.allowed(dir, &[name]).map(|d| d.remove(name)) {
            Err(why) => refused(why),
            Ok(Err(e)) => refused(Refusal::system(Operation::Remove(name.into()), &e)),
            Ok(Ok(())) => done(),
        }
    }

    fn segment_closed(&self, file: &str, sidecar: &str, index: u64) -> Answer {
        let Some((runner, dir)) = &self.hooks else {
            return refused(Refusal::NoHook);
        };
        if let Some(bad) = [file, sidecar]
            .into_iter()
            .find(|n| create::check_name(n).is_err())
        {
            return refused(Refusal::NotPlainName(bad.into()));
        }
        runner.submit(HookJob {
            path: dir.join(file),
            sidecar: dir.join(sidecar),
            index,
        });
        done()
    }

    fn hook_counts(&self) -> Answer {
        match &self.hooks {
            Some((r, _)) => (
                Reply::Hooks {
                    counts: r.counts(),
                    last_error: r.last_error(),
                    deleted: r.deleted(),
                },
                None,
            ),
            None => refused(Refusal::NoHook),
        }
    }

    fn finish_hooks(&mut self, grace_ms: u64) -> Answer {
        let Some((r, _)) = &mut self.hooks else {
            return refused(Refusal::NoHook);
        };
        let grace = Duration::from_millis(grace_ms).min(crate::storage::segment::HOOK_GRACE);
        let counts = r.finish(grace);
        (
            Reply::Hooks {
                counts,
                last_error: r.last_error(),
                deleted: r.deleted(),
            },
            None,
        )
    }

    fn release_ftrace(&mut self, key: u64) -> Answer {
        match self.served.as_mut().and_then(|s| s.live.remove(&key)) {
            Some(i) => {
                i.teardown.run();
                done()
            }
            None => refused(Refusal::NoInstance(key)),
        }
    }

    /// The registered directory `id`, when every name is one of its own.
    fn allowed(&self, id: u32, names: &[&str]) -> Result<&OutputDir, Refusal> {
        if !self.sealed {
            return Err(Refusal::NotSealed);
        }
        let reg = self.dirs.get(id as usize).ok_or(Refusal::NoDirectory(id))?;
        for name in names {
            create::check_name(name).map_err(|_| Refusal::NotPlainName(name.to_string()))?;
            let body = name.strip_prefix('.').unwrap_or(name);
            if !reg.prefixes.iter().any(|p| body.starts_with(p.as_str())) {
                return Err(Refusal::NotOurs(name.to_string()));
            }
        }
        Ok(&reg.dir)
    }

    /// Prepares an instance for `request` and sends it: the reply, the
    /// formats, the descriptors. Err only when the socket failed.
    fn reply_prepared(
        &mut self,
        sock: BorrowedFd<'_>,
        uid: u32,
        request: &FtraceRequest,
    ) -> Result<(), MessageError> {
        let (key, mut info, fds) = match self.prepare_ftrace(uid, request) {
            Ok(p) => p,
            Err(e) => {
                log::info!("broker: ftrace for uid {uid} refused: {e}");
                return message::send(sock, &Reply::Refused(e), None);
            }
        };
        let formats = std::mem::take(&mut info.formats);
        message::send(
            sock,
            &Reply::Ftrace {
                key,
                info,
                formats: formats.len(),
            },
            None,
        )?;
        for (g, n, text) in formats {
            message::send(sock, &Reply::Format(g, n, text), None)?;
        }
        for chunk in fds.chunks(message::MAX_FDS) {
            let borrowed: Vec<BorrowedFd<'_>> = chunk.iter().map(AsFd::as_fd).collect();
            message::send_many(sock, &Reply::Fds, &borrowed)?;
        }
        Ok(())
    }

    /// The request checked, the uid's limits checked before anything is
    /// made, then the instance prepared; its teardown is kept.
    fn prepare_ftrace(
        &mut self,
        uid: u32,
        request: &FtraceRequest,
    ) -> Result<
        (
            u64,
            crate::sources::ftrace::remote::PreparedInfo,
            Vec<OwnedFd>,
        ),
        Refusal,
    > {
        let served = self.served.as_mut().ok_or(Refusal::NotServing)?;
        request.check().map_err(Refusal::Invalid)?;
        if served.live.len() >= MAX_INSTANCES {
            return Err(Refusal::Instances(served.live.len()));
        }
        let mine: Vec<&ServedInstance> = served.live.values().filter(|i| i.uid == uid).collect();
        if mine.len() >= MAX_INSTANCES_PER_UID {
            return Err(Refusal::UidInstances {
                uid,
                held: mine.len(),
            });
        }
        let tracefs =
            |e: &(dyn std::error::Error + 'static)| Refusal::system(Operation::PrepareFtrace, e);
        let top = Tracefs::discover().map_err(|e| tracefs(&e))?;
        let default_kb = default_buffer_size_kb(mem_total_kb(std::path::Path::new("/proc")));
        let per_cpu = match request.buffer_size_kb {
            Some(kb) if request.buffer_size_lower_bound => kb.max(default_kb),
            Some(kb) => kb,
            None => default_kb,
        };
        let want = u64::from(per_cpu) * top.cpus().len().max(1) as u64;
        let held: u64 = mine.iter().map(|i| i.kb).sum();
        if held + want > MAX_BUFFER_KB_PER_UID {
            return Err(Refusal::UidMemory { uid, want, held });
        }
        let opts = FtraceOptions {
            spec: request.to_spec(),
            tracefs_root: Some(top.root().to_path_buf()),
            ..FtraceOptions::default()
        };
        let mut src = FtraceSource::new(opts, VecOutput::new()).map_err(|e| tracefs(&e))?;
        src.prepare().map_err(|e| tracefs(&e))?;
        let (info, fds, teardown) = src.export().map_err(|e| tracefs(&e))?;
        let key = served.next;
        served.next += 1;
        served.live.insert(
            key,
            ServedInstance {
                uid,
                kb: want,
                teardown,
            },
        );
        log::info!(
            "broker: ftrace instance {key} for uid {uid}: {} events, {per_cpu} KiB per CPU",
            info.formats.len()
        );
        Ok((key, info, fds))
    }

    /// Undoes the tracefs changes and removes leftover sockets and the
    /// name lock, once. `asked`: the recorder asked (it is alive and holds
    /// its name lock); otherwise its end closed.
    fn tear_down(&mut self, asked: bool) {
        for (dir, name, pid) in self.name_locks.drain(..) {
            remove_name_lock(&dir, &name, &pid, asked);
        }
        for t in self.teardowns.drain(..) {
            t.run();
        }
        if let Some(s) = &mut self.served {
            for (_, i) in s.live.drain() {
                i.teardown.run();
            }
        }
        for (dir, name) in self.leftovers.drain(..) {
            // Only a socket: the name is in a directory others may write.
            let is_socket = rustix::fs::statat(&dir, &name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket
                });
            if is_socket {
                let _ = rustix::fs::unlinkat(&dir, &name, rustix::fs::AtFlags::empty());
            }
        }
    }

    fn clean_up(&mut self, grace: Duration) {
        self.tear_down(false);
        if let Some((r, _)) = &mut self.hooks {
            r.finish(grace);
        }
    }
}

/// Opens the lock file `name` in `dir` (a regular file, never through a
/// link), for reading.
fn open_lock(dir: &OwnedFd, name: &str) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(rustix::io::Errno::INVAL);
    }
    Ok(fd)
}

/// The pid a name lock file holds (its first line).
fn lock_holder(dir: &OwnedFd, name: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::from(open_lock(dir, name)?)
        .take(32)
        .read_to_string(&mut text)?;
    Ok(text.trim().to_string())
}

/// Removes the session's name lock file, as the session itself would
/// (`control::session_name`: unlinked while locked), but only while it is
/// still this session's: when the recorder `asked`, it holds the lock and
/// the file must hold its pid; when its end closed, the lock must be free
/// (the broker takes it before unlinking). A file another session holds
/// now is left alone.
fn remove_name_lock(dir: &OwnedFd, name: &str, pid: &str, asked: bool) {
    use rustix::fs::{FlockOperation, flock};
    let Ok(fd) = open_lock(dir, name) else {
        return;
    };
    let ours = match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => true,
        Err(rustix::io::Errno::WOULDBLOCK) => {
            asked && lock_holder(dir, name).is_ok_and(|p| p == pid)
        }
        Err(_) => false,
    };
    if !ours {
        return;
    }
    // The name must still lead to the file checked.
    let same = rustix::fs::fstat(&fd)
        .ok()
        .zip(rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok());
    if let Some((held, named)) = same
        && held.st_dev == named.st_dev
        && held.st_ino == named.st_ino
    {
        let _ = rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty());
    }
}

/// The directory's path, for messages and hooks (from /proc).
fn dir_path(fd: &OwnedFd) -> PathBuf {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap_or_else(|_| PathBuf::from("?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(dir: &std::path::Path) -> State {
        let mut st = State::default();
        let fd = rustix::fs::open(
            dir,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("dir");
        let (r, _) = st.handle(
            Request::RegisterDir {
                prefixes: vec!["t-".into()],
            },
            Some(fd),
        );
        assert!(matches!(r, Reply::Registered(0)), "{r:?}");
        st
    }

    #[test]
    fn a_sessions_broker_prepares_no_ftrace_and_releases_nothing() {
        let mut st = State::default();
        let request = FtraceRequest {
            events: vec!["sched/sched_switch".into()],
            ..FtraceRequest::default()
        };
        assert!(matches!(
            st.prepare_ftrace(0, &request),
            Err(Refusal::NotServing)
        ));
        let (r, _) = st.handle(Request::ReleaseFtrace { key: 0 }, None);
        assert!(matches!(r, Reply::Refused(Refusal::NoInstance(0))), "{r:?}");
    }

    #[test]
    fn a_bad_request_is_refused_before_tracefs_is_looked_at() {
        let mut st = State {
            served: Some(ServedInstances::default()),
            ..State::default()
        };
        let request = FtraceRequest {
            events: vec!["sched/../../x".into()],
            ..FtraceRequest::default()
        };
        assert!(matches!(
            st.prepare_ftrace(0, &request),
            Err(Refusal::Invalid(_))
        ));
    }

    #[test]
    fn only_the_sessions_names_in_registered_directories_after_the_seal() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut st = registered(d.path());
        let create = |name: &str| Request::Create {
            dir: 0,
            name: name.into(),
            replace: false,
        };
        // Nothing is done before the seal.
        assert!(matches!(
            st.handle(create("t-1"), None).0,
            Reply::Refused(Refusal::NotSealed)
        ));
        assert!(matches!(st.handle(Request::Seal, None).0, Reply::Done));
        let (r, fd) = st.handle(create("t-1"), None);
        assert!(matches!(r, Reply::File) && fd.is_some(), "{r:?}");
        assert!(matches!(st.handle(create("t-1"), None).0, Reply::Exists));
        for bad in ["../t-2", "x-1", "t-1/..", "..", "", "/etc/t-1"] {
            let (r, fd) = st.handle(create(bad), None);
            assert!(
                matches!(
                    &r,
                    Reply::Refused(Refusal::NotPlainName(n) | Refusal::NotOurs(n)) if n == bad
                ) && fd.is_none(),
                "{bad}: {r:?}"
            );
        }
        let (r, _) = st.handle(
            Request::Rename {
                dir: 0,
                from: "t-1".into(),
                to: "passwd".into(),
            },
            None,
        );
        assert!(
            matches!(&r, Reply::Refused(Refusal::NotOurs(n)) if n == "passwd"),
            "{r:?}"
        );
        let (r, _) = st.handle(
            Request::Create {
                dir: 7,
                name: "t-3".into(),
                replace: false,
            },
            None,
        );
        assert!(
            matches!(r, Reply::Refused(Refusal::NoDirectory(7))),
            "{r:?}"
        );
        // Registrations are closed.
        let other = tempfile::tempdir().expect("tempdir");
        let fd = rustix::fs::open(
            other.path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("dir");
        let (r, _) = st.handle(
            Request::RegisterDir {
                prefixes: vec![String::new()],
            },
            Some(fd),
        );
        assert!(matches!(r, Reply::Refused(Refusal::Sealed)), "{r:?}");
    }
}
