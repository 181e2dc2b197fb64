//! The sessions the service hosts: who holds each, what each costs, and
//! the quotas, checked before anything is allocated and charged until the
//! session has really ended (and, when it left data to read, until that is
//! read or let go of).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::time::{Duration, Instant};

use super::Limits;
use super::readback::Readback;
use crate::event_loop::{BufferSummary, Runner};

/// A consumer connection, as the service numbers them.
pub(crate) type ConnId = u64;

/// Where a session is, as `perfetto --query` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SessionState {
    Configured,
    Started,
    Disabled,
    /// A clone: a copy of another session's buffers, to be read.
    ClonedReadOnly,
}

impl SessionState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SessionState::Configured => "CONFIGURED",
            SessionState::Started => "STARTED",
            SessionState::Disabled => "DISABLED",
            SessionState::ClonedReadOnly => "CLONED_READ_ONLY",
        }
    }
}

/// Who holds a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The connection that enabled, attached or cloned it.
    Conn(ConnId),
    /// Detached by its uid under a key, until a connection of that uid
    /// attaches.
    Detached(String),
    /// Nobody: its client went or let it go. It ends, and is forgotten at
    /// its end.
    Nobody,
}

/// What a session costs and shows, fixed when it is reserved.
#[derive(Clone, Debug, Default)]
pub(crate) struct Entry {
    pub uid: u32,
    pub(crate) unique_name: Option<String>,
    pub buffer_kb: Vec<u32>,
    /// Bytes charged to the uid: its buffers, and a stream output's
    /// backlog bound.
    pub(crate) charged_bytes: u64,
    pub duration_ms: u32,
    pub data_sources: u32,
    pub(crate) start_realtime_ns: i64,
    /// Its flush and stop timeouts: how long a stop may take.
    pub(crate) stop_budget: Duration,
}

/// One hosted session.
pub(crate) struct Hosted {
    pub entry: Entry,
    pub state: SessionState,
    /// Its executor, while it runs.
    pub runner: Option<Runner>,
    pub holder: Holder,
    /// The held EnableTracing reply: the connection and request to tell of
    /// the end.
    pub(crate) end_to: Option<(ConnId, u64)>,
    /// `None` while it runs; then its error (`None`: it ended well).
    pub ended: Option<Option<String>>,
    /// The in-memory trace file ReadBuffers reads; none when the data went
    /// to the client's own file.
    pub file: Option<File>,
    /// Where the last ReadBuffers ended.
    pub(crate) readback: Option<Readback>,
    /// The TraceConfig as the consumer sent it (Attach returns it).
    pub config: Vec<u8>,
    /// `all_data_sources_started` came.
    pub all_started: bool,
    /// Asked to stop (by its client, or because it went): aborted if it
    /// has not ended by then.
    pub deadline: Option<Instant>,
    /// Its buffers' figures at its end.
    pub(crate) final_buffers: Vec<BufferSummary>,
    /// The broker holds what it saves of this session if the service
    /// dies: told when it ends.
    pub(crate) saved_at_death: bool,
}

impl Hosted {
    fn new(entry: Entry, state: SessionState, holder: Holder) -> Self {
        Self {
            entry,
            state,
            runner: None,
            holder,
            end_to: None,
            ended: None,
            file: None,
            readback: None,
            config: Vec::new(),
            all_started: false,
            deadline: None,
            final_buffers: Vec::new(),
            saved_at_death: false,
        }
    }

    /// It ended and nothing of it is left to read (its data went to the
    /// client's file): its quota can go.
    pub(crate) fn spent(&self) -> bool {
        self.ended.is_some() && self.file.is_none()
    }
}

/// Why a connection or a session was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAdmitted {
    #[error("too many consumer connections ({0})")]
    Connections(usize),
    #[error("too many consumer connections from uid {uid} ({limit})")]
    ConnectionsOfUid { uid: u32, limit: usize },
    #[error("too many concurrent tracing sessions ({0})")]
    Sessions(usize),
    #[error("too many concurrent tracing sessions for uid {uid} ({limit})")]
    SessionsOfUid { uid: u32, limit: usize },
    #[error(
        "buffers of {asked} bytes would take uid {uid} past its {limit}-byte quota ({held} held)"
    )]
    BytesOfUid {
        uid: u32,
        asked: u64,
        held: u64,
        limit: u64,
    },
    #[error("buffers of {asked} bytes would take the service past {limit} bytes ({held} held)")]
    Bytes { asked: u64, held: u64, limit: u64 },
    #[error(
        "a tracing session of uid {uid} with the unique_session_name {name:?} is already running"
    )]
    UniqueName { uid: u32, name: String },
}

/// Every session, and the connections counted against their uids.
pub(crate) struct Sessions {
    map: BTreeMap<u64, Hosted>,
    next_id: u64,
    limits: Limits,
    conns: usize,
    conns_of: HashMap<u32, usize>,
    /// Refusals per uid, for the log at the end.
    refused: BTreeMap<u32, u64>,
    /// Sessions aborted at their hard deadline.
    pub aborted: u64,
}

impl Sessions {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            map: BTreeMap::new(),
            next_id: 1,
            limits,
            conns: 0,
            conns_of: HashMap::new(),
            refused: BTreeMap::new(),
            aborted: 0,
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    fn refuse<T>(&mut self, uid: u32, r: NotAdmitted) -> Result<T, NotAdmitted> {
        *self.refused.entry(uid).or_default() += 1;
        Err(r)
    }

    /// Counts a new connection of `uid`, or refuses it.
    pub(crate) fn admit(&mut self, uid: u32) -> Result<(), NotAdmitted> {
        let l = self.limits;
        if self.conns >= l.connections {
            return self.refuse(uid, NotAdmitted::Connections(l.connections));
        }
        if self.conns_of.get(&uid).copied().unwrap_or(0) >= l.connections_per_uid {
            return self.refuse(
                uid,
                NotAdmitted::ConnectionsOfUid {
                    uid,
                    limit: l.connections_per_uid,
                },
            );
        }
        self.conns += 1;
        *self.conns_of.entry(uid).or_default() += 1;
        Ok(())
    }

    /// A connection of `uid` closed.
    pub(crate) fn release_connection(&mut self, uid: u32) {
        self.conns = self.conns.saturating_sub(1);
        if let Some(n) = self.conns_of.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.conns_of.remove(&uid);
            }
        }
    }

    /// Reserves a session for `entry.uid` within every quota, held by
    /// `holder`; its id.
    pub(crate) fn reserve(
        &mut self,
        entry: Entry,
        state: SessionState,
        holder: Holder,
    ) -> Result<u64, NotAdmitted> {
        if let Err(r) = self.check(&entry) {
            return self.refuse(entry.uid, r);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.map.insert(id, Hosted::new(entry, state, holder));
        Ok(id)
    }

    fn check(&self, e: &Entry) -> Result<(), NotAdmitted> {
        let l = self.limits;
        let of_uid = || self.map.values().filter(|s| s.entry.uid == e.uid);
        if self.map.len() >= l.sessions {
            return Err(NotAdmitted::Sessions(l.sessions));
        }
        if of_uid().count() >= l.sessions_per_uid {
            return Err(NotAdmitted::SessionsOfUid {
                uid: e.uid,
                limit: l.sessions_per_uid,
            });
        }
        let held_uid: u64 = of_uid().map(|s| s.entry.charged_bytes).sum();
        if held_uid.saturating_add(e.charged_bytes) > l.buffer_bytes_per_uid {
            return Err(NotAdmitted::BytesOfUid {
                uid: e.uid,
                asked: e.charged_bytes,
                held: held_uid,
                limit: l.buffer_bytes_per_uid,
            });
        }
        let held: u64 = self.map.values().map(|s| s.entry.charged_bytes).sum();
        if held.saturating_add(e.charged_bytes) > l.buffer_bytes {
            return Err(NotAdmitted::Bytes {
                asked: e.charged_bytes,
                held,
                limit: l.buffer_bytes,
            });
        }
        // Names are each uid's own: another user cannot take root's.
        if let Some(name) = &e.unique_name
            && of_uid()
                .filter(|s| s.ended.is_none())
                .any(|s| s.entry.unique_name.as_ref() == Some(name))
        {
            return Err(NotAdmitted::UniqueName {
                uid: e.uid,
                name: name.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn get(&self, id: u64) -> Option<&Hosted> {
        self.map.get(&id)
    }

    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut Hosted> {
        self.map.get_mut(&id)
    }

    /// Forgets session `id`: its quota is free.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Hosted> {
        self.map.remove(&id)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn ids(&self) -> Vec<u64> {
        self.map.keys().copied().collect()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &Hosted)> {
        self.map.iter()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Hosted)> {
        self.map.iter_mut()
    }

    /// The session `caller` may clone: by id, else by unique name; its own
    /// uid's, or any for root. Another uid's sessions are not found.
    pub(crate) fn clone_source(
        &self,
        caller: u32,
        id: Option<u64>,
        name: Option<&str>,
    ) -> Option<u64> {
        self.map
            .iter()
            .filter(|(_, s)| caller == 0 || s.entry.uid == caller)
            .filter(|(_, s)| s.runner.is_some())
            .find(|(sid, s)| match (id, name) {
                (Some(id), _) if id != 0 => **sid == id,
                (_, Some(n)) => s.entry.unique_name.as_deref() == Some(n),
                _ => false,
            })
            .map(|(sid, _)| *sid)
    }

    /// The session `uid` detached under `key`; another uid's keys are not
    /// looked at.
    pub(crate) fn detached(&self, uid: u32, key: &str) -> Option<u64> {
        self.map
            .iter()
            .find(|(_, s)| s.entry.uid == uid && s.holder == Holder::Detached(key.to_string()))
            .map(|(id, _)| *id)
    }

    /// Refusals so far, per uid.
    pub(crate) fn refused(&self) -> &BTreeMap<u32, u64> {
        &self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uid: u32, bytes: u64, name: Option<&str>) -> Entry {
        Entry {
            uid,
            unique_name: name.map(str::to_string),
            buffer_kb: vec![(bytes / 1024) as u32],
            charged_bytes: bytes,
            data_sources: 1,
            ..Entry::default()
        }
    }

    fn reserve(s: &mut Sessions, e: Entry) -> Result<u64, NotAdmitted> {
        s.reserve(e, SessionState::Started, Holder::Nobody)
    }

    #[test]
    fn quotas_are_per_uid_and_freed_on_removal() {
        let mut s = Sessions::new(Limits::default());
        let mut ids = Vec::new();
        for _ in 0..super::super::MAX_SESSIONS_PER_UID {
            ids.push(reserve(&mut s, entry(1000, 1 << 20, None)).expect("within quota"));
        }
        assert_eq!(
            reserve(&mut s, entry(1000, 1 << 20, None)).err(),
            Some(NotAdmitted::SessionsOfUid {
                uid: 1000,
                limit: 5
            })
        );
        // Another uid is not affected.
        let other = reserve(&mut s, entry(1001, 1 << 20, None)).expect("other uid");
        s.remove(ids[0]);
        assert!(reserve(&mut s, entry(1000, 1 << 20, None)).is_ok());
        assert!(matches!(
            reserve(
                &mut s,
                entry(1001, super::super::MAX_BUFFER_BYTES_PER_UID, None)
            ),
            Err(NotAdmitted::BytesOfUid { uid: 1001, .. })
        ));
        s.remove(other);
        assert_eq!(s.refused().get(&1000), Some(&1));
    }

    #[test]
    fn unique_names_are_each_uids_own() {
        let mut s = Sessions::new(Limits::default());
        reserve(&mut s, entry(0, 4096, Some("a"))).expect("root's");
        // Another uid's session of the same name does not block root's,
        // nor root's another uid's.
        reserve(&mut s, entry(1001, 4096, Some("a"))).expect("1001's own");
        assert_eq!(
            reserve(&mut s, entry(1001, 4096, Some("a"))).err(),
            Some(NotAdmitted::UniqueName {
                uid: 1001,
                name: "a".into()
            })
        );
        assert!(reserve(&mut s, entry(0, 4096, Some("a"))).is_err());
    }

    #[test]
    fn connections_are_counted_per_uid() {
        let mut s = Sessions::new(Limits::default());
        for _ in 0..super::super::MAX_CONNECTIONS_PER_UID {
            s.admit(7).expect("within quota");
        }
        assert!(matches!(
            s.admit(7),
            Err(NotAdmitted::ConnectionsOfUid { uid: 7, .. })
        ));
        assert!(s.admit(8).is_ok());
        s.release_connection(7);
        assert!(s.admit(7).is_ok());
    }

    #[test]
    fn raised_limits_hold_a_hundred_sessions_of_ten_uids() {
        let mut s = Sessions::new(Limits::with_sessions(Some(100), Some(10)));
        for uid in 0..10 {
            for _ in 0..10 {
                reserve(&mut s, entry(1000 + uid, 1 << 20, None)).expect("within quota");
            }
        }
        assert_eq!(s.len(), 100);
        assert!(matches!(
            reserve(&mut s, entry(2000, 1 << 20, None)),
            Err(NotAdmitted::Sessions(100))
        ));
    }

    #[test]
    fn detached_sessions_are_found_by_their_uid_and_key_only() {
        let mut s = Sessions::new(Limits::default());
        let id = s
            .reserve(
                entry(1000, 4096, None),
                SessionState::Started,
                Holder::Detached("k".into()),
            )
            .expect("reserve");
        assert_eq!(s.detached(1000, "k"), Some(id));
        assert_eq!(s.detached(1001, "k"), None);
        assert_eq!(s.detached(0, "k"), None);
        assert_eq!(s.detached(1000, "j"), None);
    }
}
