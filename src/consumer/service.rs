//! The service: one thread, one wait. It accepts consumers (SO_PEERCRED,
//! the connection quotas), reads their requests and answers them
//! (`methods`), serves the producer socket, and hosts every session's
//! runner: their timers, sources and outputs are its wake-ups. A session
//! charged to a uid stays charged until it has really ended; one asked to
//! stop that has not ended by its hard deadline is aborted (its buffers
//! freed, counted).

use std::collections::{BTreeMap, HashMap};
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use super::connection::{Closed, Connection};
use super::sessions::{ConnId, Holder, SessionState, Sessions};
use super::{ConsumerError, Limits};
use crate::event_loop::{Command, SessionEvent, Ticket, wait_for};
use crate::privilege::Broker;
use crate::producer::host::ProducerService;
use crate::sources::ftrace::remote::RemoteTracefs;
use crate::sys::signals::Signals;
use crate::transport::log_budget::{LogBucket, for_log};
use crate::transport::peer::{MAX_UIDS, OTHER_UIDS, Peer};

/// How long the service's stop waits for sessions to end and their clients
/// to read them.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// A session asked to stop has its flush and stop timeouts, then this
/// much more, before it is aborted.
pub(crate) const ABORT_GRACE: Duration = Duration::from_secs(5);
/// How long accepting pauses when the process is out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Who waits for a session's answer.
pub(super) enum Waiter {
    /// Nobody (a stop the service asked for).
    Nobody,
    Flush {
        conn: ConnId,
        req: u64,
        drop_reply: bool,
    },
    Start {
        conn: ConnId,
        req: u64,
        drop_reply: bool,
    },
    /// ReadBuffers of a running session: its write pass, then the read.
    Drain { conn: ConnId, req: u64 },
    /// CloneSession: the copy, into the clone's reserved session.
    Clone { conn: ConnId, req: u64, clone: u64 },
}

/// Whose descriptor a readiness belongs to.
enum Owner {
    Signals,
    Listener,
    Conn(ConnId),
    Producers,
    Session(u64),
}

/// The consumer socket and everything it serves.
pub(crate) struct Service {
    listener: UnixListener,
    path: PathBuf,
    pub(super) conns: BTreeMap<ConnId, Connection>,
    next_conn: ConnId,
    pub(super) sessions: Sessions,
    pub(super) producers: Option<ProducerService>,
    pub(super) ftrace: Option<Arc<dyn RemoteTracefs>>,
    /// The broker that saves sessions writing into their clients' files
    /// if the service dies.
    pub(super) saver: Option<Arc<Broker>>,
    pub(super) direct_io: bool,
    /// Log lines each uid may still cause.
    logs: HashMap<u32, LogBucket>,
    /// Requests to sessions, by ticket: who waits, and which session.
    pub(super) tickets: HashMap<Ticket, (u64, Waiter)>,
    next_ticket: u64,
    /// The uid and pid the service runs as (its built-in producer's).
    pub(super) service_uid: u32,
    pub(super) service_pid: u32,
    accept_paused_until: Option<Instant>,
    stopping: Option<Instant>,
}

impl Service {
    /// Serves on `listener` (bound at `path`) within `limits`; sessions that
    /// need apps attach to `producers` when given.
    pub(crate) fn new(
        listener: UnixListener,
        path: PathBuf,
        producers: Option<ProducerService>,
        limits: Limits,
    ) -> Self {
        Self {
            listener,
            path,
            conns: BTreeMap::new(),
            next_conn: 1,
            sessions: Sessions::new(limits),
            producers,
            ftrace: None,
            saver: None,
            direct_io: true,
            logs: HashMap::new(),
            tickets: HashMap::new(),
            next_ticket: 1,
            service_uid: rustix::process::getuid().as_raw(),
            service_pid: std::process::id(),
            accept_paused_until: None,
            stopping: None,
        }
    }

    /// Sessions record linux.ftrace themselves, on instances `remote` (the
    /// root broker) prepares, instead of leaving it to producers.
    pub(crate) fn serve_ftrace(&mut self, remote: Arc<dyn RemoteTracefs>) {
        self.ftrace = Some(remote);
    }

    /// Sessions writing into their clients' files are saved by `broker`
    /// if the service dies while they record (their buffers on memfds).
    pub(crate) fn save_at_death(&mut self, broker: Arc<Broker>) {
        self.saver = Some(broker);
    }

    /// Sessions write their files through the page cache even where
    /// `O_DIRECT` works (`RECORDER_DIRECT_IO=off`).
    pub(crate) fn no_direct_io(&mut self) {
        self.direct_io = false;
    }

    /// Serves until SIGINT or SIGTERM, then stops every session and waits
    /// (bounded) for them to end and their clients to read them.
    pub(crate) fn run(mut self) -> Result<(), ConsumerError> {
        let signals = Signals::install().map_err(|source| ConsumerError::Io {
            what: "signal handlers",
            source,
        })?;
        self.listener
            .set_nonblocking(true)
            .map_err(|source| ConsumerError::Io {
                what: "consumer socket",
                source,
            })?;
        // This thread serves the producers too: the scheduler's shortest
        // slice, so an app's commits are taken soon on a loaded machine.
        crate::producer::host::ask_for_serving_slice();
        // Every EnableTracing reads its config with the schema: decoded
        // now (tens of ms), not on the first client's time.
        drop(crate::config::pool());
        log::info!(
            "consumer socket: {} (at most {} sessions, {} per uid)",
            self.path.display(),
            self.sessions.limits().sessions,
            self.sessions.limits().sessions_per_uid
        );
        loop {
            self.settle();
            if let Some(at) = self.stopping
                && (self.sessions.is_empty() || Instant::now() >= at)
            {
                break;
            }
            let woken = self.wait(&signals);
            if signals.take() > 0 && self.stopping.is_none() {
                self.begin_stop();
            }
            self.dispatch(woken);
        }
        self.finish();
        Ok(())
    }

    /// Waits once for everything the service hosts; what woke, by owner.
    fn wait(&self, signals: &Signals) -> Vec<(Owner, PollFlags)> {
        let handles = self.producers.as_ref().map(ProducerService::handles);
        let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
        let mut owners = Vec::new();
        fds.push((signals.fd(), PollFlags::IN));
        owners.push(Owner::Signals);
        let now = Instant::now();
        let accepting =
            self.stopping.is_none() && self.accept_paused_until.is_none_or(|t| t <= now);
        if accepting {
            fds.push((self.listener.as_fd(), PollFlags::IN));
            owners.push(Owner::Listener);
        }
        for (id, c) in &self.conns {
            let f = c.interest();
            if !f.is_empty() {
                fds.push((c.fd(), f));
                owners.push(Owner::Conn(*id));
            }
        }
        if let Some((listener, streams)) = &handles {
            fds.push((listener.as_fd(), PollFlags::IN));
            owners.push(Owner::Producers);
            for s in streams {
                fds.push((s.as_fd(), PollFlags::IN));
                owners.push(Owner::Producers);
            }
        }
        for (id, h) in self.sessions.iter() {
            if let Some(r) = &h.runner {
                for f in r.interest() {
                    fds.push(f);
                    owners.push(Owner::Session(*id));
                }
            }
        }
        let deadline = self.deadline(now);
        let ready = wait_for(&fds, deadline);
        drop(fds);
        owners.into_iter().zip(ready).collect()
    }

    /// The nearest thing due: a session's timer or source work, a hard
    /// deadline, a stalled client's, the stop's, the end of an accept pause.
    fn deadline(&self, now: Instant) -> Option<Instant> {
        let sessions = self.sessions.iter().flat_map(|(_, h)| {
            let due = h.runner.as_ref().and_then(|r| r.next_due());
            due.into_iter().chain(h.deadline)
        });
        let conns = self.conns.values().filter_map(Connection::deadline);
        let paused = self.accept_paused_until.filter(|t| *t > now);
        sessions
            .chain(conns)
            .chain(self.stopping)
            .chain(paused)
            .min()
    }

    /// Hands what woke to its owners; every session takes its due work.
    fn dispatch(&mut self, woken: Vec<(Owner, PollFlags)>) {
        let mut session_ready: HashMap<u64, Vec<bool>> = HashMap::new();
        let mut producers = false;
        let mut conns = Vec::new();
        for (owner, flags) in woken {
            match owner {
                Owner::Signals => {}
                Owner::Listener if !flags.is_empty() => self.accept_all(),
                Owner::Listener => {}
                Owner::Conn(id) => conns.push((id, flags)),
                Owner::Producers => producers |= !flags.is_empty(),
                Owner::Session(id) => session_ready.entry(id).or_default().push(!flags.is_empty()),
            }
        }
        for (id, flags) in conns {
            self.on_connection(id, flags);
        }
        // Connections whose client stalled past its deadline.
        let now = Instant::now();
        let stalled: Vec<ConnId> = (self.conns.iter())
            .filter(|(_, c)| c.deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in stalled {
            self.on_connection(id, PollFlags::OUT);
        }
        if producers && let Some(p) = &self.producers {
            p.poll();
        }
        // Only the sessions with something to take: work due, a descriptor
        // of theirs ready, or producers' events after a poll.
        let now = Instant::now();
        for (id, h) in self.sessions.iter_mut() {
            if let Some(r) = &mut h.runner {
                let ready = session_ready.remove(id).unwrap_or_default();
                let due = r.next_due().is_some_and(|d| d <= now);
                if due || ready.iter().any(|b| *b) || (producers && r.has_producers()) {
                    r.on_wake(&ready);
                }
            }
        }
    }

    fn on_connection(&mut self, id: ConnId, flags: PollFlags) {
        let result = match self.conns.get_mut(&id) {
            None => return,
            Some(c) if flags.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) => {
                c.receive()
            }
            Some(_) => Ok(Vec::new()),
        };
        match result {
            Ok(frames) => {
                for f in frames {
                    self.frame(id, f);
                }
            }
            Err(e) => return self.close(id, &e),
        }
        self.pump_readback(id);
        let flushed = self.conns.get_mut(&id).map(Connection::flush);
        if let Some(Err(e)) = flushed {
            self.close(id, &e);
        }
    }

    /// Accepts every waiting client that its quotas admit.
    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: the client waits in the backlog
                    // while the service pauses accepting.
                    self.say(OTHER_UIDS, log::Level::Warn, || {
                        format!("consumer socket: accept: {e}")
                    });
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            let Ok(Peer { uid, pid }) = crate::transport::peer::of(&stream) else {
                continue;
            };
            if let Err(r) = self.sessions.admit(uid) {
                self.say(uid, log::Level::Info, || {
                    format!("consumer connection refused: {r}")
                });
                continue;
            }
            let id = self.next_conn;
            self.next_conn += 1;
            match Connection::new(stream, uid, pid) {
                Ok(c) => {
                    self.conns.insert(id, c);
                }
                Err(e) => {
                    self.sessions.release_connection(uid);
                    self.say(uid, log::Level::Info, || {
                        format!("consumer connection: {e}")
                    });
                }
            }
        }
    }

    /// Ends connection `id`: the session it held stops and its data is
    /// dropped (as FreeBuffers), its quota held until the session really
    /// ended.
    pub(super) fn close(&mut self, id: ConnId, why: &Closed) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        c.shut();
        self.sessions.release_connection(c.uid);
        self.say(c.uid, log::Level::Debug, || {
            format!(
                "consumer connection of uid {} (pid {}) closed: {why}",
                c.uid, c.pid
            )
        });
        if let Some(sid) = c.session {
            self.let_go(sid, id);
        }
    }

    /// Connection `conn` lets go of session `sid`: nobody holds it now; it
    /// stops, and is forgotten at its end.
    pub(super) fn let_go(&mut self, sid: u64, conn: ConnId) {
        let Some(h) = self.sessions.get_mut(sid) else {
            return;
        };
        if h.holder != Holder::Conn(conn) {
            return;
        }
        h.holder = Holder::Nobody;
        h.end_to = None;
        if h.ended.is_some() {
            self.sessions.remove(sid);
        } else {
            self.stop_session(sid);
        }
    }

    /// Asks session `sid` to stop, with its hard deadline.
    pub(super) fn stop_session(&mut self, sid: u64) {
        let ticket = self.ticket(sid, Waiter::Nobody);
        let Some(h) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(r) = &mut h.runner else {
            return;
        };
        r.command(Command::Stop, ticket);
        if h.deadline.is_none() {
            h.deadline = Some(Instant::now() + h.stop_budget());
        }
    }

    /// A new ticket for a request to session `sid`, answered to `waiter`.
    pub(super) fn ticket(&mut self, sid: u64, waiter: Waiter) -> Ticket {
        let t = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.tickets.insert(t, (sid, waiter));
        t
    }

    /// Settles every session, hands what each published to its waiters,
    /// ends those that are over and aborts those past their deadline.
    fn settle(&mut self) {
        let now = Instant::now();
        for sid in self.sessions.ids() {
            let Some(h) = self.sessions.get_mut(sid) else {
                continue;
            };
            let Some(r) = &mut h.runner else {
                continue;
            };
            r.settle();
            let published = r.take_published();
            let over = r.is_over();
            let overdue = h.deadline.is_some_and(|d| d <= now);
            for ev in published {
                self.on_session_event(sid, ev);
            }
            if over {
                self.end_session(sid, None);
            } else if overdue {
                let why = "it did not end within its flush and stop timeouts (its output blocked?): aborted";
                self.end_session(sid, Some(why.into()));
            }
        }
    }

    fn on_session_event(&mut self, sid: u64, ev: SessionEvent) {
        match ev {
            SessionEvent::AllDataSourcesStarted => {
                let mut head_now = false;
                if let Some(h) = self.sessions.get_mut(sid) {
                    h.all_started = true;
                    head_now = h.saved_at_death;
                }
                // A session saved at death writes its head at once: the
                // stock client removes an output still empty when the
                // service goes away, and the save would go with it.
                if head_now {
                    let ticket = self.ticket(sid, Waiter::Nobody);
                    if let Some(r) = self.sessions.get_mut(sid).and_then(|h| h.runner.as_mut()) {
                        r.command(Command::Drain, ticket);
                    }
                }
                self.tell_started(sid);
            }
            SessionEvent::CloneTriggerHit { trigger } => self.tell_clone_hit(sid, &trigger),
            SessionEvent::Answered { ticket, response } => {
                if let Some((_, waiter)) = self.tickets.remove(&ticket) {
                    self.answered(sid, waiter, Some(response));
                }
            }
        }
    }

    /// Session `sid` is over (`abort`: cut short, with why): its outcome is
    /// kept, its client told, its buffers freed; when nobody holds it, it is
    /// forgotten and its quota freed.
    fn end_session(&mut self, sid: u64, abort: Option<String>) {
        let Some(h) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(runner) = h.runner.take() else {
            return;
        };
        let saved = std::mem::take(&mut h.saved_at_death);
        let (uid, label) = (h.entry.uid, format!("session {sid} of uid {}", h.entry.uid));
        let error = match abort {
            Some(why) => {
                // Dropped: its sources stop, its buffers are unmapped.
                drop(runner);
                self.sessions.aborted += 1;
                Some(why)
            }
            None => {
                let outcome = runner.outcome();
                log::info!(
                    "{label} ended ({}): {} bytes",
                    outcome.reason,
                    outcome.bytes_written
                );
                if let Some(h) = self.sessions.get_mut(sid) {
                    h.final_buffers = outcome.buffers.clone();
                }
                outcome
                    .reason
                    .is_failure()
                    .then(|| format!("the session failed: {}", outcome.reason))
            }
        };
        // Its last pass is written (or it was aborted): nothing of it is
        // to be saved any more.
        if saved
            && let Some(b) = &self.saver
            && let Err(e) = b.served_saved(sid)
        {
            log::warn!("{label}: the broker did not take back its save: {e}");
        }
        if let Some(why) = &error {
            self.say(uid, log::Level::Warn, || format!("{label}: {why}"));
        }
        let Some(h) = self.sessions.get_mut(sid) else {
            return;
        };
        if h.state != SessionState::ClonedReadOnly {
            h.state = SessionState::Disabled;
        }
        h.deadline = None;
        h.ended = Some(error.clone());
        let end_to = h.end_to.take();
        let forget = match &h.holder {
            Holder::Nobody => true,
            Holder::Detached(_) => h.spent(),
            Holder::Conn(_) => false,
        };
        if let Some((conn, req)) = end_to {
            self.tell_end(conn, req, error.as_deref());
        }
        // Requests it never answered.
        let orphans: Vec<Ticket> = (self.tickets.iter())
            .filter(|(_, (s, _))| *s == sid)
            .map(|(t, _)| *t)
            .collect();
        for t in orphans {
            if let Some((_, waiter)) = self.tickets.remove(&t) {
                self.answered(sid, waiter, None);
            }
        }
        if forget {
            self.sessions.remove(sid);
        }
    }

    /// SIGINT or SIGTERM: every session stops; the service ends once they
    /// ended and their clients read them, or at the grace's end.
    fn begin_stop(&mut self) {
        log::info!("stopping: ending every session");
        self.stopping = Some(Instant::now() + STOP_GRACE);
        for sid in self.sessions.ids() {
            self.stop_session(sid);
        }
    }

    fn finish(&mut self) {
        for sid in self.sessions.ids() {
            if self.sessions.get(sid).is_some_and(|h| h.runner.is_some()) {
                self.end_session(sid, Some("the service stopped".into()));
            }
        }
        for (uid, n) in self.sessions.refused() {
            log::info!("uid {uid}: {n} connections or sessions refused by quota");
        }
        if self.sessions.aborted > 0 {
            log::warn!(
                "{} sessions were aborted at their deadline",
                self.sessions.aborted
            );
        }
        let _ = std::fs::remove_file(&self.path);
        if let Some(p) = &self.producers {
            let _ = std::fs::remove_file(p.path());
        }
    }

    /// Logs a line `uid` caused, within its budget; lines left out are
    /// counted and said with the next.
    pub(super) fn say(&mut self, uid: u32, level: log::Level, line: impl FnOnce() -> String) {
        if !log::log_enabled!(level) {
            return;
        }
        let key = if self.logs.contains_key(&uid) || self.logs.len() < MAX_UIDS {
            uid
        } else {
            OTHER_UIDS
        };
        match self.logs.entry(key).or_default().take(Instant::now()) {
            Some(0) => log::log!(level, "{}", line()),
            Some(n) => log::log!(
                level,
                "{} ({n} earlier lines of uid {uid} left out)",
                line()
            ),
            None => {}
        }
    }
}

/// A client's text, as a log line shows it.
pub(super) fn shown(text: &str) -> String {
    for_log(text)
}
