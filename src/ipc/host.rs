//! The producer side of a session: the listening socket, every producer
//! connection, and the match between the config's data sources and what the
//! producers registered (by name and the producer filters, ARCHITECTURE.md §8.2).
//!
//! The event loop polls [`ProducerHost::fds`], calls [`ProducerHost::poll`]
//! and turns the returned [`HostEvent`]s into session events; it carries out
//! the session's start, flush and stop here too. Producers that connect
//! after the start are started as soon as they can take commands.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::connection::{Connection, Instance, Note, Shared};
use super::filter::ProducerFilter;
use super::quota::{self, MAX_CLOSED_KEPT, MAX_CONNECTIONS_PER_UID, Quotas, UidReport};
use super::socket_path::{self, SocketPathError};
use super::stats::{ProducerStats, ProducerTotals};
use crate::protos::get_async_command_response::{self as cmd, Cmd};
use crate::ringbuf::Buffer;

/// Connections taken from the listener per wake-up: a uid that reconnects
/// as fast as it is refused cannot hold the loop.
const ACCEPT_BATCH: usize = 64;
/// Flushes waiting for acks, at most (as Perfetto's service): a producer
/// that never answers costs the oldest entry, not unbounded memory; the
/// session's own deadline has long ended such a flush.
const MAX_PENDING_FLUSHES: usize = 1000;
/// Flush reason TraceStop / Periodic in the flags' low bits (ARCHITECTURE.md §8.6),
/// initiator Traced (1) in bits 4-7.
const FLUSH_FLAGS_PERIODIC: u64 = 1 | (1 << 4);
const FLUSH_FLAGS_STOP: u64 = 2 | (1 << 4);

/// A config data source that producers may provide.
#[derive(Clone, Debug)]
pub struct WantedSource {
    pub name: String,
    pub filter: ProducerFilter,
    /// Global buffer id (index + 1).
    pub buffer: u32,
    /// The DataSourceConfig as written, service fields rewritten.
    pub config: Vec<u8>,
}

/// What the loop turns into session events.
#[derive(Debug, PartialEq)]
pub enum HostEvent {
    Triggers {
        producer: String,
        uid: u32,
        names: Vec<String>,
    },
    /// Every producer asked in flush `id` acknowledged it (or went away).
    Flushed(u64),
    /// Every instance started at the start that acknowledges starts has
    /// (or went away).
    Started,
    /// Every instance that acknowledges stops has (or went away).
    Stopped,
}

/// What one producer did, for the summary and `trace_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerReport {
    pub name: String,
    pub pid: u32,
    pub uid: u32,
    pub data_sources: Vec<String>,
    pub stats: ProducerStats,
    pub connected: bool,
}

struct PendingFlush {
    id: u64,
    request: u64,
    waiting: BTreeSet<u32>,
}

/// The producer socket and its connections.
pub struct ProducerHost {
    listener: UnixListener,
    path: PathBuf,
    wanted: Vec<WantedSource>,
    buffers: Vec<Arc<Buffer>>,
    per_buffer: Vec<ProducerStats>,
    next_sequence: u32,
    conns: BTreeMap<u32, Connection>,
    gone: Vec<ProducerReport>,
    next_conn: u32,
    next_instance: u64,
    started: bool,
    stopping: bool,
    flushes: Vec<PendingFlush>,
    next_flush_request: u64,
    stop_waiting: BTreeSet<(u32, u64)>,
    stop_pending: bool,
    /// Instances whose start ack is awaited (connection, instance).
    start_waiting: BTreeSet<(u32, u64)>,
    start_pending: bool,
    /// Per-uid accounts: connections, hits, closed producers, log lines.
    quotas: Quotas,
    /// Connections admitted so far (Perfetto's producers_seen).
    seen: u64,
}

impl ProducerHost {
    /// Listens on `path` (see [`socket_path::claim`]). Sequence ids of
    /// producer writers start at `first_sequence`.
    pub fn listen(
        path: &Path,
        wanted: Vec<WantedSource>,
        buffers: Vec<Arc<Buffer>>,
        first_sequence: u32,
    ) -> Result<Self, SocketPathError> {
        let listener = socket_path::claim(path)?;
        let max = quota::connection_budget(quota::open_file_limit());
        log::info!(
            "producer socket: {} (at most {max} connections, {MAX_CONNECTIONS_PER_UID} per uid)",
            path.display()
        );
        Ok(Self::on_listener(
            listener,
            path,
            wanted,
            buffers,
            first_sequence,
        ))
    }

    /// Serves producers on a socket already listening at `path` (bound by
    /// `recorder serve`, which lends it to one session at a time).
    pub fn on_listener(
        listener: UnixListener,
        path: &Path,
        wanted: Vec<WantedSource>,
        buffers: Vec<Arc<Buffer>>,
        first_sequence: u32,
    ) -> Self {
        let max = quota::connection_budget(quota::open_file_limit());
        Self {
            listener,
            path: path.to_path_buf(),
            wanted,
            per_buffer: vec![ProducerStats::default(); buffers.len()],
            buffers,
            next_sequence: first_sequence,
            conns: BTreeMap::new(),
            gone: Vec::new(),
            next_conn: 1,
            next_instance: 1,
            started: false,
            stopping: false,
            flushes: Vec::new(),
            next_flush_request: 1,
            stop_waiting: BTreeSet::new(),
            stop_pending: false,
            start_waiting: BTreeSet::new(),
            start_pending: false,
            quotas: Quotas::new(max, MAX_CONNECTIONS_PER_UID),
            seen: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Descriptors to wait on.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = vec![self.listener.as_fd()];
        v.extend(self.conns.values().map(|c| c.fd()));
        v
    }

    /// Accepts, reads and handles what the producers sent.
    pub fn poll(&mut self) -> Vec<HostEvent> {
        self.accept();
        let mut events = Vec::new();
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        let mut changed = false;
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            let mut shared = Shared {
                buffers: &self.buffers,
                next_sequence: &mut self.next_sequence,
                per_buffer: &mut self.per_buffer,
            };
            for note in c.read(&mut shared) {
                match note {
                    Note::Changed => changed = true,
                    Note::Triggers(names) => events.push(HostEvent::Triggers {
                        producer: c.name.clone().unwrap_or_default(),
                        uid: c.uid,
                        names,
                    }),
                    Note::FlushAck(r) => {
                        for f in &mut self.flushes {
                            if f.request <= r {
                                f.waiting.remove(&id);
                            }
                        }
                    }
                    Note::Started(inst) => {
                        self.start_waiting.remove(&(id, inst));
                    }
                    Note::Stopped(inst) => {
                        self.stop_waiting.remove(&(id, inst));
                    }
                }
            }
        }
        self.reap();
        if changed {
            self.match_sources();
        }
        self.completions(&mut events);
        self.charge();
        events
    }

    /// Moves every connection's quota hits to its uid's account and writes
    /// its log lines within that uid's log quota.
    fn charge(&mut self) {
        for c in self.conns.values_mut() {
            charge(&mut self.quotas, c);
        }
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // Charged to the peer's uid before anything is
                    // allocated for it; refused, it is closed at once.
                    let Ok(cred) = rustix::net::sockopt::socket_peercred(&stream) else {
                        continue;
                    };
                    let uid = cred.uid.as_raw();
                    if let Err(limit) = self.quotas.admit(uid) {
                        drop(stream);
                        let line = format!(
                            "producer connection of uid {uid} refused: {} (at most {} per uid, {} in all)",
                            limit.what(),
                            MAX_CONNECTIONS_PER_UID,
                            self.quotas.max_connections()
                        );
                        say(&mut self.quotas, uid, log::Level::Warn, &line);
                        continue;
                    }
                    self.seen += 1;
                    let id = self.next_conn;
                    self.next_conn = self.next_conn.wrapping_add(1).max(1);
                    match Connection::new(id, stream) {
                        Ok(mut c) => {
                            c.holds = self.quotas.holds(uid);
                            self.conns.insert(id, c);
                        }
                        Err(e) => {
                            self.quotas.release(uid);
                            log::warn!("producer connection: {e}");
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    // Out of descriptors despite the budget: the listener
                    // waits (the control path has its own reserve).
                    log::debug!("producer socket: accept: {e}");
                    break;
                }
            }
        }
    }

    /// Closed connections: what they committed stays; what they held is
    /// counted lost; nobody waits for them any more.
    fn reap(&mut self) {
        let closed: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.closed.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in closed {
            if let Some(mut c) = self.conns.remove(&id) {
                // What it wrote and never committed, as Perfetto's service
                // does when a producer goes.
                c.scrape(&mut Shared {
                    buffers: &self.buffers,
                    next_sequence: &mut self.next_sequence,
                    per_buffer: &mut self.per_buffer,
                });
                c.finish();
                for f in &mut self.flushes {
                    f.waiting.remove(&id);
                }
                self.stop_waiting.retain(|(cid, _)| *cid != id);
                self.start_waiting.retain(|(cid, _)| *cid != id);
                charge(&mut self.quotas, &mut c);
                self.quotas.release(c.uid);
                self.quotas.shared_memory(c.uid, c.shared_memory(), false);
                // A connection that never said who it is and did nothing
                // wrong (a liveness probe, say) is not worth a line; past
                // MAX_CLOSED_KEPT, closed producers are folded per uid.
                if c.name.is_some() || c.stats != ProducerStats::default() {
                    if self.gone.len() < MAX_CLOSED_KEPT {
                        self.gone.push(report(&c, false));
                    } else {
                        self.quotas.fold_closed(c.uid, &c.stats);
                    }
                }
            }
        }
    }

    fn completions(&mut self, events: &mut Vec<HostEvent>) {
        self.flushes.retain(|f| {
            if f.waiting.is_empty() {
                events.push(HostEvent::Flushed(f.id));
                false
            } else {
                true
            }
        });
        if self.start_pending && self.start_waiting.is_empty() {
            self.start_pending = false;
            events.push(HostEvent::Started);
        }
        if self.stop_pending && self.stop_waiting.is_empty() {
            self.stop_pending = false;
            events.push(HostEvent::Stopped);
        }
    }

    /// Sets up every instance the config asks for that is not there yet
    /// (from the session's beginning, as Perfetto's service does for a
    /// configured session), and starts it when the session has started.
    fn match_sources(&mut self) {
        if self.stopping {
            return;
        }
        for c in self.conns.values_mut() {
            if !c.ready() {
                continue;
            }
            let name = c.name.clone().unwrap_or_default();
            let regs = c.registered.clone();
            for reg in &regs {
                for (w, want) in self.wanted.iter().enumerate() {
                    if want.name != reg.name || !want.filter.admits(&name) {
                        continue;
                    }
                    if c.instances
                        .values()
                        .any(|i| i.wanted == w && i.name == reg.name)
                    {
                        continue;
                    }
                    let id = self.next_instance;
                    self.next_instance += 1;
                    let line = format!(
                        "setting up {:?} on producer {} (instance {id})",
                        super::connection::short(&reg.name),
                        c.label()
                    );
                    let room = self.quotas.shared_memory_room(c.uid);
                    let before = c.shared_memory();
                    let set_up = c.setup_instance(
                        id,
                        Instance {
                            wanted: w,
                            name: reg.name.clone(),
                            buffer: want.buffer,
                            no_flush: reg.no_flush,
                            will_notify_on_start: reg.will_notify_on_start,
                            will_notify_on_stop: reg.will_notify_on_stop,
                            config: want.config.clone(),
                            started: false,
                            started_ack: false,
                            stopping: false,
                        },
                        room,
                    );
                    self.quotas
                        .shared_memory(c.uid, c.shared_memory() - before, true);
                    if !set_up {
                        continue;
                    }
                    say(&mut self.quotas, c.uid, log::Level::Info, &line);
                    // A producer that comes after the start is started at
                    // once; the session's start no longer waits for it.
                    if self.started {
                        c.start_instance(id);
                    }
                }
            }
        }
    }

    /// The session started: start every instance set up so far, and
    /// whatever connects later. Whether start acks are due from instances
    /// that promised them (`will_notify_on_start`; [`HostEvent::Started`]
    /// follows once they all came or their producers went).
    pub fn start(&mut self) -> bool {
        self.match_sources();
        self.started = true;
        for (cid, c) in &mut self.conns {
            let ids: Vec<u64> = c.instances.keys().copied().collect();
            for id in ids {
                if c.start_instance(id) {
                    self.start_waiting.insert((*cid, id));
                }
            }
        }
        self.start_pending = !self.start_waiting.is_empty();
        self.start_pending
    }

    /// The (producer, data source) pairs whose start ack is still awaited,
    /// at most `max`.
    pub fn not_started(&self, max: usize) -> Vec<(String, String)> {
        self.start_waiting
            .iter()
            .filter_map(|(cid, id)| {
                let c = self.conns.get(cid)?;
                let i = c.instances.get(id)?;
                Some((c.name.clone().unwrap_or_default(), i.name.clone()))
            })
            .take(max)
            .collect()
    }

    /// Flush `id` (at the stop when `stop`): sends Flush to every producer
    /// with instances that flush. Whether acks are due
    /// ([`HostEvent::Flushed`] follows).
    pub fn flush(&mut self, id: u64, stop: bool) -> bool {
        let request = self.next_flush_request;
        self.next_flush_request += 1;
        let mut waiting = BTreeSet::new();
        for (cid, c) in &mut self.conns {
            let ids: Vec<u64> = c
                .instances
                .iter()
                .filter(|(_, i)| !i.no_flush && !i.stopping)
                .map(|(id, _)| *id)
                .collect();
            if ids.is_empty() || c.closed.is_some() {
                continue;
            }
            c.command(
                Cmd::Flush(cmd::Flush {
                    data_source_ids: ids,
                    request_id: Some(request),
                    flags: Some(if stop {
                        FLUSH_FLAGS_STOP
                    } else {
                        FLUSH_FLAGS_PERIODIC
                    }),
                }),
                None,
            );
            if c.closed.is_none() {
                waiting.insert(*cid);
            }
        }
        if waiting.is_empty() {
            return false;
        }
        if self.flushes.len() >= MAX_PENDING_FLUSHES {
            self.flushes.remove(0);
        }
        self.flushes.push(PendingFlush {
            id,
            request,
            waiting,
        });
        true
    }

    /// Stops every instance. Whether stop acks are due
    /// ([`HostEvent::Stopped`] follows).
    pub fn stop(&mut self) -> bool {
        self.stopping = true;
        for (cid, c) in &mut self.conns {
            let ids: Vec<u64> = c.instances.keys().copied().collect();
            for id in ids {
                if c.stop_instance(id) {
                    self.stop_waiting.insert((*cid, id));
                }
            }
        }
        self.reap();
        self.stop_pending = !self.stop_waiting.is_empty();
        self.stop_pending
    }

    /// Reads what every producer that allows it wrote and has not committed
    /// yet (at the end of a flush and at the stop).
    pub fn scrape(&mut self) {
        for c in self.conns.values_mut() {
            c.scrape(&mut Shared {
                buffers: &self.buffers,
                next_sequence: &mut self.next_sequence,
                per_buffer: &mut self.per_buffer,
            });
        }
    }

    /// ClearIncrementalState to every producer with instances.
    pub fn clear_incremental_state(&mut self) {
        for c in self.conns.values_mut() {
            let ids: Vec<u64> = c.instances.keys().copied().collect();
            if !ids.is_empty() {
                c.command(
                    Cmd::ClearIncrementalState(cmd::ClearIncrementalState {
                        data_source_ids: ids,
                    }),
                    None,
                );
            }
        }
    }

    /// The figures of every producer in all, for `trace_stats`.
    pub fn totals(&self) -> ProducerTotals {
        let mut all = ProducerStats::default();
        let zero = ProducerStats::default();
        for c in self
            .gone
            .iter()
            .map(|r| &r.stats)
            .chain(self.conns.values().map(|c| &c.stats))
        {
            all.add_change(&zero, c);
        }
        let (_, folded) = self.quotas.closed_stats();
        all.add_change(&zero, &folded);
        let live = self.conns.values().filter(|c| c.closed.is_none());
        ProducerTotals {
            per_buffer: self.per_buffer.clone(),
            all,
            connected: live.clone().count() as u32,
            seen: self.seen,
            data_sources_registered: live.map(|c| c.registered.len() as u32).sum(),
        }
    }

    /// Every uid that hit a limit or whose closed producers were folded,
    /// by uid.
    pub fn quota_reports(&self) -> Vec<UidReport> {
        self.quotas.reports()
    }

    /// Every producer seen so far, connected ones last.
    pub fn reports(&self) -> Vec<ProducerReport> {
        let mut v = self.gone.clone();
        v.extend(
            self.conns
                .values()
                .filter(|c| c.name.is_some())
                .map(|c| report(c, true)),
        );
        v
    }
}

impl Drop for ProducerHost {
    fn drop(&mut self) {
        for c in self.conns.values_mut() {
            c.finish();
        }
        for r in self.reports() {
            log::debug!("producer {:?} (pid {}): {:?}", r.name, r.pid, r.stats);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Moves `c`'s quota hits to its uid's account and writes its log lines
/// within that uid's log quota.
fn charge(quotas: &mut Quotas, c: &mut Connection) {
    if !c.hits.is_empty() {
        quotas.add_hits(c.uid, &std::mem::take(&mut c.hits));
    }
    for (level, line) in std::mem::take(&mut c.log_lines) {
        say(quotas, c.uid, level, &line);
    }
}

/// Logs `line`, caused by `uid`, within that uid's log quota; lines left
/// out are counted and said with the next one written.
fn say(quotas: &mut Quotas, uid: u32, level: log::Level, line: &str) {
    if !log::log_enabled!(level) {
        return;
    }
    match quotas.may_log(uid, std::time::Instant::now()) {
        Some(0) => log::log!(level, "{line}"),
        Some(n) => log::log!(level, "{line} ({n} earlier lines of uid {uid} left out)"),
        None => {}
    }
}

fn report(c: &Connection, connected: bool) -> ProducerReport {
    ProducerReport {
        name: c.name.clone().unwrap_or_default(),
        pid: c.pid,
        uid: c.uid,
        data_sources: c.instances.values().map(|i| i.name.clone()).collect(),
        stats: c.stats.clone(),
        connected,
    }
}
