//! Model-based oracle for the producer socket's per-uid quotas
//! (`recorder::producer::quota`) and a producer connection's own
//! (`recorder::producer::connection`).
//!
//! Drives a real [`Quotas`] with connects, closes, log lines and folded
//! producers of fuzzed uids, and real [`Connection`]s (over socket pairs)
//! with registrations of fuzzed names, and checks after every step against
//! a model that counts what each uid holds:
//! * Q1: no uid ever holds more connections than its cap, nor all of them
//!   more than the total; a connection is refused exactly when the model
//!   says so, and the hit names the limit the model expects;
//! * Q2: every hit is charged to the uid that caused it and to no other:
//!   the per-uid reports equal the model's counts exactly;
//! * Q3: a connection never holds more data sources, name bytes or longer
//!   names than its quotas allow, and each refused registration is one hit
//!   of the limit the model expects;
//! * Q4: log lines of a uid never pass its burst plus one per interval, and
//!   every line left out is counted against that uid;
//! * Q5: what a uid's connections hold (bytes waiting for patches,
//!   sequences) is the sum of their shares, never passes the uid's cap
//!   however many connections it has, is refused exactly at the cap, is
//!   given back when a connection closes, and never changes another uid's
//!   room.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use recorder::producer::connection::{Connection, Routes};
use recorder::transport::frame::encode_frame;
use recorder::producer::quota::{
    Hits, Holds, LOG_BURST, LOG_INTERVAL, Limit, MAX_DATA_SOURCES, MAX_HELD_BYTES_PER_UID,
    MAX_NAME_BYTES, MAX_REGISTERED_BYTES, MAX_SEQUENCES_PER_UID, Quotas,
};
use recorder::producer::stats::ProducerStats;
use recorder::protos::ipc_frame::{BindService, InvokeMethod, Msg};
use recorder::protos::{self as pb, IpcFrame};
use recorder::ringbuf::Buffer;

/// Uids the model draws from (few, so that caps are reached).
const UIDS: u32 = 4;
/// Real connections at once (each is a socket pair).
const REAL: usize = 3;

/// One step.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Connect {
        uid: u32,
    },
    Close {
        index: usize,
    },
    /// `count` RegisterDataSource calls on live connection `index`, names
    /// `len` bytes long.
    Register {
        index: usize,
        count: u16,
        len: u16,
    },
    Log {
        uid: u32,
        advance_ms: u16,
    },
    Fold {
        uid: u32,
    },
    /// Live connection `index` takes `bytes` for patches (as much as its
    /// uid has room for), or gives back as many of its own.
    Hold {
        index: usize,
        bytes: usize,
        give: bool,
    },
    /// Live connection `index` takes `count` sequences.
    Sequences {
        index: usize,
        count: u16,
    },
}

/// The input as a cap pair and a list of steps.
pub fn decode(data: &[u8]) -> (usize, usize, Vec<Op>) {
    let total = data.first().map_or(4, |b| usize::from(b % 12) + 1);
    let per_uid = data.get(1).map_or(2, |b| usize::from(b % 6) + 1);
    let mut ops = Vec::new();
    let mut rest = data.get(2..).unwrap_or(&[]);
    while let [kind, a, b, c, tail @ ..] = rest {
        rest = tail;
        let uid = u32::from(*a) % UIDS + 65530;
        ops.push(match kind % 7 {
            0 => Op::Connect { uid },
            1 => Op::Close {
                index: usize::from(*a),
            },
            2 => Op::Register {
                index: usize::from(*a),
                count: u16::from(*b) * 2 % 300,
                len: (u16::from(*c) << 3) % (MAX_NAME_BYTES as u16 + 64),
            },
            3 => Op::Log {
                uid,
                advance_ms: u16::from(*b) * 8,
            },
            4 => Op::Fold { uid },
            5 => Op::Hold {
                index: usize::from(*a),
                // Up to 2 caps at once, in steps of 32 KiB (a page).
                bytes: (usize::from(*b) << 8 | usize::from(*c)) % 2049 * (32 * 1024),
                give: kind & 0x80 != 0,
            },
            _ => Op::Sequences {
                index: usize::from(*a),
                count: (u16::from(*b) << 8 | u16::from(*c)) % 5000,
            },
        });
    }
    (total, per_uid, ops)
}

/// What the model knows of each uid.
#[derive(Default, Clone, Debug, PartialEq, Eq)]
struct UidModel {
    live: usize,
    held_bytes: usize,
    sequences: usize,
    hits: BTreeMap<Limit, u64>,
    folded: u64,
    log_tokens: Option<u32>,
    log_since: Option<Instant>,
}

struct Live {
    uid: u32,
    /// The real connection behind it, for the first few.
    real: Option<(Connection, UnixStream)>,
    registered: usize,
    bytes: usize,
    next_rid: u64,
    /// Its share of its uid's holds, and what the model says it holds.
    holds: Holds,
    held: (usize, usize),
}

pub fn check(data: &[u8]) {
    let (total, per_uid, ops) = decode(data);
    let mut q = Quotas::new(total, per_uid);
    let mut model: BTreeMap<u32, UidModel> = BTreeMap::new();
    let mut live: Vec<Live> = Vec::new();
    let mut now = Instant::now();
    for op in ops {
        match op {
            Op::Connect { uid } => {
                let m = model.entry(uid).or_default();
                let expect = if m.live >= per_uid {
                    Err(Limit::ConnectionsPerUid)
                } else if live.len() >= total {
                    Err(Limit::Connections)
                } else {
                    Ok(())
                };
                assert_eq!(q.admit(uid), expect, "Q1: admit uid {uid}");
                match expect {
                    Ok(()) => {
                        m.live += 1;
                        let mut real = (live.iter().filter(|l| l.real.is_some()).count() < REAL)
                            .then(real_connection)
                            .flatten();
                        if let Some((c, _)) = real.as_mut() {
                            c.holds = q.holds(uid);
                        }
                        live.push(Live {
                            uid,
                            real,
                            registered: 0,
                            bytes: 0,
                            next_rid: 3,
                            holds: q.holds(uid),
                            held: (0, 0),
                        });
                    }
                    Err(l) => *m.hits.entry(l).or_default() += 1,
                }
            }
            Op::Close { index } => {
                if live.is_empty() {
                    continue;
                }
                let l = live.remove(index % live.len());
                let m = model.entry(l.uid).or_default();
                m.live -= 1;
                m.held_bytes -= l.held.0;
                m.sequences -= l.held.1;
                if let Some((mut c, _peer)) = l.real {
                    charge(&mut q, l.uid, &mut c);
                }
                q.release(l.uid);
            }
            Op::Register { index, count, len } => {
                if live.is_empty() {
                    continue;
                }
                let n = live.len();
                let l = &mut live[index % n];
                let uid = l.uid;
                let Some((c, peer)) = l.real.as_mut() else {
                    continue;
                };
                let mut wire = Vec::new();
                let mut expect = Hits::default();
                for k in 0..count {
                    let name = format!("{uid}.{:05}.", l.next_rid);
                    let name = format!("{name:x<width$}", width = usize::from(len).max(name.len()));
                    if name.len() > MAX_NAME_BYTES {
                        expect.add(Limit::NameLength, 1);
                    } else if l.registered >= MAX_DATA_SOURCES {
                        expect.add(Limit::DataSources, 1);
                    } else if l.bytes + name.len() > MAX_REGISTERED_BYTES {
                        expect.add(Limit::RegisteredBytes, 1);
                    } else {
                        l.registered += 1;
                        l.bytes += name.len();
                    }
                    wire.extend(register(l.next_rid, &name));
                    l.next_rid += 1;
                    // Written in pieces the connection reads at once.
                    if wire.len() > 32 * 1024 || k + 1 == count {
                        feed(c, peer, &wire);
                        wire.clear();
                    }
                }
                assert!(c.closed.is_none(), "{:?}", c.closed);
                assert_eq!(c.hits, expect, "Q3: the connection's own hits");
                assert_eq!(c.registered.len(), l.registered, "Q3: data sources held");
                assert!(c.registered.len() <= MAX_DATA_SOURCES);
                let held: usize = c.registered.iter().map(|r| r.name.len()).sum();
                assert_eq!(held, l.bytes, "Q3: name bytes held");
                assert!(held <= MAX_REGISTERED_BYTES);
                assert!(c.registered.iter().all(|r| r.name.len() <= MAX_NAME_BYTES));
                let m = model.entry(uid).or_default();
                for (limit, k) in expect.each() {
                    *m.hits.entry(limit).or_default() += k;
                }
                charge(&mut q, uid, c);
            }
            Op::Log { uid, advance_ms } => {
                now += Duration::from_millis(u64::from(advance_ms));
                let m = model.entry(uid).or_default();
                let since = *m.log_since.get_or_insert(now);
                let tokens = m.log_tokens.get_or_insert(LOG_BURST);
                let refills =
                    (now.duration_since(since).as_nanos() / LOG_INTERVAL.as_nanos()) as u32;
                if refills > 0 {
                    *tokens = (*tokens).saturating_add(refills).min(LOG_BURST);
                    m.log_since = Some(now);
                }
                let allowed = q.may_log(uid, now).is_some();
                let tokens = m.log_tokens.get_or_insert(LOG_BURST);
                assert_eq!(allowed, *tokens > 0, "Q4: uid {uid}'s log quota");
                if allowed {
                    *tokens -= 1;
                } else {
                    *m.hits.entry(Limit::LogLines).or_default() += 1;
                }
            }
            Op::Fold { uid } => {
                q.fold_closed(uid, &ProducerStats::default());
                model.entry(uid).or_default().folded += 1;
            }
            Op::Hold { index, bytes, give } => {
                if live.is_empty() {
                    continue;
                }
                let n = live.len();
                let l = &mut live[index % n];
                let m = model.entry(l.uid).or_default();
                let room = l.holds.room();
                assert_eq!(
                    room,
                    MAX_HELD_BYTES_PER_UID - m.held_bytes,
                    "Q5: uid's room"
                );
                if give {
                    let back = bytes.min(l.held.0);
                    l.holds.settle(room, room + back);
                    l.held.0 -= back;
                    m.held_bytes -= back;
                } else {
                    let took = bytes.min(room);
                    l.holds.settle(room, room - took);
                    l.held.0 += took;
                    m.held_bytes += took;
                }
                assert_eq!(l.holds.bytes(), l.held.0, "Q5: the connection's share");
            }
            Op::Sequences { index, count } => {
                if live.is_empty() {
                    continue;
                }
                let n = live.len();
                let l = &mut live[index % n];
                let m = model.entry(l.uid).or_default();
                for _ in 0..count {
                    let expect = m.sequences < MAX_SEQUENCES_PER_UID;
                    assert_eq!(
                        l.holds.take_sequence(),
                        expect,
                        "Q5: sequence of uid {}",
                        l.uid
                    );
                    if expect {
                        m.sequences += 1;
                        l.held.1 += 1;
                    }
                }
            }
        }
        // Q1, Q2 after every step.
        assert_eq!(q.live_total(), live.len());
        assert!(q.live_total() <= total);
        for (uid, m) in &model {
            assert_eq!(q.live(*uid), m.live, "Q1: uid {uid}'s connections");
            assert!(m.live <= per_uid);
            assert_eq!(
                q.held(*uid),
                (m.held_bytes, m.sequences),
                "Q5: uid {uid}'s holds"
            );
            assert!(m.held_bytes <= MAX_HELD_BYTES_PER_UID);
            assert!(m.sequences <= MAX_SEQUENCES_PER_UID);
        }
        let reports: BTreeMap<u32, _> = q.reports().into_iter().map(|r| (r.uid, r)).collect();
        for (uid, m) in &model {
            let got = reports.get(uid);
            for l in Limit::ALL {
                let want = m.hits.get(&l).copied().unwrap_or(0);
                let have = got.map_or(0, |r| r.hits.get(l));
                assert_eq!(have, want, "Q2: uid {uid}'s {l:?} hits");
            }
            assert_eq!(got.map_or(0, |r| r.closed_producers), m.folded);
        }
        assert!(
            reports.keys().all(|u| model.contains_key(u)),
            "Q2: a uid charged that did nothing"
        );
    }
}

/// Moves a real connection's hits to the model's uid of it, as the host
/// charges the peer's (a socket pair's peer is always us).
fn charge(q: &mut Quotas, uid: u32, c: &mut Connection) {
    let hits = std::mem::take(&mut c.hits);
    q.add_hits(uid, &hits);
    c.log_lines.clear();
}

/// A connection that has bound and initialized, with its peer.
fn real_connection() -> Option<(Connection, UnixStream)> {
    let (ours, peer) = UnixStream::pair().ok()?;
    let mut c = Connection::new(1, ours).ok()?;
    let init = pb::InitializeConnectionRequest {
        producer_name: Some("model".into()),
        ..Default::default()
    }
    .encode_to_vec();
    let mut wire = frame(
        1,
        Msg::MsgBindService(BindService {
            service_name: Some("ProducerPort".into()),
        }),
    );
    wire.extend(invoke(2, 1, init));
    let mut peer = peer;
    feed(&mut c, &mut peer, &wire);
    c.name.as_ref()?;
    Some((c, peer))
}

fn frame(rid: u64, msg: Msg) -> Vec<u8> {
    encode_frame(&IpcFrame {
        request_id: Some(rid),
        msg: Some(msg),
        data_for_testing: Vec::new(),
    })
    .unwrap_or_default()
}

fn invoke(rid: u64, method: u32, args: Vec<u8>) -> Vec<u8> {
    frame(
        rid,
        Msg::MsgInvokeMethod(InvokeMethod {
            service_id: Some(1),
            method_id: Some(method),
            args_proto: Some(args),
            drop_reply: Some(true),
        }),
    )
}

fn register(rid: u64, name: &str) -> Vec<u8> {
    let req = pb::RegisterDataSourceRequest {
        data_source_descriptor: Some(pb::ProducerDataSourceDescriptor {
            name: Some(name.into()),
            ..Default::default()
        }),
    };
    invoke(rid, 2, req.encode_to_vec())
}

/// No session attached: every buffer id is nobody's (the model checks
/// admission and names, not routing).
struct NoSession;

impl Routes for NoSession {
    fn ring(&mut self, _: u32) -> Option<(&Arc<Buffer>, &mut u32)> {
        None
    }
    fn account(&mut self, _: u32, _: u32, _: &ProducerStats, _: &ProducerStats) {}
}

/// Writes `wire` to the connection's peer, lets the connection read all of
/// it, and takes its replies.
fn feed(c: &mut Connection, peer: &mut UnixStream, wire: &[u8]) {
    let _ = peer.set_nonblocking(true);
    let mut sink = [0u8; 64 * 1024];
    for piece in wire.chunks(32 * 1024) {
        peer.write_all(piece).expect("a socket pair takes 32 KiB");
        c.read(&mut NoSession);
        while matches!(std::io::Read::read(peer, &mut sink), Ok(n) if n > 0) {}
    }
}
