//! One consumer connection, on a thread of its own: frames in, the
//! ConsumerPort's methods dispatched, replies out. The EnableTracing reply
//! is held until the session ends and is then written by the session's
//! thread, so writes share one lock.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;

use super::readback::Readback;
use super::registry::{ConnectionSlot, Registry, SessionEntry, SessionState};
use super::session::{self, Running};
use super::wire::{self, Method};
use crate::control::message::{Reply, Request};
use crate::ipc::frame::FrameDecoder;
use crate::protos::ipc_frame::{InvokeMethod, Msg};
use crate::protos::{self, IpcFrame};

/// How long a client has to take a reply before it is dropped (as
/// Perfetto's consumer socket).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the session's loop has to answer a request.
const LOOP_DEADLINE: Duration = Duration::from_secs(5);
/// How long a write pass for a ReadBuffers of a running session may take
/// (it writes whole buffers).
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);
/// How long a clone (its flush, then the copy) may take.
const CLONE_DEADLINE: Duration = Duration::from_secs(40);
/// Flushes one connection may wait for at once.
const MAX_FLUSHES_IN_FLIGHT: usize = 4;
/// How long a closed connection's session has to finish before its quota
/// is given back anyway (the loop still ends on its own).
const END_GRACE: Duration = Duration::from_secs(30);

/// The client's socket for writing, shared with the session's thread.
#[derive(Clone)]
struct Writer(Arc<Mutex<UnixStream>>);

impl Writer {
    /// Writes one frame; a client that does not take it loses the
    /// connection.
    fn send(&self, f: &IpcFrame) {
        let bytes = match wire::encode(f) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("consumer reply not sent: {e}");
                return;
            }
        };
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = s.write_all(&bytes) {
            log::info!("consumer connection: {e}; closing it");
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A connection's state.
pub struct Connection {
    stream: UnixStream,
    writer: Writer,
    uid: u32,
    pid: u32,
    registry: Arc<Registry>,
    session: Option<Owned>,
    /// An ObserveEvents stream waiting for this connection's session: its
    /// request id and the events it asked for.
    observer: Option<(u64, i32)>,
    /// The last descriptor the client passed.
    passed_fd: Option<OwnedFd>,
    /// Flushes waiting for the session's answer.
    flushes: Arc<AtomicUsize>,
    _slot: ConnectionSlot,
}

impl Connection {
    pub fn new(
        stream: UnixStream,
        uid: u32,
        pid: u32,
        registry: Arc<Registry>,
        slot: ConnectionSlot,
    ) -> std::io::Result<Self> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(SEND_TIMEOUT))?;
        let writer = Writer(Arc::new(Mutex::new(stream.try_clone()?)));
        Ok(Self {
            stream,
            writer,
            uid,
            pid,
            registry,
            session: None,
            observer: None,
            passed_fd: None,
            flushes: Arc::new(AtomicUsize::new(0)),
            _slot: slot,
        })
    }

    /// Serves the connection until the client closes it or breaks the
    /// framing; then ends its session.
    pub fn serve(mut self) {
        let mut dec = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let room = dec.room().min(buf.len());
            let n = match self.receive(&mut buf[..room]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            dec.feed(&buf[..n]);
            loop {
                match dec.next_frame() {
                    Ok(Some(f)) => self.frame(f),
                    Ok(None) => break,
                    Err(e) => {
                        log::info!("consumer uid {}: {e}; closing the connection", self.uid);
                        self.end();
                        return;
                    }
                }
            }
        }
        self.end();
    }

    /// Reads bytes and keeps the one descriptor a client may pass along
    /// (the output file of a `write_into_file` session), as Perfetto's
    /// service does: the newest one, whichever frame it rode on. More than
    /// one in a message breaks the connection.
    fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            &self.stream,
            &mut [std::io::IoSliceMut::new(buf)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                for fd in fds {
                    self.passed_fd = Some(fd);
                }
            }
        }
        if r.flags.contains(ReturnFlags::CTRUNC) {
            return Err(std::io::Error::other("more descriptors than one"));
        }
        Ok(r.bytes)
    }

    /// The client went: its session stops and its data is dropped (as
    /// FreeBuffers).
    fn end(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.free();
    }

    fn free(&mut self) {
        let Some(s) = self.session.take() else {
            return;
        };
        if !s.done.ended() {
            let _ = s
                .control
                .ask(Request::Stop {}, self.uid, self.pid, LOOP_DEADLINE);
            if !s.done.wait(END_GRACE) {
                log::warn!("session {} did not end within {END_GRACE:?}", s.id);
            }
        }
        self.registry.release(s.id);
    }

    fn frame(&mut self, f: IpcFrame) {
        let id = f.request_id.unwrap_or(0);
        match f.msg {
            Some(Msg::MsgBindService(b)) => self.writer.send(&wire::bind_reply(
                id,
                b.service_name.as_deref().unwrap_or(""),
            )),
            Some(Msg::MsgInvokeMethod(m)) => self.invoke(id, m),
            // Ignored on unix sockets, as Perfetto's service does.
            Some(Msg::SetPeerIdentity(_)) => {}
            _ => self.writer.send(&IpcFrame {
                request_id: Some(id),
                msg: Some(Msg::MsgRequestError(protos::ipc_frame::RequestError {
                    error: Some("unknown request".into()),
                })),
                data_for_testing: Vec::new(),
            }),
        }
    }

    fn invoke(&mut self, id: u64, m: InvokeMethod) {
        let method = (m.service_id == Some(wire::SERVICE_ID))
            .then(|| Method::from_id(m.method_id.unwrap_or(0)))
            .flatten();
        let Some(method) = method else {
            self.writer.send(&wire::failure(id));
            return;
        };
        let args = m.args_proto.unwrap_or_default();
        let drop_reply = m.drop_reply.unwrap_or(false);
        match method {
            Method::EnableTracing => self.enable(id, &args),
            Method::DisableTracing => self.disable(id, drop_reply),
            Method::ReadBuffers => self.read_buffers(id),
            Method::FreeBuffers => {
                self.free();
                self.ok(id, &protos::FreeBuffersResponse {}, drop_reply);
            }
            Method::Flush => self.flush(id, drop_reply),
            Method::StartTracing => self.start_tracing(id, drop_reply),
            Method::GetTraceStats => self.trace_stats(id),
            Method::ObserveEvents => self.observe(id, &args),
            Method::QueryServiceState => self.query_state(id, &args),
            Method::QueryCapabilities => self.writer.send(&wire::reply(
                id,
                &protos::QueryCapabilitiesResponse {
                    capabilities: Some(protos::TracingServiceCapabilities {
                        has_query_capabilities: Some(true),
                        observable_events: vec![
                            wire::EVENT_ALL_DATA_SOURCES_STARTED,
                            wire::EVENT_CLONE_TRIGGER_HIT,
                        ],
                    }),
                },
                false,
            )),
            Method::SaveTraceForBugreport => self.writer.send(&wire::reply(
                id,
                &protos::SaveTraceForBugreportResponse {
                    success: Some(false),
                    msg: Some("recorder serve does not save traces for bug reports".into()),
                },
                false,
            )),
            Method::CloneSession => self.clone_session(id, &args),
            Method::Detach => self.detach(id, &args),
            Method::Attach => self.attach(id, &args),
            // No error field to carry a reason: the client reports the
            // failure itself.
            Method::ChangeTraceConfig => {
                log::info!("consumer uid {}: {method:?} is not supported", self.uid);
                self.writer.send(&wire::failure(id));
            }
        }
    }

    fn ok(&self, id: u64, reply: &impl Message, drop_reply: bool) {
        if !drop_reply {
            self.writer.send(&wire::reply(id, reply, false));
        }
    }

    fn enable_error(&self, id: u64, error: String) {
        log::info!("consumer uid {}: EnableTracing refused: {error}", self.uid);
        self.writer.send(&wire::reply(
            id,
            &protos::EnableTracingResponse {
                state: Some(protos::enable_tracing_response::State::Disabled(true)),
                error: Some(error),
            },
            false,
        ));
    }

    fn enable(&mut self, id: u64, args: &[u8]) {
        let req = match protos::EnableTracingRequest::decode(args) {
            Ok(r) => r,
            Err(_) => {
                self.writer.send(&wire::failure(id));
                return;
            }
        };
        if req.attach_notification_only() {
            // After Attach: the session's end is told to this request.
            return match &self.session {
                Some(s) => s.notice.tell(self.writer.clone(), id),
                None => self.enable_error(id, "no session is attached".into()),
            };
        }
        if self.session.is_some() {
            return self.enable_error(id, "this consumer already has a tracing session".into());
        }
        let origin = format!("trace config from uid {}", self.uid);
        let spec = match crate::config::load_binary(req.trace_config(), &origin)
            .and_then(|l| l.validate())
        {
            Ok(s) => s,
            Err(e) => return self.enable_error(id, e.to_string()),
        };
        if !spec.activate_triggers.is_empty() {
            return self.enable_error(
                id,
                "activate_triggers is sent to the producer socket, not as a session".into(),
            );
        }
        let notice = Arc::new(EndNotice::default());
        notice.tell(self.writer.clone(), id);
        let n = notice.clone();
        let on_end = Box::new(move |error: &str| n.ended(error));
        // write_into_file streams into the client's own file: the service
        // opens no path on a client's behalf.
        let output = match (&spec.file, self.passed_fd.take()) {
            (None, _) => None,
            (Some(f), _) if f.output_path.is_some() => {
                return self.enable_error(
                    id,
                    "output_path: recorder serve does not create files for clients; give the file with perfetto -o".into(),
                );
            }
            (Some(_), Some(fd)) => Some(fd),
            (Some(_), None) => {
                return self.enable_error(
                    id,
                    "write_into_file needs the output file's descriptor from the client".into(),
                );
            }
        };
        // CLONE_SNAPSHOT: each snapshot is told on the ObserveEvents stream,
        // and the client clones the session.
        let on_clone_hit = self
            .observer
            .filter(|(_, mask)| mask & wire::EVENT_CLONE_TRIGGER_HIT != 0)
            .map(|(oid, _)| {
                let writer = self.writer.clone();
                Box::new(move |sid: u64, trigger: &str| {
                    writer.send(&wire::reply(
                        oid,
                        &protos::ObserveEventsResponse {
                            events: Some(protos::ObservableEvents {
                                clone_trigger_hit: Some(
                                    protos::observable_events::CloneTriggerHit {
                                        tracing_session_id: Some(sid as i64),
                                        trigger_name: Some(trigger.to_string()),
                                    },
                                ),
                                ..Default::default()
                            }),
                        },
                        true,
                    ));
                }) as session::CloneHit
            });
        let told = session::Told {
            end: on_end,
            clone_hit: on_clone_hit,
        };
        match session::start(&spec, self.uid, &self.registry, output, told) {
            Ok(r) => {
                log::info!(
                    "session {} for uid {} (pid {}) started",
                    r.id,
                    self.uid,
                    self.pid
                );
                if let Some((oid, _)) = self
                    .observer
                    .take()
                    .filter(|(_, m)| m & wire::EVENT_ALL_DATA_SOURCES_STARTED != 0)
                {
                    spawn_started_watch(
                        oid,
                        r.control.clone(),
                        r.done.clone(),
                        self.writer.clone(),
                        self.uid,
                    );
                }
                self.session = Some(Owned {
                    running: r,
                    readback: None,
                    notice,
                    config: req.trace_config.unwrap_or_default(),
                });
            }
            Err(e) => self.enable_error(id, e.to_string()),
        }
    }

    /// Detach: the session goes on without this connection, kept under
    /// the caller's uid and `key` until a consumer of that uid attaches.
    fn detach(&mut self, id: u64, args: &[u8]) {
        let Ok(req) = protos::DetachRequest::decode(args) else {
            self.writer.send(&wire::failure(id));
            return;
        };
        let Some(s) = self.session.take() else {
            log::info!("consumer uid {}: Detach without a session", self.uid);
            self.writer.send(&wire::failure(id));
            return;
        };
        s.notice.forget();
        let key = req.key.unwrap_or_default();
        match self.registry.detach(self.uid, key.clone(), s) {
            Ok(()) => {
                log::info!("consumer uid {}: session detached as {key:?}", self.uid);
                self.writer
                    .send(&wire::reply(id, &protos::DetachResponse {}, false));
            }
            Err(s) => {
                log::info!(
                    "consumer uid {}: Detach refused: a session is already detached as {key:?}",
                    self.uid
                );
                self.session = Some(*s);
                self.writer.send(&wire::failure(id));
            }
        }
    }

    /// Attach: takes back the caller's uid's session detached as `key`
    /// (another uid's keys are not even looked at) and returns its config.
    fn attach(&mut self, id: u64, args: &[u8]) {
        let Ok(req) = protos::AttachRequest::decode(args) else {
            self.writer.send(&wire::failure(id));
            return;
        };
        if self.session.is_some() {
            self.writer.send(&wire::failure(id));
            return;
        }
        let key = req.key.unwrap_or_default();
        let Some(s) = self.registry.attach(self.uid, &key) else {
            log::info!("consumer uid {}: no session detached as {key:?}", self.uid);
            self.writer.send(&wire::failure(id));
            return;
        };
        let reply = protos::AttachResponse {
            trace_config: Some(s.config.clone()),
        };
        self.session = Some(s);
        self.writer.send(&wire::reply(id, &reply, false));
    }

    /// CloneSession: a copy of a running session's buffers (after a
    /// flush) becomes this connection's read-only session; the original
    /// records on. The copy counts against the caller's quota.
    fn clone_session(&mut self, id: u64, args: &[u8]) {
        let refuse = |error: String| {
            log::info!("consumer uid {}: CloneSession refused: {error}", self.uid);
            self.writer.send(&wire::reply(
                id,
                &protos::CloneSessionResponse {
                    success: Some(false),
                    error: Some(error),
                    ..Default::default()
                },
                false,
            ));
        };
        let Ok(req) = protos::CloneSessionRequest::decode(args) else {
            self.writer.send(&wire::failure(id));
            return;
        };
        if req.for_bugreport() {
            return refuse("recorder serve does not save traces for bug reports".into());
        }
        if self.session.is_some() {
            return refuse("this consumer already has a tracing session".into());
        }
        let source = self.registry.clone_source(
            self.uid,
            req.session_id,
            req.unique_session_name.as_deref(),
        );
        let Some((src, control)) = source.and_then(|s| s.control.clone().map(|c| (s, c))) else {
            return refuse(format!(
                "no running tracing session {} of uid {}",
                req.unique_session_name
                    .clone()
                    .unwrap_or_else(|| req.session_id().to_string()),
                self.uid
            ));
        };
        let entry = SessionEntry {
            id: 0,
            uid: self.uid,
            unique_name: None,
            buffer_kb: src.buffer_kb.clone(),
            buffer_bytes: src.buffer_bytes,
            duration_ms: 0,
            data_sources: src.data_sources,
            start_realtime_ns: crate::clock::realtime_ms() as i64 * 1_000_000,
            state: SessionState::ClonedReadOnly,
            control: None,
            producers: false,
        };
        let cid = match self.registry.reserve(entry) {
            Ok((cid, _)) => cid,
            Err(e) => return refuse(e.to_string()),
        };
        let copied = copy_of(&control, self.uid, self.pid, cid)
            .and_then(|file| Running::read_only(cid, file).map_err(CopyError::from));
        let running = match copied {
            Ok(r) => r,
            Err(e) => {
                self.registry.release(cid);
                return refuse(e.to_string());
            }
        };
        log::info!(
            "session {} of uid {} cloned as session {cid} for uid {}",
            src.id,
            src.uid,
            self.uid
        );
        // Nothing ends later: a notification asked for is sent at once.
        let notice = Arc::new(EndNotice::default());
        notice.ended("");
        self.session = Some(Owned {
            running,
            readback: None,
            notice,
            config: Vec::new(),
        });
        self.writer.send(&wire::reply(
            id,
            &protos::CloneSessionResponse {
                success: Some(true),
                was_write_into_file: Some(false),
                ..Default::default()
            },
            false,
        ));
    }

    fn disable(&mut self, id: u64, drop_reply: bool) {
        if let Some(s) = &self.session
            && !s.done.ended()
        {
            let _ = s
                .control
                .ask(Request::Stop {}, self.uid, self.pid, LOOP_DEADLINE);
        }
        self.ok(id, &protos::DisableTracingResponse {}, drop_reply);
    }

    /// Flush: answered when the session's flush ended (every source,
    /// producers included, acknowledged it or its timeout passed), on a
    /// thread of its own so the connection goes on serving meanwhile.
    fn flush(&mut self, id: u64, drop_reply: bool) {
        let Some(s) = self.session.as_ref().filter(|s| !s.done.ended()) else {
            self.writer.send(&wire::failure(id));
            return;
        };
        // Each waiting flush is a thread: a client gets a few at a time.
        let in_flight = self.flushes.clone();
        if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_FLUSHES_IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::SeqCst);
            log::info!("consumer uid {}: too many flushes at once", self.uid);
            self.writer.send(&wire::failure(id));
            return;
        }
        let (control, writer, uid, pid) =
            (s.control.clone(), self.writer.clone(), self.uid, self.pid);
        let deadline = s.flush_timeout + LOOP_DEADLINE;
        let spawned = std::thread::Builder::new()
            .name("recorder-flush".into())
            .spawn(move || {
                match control.ask(Request::Flush {}, uid, pid, deadline) {
                    Some(Reply::Flushed { complete: true }) => {
                        if !drop_reply {
                            writer.send(&wire::reply(id, &protos::FlushResponse {}, false));
                        }
                    }
                    other => {
                        log::info!("Flush for uid {uid}: {other:?}");
                        writer.send(&wire::failure(id));
                    }
                }
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.flushes.fetch_sub(1, Ordering::SeqCst);
            log::warn!("flush thread: {e}");
            self.writer.send(&wire::failure(id));
        }
    }

    fn start_tracing(&mut self, id: u64, drop_reply: bool) {
        let Some(s) = &self.session else {
            self.writer.send(&wire::failure(id));
            return;
        };
        match s
            .control
            .ask(Request::Start {}, self.uid, self.pid, LOOP_DEADLINE)
        {
            Some(Reply::Started) => {
                self.registry.set_state(s.id, SessionState::Started);
                self.ok(id, &protos::StartTracingResponse {}, drop_reply);
            }
            other => {
                log::info!("StartTracing for uid {}: {other:?}", self.uid);
                self.writer.send(&wire::failure(id));
            }
        }
    }

    /// What the session's buffers hold, in order, consumed as read: a
    /// running session first writes them into its file (a write pass), so
    /// a later read goes on where this one ended. A `write_into_file`
    /// session's data is in the client's own file.
    fn read_buffers(&mut self, id: u64) {
        let Some(s) = &mut self.session else {
            self.writer.send(&wire::failure(id));
            return;
        };
        let Some(file) = &s.running.file else {
            self.writer.send(&wire::reply(
                id,
                &protos::ReadBuffersResponse::default(),
                false,
            ));
            return;
        };
        if !s.done.ended() {
            match s
                .running
                .control
                .ask(Request::Drain {}, self.uid, self.pid, DRAIN_DEADLINE)
            {
                Some(Reply::Drained) => {}
                // It ended meanwhile: its file is complete.
                _ if s.done.ended() => {}
                other => {
                    log::info!("ReadBuffers for uid {}: {other:?}", self.uid);
                    self.writer.send(&wire::failure(id));
                    return;
                }
            }
        }
        if s.readback.is_none() {
            match file.try_clone() {
                Ok(f) => s.readback = Some(Readback::new(f)),
                Err(e) => {
                    log::warn!("ReadBuffers: {e}");
                    self.writer.send(&wire::failure(id));
                    return;
                }
            }
        }
        let Some(rb) = s.readback.as_mut() else {
            return;
        };
        rb.resume();
        let mut pending: Option<protos::ReadBuffersResponse> = None;
        loop {
            let next = match rb.next_reply() {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("ReadBuffers: {e}");
                    None
                }
            };
            match (pending.take(), next) {
                (Some(p), Some(n)) => {
                    self.writer.send(&wire::reply(id, &p, true));
                    pending = Some(n);
                }
                (Some(p), None) => {
                    self.writer.send(&wire::reply(id, &p, false));
                    break;
                }
                (None, Some(n)) => pending = Some(n),
                (None, None) => {
                    self.writer.send(&wire::reply(
                        id,
                        &protos::ReadBuffersResponse::default(),
                        false,
                    ));
                    break;
                }
            }
        }
    }

    fn trace_stats(&mut self, id: u64) {
        let status = self.session.as_ref().and_then(|s| {
            match s
                .control
                .ask(Request::Query {}, self.uid, self.pid, LOOP_DEADLINE)
            {
                Some(Reply::Status(st)) => Some(st),
                _ => None,
            }
        });
        let Some(st) = status else {
            self.writer.send(&wire::failure(id));
            return;
        };
        let stats = protos::TraceStats {
            buffer_stats: st
                .buffers
                .iter()
                .map(|b| protos::trace_stats::BufferStats {
                    buffer_size: Some(b.size_bytes),
                    bytes_written: Some(b.bytes_written),
                    bytes_overwritten: Some(b.bytes_overwritten),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.writer.send(&wire::reply(
            id,
            &protos::GetTraceStatsResponse {
                trace_stats: Some(stats),
            },
            false,
        ));
    }

    /// ObserveEvents: "all data sources started" is sent once the session's
    /// loop reports it recording; an empty mask closes the stream.
    fn observe(&mut self, id: u64, args: &[u8]) {
        let Ok(req) = protos::ObserveEventsRequest::decode(args) else {
            self.writer.send(&wire::failure(id));
            return;
        };
        let mask = req.events_to_observe.iter().fold(0, |m, e| m | e);
        let known = wire::EVENT_ALL_DATA_SOURCES_STARTED | wire::EVENT_CLONE_TRIGGER_HIT;
        if mask & known == 0 {
            self.writer.send(&wire::reply(
                id,
                &protos::ObserveEventsResponse::default(),
                false,
            ));
            return;
        }
        let Some(s) = &self.session else {
            // perfetto observes before EnableTracing: the watch starts
            // with the session.
            self.observer = Some((id, mask));
            return;
        };
        if mask & wire::EVENT_ALL_DATA_SOURCES_STARTED == 0 {
            // Clone trigger hits are told only to the consumer that
            // observed before enabling.
            return;
        }
        spawn_started_watch(
            id,
            s.control.clone(),
            s.done.clone(),
            self.writer.clone(),
            self.uid,
        );
    }

    fn query_state(&mut self, id: u64, args: &[u8]) {
        let sessions_only = protos::QueryServiceStateRequest::decode(args)
            .map(|r| r.sessions_only())
            .unwrap_or(false);
        let sessions = self.registry.visible(self.uid);
        let mut state = protos::TracingServiceState {
            supports_tracing_sessions: Some(true),
            // Counted over what the caller may see: another uid's sessions
            // are not even counted.
            num_sessions: Some(sessions.len() as i32),
            num_sessions_started: Some(
                sessions
                    .iter()
                    .filter(|s| s.state == SessionState::Started)
                    .count() as i32,
            ),
            tracing_service_version: Some(format!(
                "recorder {} (serve)",
                env!("CARGO_PKG_VERSION")
            )),
            tracing_sessions: sessions
                .iter()
                .map(|s| protos::tracing_service_state::TracingSession {
                    id: Some(s.id),
                    consumer_uid: Some(s.uid as i32),
                    state: Some(s.state.as_str().into()),
                    unique_session_name: s.unique_name.clone(),
                    buffer_size_kb: s.buffer_kb.clone(),
                    duration_ms: Some(s.duration_ms),
                    num_data_sources: Some(s.data_sources),
                    start_realtime_ns: Some(s.start_realtime_ns),
                })
                .collect(),
            ..Default::default()
        };
        if !sessions_only {
            state.producers = vec![protos::tracing_service_state::Producer {
                id: Some(1),
                name: Some(crate::sources::PRODUCER_NAME.into()),
                uid: Some(self.registry.service_uid as i32),
                pid: Some(self.registry.service_pid as i32),
                sdk_version: Some(format!("recorder {}", env!("CARGO_PKG_VERSION"))),
            }];
            // linux.ftrace is built in only where the broker prepares
            // tracefs (a root service without --no-builtin-ftrace).
            let ftrace = self.registry.ftrace().is_some().then_some("linux.ftrace");
            state.data_sources = (BUILTIN_SOURCES.iter().copied())
                .chain(ftrace)
                .map(|name| protos::tracing_service_state::DataSource {
                    ds_descriptor: Some(protos::ProducerDataSourceDescriptor {
                        name: Some(name.into()),
                        ..Default::default()
                    }),
                    producer_id: Some(1),
                })
                .collect();
            // Every connected producer, with what it registered (as
            // traced, every caller sees every producer).
            for (i, p) in self.registry.producers().into_iter().enumerate() {
                let pid = i as i32 + 2;
                state
                    .producers
                    .push(protos::tracing_service_state::Producer {
                        id: Some(pid),
                        name: Some(p.name),
                        uid: Some(p.uid as i32),
                        pid: Some(p.pid as i32),
                        sdk_version: None,
                    });
                state
                    .data_sources
                    .extend(p.data_sources.into_iter().map(|name| {
                        protos::tracing_service_state::DataSource {
                            ds_descriptor: Some(protos::ProducerDataSourceDescriptor {
                                name: Some(name),
                                ..Default::default()
                            }),
                            producer_id: Some(pid),
                        }
                    }));
            }
        }
        self.writer.send(&wire::reply(
            id,
            &protos::QueryServiceStateResponse {
                service_state: Some(state),
            },
            false,
        ));
    }
}

/// A session and what its consumer holds of it: it moves from connection
/// to connection with Detach and Attach.
pub struct Owned {
    running: Running,
    /// Where the last ReadBuffers ended.
    readback: Option<Readback>,
    notice: Arc<EndNotice>,
    /// The TraceConfig as the consumer sent it (Attach returns it).
    config: Vec<u8>,
}

impl std::ops::Deref for Owned {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.running
    }
}

impl Owned {
    /// A clone-like session (ended, its data in `file`), for tests of what
    /// holds sessions.
    #[cfg(test)]
    pub fn ended_for_test(id: u64, file: Option<std::fs::File>) -> Owned {
        let mut running = Running::read_only(id, tempfile::tempfile().expect("tempfile"))
            .expect("a read-only session");
        running.file = file;
        Owned {
            running,
            readback: None,
            notice: Arc::new(EndNotice::default()),
            config: b"config".to_vec(),
        }
    }

    /// Whether the session ended with its data elsewhere (the client's
    /// own file): nothing is left to read.
    pub fn spent(&self) -> bool {
        self.running.done.ended() && self.running.file.is_none()
    }

    pub fn id(&self) -> u64 {
        self.running.id
    }
}

/// Who is told of the session's end (the held EnableTracing reply): the
/// consumer that enabled it, nobody while it is detached, the consumer that
/// attached and asked.
#[derive(Default)]
struct EndNotice {
    inner: Mutex<NoticeState>,
}

#[derive(Default)]
struct NoticeState {
    to: Option<(Writer, u64)>,
    /// The end's error (empty on success), once it ended.
    ended: Option<String>,
}

impl EndNotice {
    fn lock(&self) -> std::sync::MutexGuard<'_, NoticeState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells the end to request `id` on `writer`: now if it came.
    fn tell(&self, writer: Writer, id: u64) {
        let mut g = self.lock();
        match &g.ended {
            Some(e) => send_end(&writer, id, e),
            None => g.to = Some((writer, id)),
        }
    }

    fn forget(&self) {
        self.lock().to = None;
    }

    fn ended(&self, error: &str) {
        let mut g = self.lock();
        g.ended = Some(error.to_string());
        if let Some((w, id)) = g.to.take() {
            send_end(&w, id, error);
        }
    }
}

fn send_end(writer: &Writer, id: u64, error: &str) {
    writer.send(&wire::reply(
        id,
        &protos::EnableTracingResponse {
            state: Some(protos::enable_tracing_response::State::Disabled(true)),
            error: (!error.is_empty()).then(|| error.to_string()),
        },
        false,
    ));
}

/// The data sources a served session records itself.
pub const BUILTIN_SOURCES: [&str; 4] = [
    "for_testing",
    "linux.process_stats",
    "linux.sys_stats",
    "linux.system_info",
];

/// Why a clone of a session's buffers was not made.
#[derive(Debug, thiserror::Error)]
enum CopyError {
    #[error("in-memory trace file: {0}")]
    Memfd(#[source] std::io::Error),
    /// The session's reason, as it sent it.
    #[error("{0}")]
    Refused(String),
    #[error("the session did not clone in time ({0})")]
    NoCopy(String),
    #[error(transparent)]
    ReadOnly(#[from] session::StartError),
}

/// Has the session behind `control` write a copy of its buffers into a
/// new in-memory file, returned for reading.
fn copy_of(
    control: &crate::control::server::InProcessControl,
    uid: u32,
    pid: u32,
    clone_id: u64,
) -> Result<std::fs::File, CopyError> {
    let memfd = rustix::fs::memfd_create(
        format!("recorder-clone-{clone_id}"),
        rustix::fs::MemfdFlags::CLOEXEC,
    )
    .map_err(|e| CopyError::Memfd(e.into()))?;
    let file = std::fs::File::from(memfd.try_clone().map_err(CopyError::Memfd)?);
    match control.ask_with(Request::Clone {}, Some(memfd), uid, pid, CLONE_DEADLINE) {
        Some(Reply::Cloned { .. }) => Ok(file),
        Some(Reply::Refused(why)) => Err(CopyError::Refused(why)),
        other => Err(CopyError::NoCopy(format!("{other:?}"))),
    }
}

/// Sends "all data sources started" once the session records (or drops
/// the watch when it ends first).
fn spawn_started_watch(
    id: u64,
    control: crate::control::server::InProcessControl,
    done: Arc<session::Done>,
    writer: Writer,
    uid: u32,
) {
    let _ = std::thread::Builder::new()
        .name("recorder-observe".into())
        .spawn(move || {
            while !done.ended() {
                if let Some(Reply::Status(st)) =
                    control.ask(Request::Query {}, uid, 0, LOOP_DEADLINE)
                    && st.state.starts_with("recording")
                {
                    writer.send(&wire::reply(
                        id,
                        &protos::ObserveEventsResponse {
                            events: Some(protos::ObservableEvents {
                                all_data_sources_started: Some(true),
                                ..Default::default()
                            }),
                        },
                        true,
                    ));
                    return;
                }
                done.wait(Duration::from_millis(20));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::frame::{FrameDecoder, encode_frame};
    use crate::protos::ipc_frame::{BindService, InvokeMethodReply};
    use std::io::Read;

    struct Client {
        stream: UnixStream,
        dec: FrameDecoder,
        next: u64,
    }

    impl Client {
        fn send(&mut self, msg: Msg) -> u64 {
            self.next += 1;
            let f = IpcFrame {
                request_id: Some(self.next),
                msg: Some(msg),
                data_for_testing: Vec::new(),
            };
            self.stream
                .write_all(&encode_frame(&f).expect("encode"))
                .expect("send");
            self.next
        }

        fn invoke(&mut self, method: u32, args: Vec<u8>) -> (u64, InvokeMethodReply) {
            let id = self.send(Msg::MsgInvokeMethod(InvokeMethod {
                service_id: Some(wire::SERVICE_ID),
                method_id: Some(method),
                args_proto: Some(args),
                drop_reply: None,
            }));
            match self.recv() {
                (rid, Some(Msg::MsgInvokeMethodReply(r))) => {
                    assert_eq!(rid, id);
                    (rid, r)
                }
                other => panic!("not a method reply: {other:?}"),
            }
        }

        fn recv(&mut self) -> (u64, Option<Msg>) {
            let mut buf = [0u8; 4096];
            loop {
                if let Some(f) = self.dec.next_frame().expect("frame") {
                    return (f.request_id.unwrap_or(0), f.msg);
                }
                let n = self.stream.read(&mut buf).expect("read");
                assert!(n > 0, "closed");
                self.dec.feed(&buf[..n]);
            }
        }
    }

    fn connect() -> Client {
        let (a, b) = UnixStream::pair().expect("pair");
        let registry = Registry::new(None);
        let slot = registry.admit(1234).expect("slot");
        let conn = Connection::new(b, 1234, 1, registry, slot).expect("connection");
        std::thread::spawn(move || conn.serve());
        a.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Client {
            stream: a,
            dec: FrameDecoder::new(),
            next: 0,
        }
    }

    #[test]
    fn methods_answer_and_bad_calls_fail_without_closing_the_connection() {
        let mut c = connect();
        c.send(Msg::MsgBindService(BindService {
            service_name: Some("ConsumerPort".into()),
        }));
        assert!(matches!(c.recv().1, Some(Msg::MsgBindServiceReply(_))));
        // Unknown method and unknown service: a failure reply.
        let (_, r) = c.invoke(99, Vec::new());
        assert_eq!(r.success, None);
        let id = c.send(Msg::MsgInvokeMethod(InvokeMethod {
            service_id: Some(7),
            method_id: Some(1),
            args_proto: None,
            drop_reply: None,
        }));
        let (rid, m) = c.recv();
        assert_eq!(rid, id);
        assert!(matches!(m, Some(Msg::MsgInvokeMethodReply(r)) if r.success.is_none()));
        // A config that is not a TraceConfig: EnableTracing says why.
        let (_, r) = c.invoke(
            Method::EnableTracing as u32,
            protos::EnableTracingRequest {
                trace_config: Some(vec![0xff, 0xff, 0xff]),
                attach_notification_only: None,
            }
            .encode_to_vec(),
        );
        let resp =
            protos::EnableTracingResponse::decode(r.reply_proto.unwrap_or_default().as_slice())
                .expect("EnableTracingResponse");
        assert!(resp.error.is_some_and(|e| !e.is_empty()));
        // Reading with no session fails; capabilities and state answer.
        let (_, r) = c.invoke(Method::ReadBuffers as u32, Vec::new());
        assert_eq!(r.success, None);
        let (_, r) = c.invoke(Method::QueryCapabilities as u32, Vec::new());
        let caps =
            protos::QueryCapabilitiesResponse::decode(r.reply_proto.unwrap_or_default().as_slice())
                .expect("capabilities");
        assert_eq!(
            caps.capabilities.map(|c| c.observable_events),
            Some(vec![
                wire::EVENT_ALL_DATA_SOURCES_STARTED,
                wire::EVENT_CLONE_TRIGGER_HIT
            ])
        );
        let (_, r) = c.invoke(Method::QueryServiceState as u32, Vec::new());
        let st =
            protos::QueryServiceStateResponse::decode(r.reply_proto.unwrap_or_default().as_slice())
                .expect("state")
                .service_state
                .expect("service_state");
        assert_eq!(st.data_sources.len(), BUILTIN_SOURCES.len());
        assert!(st.tracing_sessions.is_empty());
        // A frame with no request: the client is told.
        c.send(Msg::SetPeerIdentity(Default::default()));
        let id = {
            c.next += 1;
            let f = IpcFrame {
                request_id: Some(c.next),
                msg: None,
                data_for_testing: Vec::new(),
            };
            c.stream
                .write_all(&encode_frame(&f).expect("encode"))
                .expect("send");
            c.next
        };
        let (rid, m) = c.recv();
        assert_eq!(rid, id);
        assert!(matches!(m, Some(Msg::MsgRequestError(_))));
    }

    #[test]
    fn session_methods_without_a_session_fail_and_keys_are_not_found() {
        let mut c = connect();
        c.send(Msg::MsgBindService(BindService {
            service_name: Some("ConsumerPort".into()),
        }));
        assert!(matches!(c.recv().1, Some(Msg::MsgBindServiceReply(_))));
        for (m, args) in [
            (
                Method::Flush,
                protos::FlushRequest::default().encode_to_vec(),
            ),
            (
                Method::Detach,
                protos::DetachRequest {
                    key: Some("k".into()),
                }
                .encode_to_vec(),
            ),
            (
                Method::Attach,
                protos::AttachRequest {
                    key: Some("k".into()),
                }
                .encode_to_vec(),
            ),
        ] {
            let (_, r) = c.invoke(m as u32, args);
            assert_eq!(r.success, None, "{m:?}");
        }
        // A clone of a session that is not there says so.
        let (_, r) = c.invoke(
            Method::CloneSession as u32,
            protos::CloneSessionRequest {
                session_id: Some(42),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let resp =
            protos::CloneSessionResponse::decode(r.reply_proto.unwrap_or_default().as_slice())
                .expect("CloneSessionResponse");
        assert_eq!(resp.success, Some(false));
        assert!(resp.error.is_some_and(|e| e.contains("42")));
        // Bug reports: the precise refusal.
        let (_, r) = c.invoke(
            Method::CloneSession as u32,
            protos::CloneSessionRequest {
                for_bugreport: Some(true),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let resp =
            protos::CloneSessionResponse::decode(r.reply_proto.unwrap_or_default().as_slice())
                .expect("CloneSessionResponse");
        assert!(resp.error.is_some_and(|e| e.contains("bug reports")));
    }

    #[test]
    fn an_oversized_frame_closes_the_connection() {
        let mut c = connect();
        c.stream
            .write_all(&(crate::ipc::frame::MAX_FRAME_BYTES as u32).to_le_bytes())
            .expect("send");
        let mut buf = [0u8; 8];
        assert_eq!(c.stream.read(&mut buf).expect("read"), 0);
    }
}
