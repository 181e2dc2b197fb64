//! Per-uid quotas of the producer socket: what one local user's connections
//! may cost the session, checked before anything is allocated for them.
//!
//! Every limit is here, with its value. A connection is charged to its
//! peer's uid (`SO_PEERCRED`, never what the peer says); a hit is counted
//! against that uid alone, refuses only that uid's request or connection,
//! and shows in the summary and the trace (`trace_attributes` keys
//! `recorder.quota.uid.<uid>.<limit>`). No limit of one uid is ever charged
//! to another: the fuzz target `quota_model` checks that against a model.
//!
//! | limit | value | a hit |
//! |---|---|---|
//! | connections per uid | [`MAX_CONNECTIONS_PER_UID`] | the new connection is closed at once |
//! | connections in all | [`MAX_CONNECTIONS`], at most [`connection_budget`] of the open-file limit | the new connection is closed at once |
//! | producer / data source name | [`MAX_NAME_BYTES`] | the request fails |
//! | data sources per producer | [`MAX_DATA_SOURCES`] | RegisterDataSource fails |
//! | name bytes per producer | [`MAX_REGISTERED_BYTES`] | RegisterDataSource fails |
//! | sequences and writers per producer | [`MAX_SEQUENCES`] | the chunk is refused |
//! | sequences and writers per uid | [`MAX_SEQUENCES_PER_UID`] | the chunk is refused |
//! | bytes held for patches and partial packets per uid | [`MAX_HELD_BYTES_PER_UID`] | the sequence's held chunks (or the partial packet) are given up as lost |
//! | shared memory per uid | [`MAX_SHARED_MEMORY_PER_UID`] | a smaller buffer, or none: the data source is not set up |
//! | closed producers kept one by one | [`MAX_CLOSED_KEPT`] | later ones fold into their uid's line |
//! | uids accounted one by one | [`MAX_UIDS`] | later uids share one account |
//! | log lines per uid | [`LOG_BURST`], then one per [`LOG_INTERVAL`] | the line is counted, not written |
//! | control and trigger requests | `control::server`'s caps per uid and in all | the request is refused; counted here as `control_requests` |

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::stats::ProducerStats;

/// Producer connections one uid may hold at once. An app is one
/// connection; this leaves room for many apps of one user.
pub(crate) const MAX_CONNECTIONS_PER_UID: usize = 32;
/// Producer connections in all, at most (and at most
/// [`connection_budget`] of the open-file limit).
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// Descriptors never given to producers: the control and trigger sockets
/// (their connections included), the output, the sources, the ring.
pub(crate) const FDS_RESERVED: u64 = 256;
/// Descriptors one producer connection may hold: its socket and its shared
/// memory.
pub(crate) const FDS_PER_CONNECTION: u64 = 2;
/// The longest producer or data source name taken.
pub const MAX_NAME_BYTES: usize = 1024;
/// Bytes of a commit's chunks one connection copies out of its shared
/// memory before parsing them, at most: a whole default (256 KiB) shared
/// memory, and a bound on the copy whatever the producer names (no more
/// than its own shared memory either).
pub(crate) const MOVE_BATCH: usize = 1024 * 1024;
/// Data sources one producer may have registered at once.
pub const MAX_DATA_SOURCES: usize = 256;
/// Bytes of data source names one producer may have registered at once.
pub const MAX_REGISTERED_BYTES: usize = 64 * 1024;
/// Sequences (writer and buffer) and trace writers one producer may have.
pub(crate) const MAX_SEQUENCES: usize = 1024;
/// Sequences and trace writers one uid's producers may have in all: each
/// stays attached to its buffer, so many producers of one uid must not
/// multiply [`MAX_SEQUENCES`].
pub const MAX_SEQUENCES_PER_UID: usize = 4 * MAX_SEQUENCES;
/// Bytes one uid's producers may hold in all in chunks waiting for their
/// patches and in packets reassembled across chunks: as much as the largest
/// SMB can hand over before its patches. Per uid, not per producer, so
/// that many connections of one user that never send their patches hold
/// no more than one.
pub const MAX_HELD_BYTES_PER_UID: usize = super::smb::MAX_SIZE;
/// Shared memory buffers one uid's producers may hold in all (the recorder
/// creates them, and its reads can fault their pages in).
pub(crate) const MAX_SHARED_MEMORY_PER_UID: usize = 128 * 1024 * 1024;
/// The smallest buffer given when a uid's room is short of what its
/// producer asked for (the default size).
pub(crate) const MIN_SHARED_MEMORY: usize = 256 * 1024;
/// Closed producers kept one by one for the summary and `recorder query`;
/// the ones after are folded into one line per uid.
pub(crate) const MAX_CLOSED_KEPT: usize = 64;
use crate::transport::log_budget::LogBucket;
pub use crate::transport::log_budget::{LOG_BURST, LOG_INTERVAL};
pub use crate::transport::peer::{MAX_UIDS, OTHER_UIDS};

/// Producer connections the open-file limit allows: what is left after
/// [`FDS_RESERVED`], at [`FDS_PER_CONNECTION`] each, within
/// [`MAX_CONNECTIONS`].
pub(crate) fn connection_budget(open_files: u64) -> usize {
    let spare = open_files.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION;
    usize::try_from(spare)
        .unwrap_or(usize::MAX)
        .min(MAX_CONNECTIONS)
}

/// The soft open-file limit in force.
pub(crate) fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
}

/// Raises the soft open-file limit to the hard one (at start), and returns
/// the soft limit then in force.
pub(crate) fn raise_open_file_limit() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut r = getrlimit(Resource::Nofile);
    if r.current != r.maximum {
        let raised = rustix::process::Rlimit {
            current: r.maximum,
            maximum: r.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => r = raised,
            Err(e) => log::debug!("cannot raise the open-file limit: {e}"),
        }
    }
    // Unlimited (None) is capped by the kernel's nr_open anyway.
    r.current.unwrap_or(1 << 20)
}

/// One limit, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    /// A new connection past `MAX_CONNECTIONS_PER_UID` of its uid.
    ConnectionsPerUid,
    /// A new connection past `MAX_CONNECTIONS` (or the open-file budget)
    /// in all.
    Connections,
    /// A producer or data source name longer than `MAX_NAME_BYTES`.
    NameLength,
    /// A RegisterDataSource past `MAX_DATA_SOURCES` registered.
    DataSources,
    /// A RegisterDataSource past `MAX_REGISTERED_BYTES` of names.
    RegisteredBytes,
    /// A chunk that would open a sequence or trace writer past
    /// `MAX_SEQUENCES` of its producer.
    Sequences,
    /// A chunk that would open a sequence or trace writer past
    /// `MAX_SEQUENCES_PER_UID` of its uid.
    SequencesPerUid,
    /// Bytes held for patches and partial packets past
    /// `MAX_HELD_BYTES_PER_UID` of the uid: they are given up as lost.
    HeldBytes,
    /// Shared memory past `MAX_SHARED_MEMORY_PER_UID` of the uid: a smaller
    /// buffer, or none and the data source is not set up.
    SharedMemory,
    /// A log line past the uid's `LOG_BURST` and rate: counted, not
    /// written.
    LogLines,
    /// Requests on the control and trigger sockets refused (counted there).
    ControlRequests,
    /// Chunks committed for a buffer none of the producer's data source
    /// instances writes into (another session's, or nobody's).
    ForeignBuffer,
}

impl Limit {
    /// Every limit, in declaration order (the order reports list them in).
    pub const ALL: [Limit; 12] = [
        Limit::ConnectionsPerUid,
        Limit::Connections,
        Limit::NameLength,
        Limit::DataSources,
        Limit::RegisteredBytes,
        Limit::Sequences,
        Limit::SequencesPerUid,
        Limit::HeldBytes,
        Limit::SharedMemory,
        Limit::LogLines,
        Limit::ControlRequests,
        Limit::ForeignBuffer,
    ];

    /// Its key in the trace and the summary.
    pub fn key(self) -> &'static str {
        match self {
            Limit::ConnectionsPerUid => "connections_per_uid",
            Limit::Connections => "connections",
            Limit::NameLength => "name_length",
            Limit::DataSources => "data_sources",
            Limit::RegisteredBytes => "registered_bytes",
            Limit::Sequences => "sequences",
            Limit::SequencesPerUid => "sequences_per_uid",
            Limit::HeldBytes => "held_bytes",
            Limit::SharedMemory => "shared_memory",
            Limit::LogLines => "log_lines",
            Limit::ControlRequests => "control_requests",
            Limit::ForeignBuffer => "foreign_buffer_chunks",
        }
    }

    /// The limit of a key (a status from another build may name one this
    /// build does not know: `None`).
    pub(crate) fn from_key(key: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|l| l.key() == key)
    }

    /// What a hit is, for people.
    pub fn what(self) -> &'static str {
        match self {
            Limit::ConnectionsPerUid => "connections refused (too many of this uid)",
            Limit::Connections => "connections refused (too many in all)",
            Limit::NameLength => "names refused (too long)",
            Limit::DataSources => "data sources refused (too many)",
            Limit::RegisteredBytes => "data sources refused (too many name bytes)",
            Limit::Sequences => "chunks refused (too many writers)",
            Limit::SequencesPerUid => "chunks refused (too many writers of this uid)",
            Limit::HeldBytes => {
                "chunks or packets given up (bytes held for patches by this uid used up)"
            }
            Limit::SharedMemory => "data sources not set up (shared memory of this uid used up)",
            Limit::LogLines => "log lines left out",
            Limit::ControlRequests => "control or trigger requests refused",
            Limit::ForeignBuffer => "chunks dropped (for a buffer not its own)",
        }
    }
}

/// Hits of each limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hits([u64; Limit::ALL.len()]);

impl Hits {
    /// Counts `n` hits of `l` (saturating).
    pub fn add(&mut self, l: Limit, n: u64) {
        self.0[l as usize] = self.0[l as usize].saturating_add(n);
    }

    /// The hits of `l`.
    pub fn get(&self, l: Limit) -> u64 {
        self.0[l as usize]
    }

    pub(crate) fn merge(&mut self, other: &Hits) {
        for l in Limit::ALL {
            self.add(l, other.get(l));
        }
    }

    /// No limit was hit.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|n| *n == 0)
    }

    /// The non-zero counts.
    pub fn each(&self) -> impl Iterator<Item = (Limit, u64)> + '_ {
        Limit::ALL
            .into_iter()
            .map(|l| (l, self.get(l)))
            .filter(|(_, n)| *n > 0)
    }
}

/// What one uid (or [`OTHER_UIDS`]) did past the limits, and its closed
/// producers that were not kept one by one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UidReport {
    /// The uid, or `OTHER_UIDS` for the uids past `MAX_UIDS`.
    pub uid: u32,
    /// Its hits of each limit.
    pub hits: Hits,
    /// Closed producers folded here (past [`MAX_CLOSED_KEPT`]).
    pub closed_producers: u64,
    /// What they did in all.
    pub(crate) closed_stats: ProducerStats,
}

/// What one uid's producers hold now, shared by their connections' [`Holds`].
#[derive(Debug, Default)]
struct Held {
    bytes: AtomicUsize,
    sequences: AtomicUsize,
}

/// One connection's share of its uid's holds (bytes held for patches and
/// partial packets, sequences): checked against the uid's room before
/// anything is taken, and given back when the connection goes (dropped).
#[derive(Debug)]
pub struct Holds {
    uid: Arc<Held>,
    bytes: usize,
    sequences: usize,
}

impl Holds {
    /// An account of its own, charged to no uid's (a connection not yet
    /// admitted by a host).
    pub fn alone() -> Self {
        Self {
            uid: Arc::default(),
            bytes: 0,
            sequences: 0,
        }
    }

    /// Bytes this connection may still take: what its uid has left.
    pub fn room(&self) -> usize {
        MAX_HELD_BYTES_PER_UID.saturating_sub(self.uid.bytes.load(Ordering::Relaxed))
    }

    /// Bytes this connection holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// After work that was lent `lent` bytes of room and left `left` of
    /// them (more when it gave bytes back): charges or returns the
    /// difference.
    pub fn settle(&mut self, lent: usize, left: usize) {
        if left <= lent {
            let took = lent - left;
            self.bytes += took;
            self.uid.bytes.fetch_add(took, Ordering::Relaxed);
        } else {
            let gave = (left - lent).min(self.bytes);
            self.bytes -= gave;
            self.uid.bytes.fetch_sub(gave, Ordering::Relaxed);
        }
    }

    /// Takes one sequence, unless the uid has [`MAX_SEQUENCES_PER_UID`].
    pub fn take_sequence(&mut self) -> bool {
        let taken = self
            .uid
            .sequences
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_SEQUENCES_PER_UID).then_some(n + 1)
            })
            .is_ok();
        self.sequences += usize::from(taken);
        taken
    }

    /// Gives one sequence back (its session detached while the connection
    /// stays, as under `recorder serve`).
    pub(crate) fn give_sequence(&mut self) {
        if self.sequences > 0 {
            self.sequences -= 1;
            self.uid.sequences.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        self.uid.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.uid
            .sequences
            .fetch_sub(self.sequences, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Account {
    live: usize,
    held: Arc<Held>,
    /// Bytes of shared memory its producers hold.
    shared_memory: usize,
    hits: Hits,
    closed_producers: u64,
    closed_stats: ProducerStats,
    log: LogBucket,
}

impl Account {
    fn new() -> Self {
        Self {
            live: 0,
            held: Arc::default(),
            shared_memory: 0,
            hits: Hits::default(),
            closed_producers: 0,
            closed_stats: ProducerStats::default(),
            log: LogBucket::default(),
        }
    }
}

/// The accounts of every uid that connected.
#[derive(Debug)]
pub struct Quotas {
    accounts: BTreeMap<u32, Account>,
    live: usize,
    max_connections: usize,
    per_uid: usize,
}

impl Quotas {
    /// At most `max_connections` in all (see [`connection_budget`]) and
    /// `per_uid` per uid.
    pub fn new(max_connections: usize, per_uid: usize) -> Self {
        Self {
            accounts: BTreeMap::new(),
            live: 0,
            max_connections,
            per_uid,
        }
    }

    /// The connections allowed in all.
    pub(crate) fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The account `uid` is charged to (made on first use, within
    /// [`MAX_UIDS`]).
    fn account(&mut self, uid: u32) -> &mut Account {
        let key = if self.accounts.contains_key(&uid) || self.accounts.len() < MAX_UIDS {
            uid
        } else {
            OTHER_UIDS
        };
        self.accounts.entry(key).or_insert_with(Account::new)
    }

    /// Admits a new connection of `uid` (charged to it) or refuses it (the
    /// hit counted against it).
    pub fn admit(&mut self, uid: u32) -> Result<(), Limit> {
        let per_uid = self.per_uid;
        let full = self.live >= self.max_connections;
        let a = self.account(uid);
        let refusal = if a.live >= per_uid {
            Some(Limit::ConnectionsPerUid)
        } else if full {
            Some(Limit::Connections)
        } else {
            None
        };
        match refusal {
            Some(l) => {
                a.hits.add(l, 1);
                Err(l)
            }
            None => {
                a.live += 1;
                self.live += 1;
                Ok(())
            }
        }
    }

    /// A connection of `uid` closed.
    pub fn release(&mut self, uid: u32) {
        let a = self.account(uid);
        if a.live > 0 {
            a.live -= 1;
            self.live = self.live.saturating_sub(1);
        }
    }

    /// Counts hits of `limit` against `uid`.
    pub fn hit(&mut self, uid: u32, limit: Limit, n: u64) {
        if n > 0 {
            self.account(uid).hits.add(limit, n);
        }
    }

    /// Shared memory `uid`'s producers may still be given.
    pub(crate) fn shared_memory_room(&mut self, uid: u32) -> usize {
        MAX_SHARED_MEMORY_PER_UID.saturating_sub(self.account(uid).shared_memory)
    }

    /// `uid`'s producers now hold `bytes` more (`grew`) or fewer.
    pub(crate) fn shared_memory(&mut self, uid: u32, bytes: usize, grew: bool) {
        let a = self.account(uid);
        a.shared_memory = if grew {
            a.shared_memory.saturating_add(bytes)
        } else {
            a.shared_memory.saturating_sub(bytes)
        };
    }

    /// A share of `uid`'s holds for one of its connections.
    pub fn holds(&mut self, uid: u32) -> Holds {
        Holds {
            uid: Arc::clone(&self.account(uid).held),
            bytes: 0,
            sequences: 0,
        }
    }

    /// Bytes `uid`'s producers hold now (for patches, partial packets),
    /// and their sequences.
    pub fn held(&self, uid: u32) -> (usize, usize) {
        self.accounts
            .get(&uid)
            .or_else(|| self.accounts.get(&OTHER_UIDS))
            .map_or((0, 0), |a| {
                (
                    a.held.bytes.load(Ordering::Relaxed),
                    a.held.sequences.load(Ordering::Relaxed),
                )
            })
    }

    /// Adds `hits` to `uid`'s account.
    pub fn add_hits(&mut self, uid: u32, hits: &Hits) {
        self.account(uid).hits.merge(hits);
    }

    /// A closed producer of `uid` not kept one by one.
    pub fn fold_closed(&mut self, uid: u32, stats: &ProducerStats) {
        let a = self.account(uid);
        a.closed_producers += 1;
        a.closed_stats.add_change(&ProducerStats::default(), stats);
    }

    /// Whether a log line caused by `uid` may be written at `now`: `Some`
    /// with how many lines were left out before it, `None` when this one
    /// is left out (and counted).
    pub fn may_log(&mut self, uid: u32, now: Instant) -> Option<u64> {
        let a = self.account(uid);
        let said = a.log.take(now);
        if said.is_none() {
            a.hits.add(Limit::LogLines, 1);
        }
        said
    }

    /// Connections of `uid` open now.
    pub fn live(&self, uid: u32) -> usize {
        self.accounts
            .get(&uid)
            .or_else(|| self.accounts.get(&OTHER_UIDS))
            .map_or(0, |a| a.live)
    }

    /// Connections open now, in all.
    pub fn live_total(&self) -> usize {
        self.live
    }

    /// Every uid with hits or folded producers, by uid.
    pub fn reports(&self) -> Vec<UidReport> {
        self.accounts
            .iter()
            .filter(|(_, a)| !a.hits.is_empty() || a.closed_producers > 0)
            .map(|(uid, a)| UidReport {
                uid: *uid,
                hits: a.hits,
                closed_producers: a.closed_producers,
                closed_stats: a.closed_stats.clone(),
            })
            .collect()
    }

    /// What the folded producers did, in all.
    pub(crate) fn closed_stats(&self) -> (u64, ProducerStats) {
        let mut all = ProducerStats::default();
        let mut n = 0;
        for a in self.accounts.values() {
            n += a.closed_producers;
            all.add_change(&ProducerStats::default(), &a.closed_stats);
        }
        (n, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_names_its_limit() {
        for l in Limit::ALL {
            assert_eq!(Limit::from_key(l.key()), Some(l));
        }
        assert_eq!(Limit::from_key("closed_producers"), None);
    }

    #[test]
    fn the_budget_leaves_the_reserve_and_never_passes_the_cap() {
        assert_eq!(connection_budget(1024), (1024 - 256) / 2);
        assert_eq!(connection_budget(100), 0);
        assert_eq!(connection_budget(1 << 20), MAX_CONNECTIONS);
    }

    #[test]
    fn one_uid_at_its_cap_leaves_the_others_their_room() {
        let mut q = Quotas::new(40, 32);
        for _ in 0..32 {
            q.admit(65534).expect("within the uid's cap");
        }
        assert_eq!(q.admit(65534), Err(Limit::ConnectionsPerUid));
        for _ in 0..8 {
            q.admit(0).expect("root has room");
        }
        assert_eq!(q.admit(1000), Err(Limit::Connections));
        q.release(65534);
        q.admit(1000).expect("room again");
        let r = q.reports();
        let of = |uid| r.iter().find(|u| u.uid == uid).map(|u| u.hits);
        assert_eq!(of(65534).map(|h| h.get(Limit::ConnectionsPerUid)), Some(1));
        assert_eq!(of(1000).map(|h| h.get(Limit::Connections)), Some(1));
        assert_eq!(of(0), None, "root was never refused");
    }

    #[test]
    fn log_lines_come_in_a_burst_then_one_per_interval_and_the_rest_are_counted() {
        let mut q = Quotas::new(10, 10);
        let t0 = Instant::now();
        for _ in 0..LOG_BURST {
            assert_eq!(q.may_log(7, t0), Some(0));
        }
        assert_eq!(q.may_log(7, t0), None);
        assert_eq!(q.may_log(7, t0), None);
        assert_eq!(q.may_log(8, t0), Some(0), "another uid is not charged");
        assert_eq!(q.may_log(7, t0 + LOG_INTERVAL), Some(2));
        assert_eq!(q.reports()[0].hits.get(Limit::LogLines), 2);
    }

    #[test]
    fn shared_memory_is_charged_to_its_uid_and_given_back() {
        let mut q = Quotas::new(10, 10);
        q.shared_memory(7, 100 * 1024 * 1024, true);
        assert_eq!(q.shared_memory_room(7), 28 * 1024 * 1024);
        assert_eq!(q.shared_memory_room(8), MAX_SHARED_MEMORY_PER_UID);
        q.shared_memory(7, 100 * 1024 * 1024, false);
        assert_eq!(q.shared_memory_room(7), MAX_SHARED_MEMORY_PER_UID);
    }

    #[test]
    fn held_bytes_and_sequences_are_one_uids_in_all_and_given_back_when_a_connection_goes() {
        let mut q = Quotas::new(10, 10);
        let mut a = q.holds(7);
        let mut b = q.holds(7);
        let other = q.holds(8);
        let lent = a.room();
        assert_eq!(lent, MAX_HELD_BYTES_PER_UID);
        a.settle(lent, lent - 20 * 1024 * 1024);
        // The uid's other connection sees what is left, another uid all.
        assert_eq!(b.room(), MAX_HELD_BYTES_PER_UID - 20 * 1024 * 1024);
        assert_eq!(other.room(), MAX_HELD_BYTES_PER_UID);
        let lent = b.room();
        b.settle(lent, 0);
        assert_eq!(a.room(), 0);
        assert_eq!(q.held(7).0, MAX_HELD_BYTES_PER_UID);
        // Given back: by work that releases, and by closing.
        a.settle(0, 5);
        assert_eq!(a.bytes(), 20 * 1024 * 1024 - 5);
        drop(a);
        assert_eq!(q.held(7).0, b.bytes());
        drop(b);
        assert_eq!(q.held(7), (0, 0));
        let mut c = q.holds(7);
        let mut d = q.holds(7);
        for _ in 0..MAX_SEQUENCES_PER_UID / 2 {
            assert!(c.take_sequence() && d.take_sequence());
        }
        assert!(!c.take_sequence() && !d.take_sequence());
        assert!(q.holds(8).take_sequence(), "another uid is not charged");
        drop(d);
        assert!(c.take_sequence());
        assert_eq!(q.held(7).1, MAX_SEQUENCES_PER_UID / 2 + 1);
    }

    #[test]
    fn uids_past_the_table_share_one_account() {
        let mut q = Quotas::new(usize::MAX, 1);
        for uid in 0..MAX_UIDS as u32 {
            q.admit(uid).expect("admitted");
        }
        q.admit(5_000_000).expect("the shared account has room");
        assert_eq!(q.admit(5_000_001), Err(Limit::ConnectionsPerUid));
        assert_eq!(q.live(5_000_001), 1);
        q.release(5_000_000);
        assert_eq!(q.live_total(), MAX_UIDS);
    }
}
