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
//! Beyond making a new file, it acts only on files it made itself for this
//! session (or that the session registered as made before the drop), by
//! identity: renames, removals and hooks name such a file, and only while
//! the name still leads to it. A rename goes only to the name the file was
//! made for (`X.partial` to `X`, `.X.tmp` to `X`).
//!
//! If the recorder's end closes before it said it was done (`Teardown`),
//! the recorder died while recording: what its buffers held is saved to its
//! trace file first ([`super::rescue`]), the kernel's ftrace leftover with
//! it, and only then is tracefs undone. An unprivileged session's keeper
//! runs this same loop without root, for the save alone.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use super::rescue::Rescue;
use super::wire::{self, MessageError, Operation, Refusal, Reply, Request};
use crate::sources::ftrace::remote::FtraceRequest;
use crate::sources::ftrace::tracefs::{Tracefs, TracefsTeardown};
use crate::sources::ftrace::{
    FtraceOptions, FtraceSource, Leftover, VecOutput, default_buffer_size_kb, mem_total_kb,
};
use crate::storage::create::{self, CreateError, FileId, OutputDir};
use crate::storage::segment::hook::{HookJob, HookRunner};
use crate::trace::salvage::SavedBy;

/// A directory the recorder may have files made in.
struct Registered {
    dir: OutputDir,
    prefixes: Vec<String>,
    /// The files of this session there, by name: the ones it made (or was
    /// told of before the seal), and what each is.
    made: HashMap<String, FileId>,
}

struct State {
    dirs: Vec<Registered>,
    /// Sockets to remove at the end: (directory, name).
    leftovers: Vec<(OwnedFd, String)>,
    /// The session's name lock: (directory, name, the pid it holds).
    name_locks: Vec<(OwnedFd, String, String)>,
    teardowns: Vec<TracefsTeardown>,
    /// The hook runner and the registered directory it runs on.
    hooks: Option<(HookRunner, u32)>,
    sealed: bool,
    /// `recorder serve`'s broker: the instances it prepared for sessions.
    served: Option<ServedInstances>,
    /// A session's broker: the recorder's pid, whose tracefs instances and
    /// kprobes are swept at the end even if it died before registering them.
    recorder: Option<u32>,
    /// What is saved if the recorder dies.
    rescue: Rescue,
    /// The recorder said it is done: nothing is to be saved.
    done: bool,
    /// Who this is, for the save's attributes.
    by: SavedBy,
}

/// Instances a uid's sessions may hold at once.
pub(crate) const MAX_INSTANCES_PER_UID: usize = 4;
/// Instances all sessions together may hold.
pub(crate) const MAX_INSTANCES: usize = 16;
/// Kernel buffer memory a uid's instances may hold, all CPUs (KiB).
pub(crate) const MAX_BUFFER_KB_PER_UID: u64 = 256 * 1024;

/// Served sessions that may be registered for saving at once: the most
/// `--max-sessions` allows.
pub(crate) const MAX_SAVED_SESSIONS: usize = u16::MAX as usize;

/// Tracefs instances prepared for `recorder serve`'s sessions, and what
/// is saved of each recording session if the service dies.
#[derive(Default)]
struct ServedInstances {
    live: HashMap<u64, ServedInstance>,
    next: u64,
    /// By the service's session id, until that session says it is done.
    saves: HashMap<u64, Rescue>,
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

impl State {
    fn new(served: Option<ServedInstances>, by: SavedBy) -> State {
        State {
            dirs: Vec::new(),
            leftovers: Vec::new(),
            name_locks: Vec::new(),
            teardowns: Vec::new(),
            hooks: None,
            sealed: false,
            served,
            recorder: None,
            rescue: Rescue::default(),
            done: false,
            by,
        }
    }
}

/// Serves requests on `sock` until the other end closes, then cleans up.
/// Runs in the forked child; returns when it is time to exit.
/// `prepares_ftrace`: `recorder serve`'s broker, which prepares tracefs
/// instances for sessions on request. `by`: the root broker, or an
/// unprivileged session's keeper.
pub(crate) fn serve(sock: OwnedFd, prepares_ftrace: bool, by: SavedBy) {
    let mut st = State::new(prepares_ftrace.then(ServedInstances::default), by);
    loop {
        let (req, fd) = match wire::recv::<Request>(sock.as_fd()) {
            Ok(r) => r,
            Err(MessageError::Closed) => break,
            Err(e) => {
                // A malformed request is answered, not fatal: the other end
                // is the only one that can send here.
                log::warn!("broker: {e}");
                let why = Refusal::Unreadable(e.to_string());
                if wire::send(sock.as_fd(), &Reply::Refused(why), None).is_err() {
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
        let sent = wire::send(sock.as_fd(), &reply, out.as_ref().map(AsFd::as_fd));
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
                | Request::RegisterRecorder { .. }
                | Request::RegisterRing { .. }
                | Request::RegisterSaveTo { .. }
                | Request::RegisterSaveToSegments { .. }
                | Request::RegisterRingFiles { .. }
                | Request::RegisterDrain { .. }
        );
        if registration && self.sealed {
            return refused(Refusal::Sealed);
        }
        match req {
            Request::RegisterDir { prefixes, files } => self.register_dir(prefixes, files, fd),
            Request::RegisterLeftover { name } => self.register_leftover(name, fd),
            Request::RegisterNameLock { name } => self.register_name_lock(name, fd),
            Request::RegisterRecorder { pid } => {
                // A session's broker only: `recorder serve`'s sweeps its own.
                if self.served.is_none() {
                    self.recorder = Some(pid);
                }
                done()
            }
            Request::RegisterTeardown { teardown } => {
                self.teardowns.push(teardown);
                done()
            }
            Request::RegisterHook {
                command,
                dir,
                timeout_ms,
            } => self.register_hook(command, dir, timeout_ms),
            Request::RegisterRing { index } => match fd {
                Some(fd) => {
                    if self.rescue.add_ring(index, fd) {
                        done()
                    } else {
                        refused(Refusal::TooManyRings(super::rescue::MAX_RINGS))
                    }
                }
                None => refused(Refusal::NoDescriptor),
            },
            Request::RegisterSaveTo { label, pid } => match fd {
                Some(fd) => {
                    self.rescue.save_to(fd, label, pid);
                    done()
                }
                None => refused(Refusal::NoDescriptor),
            },
            Request::RegisterSaveToSegments {
                dir,
                stem,
                ext,
                pid,
            } => match fd {
                Some(fd) => {
                    let names = crate::storage::segment::names::SegmentNames { dir, stem, ext };
                    let name = names.partial_name(0);
                    if create::check_name(&name).is_err() {
                        return refused(Refusal::NotPlainName(name));
                    }
                    self.rescue.save_to_segments(fd, names, pid);
                    done()
                }
                None => refused(Refusal::NoDescriptor),
            },
            Request::RegisterRingFiles { names } => match fd {
                Some(fd) => match names.iter().find(|n| create::check_name(n).is_err()) {
                    Some(bad) => refused(Refusal::NotPlainName(bad.clone())),
                    None => {
                        self.rescue.ring_files(fd, names);
                        done()
                    }
                },
                None => refused(Refusal::NoDescriptor),
            },
            Request::RegisterDrain { leftover } => {
                self.rescue.add_drain(leftover);
                done()
            }
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
            Request::SaveServedRing { session, index } => match fd {
                Some(fd) => self.save_served(session, |r| {
                    r.add_ring(index, fd)
                        .then_some(())
                        .ok_or(Refusal::TooManyRings(super::rescue::MAX_RINGS))
                }),
                None => refused(Refusal::NoDescriptor),
            },
            Request::SaveServedTo { session, label } => match fd {
                Some(fd) => {
                    // The service is this broker's parent: the pid whose
                    // death the save reports.
                    let pid = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
                    let pid = u32::try_from(pid).unwrap_or(0);
                    self.save_served(session, |r| {
                        r.save_to(fd, label, pid);
                        Ok(())
                    })
                }
                None => refused(Refusal::NoDescriptor),
            },
            Request::SaveServedDrain { session, leftover } => {
                self.save_served_drain(session, leftover)
            }
            Request::ServedSaved { session } => match &mut self.served {
                Some(s) => {
                    s.saves.remove(&session);
                    done()
                }
                None => refused(Refusal::NotServing),
            },
            Request::Teardown => {
                self.done = true;
                self.tear_down(true);
                done()
            }
        }
    }

    fn register_dir(
        &mut self,
        prefixes: Vec<String>,
        files: Vec<String>,
        fd: Option<OwnedFd>,
    ) -> Answer {
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
        let mut reg = Registered {
            dir,
            prefixes,
            made: HashMap::new(),
        };
        // The session's files made before the drop, as they are now (the
        // session is still root and trusted until the seal).
        for name in files {
            if let Err(why) = reg.check_form(&name) {
                return refused(why);
            }
            match regular_id(&reg.dir, &name) {
                Some(id) => {
                    reg.made.insert(name, id);
                }
                None => return refused(Refusal::NotAFile { name }),
            }
        }
        self.dirs.push(reg);
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

    fn register_hook(&mut self, command: String, dir: u32, timeout_ms: u64) -> Answer {
        let Some(reg) = self.dirs.get(dir as usize) else {
            return refused(Refusal::NoDirectory(dir));
        };
        match HookRunner::start(command, Duration::from_millis(timeout_ms), reg.dir.clone()) {
            Ok(r) => {
                self.hooks = Some((r, dir));
                done()
            }
            Err(e) => refused(Refusal::system(Operation::StartHooks, &e)),
        }
    }

    fn create(&mut self, dir: u32, name: &str, replace: bool) -> Answer {
        let d = match self.allowed(dir, &[name]) {
            Ok(d) => d,
            Err(why) => return refused(why),
        };
        let r = if replace {
            d.dir.replace(name)
        } else {
            d.dir.create_new(name)
        };
        match r {
            Ok(fd) => match create::file_id(&fd) {
                Ok(id) => {
                    d.made.insert(name.to_string(), id);
                    (Reply::File, Some(fd))
                }
                Err(e) => refused(Refusal::system(Operation::Create(name.into()), &e)),
            },
            Err(CreateError::Exists { .. }) => (Reply::Exists, None),
            Err(e) => refused(Refusal::system(Operation::Create(name.into()), &e)),
        }
    }

    fn rename(&mut self, dir: u32, from: &str, to: &str) -> Answer {
        let d = match self.allowed(dir, &[from, to]) {
            Ok(d) => d,
            Err(why) => return refused(why),
        };
        if destination(from).as_deref() != Some(to) {
            return refused(Refusal::NotItsName {
                from: from.into(),
                to: to.into(),
            });
        }
        let Some(id) = d.made_and_there(from) else {
            return refused(Refusal::NotMade(from.into()));
        };
        match d.dir.rename(from, to) {
            Ok(()) => {
                d.made.remove(from);
                d.made.insert(to.to_string(), id);
                done()
            }
            Err(e) => {
                let op = Operation::Rename {
                    from: from.into(),
                    to: to.into(),
                };
                refused(Refusal::system(op, &e))
            }
        }
    }

    fn remove(&mut self, dir: u32, name: &str) -> Answer {
        let d = match self.allowed(dir, &[name]) {
            Ok(d) => d,
            Err(why) => return refused(why),
        };
        let Some(&id) = d.made.get(name) else {
            return refused(Refusal::NotMade(name.into()));
        };
        match d.dir.remove_if(name, id) {
            // Removed now, or gone already (a hook moved it).
            Ok(true) => {
                d.made.remove(name);
                done()
            }
            Ok(false) if !d.dir.has(name) => {
                d.made.remove(name);
                done()
            }
            // Another entry holds the name now: not ours to remove.
            Ok(false) => refused(Refusal::NotMade(name.into())),
            Err(e) => refused(Refusal::system(Operation::Remove(name.into()), &e)),
        }
    }

    fn segment_closed(&self, file: &str, sidecar: &str, index: u64) -> Answer {
        let Some((runner, dir)) = &self.hooks else {
            return refused(Refusal::NoHook);
        };
        let Some(reg) = self.dirs.get(*dir as usize) else {
            return refused(Refusal::NoDirectory(*dir));
        };
        let mut ids = [(0, 0); 2];
        for (slot, name) in ids.iter_mut().zip([file, sidecar]) {
            if let Err(why) = reg.check_form(name) {
                return refused(why);
            }
            // A name this session made, still leading to that file: the
            // hook (root) never runs on anything else.
            match reg.made_and_there(name) {
                Some(id) => *slot = id,
                None => return refused(Refusal::NotMade(name.into())),
            }
        }
        runner.submit(HookJob {
            file: file.into(),
            file_id: ids[0],
            sidecar: sidecar.into(),
            sidecar_id: ids[1],
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

    /// Adds to what is saved of served session `session` (a new entry
    /// within [`MAX_SAVED_SESSIONS`]).
    fn save_served(
        &mut self,
        session: u64,
        add: impl FnOnce(&mut Rescue) -> Result<(), Refusal>,
    ) -> Answer {
        let Some(s) = &mut self.served else {
            return refused(Refusal::NotServing);
        };
        if !s.saves.contains_key(&session) && s.saves.len() >= MAX_SAVED_SESSIONS {
            return refused(Refusal::TooManySaved(MAX_SAVED_SESSIONS));
        }
        match add(s.saves.entry(session).or_default()) {
            Ok(()) => done(),
            Err(why) => refused(why),
        }
    }

    /// The leftover of an instance is read into session `session`'s save:
    /// only an instance this broker made and still holds (the directory is
    /// compared with its own record, so no other path is ever read).
    fn save_served_drain(&mut self, session: u64, leftover: Leftover) -> Answer {
        let Some(s) = &mut self.served else {
            return refused(Refusal::NotServing);
        };
        let ours = s
            .live
            .values()
            .any(|i| i.teardown.remove_dir.as_deref() == Some(leftover.dir.as_path()));
        if !ours {
            return refused(Refusal::NotOurs(leftover.dir.display().to_string()));
        }
        let Some(r) = s.saves.get_mut(&session) else {
            return refused(Refusal::NoSaved(session));
        };
        r.add_drain(leftover);
        done()
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

    /// The registered directory `id`, when every name is of its form.
    fn allowed(&mut self, id: u32, names: &[&str]) -> Result<&mut Registered, Refusal> {
        if !self.sealed {
            return Err(Refusal::NotSealed);
        }
        let reg = self
            .dirs
            .get_mut(id as usize)
            .ok_or(Refusal::NoDirectory(id))?;
        for name in names {
            reg.check_form(name)?;
        }
        Ok(reg)
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
                return wire::send(sock, &Reply::Refused(e), None);
            }
        };
        let formats = std::mem::take(&mut info.formats);
        wire::send(
            sock,
            &Reply::Ftrace {
                key,
                info,
                formats: formats.len(),
            },
            None,
        )?;
        for (g, n, text) in formats {
            wire::send(sock, &Reply::Format(g, n, text), None)?;
        }
        for chunk in fds.chunks(wire::MAX_FDS) {
            let borrowed: Vec<BorrowedFd<'_>> = chunk.iter().map(AsFd::as_fd).collect();
            wire::send_many(sock, &Reply::Fds, &borrowed)?;
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
        // What a recorder that died during its set-up made before it could
        // register it: its instances and kprobes, found by its pid.
        if let Some(pid) = self.recorder
            && let Ok(top) = Tracefs::discover()
        {
            for what in top.remove_leftovers_of(pid) {
                log::info!("broker: removed tracefs {what} left by pid {pid}");
            }
        }
        for (dir, name) in self.leftovers.drain(..) {
            // Only a socket nobody listens on any more: the name is in a
            // directory others may write (and may be registered before the
            // session claimed it: another session's live socket stays).
            if stale_socket(&dir, &name) {
                let _ = rustix::fs::unlinkat(&dir, &name, rustix::fs::AtFlags::empty());
            }
        }
    }

    fn clean_up(&mut self, grace: Duration) {
        // Died while recording: its buffers, and the kernel's leftover,
        // before the instance goes.
        if !self.done {
            self.rescue.save(self.by);
        }
        // The service's sessions that were still recording: each its own
        // save, every one before any instance goes.
        if let Some(s) = &mut self.served {
            for (_, mut r) in s.saves.drain() {
                r.save(self.by);
            }
        }
        self.tear_down(false);
        if let Some((r, _)) = &mut self.hooks {
            r.finish(grace);
        }
    }
}

impl Registered {
    /// `name` is plain and starts with a registered prefix (or `.` and one).
    fn check_form(&self, name: &str) -> Result<(), Refusal> {
        create::check_name(name).map_err(|_| Refusal::NotPlainName(name.to_string()))?;
        let body = name.strip_prefix('.').unwrap_or(name);
        if !self.prefixes.iter().any(|p| body.starts_with(p.as_str())) {
            return Err(Refusal::NotOurs(name.to_string()));
        }
        Ok(())
    }

    /// What `name` is, when this session made it and the name still leads
    /// to that file.
    fn made_and_there(&self, name: &str) -> Option<FileId> {
        let id = *self.made.get(name)?;
        self.dir.holds(name, id).then_some(id)
    }
}

/// The identity of the regular file `name` in `dir` (never through a link).
fn regular_id(dir: &OutputDir, name: &str) -> Option<FileId> {
    let st = rustix::fs::statat(dir.fd(), name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile)
        .then_some((st.st_dev, st.st_ino))
}

/// The one name a file the session made is renamed to: `X.partial` (a
/// segment being written) and `.X.tmp` or `.X.RANDOM.tmp` (a temporary
/// name) become `X`.
fn destination(from: &str) -> Option<String> {
    if let Some(x) = from.strip_suffix(".partial") {
        return Some(x.to_string());
    }
    let body = from.strip_prefix('.')?.strip_suffix(".tmp")?;
    match body.rsplit_once('.') {
        Some((x, r)) if r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(x.to_string())
        }
        _ => Some(body.to_string()),
    }
}

/// Whether `name` in `dir` is a socket nobody listens on (a connect is
/// refused).
fn stale_socket(dir: &OwnedFd, name: &str) -> bool {
    use rustix::fs::{AtFlags, FileType};
    use std::os::fd::AsRawFd;
    let is_socket = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Socket);
    if !is_socket {
        return false;
    }
    // Reached through the held directory, never a path others could swap.
    let path = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    let Ok(addr) = rustix::net::SocketAddrUnix::new(path.as_str()) else {
        return false;
    };
    let Ok(sock) = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    ) else {
        return false;
    };
    matches!(
        rustix::net::connect(&sock, &addr),
        Err(rustix::io::Errno::CONNREFUSED)
    )
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
        let mut st = State::new(None, SavedBy::Broker);
        let fd = rustix::fs::open(
            dir,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("dir");
        std::fs::write(dir.join("t-0.partial"), b"made before the drop").expect("write");
        let (r, _) = st.handle(
            Request::RegisterDir {
                prefixes: vec!["t-".into()],
                files: vec!["t-0.partial".into()],
            },
            Some(fd),
        );
        assert!(matches!(r, Reply::Registered(0)), "{r:?}");
        st
    }

    #[test]
    fn served_saves_are_serves_alone_and_drain_only_the_brokers_instances() {
        let memfd =
            || rustix::fs::memfd_create("ring", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        let leftover = |dir: &str| Leftover {
            dir: PathBuf::from(dir),
            sequence_id: 2,
            compact_sched: false,
            mono_raw: false,
        };
        // A session's broker has no served sessions to save.
        let mut own = State::new(None, SavedBy::Broker);
        let (r, _) = own.handle(
            Request::SaveServedRing {
                session: 1,
                index: 0,
            },
            Some(memfd()),
        );
        assert!(matches!(r, Reply::Refused(Refusal::NotServing)), "{r:?}");

        let mut st = State::new(Some(ServedInstances::default()), SavedBy::Broker);
        let (r, _) = st.handle(
            Request::SaveServedRing {
                session: 1,
                index: 0,
            },
            None,
        );
        assert!(matches!(r, Reply::Refused(Refusal::NoDescriptor)), "{r:?}");
        let (r, _) = st.handle(
            Request::SaveServedRing {
                session: 1,
                index: 0,
            },
            Some(memfd()),
        );
        assert!(matches!(r, Reply::Done), "{r:?}");
        // A directory no instance of this broker lives in is never read.
        let (r, _) = st.handle(
            Request::SaveServedDrain {
                session: 1,
                leftover: leftover("/sys/kernel/tracing"),
            },
            None,
        );
        assert!(matches!(r, Reply::Refused(Refusal::NotOurs(_))), "{r:?}");
        assert_eq!(st.served.as_ref().map(|s| s.saves.len()), Some(1));
        let (r, _) = st.handle(Request::ServedSaved { session: 1 }, None);
        assert!(matches!(r, Reply::Done), "{r:?}");
        assert_eq!(st.served.as_ref().map(|s| s.saves.len()), Some(0));
    }

    #[test]
    fn a_sessions_broker_prepares_no_ftrace_and_releases_nothing() {
        let mut st = State::new(None, SavedBy::Broker);
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
        let mut st = State::new(Some(ServedInstances::default()), SavedBy::Broker);
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
                files: Vec::new(),
            },
            Some(fd),
        );
        assert!(matches!(r, Reply::Refused(Refusal::Sealed)), "{r:?}");
    }

    /// Another user's files of the session's name form, in a directory
    /// they share: the broker renames, removes and runs hooks only on the
    /// files it made (or was told of before the seal), while their names
    /// still lead to them.
    #[test]
    fn only_files_the_broker_made_are_renamed_removed_or_hooked() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut st = registered(d.path());
        let hook_log = d.path().join("hook.log");
        let (r, _) = st.handle(
            Request::RegisterHook {
                command: format!("f() {{ cat \"$1\" >> {}; }}; f", hook_log.display()),
                dir: 0,
                timeout_ms: 10_000,
            },
            None,
        );
        assert!(matches!(r, Reply::Done), "{r:?}");
        assert!(matches!(st.handle(Request::Seal, None).0, Reply::Done));
        let theirs = d.path().join("t-9");
        std::fs::write(&theirs, b"theirs").expect("write");
        let secret = d.path().join("secret");
        std::fs::write(&secret, b"secret").expect("write");
        let call = |st: &mut State, req: Request| st.handle(req, None).0;
        let remove = |name: &str| Request::Remove {
            dir: 0,
            name: name.into(),
        };
        let rename = |from: &str, to: &str| Request::Rename {
            dir: 0,
            from: from.into(),
            to: to.into(),
        };
        let closed = |file: &str, sidecar: &str| Request::SegmentClosed {
            file: file.into(),
            sidecar: sidecar.into(),
            index: 9,
        };
        // Not made here: left alone, whatever the form.
        assert!(matches!(
            call(&mut st, remove("t-9")),
            Reply::Refused(Refusal::NotMade(_))
        ));
        assert!(matches!(
            call(&mut st, closed("t-9", "t-9")),
            Reply::Refused(Refusal::NotMade(_))
        ));
        assert_eq!(std::fs::read(&theirs).expect("kept"), b"theirs");
        // Made before the drop: renamed only to its own name.
        assert!(matches!(
            call(&mut st, rename("t-0.partial", "t-9")),
            Reply::Refused(Refusal::NotItsName { .. })
        ));
        assert!(matches!(
            call(&mut st, rename("t-0.partial", "t-0")),
            Reply::Done
        ));
        // A sidecar made through a temporary name.
        let (r, fd) = st.handle(
            Request::Create {
                dir: 0,
                name: ".t-0.json.tmp".into(),
                replace: false,
            },
            None,
        );
        assert!(matches!(r, Reply::File) && fd.is_some(), "{r:?}");
        assert!(matches!(
            call(&mut st, rename(".t-0.json.tmp", "t-0.json")),
            Reply::Done
        ));
        // Deleted (by the budget) and replanted by someone else: the name
        // is no longer the file made, so nothing acts on it.
        std::fs::remove_file(d.path().join("t-0")).expect("rm");
        std::os::unix::fs::symlink(&secret, d.path().join("t-0")).expect("ln");
        assert!(matches!(
            call(&mut st, closed("t-0", "t-0.json")),
            Reply::Refused(Refusal::NotMade(_))
        ));
        assert!(matches!(
            call(&mut st, remove("t-0")),
            Reply::Refused(Refusal::NotMade(_))
        ));
        assert!(std::fs::symlink_metadata(d.path().join("t-0")).is_ok());
        // Its own sidecar is still its own: removed.
        assert!(matches!(call(&mut st, remove("t-0.json")), Reply::Done));
        assert!(!d.path().join("t-0.json").exists());
        if let Some((r, _)) = &mut st.hooks {
            let c = r.finish(Duration::from_secs(5));
            assert_eq!(c.ran, 0, "{c:?}");
        }
        assert!(!hook_log.exists(), "no hook ran");
    }
}
