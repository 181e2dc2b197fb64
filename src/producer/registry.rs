//! The producer registry: the listening socket, every connected producer
//! and its data sources, and the sessions attached to it, each owning a
//! range of buffer ids. One registry serves one session (`recorder
//! --config`) or every session of `recorder serve`; a producer connects
//! once and each attached session whose config names one of its data
//! sources gets an instance of its own (ARCHITECTURE.md §9.8).
//!
//! Routing: a chunk goes to the session whose range holds its target
//! buffer id, and only when one of the producer's instances writes into
//! that buffer; anything else is dropped and charged to the producer's uid
//! ([`ForeignBuffer`](super::quota::Limit::ForeignBuffer)). Flush, stop and ClearIncrementalState name
//! only the instances of the session that asks; a producer that goes ends
//! its instances in every session, each counting its own loss.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::connection::{Connection, Instance, Note, Routes};
use super::host::{HostEvent, ProducerReport, WantedSource};
use super::quota::{self, MAX_CLOSED_KEPT, MAX_CONNECTIONS_PER_UID, Quotas, UidReport};
use super::stats::{ProducerStats, ProducerTotals};
use crate::protos::get_async_command_response::{self as cmd, Cmd};
use crate::ringbuf::Buffer;

/// Connections taken from the listener per wake-up: a uid that reconnects
/// as fast as it is refused cannot hold the loop.
const ACCEPT_BATCH: usize = 64;
/// Flushes waiting for acks per session, at most (as Perfetto's service):
/// a producer that never answers costs the oldest entry, not unbounded
/// memory; the session's own deadline has long ended such a flush.
const MAX_PENDING_FLUSHES: usize = 1000;
/// Flush reason TraceStop / Periodic in the flags' low bits (ARCHITECTURE.md §8.6),
/// initiator Traced (1) in bits 4-7.
const FLUSH_FLAGS_PERIODIC: u64 = 1 | (1 << 4);
const FLUSH_FLAGS_STOP: u64 = 2 | (1 << 4);
/// Buffer ids are 16-bit in the producer ABI (a chunk's target buffer).
const MAX_BUFFER_ID: u32 = u16::MAX as u32;

struct PendingFlush {
    id: u64,
    request: u64,
    waiting: BTreeSet<u32>,
}

/// One attached session: its buffer ids, what it wants, and what it waits
/// for.
struct Attached {
    /// Its buffer ids are `base + 1 ..= base + buffers`.
    base: u32,
    len: u32,
    wanted: Vec<WantedSource>,
    buffers: Vec<Arc<Buffer>>,
    per_buffer: Vec<ProducerStats>,
    next_sequence: u32,
    /// What each live connection did in this session's buffers.
    per_conn: BTreeMap<u32, ProducerStats>,
    /// Producers that had instances here and went (at most
    /// [`MAX_CLOSED_KEPT`]; the rest folded into `folded`).
    gone: Vec<ProducerReport>,
    folded: ProducerStats,
    started: bool,
    stopping: bool,
    flushes: Vec<PendingFlush>,
    stop_waiting: BTreeSet<(u32, u64)>,
    stop_pending: bool,
    /// Instances whose start ack is awaited (connection, instance).
    start_waiting: BTreeSet<(u32, u64)>,
    start_pending: bool,
    events: Vec<HostEvent>,
}

impl Attached {
    fn owns(&self, id: u32) -> bool {
        id > self.base && id - self.base <= self.len
    }

    fn index(&self, id: u32) -> Option<usize> {
        self.owns(id).then(|| (id - self.base - 1) as usize)
    }
}

/// The attached sessions, by key: the routes of every chunk.
#[derive(Default)]
struct Sessions(BTreeMap<u64, Attached>);

impl Routes for Sessions {
    fn ring(&mut self, id: u32) -> Option<(&Arc<Buffer>, &mut u32)> {
        let a = self.0.values_mut().find(|a| a.owns(id))?;
        let i = a.index(id)?;
        let Attached {
            buffers,
            next_sequence,
            ..
        } = a;
        Some((buffers.get(i)?, next_sequence))
    }

    fn account(&mut self, id: u32, conn: u32, before: &ProducerStats, after: &ProducerStats) {
        let Some(a) = self.0.values_mut().find(|a| a.owns(id)) else {
            return;
        };
        if let Some(b) = a.index(id).and_then(|i| a.per_buffer.get_mut(i)) {
            b.add_change(before, after);
        }
        a.per_conn
            .entry(conn)
            .or_default()
            .add_change(before, after);
    }
}

/// Why a session could not attach.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    #[error("no {0} free buffer ids left among the served sessions' (at most {MAX_BUFFER_ID})")]
    NoBufferIds(u32),
}

/// The producer socket, its connections and the attached sessions.
pub(crate) struct ProducerRegistry {
    listener: Arc<UnixListener>,
    /// The socket's path (the unit tests connect to it).
    #[cfg_attr(not(test), expect(dead_code, reason = "only the unit tests read it"))]
    path: PathBuf,
    /// One session, which sees every producer's figures as its own
    /// (`recorder --config`).
    solo: bool,
    conns: BTreeMap<u32, Connection>,
    gone: Vec<ProducerReport>,
    next_conn: u32,
    next_instance: u64,
    next_flush_request: u64,
    sessions: Sessions,
    next_session: u64,
    /// Where the next range of buffer ids is looked for: ids are not
    /// reused at once, so a late chunk for a session that ended does not
    /// land in the next one.
    next_buffer: u32,
    /// Per-uid accounts: connections, hits, closed producers, log lines.
    quotas: Quotas,
    /// Connections admitted so far (Perfetto's producers_seen).
    seen: u64,
}

impl ProducerRegistry {
    pub(crate) fn new(listener: UnixListener, path: &Path, solo: bool) -> Self {
        let max = quota::connection_budget(quota::open_file_limit());
        Self {
            listener: Arc::new(listener),
            path: path.to_path_buf(),
            solo,
            conns: BTreeMap::new(),
            gone: Vec::new(),
            next_conn: 1,
            next_instance: 1,
            next_flush_request: 1,
            sessions: Sessions::default(),
            next_session: 1,
            next_buffer: 0,
            quotas: Quotas::new(max, MAX_CONNECTIONS_PER_UID),
            seen: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Descriptors to wait on, borrowed (the session's own loop).
    pub(crate) fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = vec![self.listener.as_fd()];
        v.extend(self.conns.values().map(|c| c.fd()));
        v
    }

    /// The listener and every connection's socket, for a wait without the
    /// registry's lock held (the service's thread).
    pub(crate) fn handles(&self) -> (Arc<UnixListener>, Vec<Arc<UnixStream>>) {
        (
            self.listener.clone(),
            self.conns.values().map(Connection::stream).collect(),
        )
    }

    /// Attaches a session of `buffers` buffers: its key and the base of
    /// its buffer ids (`base + 1 ..= base + buffers`), unique among the
    /// attached sessions. It wants nothing until [`Self::serve`].
    pub(crate) fn attach(&mut self, buffers: usize) -> Result<(u64, u32), AttachError> {
        let len = u32::try_from(buffers).unwrap_or(u32::MAX);
        let base = self.free_range(len).ok_or(AttachError::NoBufferIds(len))?;
        self.next_buffer = base + len;
        let key = self.next_session;
        self.next_session += 1;
        self.sessions.0.insert(
            key,
            Attached {
                base,
                len,
                wanted: Vec::new(),
                buffers: Vec::new(),
                per_buffer: vec![ProducerStats::default(); buffers],
                next_sequence: 1,
                per_conn: BTreeMap::new(),
                gone: Vec::new(),
                folded: ProducerStats::default(),
                started: false,
                stopping: false,
                flushes: Vec::new(),
                stop_waiting: BTreeSet::new(),
                stop_pending: false,
                start_waiting: BTreeSet::new(),
                start_pending: false,
                events: Vec::new(),
            },
        );
        Ok((key, base))
    }

    /// The first base from the cursor on whose `len` ids no attached
    /// session holds, wrapping once.
    fn free_range(&self, len: u32) -> Option<u32> {
        if len > MAX_BUFFER_ID {
            return None;
        }
        let overlaps = |base: u32| {
            self.sessions
                .0
                .values()
                .filter(|a| base < a.base + a.len && a.base < base + len)
                .map(|a| a.base + a.len)
                .max()
        };
        let mut base = self.next_buffer;
        let mut wrapped = false;
        loop {
            if base + len > MAX_BUFFER_ID {
                if wrapped {
                    return None;
                }
                wrapped = true;
                base = 0;
                continue;
            }
            match overlaps(base) {
                None => return Some(base),
                Some(end) => base = end,
            }
        }
    }

    /// What session `key` wants of producers, the rings its buffer ids
    /// name, and its first producer sequence id; instances are set up at
    /// once on the producers that provide them.
    pub(crate) fn serve(
        &mut self,
        key: u64,
        wanted: Vec<WantedSource>,
        buffers: Vec<Arc<Buffer>>,
        first_sequence: u32,
    ) {
        if let Some(a) = self.sessions.0.get_mut(&key) {
            a.per_buffer = vec![ProducerStats::default(); buffers.len()];
            a.len = a.len.min(buffers.len() as u32);
            a.wanted = wanted;
            a.buffers = buffers;
            a.next_sequence = first_sequence;
        }
        self.match_sources();
    }

    /// Session `key` ends: its instances are stopped (if not yet) and
    /// forgotten, its sequences end, its buffer ids are free.
    pub(crate) fn detach(&mut self, key: u64) {
        let Some(a) = self.sessions.0.get(&key) else {
            return;
        };
        let (base, len) = (a.base, a.len);
        for c in self.conns.values_mut() {
            let mine: Vec<u64> = c
                .instances
                .iter()
                .filter(|(_, i)| i.session == key)
                .map(|(id, _)| *id)
                .collect();
            for id in mine {
                c.stop_instance(id);
                c.instances.remove(&id);
            }
            c.finish_where(&mut self.sessions, |b| b > base && b - base <= len);
        }
        self.sessions.0.remove(&key);
        self.reap();
    }

    /// Accepts, reads and handles what the producers sent; events land in
    /// each session's queue.
    pub(crate) fn poll(&mut self) {
        self.accept();
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        let mut changed = false;
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            for note in c.read(&mut self.sessions) {
                match note {
                    Note::Changed => changed = true,
                    // Every session hears a producer's triggers; each acts
                    // on the ones its config names.
                    Note::Triggers(names) => {
                        for a in self.sessions.0.values_mut() {
                            a.events.push(HostEvent::Triggers {
                                producer: c.name.clone().unwrap_or_default(),
                                uid: c.uid,
                                names: names.clone(),
                            });
                        }
                    }
                    Note::FlushAck(r) => {
                        for a in self.sessions.0.values_mut() {
                            for f in &mut a.flushes {
                                if f.request <= r {
                                    f.waiting.remove(&id);
                                }
                            }
                        }
                    }
                    Note::Started(inst) => {
                        for a in self.sessions.0.values_mut() {
                            a.start_waiting.remove(&(id, inst));
                        }
                    }
                    Note::Stopped(inst) => {
                        for a in self.sessions.0.values_mut() {
                            a.stop_waiting.remove(&(id, inst));
                        }
                    }
                }
            }
        }
        self.reap();
        if changed {
            self.match_sources();
        }
        self.completions();
        self.charge();
    }

    /// Session `key`'s events since the last call.
    pub(crate) fn take_events(&mut self, key: u64) -> Vec<HostEvent> {
        self.sessions
            .0
            .get_mut(&key)
            .map(|a| std::mem::take(&mut a.events))
            .unwrap_or_default()
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
                Ok((stream, _)) => self.admit(stream),
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

    /// Charged to the peer's uid before anything is allocated for it;
    /// refused, it is closed at once.
    fn admit(&mut self, stream: UnixStream) {
        let Ok(crate::transport::peer::Peer { uid, .. }) = crate::transport::peer::of(&stream)
        else {
            return;
        };
        if let Err(limit) = self.quotas.admit(uid) {
            drop(stream);
            let line = format!(
                "producer connection of uid {uid} refused: {} (at most {} per uid, {} in all)",
                limit.what(),
                MAX_CONNECTIONS_PER_UID,
                self.quotas.max_connections()
            );
            say(&mut self.quotas, uid, log::Level::Warn, &line);
            return;
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

    /// Closed connections: what they committed stays; what they held is
    /// counted lost in the session that owned it; no session waits for
    /// them any more.
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
                c.scrape(&mut self.sessions, |_| true);
                c.finish(&mut self.sessions);
                for (key, a) in &mut self.sessions.0 {
                    forget(a, *key, &c);
                }
                charge(&mut self.quotas, &mut c);
                self.quotas.release(c.uid);
                self.quotas.shared_memory(c.uid, c.shared_memory(), false);
                // A connection that never said who it is and did nothing
                // wrong (a liveness probe, say) is not worth a line; past
                // MAX_CLOSED_KEPT, closed producers are folded per uid.
                if c.name.is_some() || c.stats != ProducerStats::default() {
                    if self.gone.len() < MAX_CLOSED_KEPT {
                        self.gone.push(report(&c, &c.stats, None, false));
                    } else {
                        self.quotas.fold_closed(c.uid, &c.stats);
                    }
                }
            }
        }
    }

    fn completions(&mut self) {
        for a in self.sessions.0.values_mut() {
            let Attached {
                flushes, events, ..
            } = a;
            flushes.retain(|f| {
                if f.waiting.is_empty() {
                    events.push(HostEvent::Flushed(f.id));
                    false
                } else {
                    true
                }
            });
            if a.start_pending && a.start_waiting.is_empty() {
                a.start_pending = false;
                a.events.push(HostEvent::Started);
            }
            if a.stop_pending && a.stop_waiting.is_empty() {
                a.stop_pending = false;
                a.events.push(HostEvent::Stopped);
            }
        }
    }

    /// Sets up every instance a session asks for that is not there yet
    /// (from the session's beginning, as Perfetto's service does for a
    /// configured session), and starts it when the session has started.
    fn match_sources(&mut self) {
        for (key, a) in &mut self.sessions.0 {
            if a.stopping {
                continue;
            }
            for c in self.conns.values_mut() {
                if c.ready() {
                    set_up(c, *key, a, &mut self.next_instance, &mut self.quotas);
                }
            }
        }
    }

    /// Session `key` started: start every instance set up so far, and
    /// whatever connects later. Whether start acks are due from instances
    /// that promised them (`will_notify_on_start`; [`HostEvent::Started`]
    /// follows once they all came or their producers went).
    pub(crate) fn start(&mut self, key: u64) -> bool {
        self.match_sources();
        let Some(a) = self.sessions.0.get_mut(&key) else {
            return false;
        };
        a.started = true;
        for (cid, c) in &mut self.conns {
            for id in instances_of(c, key) {
                if c.start_instance(id) {
                    a.start_waiting.insert((*cid, id));
                }
            }
        }
        a.start_pending = !a.start_waiting.is_empty();
        a.start_pending
    }

    /// The (producer, data source) pairs whose start ack session `key`
    /// still awaits, at most `max`.
    pub(crate) fn not_started(&self, key: u64, max: usize) -> Vec<(String, String)> {
        let Some(a) = self.sessions.0.get(&key) else {
            return Vec::new();
        };
        a.start_waiting
            .iter()
            .filter_map(|(cid, id)| {
                let c = self.conns.get(cid)?;
                let i = c.instances.get(id)?;
                Some((c.name.clone().unwrap_or_default(), i.name.clone()))
            })
            .take(max)
            .collect()
    }

    /// Flush `id` of session `key` (at its stop when `stop`): sends Flush
    /// for its instances that flush. Whether acks are due
    /// ([`HostEvent::Flushed`] follows).
    pub(crate) fn flush(&mut self, key: u64, id: u64, stop: bool) -> bool {
        let request = self.next_flush_request;
        self.next_flush_request += 1;
        let mut waiting = BTreeSet::new();
        for (cid, c) in &mut self.conns {
            let ids: Vec<u64> = c
                .instances
                .iter()
                .filter(|(_, i)| i.session == key && !i.no_flush && !i.stopping)
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
        let Some(a) = self.sessions.0.get_mut(&key) else {
            return false;
        };
        if waiting.is_empty() {
            return false;
        }
        if a.flushes.len() >= MAX_PENDING_FLUSHES {
            a.flushes.remove(0);
        }
        a.flushes.push(PendingFlush {
            id,
            request,
            waiting,
        });
        true
    }

    /// Stops session `key`'s instances. Whether stop acks are due
    /// ([`HostEvent::Stopped`] follows).
    pub(crate) fn stop(&mut self, key: u64) -> bool {
        let Some(a) = self.sessions.0.get_mut(&key) else {
            return false;
        };
        a.stopping = true;
        for (cid, c) in &mut self.conns {
            for id in instances_of(c, key) {
                if c.stop_instance(id) {
                    a.stop_waiting.insert((*cid, id));
                }
            }
        }
        self.reap();
        let Some(a) = self.sessions.0.get_mut(&key) else {
            return false;
        };
        a.stop_pending = !a.stop_waiting.is_empty();
        a.stop_pending
    }

    /// Reads what every producer that allows it wrote into session `key`'s
    /// buffers and has not committed yet (at the end of a flush and at
    /// the stop).
    pub(crate) fn scrape(&mut self, key: u64) {
        let Some((base, len)) = self.sessions.0.get(&key).map(|a| (a.base, a.len)) else {
            return;
        };
        for c in self.conns.values_mut() {
            c.scrape(&mut self.sessions, |b| b > base && b - base <= len);
        }
    }

    /// ClearIncrementalState for session `key`'s instances.
    pub(crate) fn clear_incremental_state(&mut self, key: u64) {
        for c in self.conns.values_mut() {
            let ids = instances_of(c, key);
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

    /// The figures for session `key`'s `trace_stats`: what producers did
    /// in its buffers; the connection counts are the service's, as
    /// Perfetto's.
    pub(crate) fn totals(&self, key: u64) -> ProducerTotals {
        let zero = ProducerStats::default();
        let mut all = ProducerStats::default();
        let live = self.conns.values().filter(|c| c.closed.is_none());
        let a = self.sessions.0.get(&key);
        if self.solo {
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
        } else if let Some(a) = a {
            for s in a
                .per_conn
                .values()
                .chain(a.gone.iter().map(|r| &r.stats))
                .chain(std::iter::once(&a.folded))
            {
                all.add_change(&zero, s);
            }
        }
        ProducerTotals {
            per_buffer: a.map(|a| a.per_buffer.clone()).unwrap_or_default(),
            all,
            connected: live.clone().count() as u32,
            seen: self.seen,
            data_sources_registered: live.map(|c| c.registered.len() as u32).sum(),
        }
    }

    /// Every uid that hit a limit or whose closed producers were folded,
    /// by uid.
    pub(crate) fn quota_reports(&self) -> Vec<UidReport> {
        self.quotas.reports()
    }

    /// Every producer session `key` has seen, connected ones last: all of
    /// them with their whole figures for a solo session, else those with
    /// instances in it and what they did there.
    pub(crate) fn reports(&self, key: u64) -> Vec<ProducerReport> {
        if self.solo {
            let mut v = self.gone.clone();
            v.extend(
                self.conns
                    .values()
                    .filter(|c| c.name.is_some())
                    .map(|c| report(c, &c.stats, None, true)),
            );
            return v;
        }
        let Some(a) = self.sessions.0.get(&key) else {
            return Vec::new();
        };
        let mut v = a.gone.clone();
        let zero = ProducerStats::default();
        v.extend(
            self.conns
                .iter()
                .filter(|(id, c)| {
                    a.per_conn.contains_key(id) || c.instances.values().any(|i| i.session == key)
                })
                .map(|(id, c)| report(c, a.per_conn.get(id).unwrap_or(&zero), Some(key), true)),
        );
        v
    }

    /// Every connected producer with the data sources it registered (what
    /// `perfetto --query` lists).
    pub(crate) fn listing(&self) -> Vec<ProducerReport> {
        self.conns
            .values()
            .filter(|c| c.closed.is_none() && c.name.is_some())
            .map(|c| ProducerReport {
                data_sources: c.registered.iter().map(|r| r.name.clone()).collect(),
                ..report(c, &c.stats, None, true)
            })
            .collect()
    }

    /// At the end of a solo session: what producers still hold is lost.
    pub(crate) fn finish(&mut self) {
        for c in self.conns.values_mut() {
            c.finish(&mut self.sessions);
        }
        for key in self.sessions.0.keys().copied().collect::<Vec<_>>() {
            for r in self.reports(key) {
                log::debug!("producer {:?} (pid {}): {:?}", r.name, r.pid, r.stats);
            }
        }
    }
}

/// Session `key` (`a`) no longer waits for `c`, which went; what it did
/// there is kept as a closed producer of the session.
fn forget(a: &mut Attached, key: u64, c: &Connection) {
    for f in &mut a.flushes {
        f.waiting.remove(&c.id);
    }
    a.stop_waiting.retain(|(cid, _)| *cid != c.id);
    a.start_waiting.retain(|(cid, _)| *cid != c.id);
    let had = c.instances.values().any(|i| i.session == key);
    let stats = a.per_conn.remove(&c.id);
    if !had && stats.is_none() {
        return;
    }
    let stats = stats.unwrap_or_default();
    if a.gone.len() < MAX_CLOSED_KEPT {
        a.gone.push(report(c, &stats, Some(key), false));
    } else {
        a.folded.add_change(&ProducerStats::default(), &stats);
    }
}

/// The instances of session `key` on `c`.
fn instances_of(c: &Connection, key: u64) -> Vec<u64> {
    c.instances
        .iter()
        .filter(|(_, i)| i.session == key)
        .map(|(id, _)| *id)
        .collect()
}

/// Sets up on `c` every data source of session `key` it registered and
/// has no instance of yet.
fn set_up(
    c: &mut Connection,
    key: u64,
    a: &mut Attached,
    next_instance: &mut u64,
    quotas: &mut Quotas,
) {
    let name = c.name.clone().unwrap_or_default();
    let regs = c.registered.clone();
    for reg in &regs {
        for (w, want) in a.wanted.iter().enumerate() {
            if want.name != reg.name || !want.filter.admits(&name) {
                continue;
            }
            if c.instances
                .values()
                .any(|i| i.session == key && i.wanted == w && i.name == reg.name)
            {
                continue;
            }
            let id = *next_instance;
            *next_instance += 1;
            let line = format!(
                "setting up \"{}\" on producer {} (instance {id})",
                super::connection::short(&reg.name),
                c.label()
            );
            let room = quotas.shared_memory_room(c.uid);
            let before = c.shared_memory();
            let set_up = c.setup_instance(
                id,
                Instance {
                    session: key,
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
            quotas.shared_memory(c.uid, c.shared_memory() - before, true);
            if !set_up {
                continue;
            }
            say(quotas, c.uid, log::Level::Info, &line);
            // A producer that comes after the start is started at once;
            // the session's start no longer waits for it.
            if a.started {
                c.start_instance(id);
            }
        }
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

/// `c` as a session reports it: with `stats`, and the data sources of
/// session `key`'s instances (all of them without one).
fn report(
    c: &Connection,
    stats: &ProducerStats,
    key: Option<u64>,
    connected: bool,
) -> ProducerReport {
    ProducerReport {
        name: c.name.clone().unwrap_or_default(),
        pid: c.pid,
        uid: c.uid,
        data_sources: c
            .instances
            .values()
            .filter(|i| key.is_none_or(|k| i.session == k))
            .map(|i| i.name.clone())
            .collect(),
        stats: stats.clone(),
        connected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::filter::ProducerFilter;
    use crate::protos::ipc_frame::{BindService, InvokeMethod, Msg};
    use crate::protos::{self as pb, GetAsyncCommandResponse, IpcFrame};
    use crate::ringbuf::{BufferParams, FillPolicy};
    use prost::Message;

    fn registry() -> (tempfile::TempDir, ProducerRegistry) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("producer.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let r = ProducerRegistry::new(listener, &path, false);
        (dir, r)
    }

    fn rings(n: usize) -> Vec<Arc<Buffer>> {
        (0..n)
            .map(|_| {
                Buffer::new(BufferParams::new(64 * 1024, FillPolicy::RingBuffer)).expect("buffer")
            })
            .collect()
    }

    /// A producer on the registry's socket, speaking the IPC by hand.
    struct Peer {
        stream: UnixStream,
        decoder: crate::transport::frame::FrameDecoder,
    }

    impl Peer {
        fn send(&mut self, rid: u64, msg: Msg) {
            use std::io::Write;
            let f = IpcFrame {
                request_id: Some(rid),
                msg: Some(msg),
                data_for_testing: Vec::new(),
            };
            let bytes = crate::transport::frame::encode_frame(&f).expect("encode");
            self.stream.write_all(&bytes).expect("write");
        }

        fn invoke(&mut self, rid: u64, method: u32, args: Vec<u8>) {
            self.send(
                rid,
                Msg::MsgInvokeMethod(InvokeMethod {
                    service_id: Some(1),
                    method_id: Some(method),
                    args_proto: Some(args),
                    drop_reply: Some(false),
                }),
            );
        }

        /// The commands received so far on the GetAsyncCommand stream.
        fn commands(&mut self) -> Vec<Cmd> {
            use std::io::Read;
            let mut buf = [0u8; 65536];
            while let Ok(n) = self.stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                self.decoder.feed(&buf[..n]);
            }
            let mut v = Vec::new();
            while let Some(f) = self.decoder.next_frame().expect("well-formed") {
                if let Some(Msg::MsgInvokeMethodReply(r)) = f.msg
                    && r.has_more == Some(true)
                    && let Ok(c) = GetAsyncCommandResponse::decode(
                        r.reply_proto.unwrap_or_default().as_slice(),
                    )
                {
                    v.extend(c.cmd);
                }
            }
            v
        }
    }

    /// A producer of data source `ds`, initialized and listening for
    /// commands.
    fn peer(r: &mut ProducerRegistry, ds: &str) -> Peer {
        let stream = UnixStream::connect(r.path()).expect("connect");
        stream.set_nonblocking(true).expect("nonblocking");
        let mut p = Peer {
            stream,
            decoder: crate::transport::frame::FrameDecoder::new(),
        };
        p.send(
            1,
            Msg::MsgBindService(BindService {
                service_name: Some("ProducerPort".into()),
            }),
        );
        let init = pb::InitializeConnectionRequest {
            producer_name: Some("unit".into()),
            ..Default::default()
        };
        p.invoke(2, 1, init.encode_to_vec());
        let reg = pb::RegisterDataSourceRequest {
            data_source_descriptor: Some(pb::ProducerDataSourceDescriptor {
                name: Some(ds.into()),
                ..Default::default()
            }),
        };
        p.invoke(3, 2, reg.encode_to_vec());
        p.invoke(4, 5, Vec::new());
        for _ in 0..100 {
            r.poll();
            if r.conns.values().any(Connection::ready) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        p
    }

    fn want(ds: &str, buffer: u32) -> Vec<WantedSource> {
        vec![WantedSource {
            name: ds.into(),
            filter: ProducerFilter::default(),
            buffer,
            config: Vec::new(),
        }]
    }

    #[test]
    fn each_session_gets_its_instance_and_commands_name_only_its_own() {
        let (_dir, mut r) = registry();
        let (a, base_a) = r.attach(1).expect("a");
        let (b, base_b) = r.attach(1).expect("b");
        r.serve(a, want("ds", base_a + 1), rings(1), 1);
        r.serve(b, want("ds", base_b + 1), rings(1), 1);
        let mut p = peer(&mut r, "ds");
        let set_up: Vec<u64> = p
            .commands()
            .into_iter()
            .filter_map(|c| match c {
                Cmd::SetupDataSource(s) => s.new_instance_id,
                _ => None,
            })
            .collect();
        assert_eq!(set_up.len(), 2, "one instance per session");
        fn of(r: &ProducerRegistry, key: u64) -> Vec<u64> {
            r.conns
                .values()
                .next()
                .map_or_else(Vec::new, |c| instances_of(c, key))
        }
        let (ia, ib) = (of(&r, a), of(&r, b));
        assert_eq!([ia.clone(), ib.clone()].concat(), set_up);
        assert!(!r.start(a) && !r.start(b), "no start acks promised");
        p.commands();
        // A flush of a names a's instance only; b's stop, b's only.
        assert!(r.flush(a, 7, false));
        assert!(!r.stop(b));
        let cmds = p.commands();
        let flushed: Vec<_> = cmds
            .iter()
            .filter_map(|c| match c {
                Cmd::Flush(f) => Some(f.data_source_ids.clone()),
                _ => None,
            })
            .collect();
        let stopped: Vec<_> = cmds
            .iter()
            .filter_map(|c| match c {
                Cmd::StopDataSource(s) => s.instance_id,
                _ => None,
            })
            .collect();
        assert_eq!(flushed, vec![ia.clone()]);
        assert_eq!(stopped, ib);
        // b detaches: its instance goes, a's stays and a still waits for
        // its flush ack.
        r.detach(b);
        assert_eq!(of(&r, a), ia);
        assert!(of(&r, b).is_empty());
        // The producer goes: a's flush completes, a lists it as closed.
        drop(p);
        for _ in 0..100 {
            r.poll();
            if r.conns.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(r.take_events(a), vec![HostEvent::Flushed(7)]);
        let gone = r.reports(a);
        assert_eq!(gone.len(), 1);
        assert!(!gone[0].connected);
        assert_eq!(gone[0].data_sources, vec!["ds".to_string()]);
    }

    #[test]
    fn buffer_ids_are_unique_among_sessions_and_not_handed_on_at_once() {
        let (_dir, mut r) = registry();
        let (a, base_a) = r.attach(2).expect("a");
        let (_, base_b) = r.attach(3).expect("b");
        assert_eq!((base_a, base_b), (0, 2));
        r.detach(a);
        // a's ids are free, but the next session gets fresh ones.
        let (_, base_c) = r.attach(1).expect("c");
        assert_eq!(base_c, 5);
        // Past the 16-bit ids the search wraps to the free ones at the start.
        let (_, base_d) = r.attach(65_528).expect("d");
        assert_eq!(base_d, 6);
        let (_, base_e) = r.attach(2).expect("e wraps");
        assert_eq!(base_e, 0);
        assert!(matches!(r.attach(600), Err(AttachError::NoBufferIds(600))));
    }

    #[test]
    fn chunks_route_to_the_session_that_owns_the_buffer_id() {
        let (_dir, mut r) = registry();
        let (a, _) = r.attach(1).expect("a");
        let (b, base_b) = r.attach(2).expect("b");
        let (ra, rb) = (rings(1), rings(2));
        r.serve(a, Vec::new(), ra.clone(), 10);
        r.serve(b, Vec::new(), rb.clone(), 20);
        let (ring, next) = r.sessions.ring(base_b + 2).expect("b's second buffer");
        assert!(Arc::ptr_eq(ring, &rb[1]));
        assert_eq!(*next, 20);
        *next += 1;
        let (ring, next) = r.sessions.ring(1).expect("a's buffer");
        assert!(Arc::ptr_eq(ring, &ra[0]));
        assert_eq!(*next, 10, "each session counts its own sequences");
        assert!(r.sessions.ring(0).is_none());
        assert!(r.sessions.ring(base_b + 3).is_none(), "nobody's id");
        let after = ProducerStats {
            packets: 5,
            ..ProducerStats::default()
        };
        r.sessions
            .account(base_b + 1, 7, &ProducerStats::default(), &after);
        assert_eq!(r.totals(b).per_buffer[0].packets, 5);
        assert_eq!(r.totals(b).all.packets, 5);
        assert_eq!(r.totals(a).all.packets, 0, "not a's");
        r.detach(b);
        assert!(
            r.sessions.ring(base_b + 1).is_none(),
            "b's ids are nobody's now"
        );
    }
}
