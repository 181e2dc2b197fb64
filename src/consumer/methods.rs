//! The ConsumerPort's methods, as the service answers them: a request is
//! checked, turned into a [`Command`] for the connection's session (with a
//! ticket naming who waits) or answered from what the service knows; the
//! session's answer comes back as a [`SessionEvent`](crate::event_loop::SessionEvent) and is written to the
//! client then. Nothing waits: a reply that depends on a session is sent
//! when the session says so.

use prost::Message;

use super::build::{self, Parts};
use super::readback::Readback;
use super::service::{ABORT_GRACE, Service, Waiter, shown};
use super::sessions::{ConnId, Entry, Holder, Hosted, SessionState};
use super::wire::{self, Method};
use crate::event_loop::{Command, Response};
use crate::protos::ipc_frame::{InvokeMethod, Msg};
use crate::protos::{self, IpcFrame};
use crate::session::Answer;

/// The data sources a served session records itself.
pub(super) const BUILTIN_SOURCES: [&str; 4] = [
    "for_testing",
    "linux.process_stats",
    "linux.sys_stats",
    "linux.system_info",
];

impl Hosted {
    /// How long it may take to stop before it is aborted.
    pub(crate) fn stop_budget(&self) -> std::time::Duration {
        self.entry.stop_budget + ABORT_GRACE
    }
}

impl Service {
    /// One frame from connection `id`.
    pub(super) fn frame(&mut self, id: ConnId, f: IpcFrame) {
        let req = f.request_id.unwrap_or(0);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match f.msg {
            Some(Msg::MsgBindService(b)) => c.send(&wire::bind_reply(
                req,
                b.service_name.as_deref().unwrap_or(""),
            )),
            Some(Msg::MsgInvokeMethod(m)) => self.invoke(id, req, m),
            // Ignored on unix sockets, as Perfetto's service does.
            Some(Msg::SetPeerIdentity(_)) => {}
            _ => c.send(&IpcFrame {
                request_id: Some(req),
                msg: Some(Msg::MsgRequestError(protos::ipc_frame::RequestError {
                    error: Some("unknown request".into()),
                })),
                data_for_testing: Vec::new(),
            }),
        }
    }

    fn conn(&mut self, id: ConnId) -> Option<&mut super::connection::Connection> {
        self.conns.get_mut(&id)
    }

    fn fail(&mut self, id: ConnId, req: u64) {
        if let Some(c) = self.conn(id) {
            c.fail(req);
        }
    }

    fn ok(&mut self, id: ConnId, req: u64, reply: &impl Message, drop_reply: bool) {
        if let Some(c) = self.conn(id)
            && !drop_reply
        {
            c.reply(req, reply, false);
        }
    }

    fn invoke(&mut self, id: ConnId, req: u64, m: InvokeMethod) {
        let method = (m.service_id == Some(wire::SERVICE_ID))
            .then(|| Method::from_id(m.method_id.unwrap_or(0)))
            .flatten();
        let Some(method) = method else {
            return self.fail(id, req);
        };
        let args = m.args_proto.unwrap_or_default();
        let drop_reply = m.drop_reply.unwrap_or(false);
        match method {
            Method::EnableTracing => self.enable(id, req, &args),
            Method::DisableTracing => self.disable(id, req, drop_reply),
            Method::ReadBuffers => self.read_buffers(id, req),
            Method::FreeBuffers => {
                if let Some(sid) = self.conn(id).and_then(|c| c.session.take()) {
                    self.let_go(sid, id);
                }
                self.ok(id, req, &protos::FreeBuffersResponse {}, drop_reply);
            }
            Method::Flush => self.flush(id, req, drop_reply),
            Method::StartTracing => self.start_tracing(id, req, drop_reply),
            Method::GetTraceStats => self.trace_stats(id, req),
            Method::ObserveEvents => self.observe(id, req, &args),
            Method::QueryServiceState => self.query_state(id, req, &args),
            Method::QueryCapabilities => self.ok(
                id,
                req,
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
            ),
            Method::SaveTraceForBugreport => self.ok(
                id,
                req,
                &protos::SaveTraceForBugreportResponse {
                    success: Some(false),
                    msg: Some("recorder serve does not save traces for bug reports".into()),
                },
                false,
            ),
            Method::CloneSession => self.clone_session(id, req, &args),
            Method::Detach => self.detach(id, req, &args),
            Method::Attach => self.attach(id, req, &args),
            // No error field to carry a reason: the client reports the
            // failure itself.
            Method::ChangeTraceConfig => {
                let uid = self.conn(id).map_or(0, |c| c.uid);
                self.say(uid, log::Level::Info, || {
                    format!("consumer uid {uid}: {method:?} is not supported")
                });
                self.fail(id, req);
            }
        }
    }

    fn enable_error(&mut self, id: ConnId, req: u64, error: String) {
        let uid = self.conn(id).map_or(0, |c| c.uid);
        self.say(uid, log::Level::Info, || {
            format!(
                "consumer uid {uid}: EnableTracing refused: {}",
                shown(&error)
            )
        });
        self.ok(
            id,
            req,
            &protos::EnableTracingResponse {
                state: Some(protos::enable_tracing_response::State::Disabled(true)),
                error: Some(error),
            },
            false,
        );
    }

    fn enable(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let Ok(request) = protos::EnableTracingRequest::decode(args) else {
            return self.fail(id, req);
        };
        let Some(c) = self.conn(id) else {
            return;
        };
        let (uid, pid, held) = (c.uid, c.pid, c.session);
        if request.attach_notification_only() {
            // After Attach: the session's end is told to this request.
            let Some(sid) = held else {
                return self.enable_error(id, req, "no session is attached".into());
            };
            let ended = self.sessions.get(sid).and_then(|h| h.ended.clone());
            match ended {
                Some(error) => self.tell_end(id, req, error.as_deref()),
                None => {
                    if let Some(h) = self.sessions.get_mut(sid) {
                        h.end_to = Some((id, req));
                    }
                }
            }
            return;
        }
        if held.is_some() {
            return self.enable_error(
                id,
                req,
                "this consumer already has a tracing session".into(),
            );
        }
        let origin = format!("trace config from uid {uid}");
        let spec = match crate::config::load_binary(request.trace_config(), &origin)
            .and_then(|l| l.validate())
        {
            Ok(s) => s,
            Err(e) => return self.enable_error(id, req, e.to_string()),
        };
        if !spec.activate_triggers.is_empty() {
            return self.enable_error(
                id,
                req,
                "activate_triggers is sent to the producer socket, not as a session".into(),
            );
        }
        // write_into_file streams into the client's own file: the service
        // opens no path on a client's behalf.
        let passed = self.conn(id).and_then(|c| c.passed_fd.take());
        let output = match (&spec.file, passed) {
            (None, _) => None,
            (Some(f), _) if f.output_path.is_some() => {
                return self.enable_error(
                    id,
                    req,
                    "output_path: recorder serve does not create files for clients; give the file with perfetto -o".into(),
                );
            }
            (Some(_), Some(fd)) => Some(fd),
            (Some(_), None) => {
                return self.enable_error(
                    id,
                    req,
                    "write_into_file needs the output file's descriptor from the client".into(),
                );
            }
        };
        let builtin_ftrace = self.ftrace.is_some();
        if build::needs_producers(&spec, builtin_ftrace) && self.producers.is_none() {
            return self.enable_error(id, req, "recorder serve has no producer socket".into());
        }
        let buffer_bytes: u64 = spec.buffers.iter().map(|b| b.size.0).sum();
        let stream = output
            .as_ref()
            .is_some_and(crate::storage::create::is_stream);
        let stream_backlog = buffer_bytes.min(build::MAX_STREAM_BACKLOG);
        let entry = Entry {
            uid,
            unique_name: spec.unique_session_name.clone(),
            buffer_kb: spec
                .buffers
                .iter()
                .map(|b| u32::try_from(b.size.0 / 1024).unwrap_or(u32::MAX))
                .collect(),
            // A stream output may hold its backlog besides the buffers.
            charged_bytes: buffer_bytes + if stream { stream_backlog } else { 0 },
            duration_ms: spec
                .duration
                .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
            data_sources: spec.data_sources.len() as u32,
            start_realtime_ns: crate::clock::realtime_ms() as i64 * 1_000_000,
            stop_budget: spec.flush_timeout + spec.data_source_stop_timeout,
        };
        let state = if build::waits_to_start(&spec) {
            SessionState::Configured
        } else {
            SessionState::Started
        };
        let sid = match self.sessions.reserve(entry, state, Holder::Conn(id)) {
            Ok(sid) => sid,
            Err(e) => return self.enable_error(id, req, e.to_string()),
        };
        let parts = Parts {
            id: sid,
            uid,
            output,
            stream_backlog,
            producers: self.producers.as_ref(),
            ftrace: self.ftrace.clone(),
            direct_io: self.direct_io,
            saver: self.saver.clone(),
        };
        let built = match build::build(&spec, parts) {
            Ok(b) => b,
            Err(e) => {
                self.sessions.remove(sid);
                return self.enable_error(id, req, crate::app::chain(&e));
            }
        };
        if let Some(h) = self.sessions.get_mut(sid) {
            h.runner = Some(built.runner);
            h.file = built.file;
            h.saved_at_death = built.saved_at_death;
            h.end_to = Some((id, req));
            h.config = request.trace_config.unwrap_or_default();
        }
        let observer = self.conn(id).and_then(|c| {
            c.session = Some(sid);
            c.observer
        });
        // ObserveEvents asked before EnableTracing waits for this session.
        if let Some((oid, mask)) = observer
            && mask & wire::EVENT_ALL_DATA_SOURCES_STARTED != 0
            && let Some(c) = self.conn(id)
        {
            c.start_watchers.push(oid);
        }
        log::info!("session {sid} for uid {uid} (pid {pid}) configured");
    }

    fn disable(&mut self, id: ConnId, req: u64, drop_reply: bool) {
        if let Some(sid) = self.conn(id).and_then(|c| c.session) {
            self.stop_session(sid);
        }
        self.ok(id, req, &protos::DisableTracingResponse {}, drop_reply);
    }

    /// A request to the connection's running session, answered later to
    /// `waiter`; refused when it holds none, or too many are in flight.
    fn ask(&mut self, id: ConnId, req: u64, command: Command, waiter: Waiter) {
        let Some(c) = self.conn(id) else {
            return;
        };
        let Some(sid) = c.session else {
            return self.fail(id, req);
        };
        if c.in_flight >= super::connection::MAX_IN_FLIGHT {
            let uid = c.uid;
            self.say(uid, log::Level::Info, || {
                format!("consumer uid {uid}: too many requests in flight")
            });
            return self.fail(id, req);
        }
        if self.sessions.get(sid).is_none_or(|h| h.runner.is_none()) {
            return self.fail(id, req);
        }
        if let Some(c) = self.conn(id) {
            c.in_flight += 1;
        }
        let ticket = self.ticket(sid, waiter);
        if let Some(r) = self.sessions.get_mut(sid).and_then(|h| h.runner.as_mut()) {
            r.command(command, ticket);
        }
    }

    /// Flush: answered when the session's flush ended (every source,
    /// producers included, acknowledged it or its timeout passed).
    fn flush(&mut self, id: ConnId, req: u64, drop_reply: bool) {
        let waiter = Waiter::Flush {
            conn: id,
            req,
            drop_reply,
        };
        self.ask(id, req, Command::Flush, waiter);
    }

    fn start_tracing(&mut self, id: ConnId, req: u64, drop_reply: bool) {
        let waiter = Waiter::Start {
            conn: id,
            req,
            drop_reply,
        };
        self.ask(id, req, Command::Start, waiter);
    }

    /// What the session's buffers hold, in order, consumed as read: a
    /// running session first writes them into its file (a write pass), so
    /// a later read goes on where this one ended. A `write_into_file`
    /// session's data is in the client's own file.
    fn read_buffers(&mut self, id: ConnId, req: u64) {
        let Some(sid) = self.conn(id).and_then(|c| c.session) else {
            return self.fail(id, req);
        };
        let Some((has_file, running, ended)) = self
            .sessions
            .get(sid)
            .map(|h| (h.file.is_some(), h.runner.is_some(), h.ended.is_some()))
        else {
            return self.fail(id, req);
        };
        if !running && !ended {
            // A clone whose copy is still being made.
            return self.fail(id, req);
        }
        if !has_file {
            return self.ok(id, req, &protos::ReadBuffersResponse::default(), false);
        }
        if self.conn(id).is_some_and(|c| c.reading.is_some()) {
            // One read at a time, as the client asks.
            return self.fail(id, req);
        }
        if running {
            return self.ask(id, req, Command::Drain, Waiter::Drain { conn: id, req });
        }
        self.begin_read(id, req);
    }

    /// Starts answering ReadBuffers `req` from the session's file.
    fn begin_read(&mut self, id: ConnId, req: u64) {
        let Some(sid) = self.conn(id).and_then(|c| c.session) else {
            return self.fail(id, req);
        };
        let Some(h) = self.sessions.get_mut(sid) else {
            return self.fail(id, req);
        };
        if h.readback.is_none() {
            match h.file.as_ref().map(std::fs::File::try_clone) {
                Some(Ok(f)) => h.readback = Some(Readback::new(f)),
                _ => return self.fail(id, req),
            }
        }
        if let Some(rb) = &mut h.readback {
            rb.resume();
        }
        if let Some(c) = self.conn(id) {
            c.reading = Some(req);
        }
        self.pump_readback(id);
    }

    /// Queues ReadBuffers replies while the client has room; the last one
    /// (`has_more` false) ends the read.
    pub(super) fn pump_readback(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let (Some(req), Some(sid)) = (c.reading, c.session) else {
            return;
        };
        let Some(rb) = self.sessions.get_mut(sid).and_then(|h| h.readback.as_mut()) else {
            c.reading = None;
            return c.fail(req);
        };
        while c.has_room() {
            let next = match rb.next_reply() {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("ReadBuffers: {e}");
                    None
                }
            };
            match next {
                Some(reply) => c.reply(req, &reply, true),
                None => {
                    // The end: an empty last reply, as the client expects.
                    c.reply(req, &protos::ReadBuffersResponse::default(), false);
                    c.reading = None;
                    return;
                }
            }
        }
    }

    fn trace_stats(&mut self, id: ConnId, req: u64) {
        let Some(sid) = self.conn(id).and_then(|c| c.session) else {
            return self.fail(id, req);
        };
        let Some(h) = self.sessions.get(sid) else {
            return self.fail(id, req);
        };
        let buffers: Vec<protos::trace_stats::BufferStats> = match &h.runner {
            Some(r) => r
                .buffer_stats()
                .into_iter()
                .map(|s| buffer_stats(&s))
                .collect(),
            None => h
                .final_buffers
                .iter()
                .map(|b| buffer_stats(&b.stats))
                .collect(),
        };
        let stats = protos::TraceStats {
            buffer_stats: buffers,
            ..Default::default()
        };
        self.ok(
            id,
            req,
            &protos::GetTraceStatsResponse {
                trace_stats: Some(stats),
            },
            false,
        );
    }

    /// ObserveEvents: "all data sources started" is sent once the session
    /// says so; an empty mask closes the stream.
    fn observe(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let Ok(r) = protos::ObserveEventsRequest::decode(args) else {
            return self.fail(id, req);
        };
        let mask = r.events_to_observe.iter().fold(0, |m, e| m | e);
        let known = wire::EVENT_ALL_DATA_SOURCES_STARTED | wire::EVENT_CLONE_TRIGGER_HIT;
        if mask & known == 0 {
            return self.ok(id, req, &protos::ObserveEventsResponse::default(), false);
        }
        let Some(c) = self.conn(id) else {
            return;
        };
        let Some(sid) = c.session else {
            // perfetto observes before EnableTracing: the watch starts
            // with the session.
            c.observer = Some((req, mask));
            return;
        };
        if mask & wire::EVENT_ALL_DATA_SOURCES_STARTED == 0 {
            // Clone trigger hits are told only to the consumer that
            // observed before enabling.
            return;
        }
        if c.start_watchers.len() >= super::connection::MAX_IN_FLIGHT {
            return self.fail(id, req);
        }
        c.start_watchers.push(req);
        if self.sessions.get(sid).is_some_and(|h| h.all_started) {
            self.tell_started(sid);
        }
    }

    /// Tells the watchers of session `sid`'s holder that every data source
    /// started.
    pub(super) fn tell_started(&mut self, sid: u64) {
        let Some(Holder::Conn(id)) = self.sessions.get(sid).map(|h| h.holder.clone()) else {
            return;
        };
        let Some(c) = self.conn(id) else {
            return;
        };
        for w in std::mem::take(&mut c.start_watchers) {
            c.reply(
                w,
                &protos::ObserveEventsResponse {
                    events: Some(protos::ObservableEvents {
                        all_data_sources_started: Some(true),
                        ..Default::default()
                    }),
                },
                true,
            );
        }
    }

    /// A CLONE_SNAPSHOT trigger of session `sid` asked for a snapshot: its
    /// holder, if it observes clone trigger hits, clones the session.
    pub(super) fn tell_clone_hit(&mut self, sid: u64, trigger: &str) {
        let Some(Holder::Conn(id)) = self.sessions.get(sid).map(|h| h.holder.clone()) else {
            return;
        };
        let Some(c) = self.conn(id) else {
            return;
        };
        let Some((oid, _)) = c
            .observer
            .filter(|(_, m)| m & wire::EVENT_CLONE_TRIGGER_HIT != 0)
        else {
            return;
        };
        c.reply(
            oid,
            &protos::ObserveEventsResponse {
                events: Some(protos::ObservableEvents {
                    clone_trigger_hit: Some(protos::observable_events::CloneTriggerHit {
                        tracing_session_id: Some(sid as i64),
                        trigger_name: Some(trigger.to_string()),
                    }),
                    ..Default::default()
                }),
            },
            true,
        );
    }

    /// The held EnableTracing reply: the session ended (with `error`).
    pub(super) fn tell_end(&mut self, id: ConnId, req: u64, error: Option<&str>) {
        self.ok(
            id,
            req,
            &protos::EnableTracingResponse {
                state: Some(protos::enable_tracing_response::State::Disabled(true)),
                error: error.map(str::to_string),
            },
            false,
        );
    }

    /// Session `sid` answered `waiter` (`None`: it ended first).
    pub(super) fn answered(&mut self, sid: u64, waiter: Waiter, response: Option<Response>) {
        let conn_of = |w: &Waiter| match w {
            Waiter::Nobody => None,
            Waiter::Flush { conn, .. }
            | Waiter::Start { conn, .. }
            | Waiter::Drain { conn, .. }
            | Waiter::Clone { conn, .. } => Some(*conn),
        };
        if let Some(c) = conn_of(&waiter).and_then(|id| self.conn(id)) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        match waiter {
            Waiter::Nobody => {}
            Waiter::Flush {
                conn,
                req,
                drop_reply,
            } => match response {
                Some(Response::Session(Answer::Flushed(true))) => {
                    self.ok(conn, req, &protos::FlushResponse {}, drop_reply)
                }
                _ => self.fail(conn, req),
            },
            Waiter::Start {
                conn,
                req,
                drop_reply,
            } => match response {
                Some(Response::Session(Answer::Started(Ok(())))) => {
                    if let Some(h) = self.sessions.get_mut(sid) {
                        h.state = SessionState::Started;
                    }
                    self.ok(conn, req, &protos::StartTracingResponse {}, drop_reply);
                }
                _ => self.fail(conn, req),
            },
            // Written, or ended meanwhile: either way the file is ready.
            Waiter::Drain { conn, req } => self.begin_read(conn, req),
            Waiter::Clone { conn, req, clone } => self.cloned(conn, req, clone, sid, response),
        }
    }

    /// CloneSession: a copy of a running session's buffers (after a flush)
    /// becomes this connection's read-only session; the original records
    /// on. The copy counts against the caller's quota.
    fn clone_session(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let Ok(r) = protos::CloneSessionRequest::decode(args) else {
            return self.fail(id, req);
        };
        if r.for_bugreport() {
            return self.clone_refused(
                id,
                req,
                "recorder serve does not save traces for bug reports".into(),
            );
        }
        let Some(c) = self.conn(id) else {
            return;
        };
        let uid = c.uid;
        if c.session.is_some() {
            return self.clone_refused(
                id,
                req,
                "this consumer already has a tracing session".into(),
            );
        }
        let source =
            self.sessions
                .clone_source(uid, r.session_id, r.unique_session_name.as_deref());
        let Some(src) = source else {
            let what = r
                .unique_session_name
                .clone()
                .unwrap_or_else(|| r.session_id().to_string());
            return self.clone_refused(
                id,
                req,
                format!("no running tracing session {} of uid {uid}", shown(&what)),
            );
        };
        let Some(src_entry) = self.sessions.get(src).map(|h| h.entry.clone()) else {
            return;
        };
        let entry = Entry {
            uid,
            unique_name: None,
            duration_ms: 0,
            start_realtime_ns: crate::clock::realtime_ms() as i64 * 1_000_000,
            ..src_entry
        };
        let clone =
            match self
                .sessions
                .reserve(entry, SessionState::ClonedReadOnly, Holder::Conn(id))
            {
                Ok(c) => c,
                Err(e) => return self.clone_refused(id, req, e.to_string()),
            };
        let memfd = match rustix::fs::memfd_create(
            format!("recorder-clone-{clone}"),
            rustix::fs::MemfdFlags::CLOEXEC,
        ) {
            Ok(fd) => fd,
            Err(e) => {
                self.sessions.remove(clone);
                return self.clone_refused(id, req, format!("in-memory trace file: {e}"));
            }
        };
        let file = match memfd.try_clone() {
            Ok(f) => std::fs::File::from(f),
            Err(e) => {
                self.sessions.remove(clone);
                return self.clone_refused(id, req, format!("in-memory trace file: {e}"));
            }
        };
        if let Some(h) = self.sessions.get_mut(clone) {
            h.file = Some(file);
        }
        // The clone is this connection's while the copy is made.
        if let Some(c) = self.conn(id) {
            c.session = Some(clone);
        }
        let ticket = self.ticket(
            src,
            Waiter::Clone {
                conn: id,
                req,
                clone,
            },
        );
        if let Some(r) = self.sessions.get_mut(src).and_then(|h| h.runner.as_mut()) {
            r.command(Command::Clone(memfd), ticket);
        }
    }

    fn clone_refused(&mut self, id: ConnId, req: u64, error: String) {
        let uid = self.conn(id).map_or(0, |c| c.uid);
        self.say(uid, log::Level::Info, || {
            format!(
                "consumer uid {uid}: CloneSession refused: {}",
                shown(&error)
            )
        });
        self.ok(
            id,
            req,
            &protos::CloneSessionResponse {
                success: Some(false),
                error: Some(error),
                ..Default::default()
            },
            false,
        );
    }

    /// The copy for clone `clone` of session `src` was made, or not.
    fn cloned(&mut self, id: ConnId, req: u64, clone: u64, src: u64, response: Option<Response>) {
        let result = match response {
            Some(Response::Cloned(Ok(bytes))) => Ok(bytes),
            Some(Response::Cloned(Err(e))) => Err(crate::app::chain(&e)),
            Some(Response::Session(Answer::NotCloned(r))) => Err(r.as_str().to_string()),
            Some(Response::Session(_)) => Err("the session did not clone".into()),
            None => Err("the session ended before its clone was made".into()),
        };
        let holder_here = self.conn(id).is_some_and(|c| c.session == Some(clone));
        match result {
            Ok(bytes) if holder_here => {
                if let Some(h) = self.sessions.get_mut(clone) {
                    h.ended = Some(None);
                }
                log::info!("session {src} cloned as session {clone} ({bytes} bytes)");
                self.ok(
                    id,
                    req,
                    &protos::CloneSessionResponse {
                        success: Some(true),
                        was_write_into_file: Some(false),
                        ..Default::default()
                    },
                    false,
                );
            }
            Ok(_) => {
                // Its client went meanwhile.
                self.sessions.remove(clone);
            }
            Err(e) => {
                self.sessions.remove(clone);
                if let Some(c) = self.conn(id)
                    && c.session == Some(clone)
                {
                    c.session = None;
                }
                self.clone_refused(id, req, e);
            }
        }
    }

    /// Detach: the session goes on without this connection, kept under
    /// the caller's uid and `key` until a consumer of that uid attaches.
    fn detach(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let Ok(r) = protos::DetachRequest::decode(args) else {
            return self.fail(id, req);
        };
        let Some(c) = self.conn(id) else {
            return;
        };
        let uid = c.uid;
        let Some(sid) = c.session else {
            return self.fail(id, req);
        };
        let key = r.key.unwrap_or_default();
        if self.sessions.detached(uid, &key).is_some() {
            self.say(uid, log::Level::Info, || {
                format!(
                    "consumer uid {uid}: Detach refused: a session is already detached as \"{}\"",
                    shown(&key)
                )
            });
            return self.fail(id, req);
        }
        if let Some(h) = self.sessions.get_mut(sid) {
            h.holder = Holder::Detached(key.clone());
            h.end_to = None;
        }
        if let Some(c) = self.conn(id) {
            c.session = None;
        }
        self.say(uid, log::Level::Info, || {
            format!(
                "consumer uid {uid}: session detached as \"{}\"",
                shown(&key)
            )
        });
        // An ended one whose data went to the client's file has nothing
        // left to keep.
        if self.sessions.get(sid).is_some_and(Hosted::spent) {
            self.sessions.remove(sid);
        }
        self.ok(id, req, &protos::DetachResponse {}, false);
    }

    /// Attach: takes back the caller's uid's session detached as `key`
    /// (another uid's keys are not even looked at) and returns its config.
    fn attach(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let Ok(r) = protos::AttachRequest::decode(args) else {
            return self.fail(id, req);
        };
        let Some(c) = self.conn(id) else {
            return;
        };
        let uid = c.uid;
        if c.session.is_some() {
            return self.fail(id, req);
        }
        let key = r.key.unwrap_or_default();
        let Some(sid) = self.sessions.detached(uid, &key) else {
            self.say(uid, log::Level::Info, || {
                format!(
                    "consumer uid {uid}: no session detached as \"{}\"",
                    shown(&key)
                )
            });
            return self.fail(id, req);
        };
        let config = match self.sessions.get_mut(sid) {
            Some(h) => {
                h.holder = Holder::Conn(id);
                h.config.clone()
            }
            None => return self.fail(id, req),
        };
        if let Some(c) = self.conn(id) {
            c.session = Some(sid);
        }
        self.ok(
            id,
            req,
            &protos::AttachResponse {
                trace_config: Some(config),
            },
            false,
        );
    }

    fn query_state(&mut self, id: ConnId, req: u64, args: &[u8]) {
        let sessions_only = protos::QueryServiceStateRequest::decode(args)
            .map(|r| r.sessions_only())
            .unwrap_or(false);
        let Some(uid) = self.conn(id).map(|c| c.uid) else {
            return;
        };
        // What the caller may see: its own sessions, or all for root;
        // another uid's sessions are not even counted.
        let visible: Vec<(u64, &Hosted)> = self
            .sessions
            .iter()
            .filter(|(_, h)| uid == 0 || h.entry.uid == uid)
            .map(|(id, h)| (*id, h))
            .collect();
        let mut state = protos::TracingServiceState {
            supports_tracing_sessions: Some(true),
            num_sessions: Some(visible.len() as i32),
            num_sessions_started: Some(
                visible
                    .iter()
                    .filter(|(_, h)| h.state == SessionState::Started)
                    .count() as i32,
            ),
            tracing_service_version: Some(format!(
                "recorder {} (serve)",
                env!("CARGO_PKG_VERSION")
            )),
            tracing_sessions: visible
                .iter()
                .map(|(sid, h)| protos::tracing_service_state::TracingSession {
                    id: Some(*sid),
                    consumer_uid: Some(h.entry.uid as i32),
                    state: Some(h.state.as_str().into()),
                    unique_session_name: h.entry.unique_name.clone(),
                    buffer_size_kb: h.entry.buffer_kb.clone(),
                    duration_ms: Some(h.entry.duration_ms),
                    num_data_sources: Some(h.entry.data_sources),
                    start_realtime_ns: Some(h.entry.start_realtime_ns),
                })
                .collect(),
            ..Default::default()
        };
        if !sessions_only {
            self.describe_producers(&mut state);
        }
        self.ok(
            id,
            req,
            &protos::QueryServiceStateResponse {
                service_state: Some(state),
            },
            false,
        );
    }

    /// The built-in producer and every connected one, with their data
    /// sources (as traced, every caller sees every producer).
    fn describe_producers(&self, state: &mut protos::TracingServiceState) {
        use protos::tracing_service_state::{DataSource, Producer};
        let source = |name: String, producer: i32| DataSource {
            ds_descriptor: Some(protos::ProducerDataSourceDescriptor {
                name: Some(name),
                ..Default::default()
            }),
            producer_id: Some(producer),
        };
        state.producers = vec![Producer {
            id: Some(1),
            name: Some(crate::sources::PRODUCER_NAME.into()),
            uid: Some(self.service_uid as i32),
            pid: Some(self.service_pid as i32),
            sdk_version: Some(format!("recorder {}", env!("CARGO_PKG_VERSION"))),
        }];
        // linux.ftrace is built in only where the broker prepares tracefs
        // (a root service without --no-builtin-ftrace).
        let ftrace = self.ftrace.is_some().then_some("linux.ftrace");
        state.data_sources = (BUILTIN_SOURCES.iter().copied())
            .chain(ftrace)
            .map(|name| source(name.into(), 1))
            .collect();
        let listed = self
            .producers
            .as_ref()
            .map_or_else(Vec::new, |p| p.producers());
        for (i, p) in listed.into_iter().enumerate() {
            let pid = i as i32 + 2;
            state.producers.push(Producer {
                id: Some(pid),
                name: Some(p.name),
                uid: Some(p.uid as i32),
                pid: Some(p.pid as i32),
                sdk_version: None,
            });
            state
                .data_sources
                .extend(p.data_sources.into_iter().map(|n| source(n, pid)));
        }
    }
}

fn buffer_stats(s: &crate::ringbuf::BufferStats) -> protos::trace_stats::BufferStats {
    protos::trace_stats::BufferStats {
        buffer_size: Some(s.buffer_size),
        bytes_written: Some(s.bytes_written),
        bytes_overwritten: Some(s.bytes_overwritten),
        ..Default::default()
    }
}
