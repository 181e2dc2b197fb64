//! Control requests and replies: one JSON line each way. Everything read
//! from a socket is untrusted until [`decode_request`] (in a session) or
//! [`decode_reply`] (in a client) has checked it: size, shape, counts and
//! lengths. A request is an object tagged by `op`, so new operations add a
//! variant without changing the existing ones.
//!
//! Fuzz targets: `control_message` (requests) and `control_reply` (the
//! client's reply parser: a well-formed reply that re-encodes to itself, or
//! a typed [`BadReply`]); `cd fuzz && cargo +nightly fuzz run control_reply
//! -- -max_total_time=300` ran clean for 301 s, 3.48 M runs.

use serde::{Deserialize, Serialize};

/// Longest request accepted, newline included.
pub(crate) const MAX_REQUEST_BYTES: usize = 4096;
/// Most trigger names in one request.
pub const MAX_TRIGGER_NAMES: usize = 64;
/// Longest trigger (or producer) name.
pub(crate) const MAX_NAME_BYTES: usize = 256;
/// Longest reply a client reads, newline included.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;
/// Longest text in a reply (a path, a state, a refusal).
pub const MAX_REPLY_TEXT_BYTES: usize = 8192;
/// Most buffers in a status reply (as many as a config may have).
pub(crate) const MAX_REPLY_BUFFERS: usize = 128;
/// Limits one uid's quota figures name at most in a status.
pub(crate) const MAX_QUOTA_LIMITS: usize = 32;

/// Which socket a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Anyone may connect: triggers only.
    Trigger,
    /// Owner and root: query and stop (and triggers).
    Control,
}

/// A request from a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Fire triggers; `producer` is the sender's self-declared producer name
    /// (matched by `producer_name_regex`); its uid comes from the socket.
    Trigger {
        /// The triggers to fire (1 to [`MAX_TRIGGER_NAMES`]), as the
        /// config's `trigger_config` names them.
        names: Vec<String>,
        /// The sender's producer name.
        producer: String,
    },
    /// Ask for the session's status: answered by [`Reply::Status`].
    Query {},
    /// Stop the session as its duration would: flush, write what is left
    /// and end. Answered by [`Reply::Stopping`].
    Stop {},
    /// Start a `deferred_start` session.
    Start {},
    /// Close the segment being written and open the next.
    Rotate {},
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// More than [`MAX_REQUEST_BYTES`] arrived before the newline.
    #[error("request larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    /// The line is not JSON, or not a request object (an unknown `op` or
    /// an unknown field included).
    #[error("request is not one JSON line: {0}")]
    Malformed(#[source] JsonError),
    /// A newline before the end: one connection carries one request.
    #[error("request is not one JSON line: more than one line")]
    NotOneLine,
    /// The request could not be read: the errno (an `io::Error` is neither
    /// `Clone` nor `Eq`, which a refusal is).
    #[error("request is not one JSON line: reading the request: {}", std::io::Error::from(*.0))]
    Unread(rustix::io::Errno),
    /// A trigger or producer name that is empty, too long, or holds a
    /// space or a non-printable byte; the name as sent.
    #[error("invalid name {0:?}: 1 to {MAX_NAME_BYTES} printable, non-space ASCII characters")]
    BadName(String),
    /// A trigger request with no names, or more than
    /// [`MAX_TRIGGER_NAMES`].
    #[error("no trigger names given, or more than {MAX_TRIGGER_NAMES}")]
    NameCount,
    /// An owner-only request (query, stop, start, rotate) on the trigger
    /// socket.
    #[error("this socket accepts triggers only")]
    NotAllowedHere,
    /// An owner-only request on the control socket from a uid that is
    /// neither the session's owner nor root.
    #[error("permission denied: only the session's owner or root may do this")]
    PermissionDenied,
    /// The whole request line did not arrive within the deadline, in ms.
    #[error("request not complete within {0} ms")]
    Slow(u64),
    /// The peer's uid holds its cap of connections at once (the cap given):
    /// sent to the oldest one pushed out, or to the new one when none can
    /// be.
    #[error("too many connections from your uid (at most {0} at once): the oldest was dropped")]
    TooManyConnections(usize),
    /// The session cannot take the request now: too many queued, or it is
    /// ending or shutting down (the reason given).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The peer closed the connection without sending a byte; nothing is
    /// answered.
    #[error("the connection closed without a request")]
    Empty,
}

pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_BYTES && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Decodes and checks one request line (without or with its newline).
pub fn decode_request(untrusted: &[u8], endpoint: Endpoint) -> Result<Request, Refusal> {
    if untrusted.len() > MAX_REQUEST_BYTES {
        return Err(Refusal::TooLarge);
    }
    let line = untrusted.strip_suffix(b"\n").unwrap_or(untrusted);
    if line.contains(&b'\n') {
        return Err(Refusal::NotOneLine);
    }
    let req: Request =
        serde_json::from_slice(line).map_err(|e| Refusal::Malformed(JsonError::from(e)))?;
    match &req {
        Request::Trigger { names, producer } => {
            if names.is_empty() || names.len() > MAX_TRIGGER_NAMES {
                return Err(Refusal::NameCount);
            }
            if let Some(bad) = names
                .iter()
                .chain(std::iter::once(producer))
                .find(|n| !valid_name(n))
            {
                return Err(Refusal::BadName(bad.clone()));
            }
        }
        Request::Query {} | Request::Stop {} | Request::Start {} | Request::Rotate {} => {}
    }
    if req.owner_only() && endpoint == Endpoint::Trigger {
        return Err(Refusal::NotAllowedHere);
    }
    Ok(req)
}

impl Request {
    /// Whether only the session's owner or root may make this request (on
    /// the control socket); anyone may fire triggers.
    pub(crate) fn owner_only(&self) -> bool {
        match self {
            Request::Trigger { .. } => false,
            Request::Query {} | Request::Stop {} | Request::Start {} | Request::Rotate {} => true,
        }
    }
}

/// Encodes a request as one line.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut v = serde_json::to_vec(req).unwrap_or_default();
    v.push(b'\n');
    v
}

/// The outcome of one trigger name at one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerOutcome {
    /// The trigger name, as asked.
    pub name: String,
    /// Whether the session took the trigger and will act on it.
    pub accepted: bool,
    /// Why not, when refused (`not_listed`, `skipped`, `rate_limited`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One buffer's live figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BufferStatus {
    /// The buffer's index in the config's `buffers`.
    pub index: u32,
    /// Its fill policy: `RING_BUFFER` or `DISCARD`.
    pub policy: String,
    /// Its size.
    pub size_bytes: u64,
    pub(crate) buffered_bytes: u64,
    /// Bytes data sources and producers have committed to it.
    pub bytes_written: u64,
    /// Unread bytes lost to a ring buffer wrapping over them.
    pub bytes_overwritten: u64,
    /// Bytes of packets dropped because no chunk could be had (a full
    /// `DISCARD` buffer, among others).
    pub bytes_discarded: u64,
    pub(crate) packets_lost: u64,
}

/// A live session's status, as `recorder query` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The recording process.
    pub pid: u32,
    /// The session's uid; a client replaces it with the uid the kernel
    /// gives for the socket's peer, not trusting the session's word.
    pub uid: u32,
    /// Where the config came from: its path, `stdin`, or the consumer it
    /// was received from.
    pub config: String,
    /// Where the trace goes: the output's path, or what stands for it.
    pub output: String,
    /// `waiting for trigger`, `recording`, `stopping`.
    pub state: String,
    pub(crate) elapsed_ms: u64,
    /// Bytes in the output so far, as its sink knows them.
    pub bytes_written: u64,
    /// Every buffer of the session, in config order.
    pub buffers: Vec<BufferStatus>,
    pub(crate) control_requests_refused: u64,
    /// Segmented output: the segments so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<Box<crate::storage::segment::SegmentsStatus>>,
    /// Where Perfetto SDK apps connect, when the session listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) producer_socket: Option<String>,
    /// The apps that connected (at most [`MAX_PRODUCERS_SHOWN`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producers: Vec<ProducerStatus>,
    /// Per-uid quota figures (at most [`MAX_QUOTA_UIDS_SHOWN`] uids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<UidQuotaStatus>,
    /// The trigger rules the session fires itself, and what each did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleStatus>,
}

/// Rules a status lists at most (as many as a session may have).
pub(crate) const MAX_RULES_SHOWN: usize = 256;
/// Characters of a rule's text a status shows at most.
pub(crate) const MAX_RULE_TEXT_SHOWN: usize = 160;

/// One trigger rule of a live session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleStatus {
    /// The rule's name (the trigger a `then trigger` rule fires).
    pub name: String,
    /// The rule as written (cut to [`MAX_RULE_TEXT_SHOWN`] characters).
    pub text: String,
    /// Times its condition held.
    pub matched: u64,
    pub(crate) suppressed: u64,
    /// Firings: matches that its count and rate let through.
    pub fired: u64,
    /// Firings the session acted on.
    pub accepted: u64,
}

/// Producers a status lists at most (the reply stays small).
pub(crate) const MAX_PRODUCERS_SHOWN: usize = 64;
/// Uids a status lists quota figures of at most: the ones with the most
/// hits (the reply stays small).
pub(crate) const MAX_QUOTA_UIDS_SHOWN: usize = 64;

/// One uid's quota figures in a live session, as the summary shows them
/// (`producer::quota`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UidQuotaStatus {
    /// The producers' uid.
    pub uid: u32,
    /// Hits by limit key (`producer::quota::Limit::key`), non-zero ones only.
    pub hits: Vec<(String, u64)>,
    /// Its closed producers folded into one line, and what they wrote.
    #[serde(default)]
    pub closed_producers: u64,
    #[serde(default)]
    pub(crate) closed_packets: u64,
    #[serde(default)]
    pub(crate) closed_bytes: u64,
}

impl UidQuotaStatus {
    /// The figures of every uid in `reports`, at most
    /// [`MAX_QUOTA_UIDS_SHOWN`] (those with the most hits), by uid.
    pub fn of(reports: &[crate::producer::quota::UidReport]) -> Vec<UidQuotaStatus> {
        let total = |r: &crate::producer::quota::UidReport| {
            r.hits
                .each()
                .fold(r.closed_producers, |a, (_, n)| a.saturating_add(n))
        };
        let mut v: Vec<_> = reports.iter().collect();
        v.sort_by_key(|r| std::cmp::Reverse(total(r)));
        v.truncate(MAX_QUOTA_UIDS_SHOWN);
        v.sort_by_key(|r| r.uid);
        v.into_iter()
            .map(|r| UidQuotaStatus {
                uid: r.uid,
                hits: r
                    .hits
                    .each()
                    .map(|(l, n)| (l.key().to_string(), n))
                    .collect(),
                closed_producers: r.closed_producers,
                closed_packets: r.closed_stats.packets,
                closed_bytes: r.closed_stats.bytes,
            })
            .collect()
    }
}

/// One producer (a Perfetto SDK app) of a live session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProducerStatus {
    /// The name the producer gave itself when it connected.
    pub name: String,
    /// Its process, as the kernel reports the socket's peer.
    pub pid: u32,
    /// Its user, as the kernel reports the socket's peer.
    pub uid: u32,
    /// The data sources it registered, by name.
    pub data_sources: Vec<String>,
    /// Packets stored from it.
    pub packets: u64,
    /// Their bytes (without the trusted fields the recorder adds).
    pub bytes: u64,
    /// Chunks and packets refused or lost on the way in.
    pub refused: u64,
    /// Whether it is still connected.
    pub connected: bool,
    /// What was refused or lost, by reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub losses: Vec<(String, u64)>,
    /// Chunks read by scraping before their commit.
    #[serde(default)]
    pub(crate) chunks_scraped: u64,
}

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// To a trigger request: one outcome per name asked, in order.
    Triggers(Vec<TriggerOutcome>),
    /// To a query: the session's status.
    Status(Box<SessionStatus>),
    /// To a stop: the session is stopping (or already was).
    Stopping,
    /// A `deferred_start` session started.
    Started,
    /// The segment was closed and the next opened.
    Rotated,
    /// The request was refused; why, for people.
    Refused(String),
    /// The session is busy: the request waits in its queue and will be
    /// acted on, but no answer came in time.
    Queued(String),
}

/// Encodes a reply as one line.
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut v = serde_json::to_vec(reply).unwrap_or_default();
    v.push(b'\n');
    v
}

/// Why a client does not believe a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadReply {
    /// More than [`MAX_REPLY_BYTES`] arrived.
    #[error("reply larger than {MAX_REPLY_BYTES} bytes")]
    TooLarge,
    /// The reply is empty: the session closed the connection before a
    /// line came.
    #[error("the reply ended before its newline")]
    Truncated,
    /// A newline before the end: a reply is one line.
    #[error("more than one line")]
    NotOneLine,
    /// The line is not JSON, or not a [`Reply`].
    #[error("not a reply: {0}")]
    Malformed(#[source] JsonError),
    /// The reply decoded but cannot be believed.
    #[error("{0}")]
    Invalid(InvalidReply),
}

/// A reply that decoded but breaks a bound or names what was not asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReply {
    /// A text over [`MAX_REPLY_TEXT_BYTES`]; which one (`config`, `output`,
    /// `state`, `policy`, `rule`, `refusal`, ...).
    #[error("{0} longer than {MAX_REPLY_TEXT_BYTES} bytes")]
    TextTooLong(&'static str),
    /// More trigger outcomes than a request may name; how many.
    #[error("{0} trigger outcomes; a request has at most {MAX_TRIGGER_NAMES}")]
    TooManyOutcomes(usize),
    /// The name as the session sent it.
    #[error("outcome for an invalid trigger name {0:?}")]
    BadName(String),
    /// The reason as the session sent it.
    #[error("invalid reason {0:?}")]
    BadReason(String),
    /// A status with more buffers than a config may have; how many.
    #[error("{0} buffers; a session has at most {MAX_REPLY_BUFFERS}")]
    TooManyBuffers(usize),
    /// A status with quota figures of too many uids, or of too many limits
    /// for one uid; how many uids.
    #[error(
        "quota figures of {0} uids; a status has at most {MAX_QUOTA_UIDS_SHOWN}, of at most {MAX_QUOTA_LIMITS} limits each"
    )]
    TooManyQuotas(usize),
    /// A status with more rules than a session may have; how many.
    #[error("{0} rules; a session has at most {MAX_RULES_SHOWN}")]
    TooManyRules(usize),
    /// Trigger outcomes that are not one per name sent, in order.
    #[error("outcomes for names that were not sent")]
    UnaskedOutcomes,
    /// The name of the request asked.
    #[error("unexpected reply to a {0} request")]
    Unexpected(&'static str),
}

/// serde_json's error, shared so that the errors holding it stay `Clone`;
/// two are equal when worded alike.
#[derive(Clone, Debug)]
pub struct JsonError(std::sync::Arc<serde_json::Error>);

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        JsonError(std::sync::Arc::new(e))
    }
}

impl PartialEq for JsonError {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for JsonError {}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for JsonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

fn check_text(what: &'static str, s: &str) -> Result<(), BadReply> {
    if s.len() > MAX_REPLY_TEXT_BYTES {
        return Err(BadReply::Invalid(InvalidReply::TextTooLong(what)));
    }
    Ok(())
}

/// Checks a decoded reply's counts and lengths.
fn check_reply(r: &Reply) -> Result<(), BadReply> {
    match r {
        Reply::Triggers(outcomes) => {
            if outcomes.len() > MAX_TRIGGER_NAMES {
                return Err(BadReply::Invalid(InvalidReply::TooManyOutcomes(
                    outcomes.len(),
                )));
            }
            for o in outcomes {
                if !valid_name(&o.name) {
                    return Err(BadReply::Invalid(InvalidReply::BadName(o.name.clone())));
                }
                if let Some(why) = &o.reason
                    && !valid_name(why)
                {
                    return Err(BadReply::Invalid(InvalidReply::BadReason(why.clone())));
                }
            }
        }
        Reply::Status(st) => {
            for (what, s) in [
                ("config", &st.config),
                ("output", &st.output),
                ("state", &st.state),
            ] {
                check_text(what, s)?;
            }
            if st.buffers.len() > MAX_REPLY_BUFFERS {
                return Err(BadReply::Invalid(InvalidReply::TooManyBuffers(
                    st.buffers.len(),
                )));
            }
            for b in &st.buffers {
                check_text("policy", &b.policy)?;
            }
            if st.quotas.len() > MAX_QUOTA_UIDS_SHOWN
                || st.quotas.iter().any(|q| q.hits.len() > MAX_QUOTA_LIMITS)
            {
                return Err(BadReply::Invalid(InvalidReply::TooManyQuotas(
                    st.quotas.len(),
                )));
            }
            for q in &st.quotas {
                for (key, _) in &q.hits {
                    check_text("quota limit", key)?;
                }
            }
            if st.rules.len() > MAX_RULES_SHOWN {
                return Err(BadReply::Invalid(InvalidReply::TooManyRules(
                    st.rules.len(),
                )));
            }
            for r in &st.rules {
                check_text("rule", &r.text)?;
                check_text("rule name", &r.name)?;
            }
        }
        Reply::Refused(msg) | Reply::Queued(msg) => check_text("refusal", msg)?,
        Reply::Stopping | Reply::Started | Reply::Rotated => {}
    }
    Ok(())
}

/// Decodes and checks a reply: exactly one line (the newline may be
/// missing only at the end of the stream) of at most [`MAX_REPLY_BYTES`].
pub fn decode_reply(untrusted: &[u8]) -> Result<Reply, BadReply> {
    if untrusted.len() > MAX_REPLY_BYTES {
        return Err(BadReply::TooLarge);
    }
    let line = untrusted.strip_suffix(b"\n").unwrap_or(untrusted);
    if line.contains(&b'\n') {
        return Err(BadReply::NotOneLine);
    }
    if line.is_empty() {
        return Err(BadReply::Truncated);
    }
    let reply: Reply =
        serde_json::from_slice(line).map_err(|e| BadReply::Malformed(JsonError::from(e)))?;
    check_reply(&reply)?;
    Ok(reply)
}

/// `s` with control characters escaped, for a terminal: text from another
/// user's session must not drive it.
pub(crate) fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        crate::transport::log_budget::push_escaped(&mut out, c, c.is_control());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let req = Request::Trigger {
            names: vec!["a.b-c".into()],
            producer: "app".into(),
        };
        let enc = encode_request(&req);
        assert_eq!(decode_request(&enc, Endpoint::Trigger), Ok(req));
        assert_eq!(
            decode_request(&encode_request(&Request::Stop {}), Endpoint::Trigger),
            Err(Refusal::NotAllowedHere)
        );
        assert_eq!(
            decode_request(&encode_request(&Request::Query {}), Endpoint::Control),
            Ok(Request::Query {})
        );
        assert_eq!(
            decode_request(&vec![b' '; MAX_REQUEST_BYTES + 1], Endpoint::Control),
            Err(Refusal::TooLarge)
        );
        let bad = br#"{"op":"trigger","names":["has space"],"producer":"p"}"#;
        assert!(matches!(
            decode_request(bad, Endpoint::Trigger),
            Err(Refusal::BadName(_))
        ));
        let none = br#"{"op":"trigger","names":[],"producer":"p"}"#;
        assert_eq!(
            decode_request(none, Endpoint::Trigger),
            Err(Refusal::NameCount)
        );
        let extra = br#"{"op":"query","x":1}"#;
        assert!(matches!(
            decode_request(extra, Endpoint::Control),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            decode_request(b"\xff\xfe", Endpoint::Control),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn replies_round_trip() {
        for r in [
            Reply::Stopping,
            Reply::Started,
            Reply::Refused("no".into()),
            Reply::Queued("busy".into()),
            Reply::Triggers(vec![TriggerOutcome {
                name: "t".into(),
                accepted: false,
                reason: Some("skipped".into()),
            }]),
            Reply::Status(Box::new(SessionStatus {
                pid: 7,
                ..Default::default()
            })),
            Reply::Status(Box::new(SessionStatus {
                pid: 8,
                quotas: vec![UidQuotaStatus {
                    uid: 65534,
                    hits: vec![("held_bytes".into(), 3)],
                    closed_producers: 1,
                    ..UidQuotaStatus::default()
                }],
                ..Default::default()
            })),
        ] {
            assert_eq!(decode_reply(&encode_reply(&r)), Ok(r));
        }
    }

    #[test]
    fn hostile_replies_are_refused_by_kind() {
        assert_eq!(
            decode_reply(&vec![b' '; MAX_REPLY_BYTES + 1]),
            Err(BadReply::TooLarge)
        );
        assert_eq!(decode_reply(b""), Err(BadReply::Truncated));
        assert_eq!(
            decode_reply(b"\"stopping\"\n\"stopping\"\n"),
            Err(BadReply::NotOneLine)
        );
        assert!(matches!(
            decode_reply(b"{\"stopping\""),
            Err(BadReply::Malformed(_))
        ));
        let many: Vec<TriggerOutcome> = (0..=MAX_TRIGGER_NAMES)
            .map(|i| TriggerOutcome {
                name: format!("t{i}"),
                accepted: true,
                reason: None,
            })
            .collect();
        assert!(matches!(
            decode_reply(&encode_reply(&Reply::Triggers(many))),
            Err(BadReply::Invalid(_))
        ));
        let crowded = SessionStatus {
            quotas: vec![UidQuotaStatus::default(); MAX_QUOTA_UIDS_SHOWN + 1],
            ..SessionStatus::default()
        };
        assert!(matches!(
            decode_reply(&encode_reply(&Reply::Status(Box::new(crowded)))),
            Err(BadReply::Invalid(_))
        ));
        let long = Reply::Refused("x".repeat(MAX_REPLY_TEXT_BYTES + 1));
        assert!(matches!(
            decode_reply(&encode_reply(&long)),
            Err(BadReply::Invalid(_))
        ));
        assert_eq!(printable("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
    }
}
