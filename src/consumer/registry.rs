//! What the service holds across connections: the sessions (who owns each,
//! what it costs), the quotas checked before anything is allocated, and the
//! producer service, which every session that needs apps attaches to.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use super::connection::Owned;
use super::{
    MAX_BUFFER_BYTES, MAX_BUFFER_BYTES_PER_UID, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID,
    MAX_SESSIONS, MAX_SESSIONS_PER_UID,
};
use crate::control::server::InProcessControl;
use crate::ipc::host::{ProducerReport, ProducerService};

/// Where a session is, as `perfetto --query` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    Configured,
    Started,
    Disabled,
    /// A clone: a copy of another session's buffers, to be read.
    ClonedReadOnly,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Configured => "CONFIGURED",
            SessionState::Started => "STARTED",
            SessionState::Disabled => "DISABLED",
            SessionState::ClonedReadOnly => "CLONED_READ_ONLY",
        }
    }
}

/// One session, as the service lists it.
#[derive(Clone)]
pub struct SessionEntry {
    pub id: u64,
    pub uid: u32,
    pub unique_name: Option<String>,
    pub buffer_kb: Vec<u32>,
    pub buffer_bytes: u64,
    pub duration_ms: u32,
    pub data_sources: u32,
    pub start_realtime_ns: i64,
    pub state: SessionState,
    pub control: Option<InProcessControl>,
    /// The session attaches to the producer service.
    pub producers: bool,
}

/// Why a connection or a session was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("too many consumer connections ({MAX_CONNECTIONS})")]
    Connections,
    #[error("too many consumer connections from uid {0} ({MAX_CONNECTIONS_PER_UID})")]
    ConnectionsOfUid(u32),
    #[error("too many concurrent tracing sessions ({MAX_SESSIONS})")]
    Sessions,
    #[error("too many concurrent tracing sessions for uid {0} ({MAX_SESSIONS_PER_UID})")]
    SessionsOfUid(u32),
    #[error(
        "buffers of {asked} bytes would take uid {uid} past its {MAX_BUFFER_BYTES_PER_UID}-byte quota ({held} held)"
    )]
    BytesOfUid { uid: u32, asked: u64, held: u64 },
    #[error(
        "buffers of {asked} bytes would take the service past {MAX_BUFFER_BYTES} bytes ({held} held)"
    )]
    Bytes { asked: u64, held: u64 },
    #[error("a tracing session with the unique_session_name {0:?} is already running")]
    UniqueName(String),
    #[error("recorder serve has no producer socket")]
    NoProducerSocket,
}

#[derive(Default)]
struct Inner {
    sessions: BTreeMap<u64, SessionEntry>,
    next_id: u64,
    conns: usize,
    conns_of: HashMap<u32, usize>,
    /// Refusals per uid, for the log at the end.
    refused: BTreeMap<u32, u64>,
    /// Sessions that outlive their consumer, by owner uid and key.
    detached: HashMap<(u32, String), Owned>,
}

impl Inner {
    fn release(&mut self, id: u64) {
        self.sessions.remove(&id);
    }

    /// Forgets detached sessions that ended with nothing left to read
    /// (their data went to their client's file), as traced frees a
    /// detached session at its end; their quota is free again.
    fn reap(&mut self) {
        let spent: Vec<_> = self
            .detached
            .iter()
            .filter(|(_, s)| s.spent())
            .map(|(k, s)| (k.clone(), s.id()))
            .collect();
        for (k, id) in spent {
            self.detached.remove(&k);
            self.release(id);
        }
    }
}

/// Shared by every connection.
pub struct Registry {
    inner: Mutex<Inner>,
    producers: Option<Arc<ProducerService>>,
    /// Who prepares tracefs for sessions' built-in linux.ftrace (the root
    /// broker); unset: producers (traced_probes) provide it.
    ftrace: std::sync::OnceLock<Arc<dyn crate::sources::ftrace::remote::RemoteTracefs>>,
    /// The uid and pid the service runs as (its built-in producer's).
    pub service_uid: u32,
    pub service_pid: u32,
    /// Sessions may write with `O_DIRECT` where their file takes it.
    direct_io: std::sync::atomic::AtomicBool,
}

/// A connection counted against its uid until dropped.
pub struct ConnectionSlot {
    registry: Arc<Registry>,
    uid: u32,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut g = self.registry.lock();
        g.conns = g.conns.saturating_sub(1);
        if let Some(n) = g.conns_of.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.conns_of.remove(&self.uid);
            }
        }
    }
}

impl Registry {
    pub fn new(producers: Option<ProducerService>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
            producers: producers.map(Arc::new),
            ftrace: std::sync::OnceLock::new(),
            service_uid: rustix::process::getuid().as_raw(),
            service_pid: std::process::id(),
            direct_io: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Sessions record linux.ftrace themselves, on instances `remote`
    /// prepares. Once.
    pub fn serve_ftrace(&self, remote: Arc<dyn crate::sources::ftrace::remote::RemoteTracefs>) {
        let _ = self.ftrace.set(remote);
    }

    /// Sessions write through the page cache only.
    pub fn no_direct_io(&self) {
        self.direct_io
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether sessions may write with `O_DIRECT` (storage still probes).
    pub fn direct_io(&self) -> bool {
        self.direct_io.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Who prepares sessions' tracefs instances, if anyone.
    pub fn ftrace(&self) -> Option<Arc<dyn crate::sources::ftrace::remote::RemoteTracefs>> {
        self.ftrace.get().cloned()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking connection thread leaves consistent counts behind:
        // every update is a single step under the lock.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection of `uid`, or refuses it.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<ConnectionSlot, Refusal> {
        let mut g = self.lock();
        let r = if g.conns >= MAX_CONNECTIONS {
            Err(Refusal::Connections)
        } else if g.conns_of.get(&uid).copied().unwrap_or(0) >= MAX_CONNECTIONS_PER_UID {
            Err(Refusal::ConnectionsOfUid(uid))
        } else {
            g.conns += 1;
            *g.conns_of.entry(uid).or_default() += 1;
            Ok(ConnectionSlot {
                registry: self.clone(),
                uid,
            })
        };
        if r.is_err() {
            *g.refused.entry(uid).or_default() += 1;
        }
        r
    }

    /// Reserves a session for `entry.uid` within every quota; the id is
    /// filled in. With `producers`, the producer service it attaches to.
    pub fn reserve(
        &self,
        mut entry: SessionEntry,
    ) -> Result<(u64, Option<Arc<ProducerService>>), Refusal> {
        let mut g = self.lock();
        g.reap();
        let r = Self::check(&g, &entry);
        let r = r.and_then(|()| match (&self.producers, entry.producers) {
            (_, false) => Ok(None),
            (Some(p), true) => Ok(Some(p.clone())),
            (None, true) => Err(Refusal::NoProducerSocket),
        });
        match r {
            Ok(producers) => {
                let id = g.next_id;
                g.next_id += 1;
                entry.id = id;
                g.sessions.insert(id, entry);
                Ok((id, producers))
            }
            Err(e) => {
                *g.refused.entry(entry.uid).or_default() += 1;
                Err(e)
            }
        }
    }

    fn check(g: &Inner, e: &SessionEntry) -> Result<(), Refusal> {
        let of_uid = || g.sessions.values().filter(|s| s.uid == e.uid);
        if g.sessions.len() >= MAX_SESSIONS {
            return Err(Refusal::Sessions);
        }
        if of_uid().count() >= MAX_SESSIONS_PER_UID {
            return Err(Refusal::SessionsOfUid(e.uid));
        }
        let held_uid: u64 = of_uid().map(|s| s.buffer_bytes).sum();
        if held_uid.saturating_add(e.buffer_bytes) > MAX_BUFFER_BYTES_PER_UID {
            return Err(Refusal::BytesOfUid {
                uid: e.uid,
                asked: e.buffer_bytes,
                held: held_uid,
            });
        }
        let held: u64 = g.sessions.values().map(|s| s.buffer_bytes).sum();
        if held.saturating_add(e.buffer_bytes) > MAX_BUFFER_BYTES {
            return Err(Refusal::Bytes {
                asked: e.buffer_bytes,
                held,
            });
        }
        if let Some(name) = &e.unique_name
            && g.sessions
                .values()
                .any(|s| s.unique_name.as_ref() == Some(name))
        {
            return Err(Refusal::UniqueName(name.clone()));
        }
        Ok(())
    }

    /// The session `caller` may clone: by id, else by unique name; its own
    /// uid's, or any for root. Another uid's sessions are not found.
    pub fn clone_source(
        &self,
        caller: u32,
        id: Option<u64>,
        name: Option<&str>,
    ) -> Option<SessionEntry> {
        self.lock()
            .sessions
            .values()
            .filter(|s| caller == 0 || s.uid == caller)
            .filter(|s| s.state != SessionState::ClonedReadOnly)
            .find(|s| match (id, name) {
                (Some(id), _) if id != 0 => s.id == id,
                (_, Some(n)) => s.unique_name.as_deref() == Some(n),
                _ => false,
            })
            .cloned()
    }

    /// The session's control, once its loop runs.
    pub fn attach_control(&self, id: u64, control: InProcessControl) {
        if let Some(s) = self.lock().sessions.get_mut(&id) {
            s.control = Some(control);
        }
    }

    pub fn set_state(&self, id: u64, state: SessionState) {
        if let Some(s) = self.lock().sessions.get_mut(&id) {
            s.state = state;
        }
    }

    /// Forgets session `id`: its quota is free.
    pub fn release(&self, id: u64) {
        self.lock().release(id);
    }

    /// Keeps `session` for `uid` under `key`; gives it back when the uid
    /// already has one under that key.
    pub fn detach(&self, uid: u32, key: String, session: Owned) -> Result<(), Box<Owned>> {
        let mut g = self.lock();
        g.reap();
        if g.detached.contains_key(&(uid, key.clone())) {
            *g.refused.entry(uid).or_default() += 1;
            return Err(Box::new(session));
        }
        g.detached.insert((uid, key), session);
        Ok(())
    }

    /// The session `uid` detached under `key`, taken out of the registry's
    /// keeping; another uid's keys are not looked at.
    pub fn attach(&self, uid: u32, key: &str) -> Option<Owned> {
        let mut g = self.lock();
        g.reap();
        g.detached.remove(&(uid, key.to_string()))
    }

    /// Sessions the service's stop waits for: each one a consumer holds
    /// (until it read the data and let go), and each detached one until it
    /// ended.
    pub fn pending(&self) -> usize {
        let g = self.lock();
        let detached_ended = g.detached.values().filter(|s| s.done.ended()).count();
        g.sessions.len().saturating_sub(detached_ended)
    }

    /// The sessions `caller` may see: its own, or all of them for root.
    pub fn visible(&self, caller: u32) -> Vec<SessionEntry> {
        self.lock()
            .sessions
            .values()
            .filter(|s| caller == 0 || s.uid == caller)
            .cloned()
            .collect()
    }

    /// Every session's control (for the service's own stop).
    pub fn controls(&self) -> Vec<InProcessControl> {
        self.lock()
            .sessions
            .values()
            .filter_map(|s| s.control.clone())
            .collect()
    }

    /// Every connected producer with the data sources it registered.
    pub fn producers(&self) -> Vec<ProducerReport> {
        self.producers
            .as_ref()
            .map_or_else(Vec::new, |p| p.producers())
    }

    /// Refusals so far, per uid.
    pub fn refused(&self) -> BTreeMap<u32, u64> {
        self.lock().refused.clone()
    }

    /// The producer socket's path, if the service has one.
    pub fn producer_path(&self) -> Option<PathBuf> {
        self.producers.as_ref().map(|p| p.path().to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uid: u32, bytes: u64, name: Option<&str>) -> SessionEntry {
        SessionEntry {
            id: 0,
            uid,
            unique_name: name.map(str::to_string),
            buffer_kb: vec![(bytes / 1024) as u32],
            buffer_bytes: bytes,
            duration_ms: 0,
            data_sources: 1,
            start_realtime_ns: 0,
            state: SessionState::Configured,
            control: None,
            producers: false,
        }
    }

    #[test]
    fn quotas_are_per_uid_and_freed_on_release() {
        let r = Registry::new(None);
        let mut ids = Vec::new();
        for _ in 0..MAX_SESSIONS_PER_UID {
            ids.push(
                r.reserve(entry(1000, 1 << 20, None))
                    .expect("within quota")
                    .0,
            );
        }
        assert_eq!(
            r.reserve(entry(1000, 1 << 20, None)).err(),
            Some(Refusal::SessionsOfUid(1000))
        );
        // Another uid is not affected.
        let other = r.reserve(entry(1001, 1 << 20, None)).expect("other uid").0;
        r.release(ids[0]);
        assert!(r.reserve(entry(1000, 1 << 20, None)).is_ok());
        assert!(matches!(
            r.reserve(entry(1001, MAX_BUFFER_BYTES_PER_UID, None)),
            Err(Refusal::BytesOfUid { uid: 1001, .. })
        ));
        r.release(other);
        assert_eq!(r.refused().get(&1000), Some(&1));
    }

    #[test]
    fn unique_names_and_visibility() {
        let r = Registry::new(None);
        r.reserve(entry(1000, 4096, Some("a"))).expect("first");
        assert_eq!(
            r.reserve(entry(1001, 4096, Some("a"))).err(),
            Some(Refusal::UniqueName("a".into()))
        );
        r.reserve(entry(1001, 4096, None)).expect("second");
        assert_eq!(r.visible(1000).len(), 1);
        assert_eq!(r.visible(0).len(), 2);
        assert_eq!(r.visible(1002).len(), 0);
    }

    #[test]
    fn connections_are_counted_per_uid() {
        let r = Registry::new(None);
        let slots: Vec<_> = (0..MAX_CONNECTIONS_PER_UID)
            .map(|_| r.admit(7).expect("within quota"))
            .collect();
        assert!(matches!(r.admit(7), Err(Refusal::ConnectionsOfUid(7))));
        assert!(r.admit(8).is_ok());
        drop(slots);
        assert!(r.admit(7).is_ok());
    }

    #[test]
    fn detached_sessions_are_kept_per_uid_and_key_and_spent_ones_freed() {
        let r = Registry::new(None);
        let (id, _) = r.reserve(entry(1000, 4096, None)).expect("reserve");
        let memfd = tempfile::tempfile().expect("tempfile");
        let held = super::super::connection::Owned::ended_for_test(id, Some(memfd));
        assert!(r.detach(1000, "k".into(), held).is_ok());
        // One per key and uid.
        let (id2, _) = r.reserve(entry(1000, 4096, None)).expect("reserve");
        let again = super::super::connection::Owned::ended_for_test(id2, None);
        assert!(r.detach(1000, "k".into(), again).is_err());
        // Another uid's key of the same name is not looked at.
        assert!(r.attach(1001, "k").is_none());
        assert!(r.attach(0, "k").is_none());
        let back = r.attach(1000, "k").expect("its own");
        assert_eq!(back.id(), id);
        assert!(r.attach(1000, "k").is_none(), "taken once");
        // A detached session whose data went to the client's file is freed
        // (and its quota given back) once it ended.
        let spent = super::super::connection::Owned::ended_for_test(id2, None);
        assert!(spent.spent());
        assert!(r.detach(1000, "w".into(), spent).is_ok());
        assert_eq!(r.visible(1000).len(), 2);
        r.reserve(entry(1002, 4096, None)).expect("reserve");
        assert_eq!(r.visible(1000).len(), 1, "the spent one was freed");
        assert!(r.attach(1000, "w").is_none());
        // Data still to read keeps the session for its uid.
        assert!(!back.spent());
    }
}
