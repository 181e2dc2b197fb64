//! One producer connection: Perfetto's IPC (BindService, InvokeMethod with
//! request ids, the streaming GetAsyncCommand reply) and the ProducerPort
//! methods, as the tracing service answers them (ARCHITECTURE.md §9.2, §9.3).
//!
//! The connection is driven by the [`Host`](super::host::ProducerHost):
//! [`Connection::read`] takes what the socket has and returns what the host
//! must act on ([`Note`]s); the host sends commands through
//! [`Connection::command`]. A peer that breaks the framing is dropped and
//! counted; an unknown method gets an error reply.

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use super::quota::{
    Hits, Holds, Limit, MAX_DATA_SOURCES, MAX_NAME_BYTES, MAX_REGISTERED_BYTES, MAX_SEQUENCES,
    MIN_SHARED_MEMORY, MOVE_BATCH,
};
use super::sequence::{Budget, Sequence, Trust};
use super::smb::{self, SharedMemory};
use super::stats::ProducerStats;
use crate::protos::get_async_command_response::Cmd;
use crate::protos::ipc_frame::bind_service_reply::MethodInfo;
use crate::protos::ipc_frame::{
    BindServiceReply, InvokeMethod, InvokeMethodReply, Msg, RequestError,
};
use crate::protos::{
    self as pb, CommitDataRequest, GetAsyncCommandResponse, InitializeConnectionRequest, IpcFrame,
};
use crate::ringbuf::{Buffer, WriterId};
use crate::transport::frame::{FrameDecoder, MAX_FRAME_BYTES, encode_frame};

/// The only service: ProducerPort, id 1 (never 0: clients read 0 as "not
/// connected").
pub(crate) const SERVICE_NAME: &str = "ProducerPort";
const SERVICE_ID: u32 = 1;
/// Methods in declaration order: id = index + 1.
pub(crate) const METHODS: [&str; 12] = [
    "InitializeConnection",
    "RegisterDataSource",
    "UnregisterDataSource",
    "CommitData",
    "GetAsyncCommand",
    "RegisterTraceWriter",
    "UnregisterTraceWriter",
    "NotifyDataSourceStarted",
    "NotifyDataSourceStopped",
    "ActivateTriggers",
    "Sync",
    "UpdateDataSource",
];
/// Longest wait to hand a frame to a producer that does not read; after it
/// the producer is dropped (Perfetto waits 10 ms).
const SEND_TIMEOUT: Duration = Duration::from_millis(20);
/// Bytes read from one producer per wake-up, so one cannot starve others.
const READ_BUDGET: usize = 4 * MAX_FRAME_BYTES;

/// A data source a producer registered.
#[derive(Clone, Debug)]
pub struct Registered {
    /// The data source's name, which configs ask for.
    pub name: String,
    /// The producer's id for it.
    pub id: u64,
    /// The producer acknowledges each start (NotifyDataSourceStarted); the
    /// acks are awaited for `all_data_sources_started`, never by the
    /// session's work.
    pub will_notify_on_start: bool,
    pub(crate) will_notify_on_stop: bool,
    pub(crate) no_flush: bool,
}

/// A data source instance started on this producer.
#[derive(Clone, Debug)]
pub struct Instance {
    /// The attached session it belongs to.
    pub session: u64,
    /// Index into that session's config data sources.
    pub(crate) wanted: usize,
    /// The data source's name.
    pub name: String,
    /// Global buffer id (index + 1).
    pub buffer: u32,
    pub(crate) no_flush: bool,
    /// The producer acknowledges the start (NotifyDataSourceStarted).
    pub will_notify_on_start: bool,
    pub(crate) will_notify_on_stop: bool,
    /// The DataSourceConfig it was set up with (StartDataSource repeats it).
    pub config: Vec<u8>,
    /// StartDataSource was sent.
    pub started: bool,
    pub(crate) started_ack: bool,
    /// StopDataSource was sent.
    pub stopping: bool,
}

/// What the host must act on.
#[derive(Debug, PartialEq)]
pub enum Note {
    /// The producer registered, or can now be sent, data sources.
    Changed,
    /// The producer activated these triggers (ActivateTriggers).
    Triggers(Vec<String>),
    /// A CommitData carried this flush request id: the producer's answer
    /// to that flush.
    FlushAck(u64),
    /// An instance acknowledged its start.
    Started(u64),
    /// This instance stopped: it acknowledged StopDataSource, or its data
    /// source was unregistered.
    Stopped(u64),
}

/// Where a producer's chunks go, by their target buffer id: the sessions
/// attached to the producer service, each owning its buffer ids
/// (ARCHITECTURE.md §9.8).
pub trait Routes {
    /// The ring of buffer `id` and the next sequence id of the session that
    /// owns it; `None` when no session does.
    fn ring(&mut self, id: u32) -> Option<(&Arc<Buffer>, &mut u32)>;
    /// What connection `conn` did in buffer `id` went from `before` to
    /// `after` (for that session's `trace_stats` and summary).
    fn account(&mut self, id: u32, conn: u32, before: &ProducerStats, after: &ProducerStats);
}

/// One producer.
pub struct Connection {
    /// The service's number for this connection.
    pub id: u32,
    /// Shared with the service's poll, which may wait on it unlocked.
    stream: Arc<UnixStream>,
    decoder: FrameDecoder,
    /// The peer's uid, from the socket's credentials, never from what it
    /// says: the quotas are charged to it.
    pub uid: u32,
    /// The peer's pid, from the socket's credentials.
    pub pid: u32,
    /// The name from InitializeConnection; `None` until it has
    /// initialized.
    pub name: Option<String>,
    bound: bool,
    async_request: Option<u64>,
    hints: (u32, u32),
    /// The producer allows its SMB to be scraped (SMB_SCRAPING_ENABLED;
    /// unspecified means no, as in Perfetto's service).
    scraping: bool,
    smb: Option<SharedMemory>,
    /// Data sources it registered, in registration order.
    pub registered: Vec<Registered>,
    /// Data source instances set up on it, by instance id.
    pub instances: BTreeMap<u64, Instance>,
    writers: HashMap<u16, u32>,
    sequences: HashMap<(u16, u32), Sequence>,
    /// Where a commit's chunks are copied out of the SMB (reused for every
    /// commit), and each one's offset, length and target buffer there.
    chunk_copy: Vec<u8>,
    moved: Vec<(usize, usize, u32)>,
    /// Lent from `holds` for each piece of work that may hold bytes.
    budget: Budget,
    /// Its share of its uid's holds; the host gives it the uid's on
    /// admission (`quota::Quotas::holds`).
    pub holds: Holds,
    /// What it did, for `trace_stats` and the summary.
    pub stats: ProducerStats,
    /// Its quota hits (`producer::quota`), charged to its uid by the host.
    pub hits: Hits,
    /// Bytes of the names in `registered`.
    registered_bytes: usize,
    /// Lines to log, which the host writes within the uid's log quota
    /// (drained after every call).
    pub log_lines: Vec<(log::Level, String)>,
    /// Why the connection ended, once it has.
    pub closed: Option<String>,
}

impl Connection {
    /// Takes an accepted producer socket, made non-blocking, with the
    /// peer's credentials read; fails when either cannot be done.
    pub fn new(id: u32, stream: UnixStream) -> std::io::Result<Self> {
        stream.set_nonblocking(true)?;
        let cred = crate::transport::peer::of(&stream)?;
        Ok(Self {
            id,
            stream: Arc::new(stream),
            decoder: FrameDecoder::new(),
            uid: cred.uid,
            pid: cred.pid,
            name: None,
            bound: false,
            async_request: None,
            hints: (0, 0),
            scraping: false,
            smb: None,
            registered: Vec::new(),
            instances: BTreeMap::new(),
            writers: HashMap::new(),
            sequences: HashMap::new(),
            chunk_copy: Vec::new(),
            moved: Vec::new(),
            budget: Budget::default(),
            holds: Holds::alone(),
            stats: ProducerStats::default(),
            hits: Hits::default(),
            registered_bytes: 0,
            log_lines: Vec::new(),
            closed: None,
        })
    }

    /// The socket's descriptor, to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// The socket, for a wait that outlives a lock on the connection.
    pub fn stream(&self) -> Arc<UnixStream> {
        self.stream.clone()
    }

    /// The name for people: the producer's own, or its pid before it said.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{} (pid {})", short(n), self.pid),
            None => format!("pid {}", self.pid),
        }
    }

    /// Initialized and listening for commands.
    pub fn ready(&self) -> bool {
        self.name.is_some() && self.async_request.is_some() && self.closed.is_none()
    }

    fn close(&mut self, why: String) {
        if self.closed.is_none() {
            self.log(
                log::Level::Info,
                format!("producer {} disconnected: {why}", self.label()),
            );
            self.closed = Some(why);
        }
    }

    /// A line for the host to log, within the uid's quota.
    fn log(&mut self, level: log::Level, line: String) {
        if log::log_enabled!(level) {
            self.log_lines.push((level, line));
        }
    }

    /// Reads and handles what the socket has (bounded per call).
    pub fn read(&mut self, shared: &mut dyn Routes) -> Vec<Note> {
        let mut notes = Vec::new();
        let mut taken = 0;
        let mut buf = [0u8; 64 * 1024];
        while self.closed.is_none() && taken < READ_BUDGET {
            let room = self.decoder.room().min(buf.len());
            match (&*self.stream).read(&mut buf[..room]) {
                Ok(0) => {
                    self.close("closed by the producer".into());
                    break;
                }
                Ok(n) => {
                    taken += n;
                    self.decoder.feed(&buf[..n]);
                    loop {
                        match self.decoder.next_frame() {
                            Ok(Some(f)) => self.on_frame(f, shared, &mut notes),
                            Ok(None) => break,
                            Err(e) => {
                                self.stats.ipc_refusals += 1;
                                self.close(format!("refused: {e}"));
                                break;
                            }
                        }
                        if self.closed.is_some() {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.close(format!("read: {e}"));
                    break;
                }
            }
        }
        notes
    }

    /// At the end of the connection: what is still held is lost, counted
    /// in the session that owns each sequence's buffer.
    pub fn finish(&mut self, shared: &mut dyn Routes) {
        self.finish_where(shared, |_| true);
    }

    /// Ends the sequences whose buffer `gone` names (a session detached):
    /// what they held is lost, and they no longer hold its rings.
    pub(crate) fn finish_where(&mut self, shared: &mut dyn Routes, gone: impl Fn(u32) -> bool) {
        self.end_sequences(shared, |(_, b)| gone(b));
    }

    /// Ends the sequences whose (writer, buffer) `gone` names.
    fn end_sequences(&mut self, shared: &mut dyn Routes, gone: impl Fn((u16, u32)) -> bool) {
        let lent = self.lend();
        let keys: Vec<(u16, u32)> = self
            .sequences
            .keys()
            .filter(|k| gone(**k))
            .copied()
            .collect();
        for key in keys {
            if let Some(mut s) = self.sequences.remove(&key) {
                let before = self.stats.clone();
                s.finish(&mut self.stats, &mut self.budget);
                shared.account(key.1, self.id, &before, &self.stats);
                self.holds.give_sequence();
            }
        }
        self.settle(lent);
    }

    /// Lends the budget what the uid may still hold, before work that may
    /// hold bytes (or give them back).
    fn lend(&mut self) -> usize {
        self.budget.left = self.holds.room();
        self.budget.left
    }

    /// After that work: charges the uid what it took (or returns what it
    /// gave back), and counts the times it was short.
    fn settle(&mut self, lent: usize) {
        self.holds.settle(lent, self.budget.left);
        self.budget.left = 0;
        self.hits
            .add(Limit::HeldBytes, std::mem::take(&mut self.budget.short));
    }

    fn on_frame(&mut self, f: IpcFrame, shared: &mut dyn Routes, notes: &mut Vec<Note>) {
        let rid = f.request_id.unwrap_or(0);
        match f.msg {
            Some(Msg::MsgBindService(b)) => {
                let ok = b.service_name.as_deref() == Some(SERVICE_NAME);
                let reply = if ok {
                    self.bound = true;
                    BindServiceReply {
                        success: Some(true),
                        service_id: Some(SERVICE_ID),
                        methods: METHODS
                            .iter()
                            .enumerate()
                            .map(|(i, n)| MethodInfo {
                                id: Some(i as u32 + 1),
                                name: Some((*n).into()),
                            })
                            .collect(),
                    }
                } else {
                    self.stats.ipc_refusals += 1;
                    BindServiceReply::default()
                };
                self.send(rid, Msg::MsgBindServiceReply(reply), None);
            }
            Some(Msg::MsgInvokeMethod(m)) => self.invoke(rid, m, shared, notes),
            // Peer identity comes from SO_PEERCRED on a unix socket.
            Some(Msg::SetPeerIdentity(_)) => {}
            _ => {
                self.stats.ipc_refusals += 1;
                self.send(
                    rid,
                    Msg::MsgRequestError(RequestError {
                        error: Some("unknown request".into()),
                    }),
                    None,
                );
            }
        }
    }

    fn fail(&mut self, rid: u64) {
        self.stats.ipc_refusals += 1;
        self.send(
            rid,
            Msg::MsgInvokeMethodReply(InvokeMethodReply {
                success: None,
                has_more: None,
                reply_proto: None,
            }),
            None,
        );
    }

    fn ok(&mut self, rid: u64, drop_reply: bool, reply: Vec<u8>) {
        if !drop_reply {
            self.send(
                rid,
                Msg::MsgInvokeMethodReply(InvokeMethodReply {
                    success: Some(true),
                    has_more: Some(false),
                    reply_proto: Some(reply),
                }),
                None,
            );
        }
    }

    /// One ProducerPort call: checked, handled by its method, answered
    /// (unless the caller asked for no reply and the call went well).
    fn invoke(
        &mut self,
        rid: u64,
        m: InvokeMethod,
        shared: &mut dyn Routes,
        notes: &mut Vec<Note>,
    ) {
        let method = m.method_id.unwrap_or(0) as usize;
        if !self.bound || m.service_id != Some(SERVICE_ID) || method == 0 || method > METHODS.len()
        {
            return self.fail(rid);
        }
        let args = m.args_proto.unwrap_or_default();
        let drop_reply = m.drop_reply.unwrap_or(false);
        let name = METHODS[method - 1];
        if self.name.is_none() && name != "InitializeConnection" {
            // Nothing before InitializeConnection (ARCHITECTURE.md §9.3).
            if !drop_reply {
                self.fail(rid);
            }
            return;
        }
        let answer = match name {
            "InitializeConnection" => decode(&args).and_then(|r| self.initialize(&r, notes)),
            "RegisterDataSource" => decode::<pb::RegisterDataSourceRequest>(&args)
                .and_then(|r| self.register(r.data_source_descriptor, notes)),
            "UpdateDataSource" => decode::<pb::UpdateDataSourceRequest>(&args)
                .and_then(|r| self.update(r.data_source_descriptor)),
            "UnregisterDataSource" => decode(&args).map(|r| self.unregister(r, notes)),
            "CommitData" => decode::<CommitDataRequest>(&args).map(|r| {
                self.commit(&r, shared);
                if let Some(ack) = r.flush_request_id.filter(|a| *a != 0) {
                    notes.push(Note::FlushAck(ack));
                }
                Answer::Done
            }),
            "GetAsyncCommand" => {
                // A second bind replaces the stream (the first one ends).
                if let Some(old) = self.async_request.replace(rid) {
                    self.fail(old);
                }
                notes.push(Note::Changed);
                Ok(Answer::Streaming)
            }
            "RegisterTraceWriter" => decode(&args).and_then(|r| self.register_writer(r)),
            "UnregisterTraceWriter" => decode::<pb::UnregisterTraceWriterRequest>(&args).map(|r| {
                if let Ok(id) = u16::try_from(r.trace_writer_id.unwrap_or(0))
                    && self.writers.remove(&id).is_some()
                {
                    // The writer is gone, after committing what it wrote (the
                    // same socket carried that first). Its id may be given to
                    // a new writer, whose chunks start again at 0: a sequence
                    // of its own, not a gap in this one.
                    self.end_sequences(shared, |(w, _)| w == id);
                }
                Answer::Done
            }),
            "NotifyDataSourceStarted" => decode(&args).map(|r| self.started(r, notes)),
            "NotifyDataSourceStopped" => {
                decode::<pb::NotifyDataSourceStoppedRequest>(&args).map(|r| {
                    let id = r.data_source_id.unwrap_or(0);
                    if self.instances.get(&id).is_some_and(|i| i.stopping) {
                        notes.push(Note::Stopped(id));
                    }
                    Answer::Done
                })
            }
            "ActivateTriggers" => decode::<pb::ActivateTriggersRequest>(&args).map(|r| {
                notes.push(Note::Triggers(r.trigger_names));
                Answer::Done
            }),
            // Sync: everything queued before it is handled, reply at once.
            _ => Ok(Answer::Done),
        };
        match answer {
            Ok(Answer::Reply(bytes)) => self.ok(rid, drop_reply, bytes),
            Ok(Answer::Done) => self.ok(rid, drop_reply, Vec::new()),
            Ok(Answer::Streaming) => {}
            Err(Refused) => self.fail(rid),
        }
    }

    fn initialize(
        &mut self,
        r: &InitializeConnectionRequest,
        notes: &mut Vec<Note>,
    ) -> Result<Answer, Refused> {
        if self.name.is_some() {
            return Err(Refused);
        }
        let name = r.producer_name.clone().unwrap_or_default();
        if name.len() > MAX_NAME_BYTES {
            self.hits.add(Limit::NameLength, 1);
            return Err(Refused);
        }
        self.hints = (
            r.shared_memory_page_size_hint_bytes.unwrap_or(0),
            r.shared_memory_size_hint_bytes.unwrap_or(0),
        );
        self.scraping = r.smb_scraping_mode
            == Some(
                pb::initialize_connection_request::ProducerSmbScrapingMode::SmbScrapingEnabled
                    as i32,
            );
        let sdk = r.sdk_version.as_deref().unwrap_or("unknown SDK");
        let line = format!(
            "producer \"{}\" connected (pid {}, uid {}, {})",
            short(&name),
            self.pid,
            self.uid,
            short(sdk)
        );
        self.log(log::Level::Info, line);
        self.name = Some(name);
        notes.push(Note::Changed);
        // The recorder always provides the SMB itself.
        let reply = pb::InitializeConnectionResponse {
            using_shmem_provided_by_producer: Some(false),
            direct_smb_patching_supported: Some(false),
            use_shmem_emulation: Some(false),
        };
        Ok(Answer::Reply(reply.encode_to_vec()))
    }

    /// A descriptor as registered; a name past the quota is refused.
    fn descriptor(
        &mut self,
        d: Option<pb::ProducerDataSourceDescriptor>,
    ) -> Result<Registered, Refused> {
        let d = d.unwrap_or_default();
        if d.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES) {
            self.hits.add(Limit::NameLength, 1);
            return Err(Refused);
        }
        Ok(Registered {
            name: d.name.unwrap_or_default(),
            id: d.id.unwrap_or(0),
            will_notify_on_start: d.will_notify_on_start.unwrap_or(false),
            will_notify_on_stop: d.will_notify_on_stop.unwrap_or(false),
            no_flush: d.no_flush.unwrap_or(false),
        })
    }

    fn register(
        &mut self,
        d: Option<pb::ProducerDataSourceDescriptor>,
        notes: &mut Vec<Note>,
    ) -> Result<Answer, Refused> {
        let reg = self.descriptor(d)?;
        // An empty name, or an id already registered: ignored.
        let known = reg.id != 0 && self.registered.iter().any(|r| r.id == reg.id);
        if reg.name.is_empty() || known {
            return Ok(Answer::Done);
        }
        if self.registered.len() >= MAX_DATA_SOURCES {
            self.hits.add(Limit::DataSources, 1);
            return Err(Refused);
        }
        if self.registered_bytes + reg.name.len() > MAX_REGISTERED_BYTES {
            self.hits.add(Limit::RegisteredBytes, 1);
            return Err(Refused);
        }
        let line = format!(
            "producer {} registered \"{}\"",
            self.label(),
            short(&reg.name)
        );
        self.log(log::Level::Debug, line);
        self.registered_bytes += reg.name.len();
        self.registered.push(reg);
        notes.push(Note::Changed);
        Ok(Answer::Done)
    }

    fn update(&mut self, d: Option<pb::ProducerDataSourceDescriptor>) -> Result<Answer, Refused> {
        let reg = self.descriptor(d)?;
        if let Some(r) = self
            .registered
            .iter_mut()
            .find(|r| reg.id != 0 && r.id == reg.id && r.name == reg.name)
        {
            *r = reg;
        }
        Ok(Answer::Done)
    }

    /// Its instances of that data source stop (in every session), and the
    /// name is forgotten.
    fn unregister(&mut self, r: pb::UnregisterDataSourceRequest, notes: &mut Vec<Note>) -> Answer {
        let n = r.data_source_name.unwrap_or_default();
        let live: Vec<u64> = self
            .instances
            .iter()
            .filter(|(_, i)| i.name == n && !i.stopping)
            .map(|(id, _)| *id)
            .collect();
        for id in live {
            self.stop_instance(id);
            notes.push(Note::Stopped(id));
        }
        if let Some(at) = self.registered.iter().position(|r| r.name == n) {
            let r = self.registered.remove(at);
            self.registered_bytes = self.registered_bytes.saturating_sub(r.name.len());
        }
        Answer::Done
    }

    fn register_writer(&mut self, r: pb::RegisterTraceWriterRequest) -> Result<Answer, Refused> {
        let id = r.trace_writer_id.unwrap_or(0);
        if let (Ok(id), Some(b)) = (u16::try_from(id), r.target_buffer) {
            if self.writers.len() >= MAX_SEQUENCES && !self.writers.contains_key(&id) {
                self.hits.add(Limit::Sequences, 1);
                return Err(Refused);
            }
            self.writers.insert(id, b);
        }
        Ok(Answer::Done)
    }

    fn started(&mut self, r: pb::NotifyDataSourceStartedRequest, notes: &mut Vec<Note>) -> Answer {
        let id = r.data_source_id.unwrap_or(0);
        // Acks for instances not started, or acked before, change nothing
        // (ARCHITECTURE.md §9.3).
        if let Some(i) = self.instances.get_mut(&id)
            && i.started
            && !i.started_ack
        {
            i.started_ack = true;
            notes.push(Note::Started(id));
        }
        Answer::Done
    }

    /// Reads what the producer wrote but has not committed (ARCHITECTURE.md
    /// §9.7): at flushes, the stop and its disconnect, when it allows it.
    /// Only chunks of writers registered for a buffer it was started for;
    /// per writer in chunk order, never past its chunk being written.
    /// Only buffers `only` admits (the session that flushes or stops).
    pub fn scrape(&mut self, shared: &mut dyn Routes, only: impl Fn(u32) -> bool) {
        let lent = self.lend();
        self.scrape_lent(shared, only);
        self.settle(lent);
    }

    fn scrape_lent(&mut self, shared: &mut dyn Routes, only: impl Fn(u32) -> bool) {
        if !self.scraping || self.writers.is_empty() {
            return;
        }
        let Some(smb) = &self.smb else {
            return;
        };
        let allowed: Vec<u32> = self
            .instances
            .values()
            .map(|i| i.buffer)
            .filter(|b| only(*b))
            .collect();
        let mut by_writer: BTreeMap<u16, Vec<(u32, smb::Scraped)>> = BTreeMap::new();
        for s in smb.scrape() {
            let Some(h) = super::chunk::ChunkHeader::parse(&s.bytes) else {
                continue;
            };
            if self
                .writers
                .get(&h.writer_id)
                .is_some_and(|b| allowed.contains(b))
            {
                by_writer
                    .entry(h.writer_id)
                    .or_default()
                    .push((h.chunk_id, s));
            }
        }
        for (writer, chunks) in by_writer {
            let Some(&buffer_id) = self.writers.get(&writer) else {
                continue;
            };
            let Some(seq) = sequence(
                &mut self.sequences,
                (writer, buffer_id),
                (self.uid, self.pid),
                shared,
                &mut self.hits,
                &mut self.holds,
            ) else {
                continue;
            };
            let before = self.stats.clone();
            seq.on_scrape(chunks, &mut self.stats, &mut self.budget);
            shared.account(buffer_id, self.id, &before, &self.stats);
        }
    }

    /// CommitData's chunk moves and patches (ARCHITECTURE.md §9.4).
    fn commit(&mut self, r: &CommitDataRequest, shared: &mut dyn Routes) {
        let lent = self.lend();
        self.commit_lent(r, shared);
        self.settle(lent);
    }

    fn commit_lent(&mut self, r: &CommitDataRequest, shared: &mut dyn Routes) {
        // Every chunk the commit names is moved out (and so freed for the
        // app) before any is parsed: the app writes into freed chunks while
        // this thread validates and stores the copies, or after it was
        // preempted between the two.
        let mut bytes = std::mem::take(&mut self.chunk_copy);
        let mut moved = std::mem::take(&mut self.moved);
        moved.clear();
        bytes.clear();
        // At most the producer's own shared memory (which its uid's quota
        // bounds) and MOVE_BATCH at a time, plus the chunk that crosses it;
        // reserved exactly, once.
        let batch = self.smb.as_ref().map_or(0, |m| m.size().min(MOVE_BATCH));
        let page = self.smb.as_ref().map_or(0, |m| m.page_size());
        if !r.chunks_to_move.is_empty() {
            bytes.reserve_exact(batch + page);
        }
        for mv in &r.chunks_to_move {
            let Some(smb) = &self.smb else {
                self.stats.chunks_discarded += 1;
                continue;
            };
            // Emulation (inline chunk bytes) is never offered.
            if mv.data.is_some() {
                self.stats.abi_violations += 1;
                continue;
            }
            let page = mv.page.unwrap_or(u32::MAX);
            let at = bytes.len();
            match smb.take_chunk(page, mv.chunk.unwrap_or(u32::MAX), &mut bytes) {
                Ok(len) => moved.push((at, len, mv.target_buffer.unwrap_or(0))),
                Err(_) => {
                    self.stats.chunks_discarded += 1;
                    continue;
                }
            }
            if bytes.len() >= batch {
                // A producer that marks chunks complete again as fast as
                // they are taken gets them stored a batch at a time.
                self.store_moved(&bytes, &moved, shared);
                moved.clear();
                bytes.clear();
            }
        }
        self.store_moved(&bytes, &moved, shared);
        self.chunk_copy = bytes;
        self.moved = moved;
        for p in &r.chunks_to_patch {
            let n = p.patches.len() as u64;
            let writer = p
                .writer_id
                .and_then(|w| u16::try_from(w).ok())
                .filter(|w| *w != 0);
            let buffer_id = p.target_buffer.unwrap_or(0);
            let key = writer.map(|w| (w, buffer_id));
            let Some(seq) = key.and_then(|k| self.sequences.get_mut(&k)) else {
                self.stats.patches_failed += n;
                continue;
            };
            if p.patches.len() > 1024 {
                self.stats.patches_failed += n;
                continue;
            }
            let patches: Vec<(u32, &[u8])> = p
                .patches
                .iter()
                .map(|x| {
                    (
                        x.offset.unwrap_or(u32::MAX),
                        x.data.as_deref().unwrap_or(&[]),
                    )
                })
                .collect();
            let before = self.stats.clone();
            seq.patch(
                p.chunk_id.unwrap_or(0),
                &patches,
                !p.has_more_patches.unwrap_or(false),
                &mut self.stats,
                &mut self.budget,
            );
            shared.account(buffer_id, self.id, &before, &self.stats);
        }
    }

    /// Stores the chunks a commit moved into `bytes` (offset, length and
    /// target buffer of each, in the commit's order).
    fn store_moved(
        &mut self,
        bytes: &[u8],
        moved: &[(usize, usize, u32)],
        shared: &mut dyn Routes,
    ) {
        let allowed: Vec<u32> = self.instances.values().map(|i| i.buffer).collect();
        for &(at, len, buffer_id) in moved {
            let chunk = &bytes[at..at + len];
            self.stats.chunks_committed += 1;
            let Some(header) = super::chunk::ChunkHeader::parse(chunk) else {
                self.stats.abi_violations += 1;
                continue;
            };
            // A buffer none of its instances writes into (another
            // session's, or nobody's) gets nothing: dropped and charged to
            // the producer's uid (ARCHITECTURE.md §9.8).
            if !allowed.contains(&buffer_id) {
                self.stats.chunks_discarded += 1;
                self.hits.add(Limit::ForeignBuffer, 1);
                continue;
            }
            let bound = self.writers.get(&header.writer_id);
            if bound.is_some_and(|b| *b != buffer_id) {
                self.stats.chunks_discarded += 1;
                continue;
            }
            let Some(seq) = sequence(
                &mut self.sequences,
                (header.writer_id, buffer_id),
                (self.uid, self.pid),
                shared,
                &mut self.hits,
                &mut self.holds,
            ) else {
                self.stats.chunks_discarded += 1;
                continue;
            };
            let before = self.stats.clone();
            seq.on_chunk(chunk, &mut self.stats, &mut self.budget);
            shared.account(buffer_id, self.id, &before, &self.stats);
        }
    }

    /// Bytes of the shared memory buffer it was given (0 before).
    pub(crate) fn shared_memory(&self) -> usize {
        self.smb.as_ref().map_or(0, |s| s.size())
    }

    /// Sets up data source instance `id` (the SMB and SetupTracing first,
    /// once, within `room` bytes of its uid's shared memory quota: smaller
    /// than asked when needed, and not at all when even
    /// [`MIN_SHARED_MEMORY`] does not fit — a hit, and no instance);
    /// [`Connection::start_instance`] starts it. Whether it was set up.
    pub(crate) fn setup_instance(&mut self, id: u64, inst: Instance, room: usize) -> bool {
        if self.smb.is_none() {
            let (page, mut size) = smb::sizes(self.hints.0, self.hints.1);
            if size > room {
                size = room - room % page;
                if size < MIN_SHARED_MEMORY.max(page) {
                    self.hits.add(Limit::SharedMemory, 1);
                    return false;
                }
            }
            match SharedMemory::create(size, page) {
                Ok(s) => {
                    let cmd = Cmd::SetupTracing(pb::get_async_command_response::SetupTracing {
                        shared_buffer_page_size_kb: Some((page / 1024) as u32),
                        shm_key_windows: None,
                    });
                    let smb_fd = s.fd();
                    // The fd rides on the frame that carries SetupTracing.
                    let dup = smb_fd.try_clone_to_owned();
                    self.smb = Some(s);
                    match dup {
                        Ok(fd) => self.command(cmd, Some(fd.as_fd())),
                        Err(e) => {
                            self.close(format!("shared memory: {e}"));
                            return false;
                        }
                    }
                }
                Err(e) => {
                    self.close(format!("shared memory: {e}"));
                    return false;
                }
            }
        }
        let config = inst.config.clone();
        self.instances.insert(id, inst);
        self.command(
            Cmd::SetupDataSource(pb::get_async_command_response::SetupDataSource {
                new_instance_id: Some(id),
                config: Some(config),
            }),
            None,
        );
        true
    }

    /// Starts instance `id` (set up before); whether a start ack is due.
    pub(crate) fn start_instance(&mut self, id: u64) -> bool {
        let Some(i) = self.instances.get_mut(&id) else {
            return false;
        };
        if i.started || i.stopping {
            return false;
        }
        i.started = true;
        let ack = i.will_notify_on_start;
        let config = i.config.clone();
        self.command(
            Cmd::StartDataSource(pb::get_async_command_response::StartDataSource {
                new_instance_id: Some(id),
                config: Some(config),
            }),
            None,
        );
        ack && self.closed.is_none()
    }

    /// Sends StopDataSource; whether an ack is due.
    pub(crate) fn stop_instance(&mut self, id: u64) -> bool {
        let Some(i) = self.instances.get_mut(&id) else {
            return false;
        };
        if i.stopping {
            return false;
        }
        i.stopping = true;
        let ack = i.will_notify_on_stop;
        self.command(
            Cmd::StopDataSource(pb::get_async_command_response::StopDataSource {
                instance_id: Some(id),
            }),
            None,
        );
        ack
    }

    /// One command on the GetAsyncCommand stream.
    pub fn command(&mut self, cmd: Cmd, fd: Option<BorrowedFd<'_>>) {
        let Some(rid) = self.async_request else {
            return;
        };
        let resp = GetAsyncCommandResponse { cmd: Some(cmd) };
        self.send(
            rid,
            Msg::MsgInvokeMethodReply(InvokeMethodReply {
                success: Some(true),
                has_more: Some(true),
                reply_proto: Some(resp.encode_to_vec()),
            }),
            fd,
        );
    }

    /// Sends one frame, with `fd` on its first bytes; a producer that does
    /// not take it within [`SEND_TIMEOUT`] is dropped.
    fn send(&mut self, rid: u64, msg: Msg, fd: Option<BorrowedFd<'_>>) {
        if self.closed.is_some() {
            return;
        }
        let frame = IpcFrame {
            request_id: Some(rid),
            msg: Some(msg),
            data_for_testing: Vec::new(),
        };
        let bytes = match encode_frame(&frame) {
            Ok(b) => b,
            Err(e) => return self.close(format!("reply too large: {e}")),
        };
        let deadline = Instant::now() + SEND_TIMEOUT;
        let mut sent = 0;
        let mut fd = fd;
        while sent < bytes.len() {
            let mut space =
                [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let fds;
            if let Some(f) = fd {
                fds = [f];
                control.push(SendAncillaryMessage::ScmRights(&fds));
            }
            let r = rustix::net::sendmsg(
                &self.stream,
                &[IoSlice::new(&bytes[sent..])],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            );
            match r {
                Ok(n) => {
                    sent += n;
                    fd = None;
                }
                Err(rustix::io::Errno::AGAIN) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return self.close("does not read its socket".into());
                    }
                    let ts = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: left.as_nanos() as i64,
                    };
                    let mut p = [PollFd::new(&self.stream, PollFlags::OUT)];
                    let _ = poll(&mut p, Some(&ts));
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return self.close(format!("send: {e}")),
            }
        }
    }
}

/// How a call that went well is answered.
enum Answer {
    /// A reply with this message.
    Reply(Vec<u8>),
    /// A reply with an empty message.
    Done,
    /// No reply now: the GetAsyncCommand stream answers with commands.
    Streaming,
}

/// The call fails: a failure reply, whatever the caller asked.
struct Refused;

/// A method's arguments, untrusted.
fn decode<T: Message + Default>(args: &[u8]) -> Result<T, Refused> {
    T::decode(args).map_err(|_| Refused)
}

/// A producer's text (its name, SDK version, a data source's name) as a
/// log line shows it: escaped, so a newline cannot forge a line, and cut.
pub(crate) fn short(name: &str) -> String {
    crate::transport::log_budget::for_log(name)
}

/// The sequence of (writer, buffer), made on first use with the next
/// session-wide sequence id.
fn sequence<'a>(
    sequences: &'a mut HashMap<(u16, u32), Sequence>,
    (writer, buffer_id): (u16, u32),
    (uid, pid): (u32, u32),
    shared: &mut dyn Routes,
    hits: &mut Hits,
    holds: &mut Holds,
) -> Option<&'a mut Sequence> {
    if writer == 0 {
        return None;
    }
    let (buffer, next_sequence) = shared.ring(buffer_id)?;
    if !sequences.contains_key(&(writer, buffer_id)) {
        if sequences.len() >= MAX_SEQUENCES {
            hits.add(Limit::Sequences, 1);
            return None;
        }
        if !holds.take_sequence() {
            hits.add(Limit::SequencesPerUid, 1);
            return None;
        }
    }
    Some(sequences.entry((writer, buffer_id)).or_insert_with(|| {
        let sequence_id = *next_sequence;
        *next_sequence += 1;
        Sequence::new(
            buffer.writer(WriterId(sequence_id)),
            Trust {
                uid,
                pid,
                sequence_id,
            },
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::ipc_frame::BindService;
    use std::io::Write;

    fn request(rid: u64, msg: Option<Msg>) -> Vec<u8> {
        encode_frame(&IpcFrame {
            request_id: Some(rid),
            msg,
            data_for_testing: vec![],
        })
        .expect("encode")
    }

    fn invoke(rid: u64, method: u32, args: Vec<u8>, drop_reply: bool) -> Vec<u8> {
        request(
            rid,
            Some(Msg::MsgInvokeMethod(InvokeMethod {
                service_id: Some(SERVICE_ID),
                method_id: Some(method),
                args_proto: Some(args),
                drop_reply: Some(drop_reply),
            })),
        )
    }

    /// Feeds `bytes` to a connection and returns the frames it answered.
    fn exchange(bytes: &[u8]) -> (Vec<IpcFrame>, Vec<Note>, Connection) {
        let (ours, mut peer) = UnixStream::pair().expect("pair");
        let mut c = Connection::new(1, ours).expect("connection");
        peer.write_all(bytes).expect("write");
        let notes = c.read(&mut NoRoutes);
        peer.set_nonblocking(true).expect("nonblocking");
        let mut d = FrameDecoder::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = peer.read(&mut buf) {
            if n == 0 {
                break;
            }
            d.feed(&buf[..n]);
        }
        let mut frames = Vec::new();
        while let Some(f) = d.next_frame().expect("our replies are well-formed") {
            frames.push(f);
        }
        (frames, notes, c)
    }

    fn bind(rid: u64, name: &str) -> Vec<u8> {
        request(
            rid,
            Some(Msg::MsgBindService(BindService {
                service_name: Some(name.into()),
            })),
        )
    }

    fn success(f: &IpcFrame) -> Option<bool> {
        match &f.msg {
            Some(Msg::MsgInvokeMethodReply(r)) => Some(r.success.unwrap_or(false)),
            _ => None,
        }
    }

    /// No session attached: every buffer id is nobody's.
    struct NoRoutes;

    impl Routes for NoRoutes {
        fn ring(&mut self, _: u32) -> Option<(&Arc<Buffer>, &mut u32)> {
            None
        }
        fn account(&mut self, _: u32, _: u32, _: &ProducerStats, _: &ProducerStats) {}
    }

    #[test]
    fn binding_names_every_method_and_refuses_other_services() {
        let (frames, _, _) = exchange(&[bind(1, "ConsumerPort"), bind(2, SERVICE_NAME)].concat());
        let Some(Msg::MsgBindServiceReply(no)) = &frames[0].msg else {
            panic!("{frames:?}")
        };
        assert_eq!((no.success, no.service_id), (None, None));
        let Some(Msg::MsgBindServiceReply(yes)) = &frames[1].msg else {
            panic!("{frames:?}")
        };
        assert_eq!(frames[1].request_id, Some(2));
        assert_eq!((yes.success, yes.service_id), (Some(true), Some(1)));
        let names: Vec<_> = yes
            .methods
            .iter()
            .map(|m| (m.id.unwrap_or(0), m.name.clone().unwrap_or_default()))
            .collect();
        assert_eq!(names[3], (4, "CommitData".into()));
        assert_eq!(names.len(), 12);
    }

    #[test]
    fn unknown_methods_and_early_calls_get_error_replies_and_the_connection_stays() {
        let init = InitializeConnectionRequest {
            producer_name: Some("unit".into()),
            ..Default::default()
        }
        .encode_to_vec();
        let bytes = [
            bind(1, SERVICE_NAME),
            // Before InitializeConnection: refused.
            invoke(2, 11, vec![], false),
            invoke(3, 1, init, false),
            // Unknown method ids: refused even with drop_reply.
            invoke(4, 99, vec![], true),
            invoke(5, 0, vec![], false),
            // Args that do not decode.
            invoke(6, 6, vec![0xFF], false),
            // A frame with no request in it.
            request(7, None),
            invoke(8, 11, vec![], false),
            invoke(
                9,
                10,
                pb::ActivateTriggersRequest {
                    trigger_names: vec!["t".into()],
                }
                .encode_to_vec(),
                true,
            ),
        ]
        .concat();
        let (frames, notes, c) = exchange(&bytes);
        let by_id = |id| {
            frames
                .iter()
                .find(|f| f.request_id == Some(id))
                .expect("answered")
        };
        assert_eq!(success(by_id(2)), Some(false));
        assert_eq!(success(by_id(3)), Some(true));
        assert_eq!(success(by_id(4)), Some(false));
        assert_eq!(success(by_id(5)), Some(false));
        assert_eq!(success(by_id(6)), Some(false));
        assert!(matches!(by_id(7).msg, Some(Msg::MsgRequestError(_))));
        assert_eq!(success(by_id(8)), Some(true));
        assert!(
            frames.iter().all(|f| f.request_id != Some(9)),
            "drop_reply honoured"
        );
        assert!(notes.contains(&Note::Triggers(vec!["t".into()])));
        assert!(c.closed.is_none());
        assert_eq!(c.name.as_deref(), Some("unit"));
    }

    #[test]
    fn an_oversized_frame_closes_the_connection_and_is_counted() {
        let (_, _, c) = exchange(&u32::MAX.to_le_bytes());
        assert!(c.closed.is_some());
        assert_eq!(c.stats.ipc_refusals, 1);
    }

    fn register(rid: u64, name: &str) -> Vec<u8> {
        let req = pb::RegisterDataSourceRequest {
            data_source_descriptor: Some(pb::ProducerDataSourceDescriptor {
                name: Some(name.into()),
                ..Default::default()
            }),
        };
        invoke(rid, 2, req.encode_to_vec(), false)
    }

    #[test]
    fn names_data_sources_and_name_bytes_are_refused_past_their_quotas() {
        let init = |name: &str| {
            InitializeConnectionRequest {
                producer_name: Some(name.into()),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let (frames, _, c) =
            exchange(&[bind(1, SERVICE_NAME), invoke(2, 1, init(&long), false)].concat());
        assert_eq!(success(&frames[1]), Some(false));
        assert_eq!(c.name, None);
        assert_eq!(c.hits.get(Limit::NameLength), 1);

        let mut bytes = vec![bind(1, SERVICE_NAME), invoke(2, 1, init("q"), false)];
        bytes.push(register(3, &long));
        for i in 0..MAX_DATA_SOURCES + 5 {
            bytes.push(register(10 + i as u64, &format!("ds{i}")));
        }
        let (frames, _, c) = exchange(&bytes.concat());
        let failed = frames.iter().filter(|f| success(f) == Some(false)).count();
        assert_eq!(failed, 1 + 5);
        assert_eq!(c.registered.len(), MAX_DATA_SOURCES);
        assert_eq!(c.hits.get(Limit::NameLength), 1);
        assert_eq!(c.hits.get(Limit::DataSources), 5);

        // Names near the length limit run into the byte quota first.
        let near = "y".repeat(MAX_NAME_BYTES - 8);
        let mut bytes = vec![bind(1, SERVICE_NAME), invoke(2, 1, init("b"), false)];
        let fit = MAX_REGISTERED_BYTES / MAX_NAME_BYTES;
        for i in 0..fit + 3 {
            bytes.push(register(10 + i as u64, &format!("{near}{i:08}")));
        }
        let (_, _, c) = exchange(&bytes.concat());
        assert_eq!(c.registered.len(), fit);
        assert_eq!(c.hits.get(Limit::RegisteredBytes), 3);
    }

    /// Buffer 1 of a session whose sequences count from 10.
    struct OneRing {
        ring: Arc<Buffer>,
        next: u32,
    }

    impl Routes for OneRing {
        fn ring(&mut self, id: u32) -> Option<(&Arc<Buffer>, &mut u32)> {
            (id == 1).then_some((&self.ring, &mut self.next))
        }
        fn account(&mut self, _: u32, _: u32, _: &ProducerStats, _: &ProducerStats) {}
    }

    fn instance(buffer: u32) -> Instance {
        Instance {
            session: 1,
            wanted: 0,
            name: "ds".into(),
            buffer,
            no_flush: false,
            will_notify_on_start: false,
            will_notify_on_stop: false,
            config: Vec::new(),
            started: false,
            started_ack: false,
            stopping: false,
        }
    }

    /// A writer the app destroyed gives its id back, and the app's next
    /// writer may get it: its chunks count from 0 again. That is a sequence
    /// of its own (the old one ended when its writer was unregistered), not
    /// a gap or a reordering in the old one.
    #[test]
    fn a_writer_id_given_again_starts_a_sequence_of_its_own() {
        use crate::ringbuf::{BufferParams, FillPolicy, FlushItem};
        let (ours, mut peer) = UnixStream::pair().expect("pair");
        let mut c = Connection::new(1, ours).expect("connection");
        let mut routes = OneRing {
            ring: Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("ring"),
            next: 10,
        };
        let init = InitializeConnectionRequest {
            producer_name: Some("app".into()),
            ..Default::default()
        };
        peer.write_all(
            &[
                bind(1, SERVICE_NAME),
                invoke(2, 1, init.encode_to_vec(), false),
            ]
            .concat(),
        )
        .expect("write");
        c.read(&mut routes);
        assert!(c.setup_instance(1, instance(1), 1 << 20));
        let writer = |rid, method, msg: Vec<u8>| invoke(rid, method, msg, true);
        for (round, page) in [(1u8, 0u32), (2, 1)] {
            let register = pb::RegisterTraceWriterRequest {
                trace_writer_id: Some(5),
                target_buffer: Some(1),
            };
            // Chunk 0 of writer 5: one packet, a timestamp.
            let mut chunk = Vec::new();
            chunk.extend(0u32.to_le_bytes()); // chunk 0
            chunk.extend(5u16.to_le_bytes()); // of writer 5
            chunk.extend(1u16.to_le_bytes()); // one fragment:
            chunk.extend([0x82, 0x80, 0x80, 0x00, 8 << 3, round]); // 2 bytes
            chunk.resize(64, 0);
            c.smb
                .as_ref()
                .expect("smb")
                .put_complete_chunk(page as usize, &chunk);
            let commit = pb::CommitDataRequest {
                chunks_to_move: vec![pb::commit_data_request::ChunksToMove {
                    page: Some(page),
                    chunk: Some(0),
                    target_buffer: Some(1),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let unregister = pb::UnregisterTraceWriterRequest {
                trace_writer_id: Some(5),
            };
            let rid = 10 * u64::from(round);
            peer.write_all(
                &[
                    writer(rid, 6, register.encode_to_vec()),
                    writer(rid + 1, 4, commit.encode_to_vec()),
                    writer(rid + 2, 7, unregister.encode_to_vec()),
                ]
                .concat(),
            )
            .expect("write");
            c.read(&mut routes);
        }
        let batch = routes.ring.take_flush();
        let mut packets = Vec::new();
        for item in batch.items() {
            if let FlushItem::Data(bytes) = item {
                for f in crate::wire::framing::frames(bytes) {
                    packets.push(crate::protos::TracePacket::decode(f.packet).expect("packet"));
                }
            }
        }
        let seen: Vec<_> = packets
            .iter()
            .map(|p| {
                (
                    p.timestamp,
                    p.optional_trusted_packet_sequence_id,
                    p.previous_packet_dropped,
                )
            })
            .collect();
        use crate::protos::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId as Seq;
        assert_eq!(
            seen,
            vec![
                (Some(1), Some(Seq(10)), None),
                (Some(2), Some(Seq(11)), None)
            ]
        );
        assert_eq!(c.stats.chunks_committed_out_of_order, 0);
        assert!(c.sequences.is_empty(), "both ended with their writers");
    }

    #[test]
    fn shared_memory_fits_the_uids_room_or_is_not_given() {
        let (ours, _peer) = UnixStream::pair().expect("pair");
        let mut c = Connection::new(1, ours).expect("connection");
        c.hints = (4096, 4 * 1024 * 1024);
        assert!(!c.setup_instance(1, instance(1), MIN_SHARED_MEMORY - 1));
        assert_eq!(c.hits.get(Limit::SharedMemory), 1);
        assert_eq!((c.shared_memory(), c.instances.len()), (0, 0));
        assert!(c.setup_instance(2, instance(1), 1024 * 1024 + 100));
        assert_eq!(c.shared_memory(), 1024 * 1024, "cut to the room, in pages");
        assert_eq!(c.instances.len(), 1);
    }
}
