//! Control requests and replies: one JSON line each way. Everything read
//! from a socket is untrusted until [`decode_request`] has checked it.

use serde::{Deserialize, Serialize};

/// Longest request accepted, newline included.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Most trigger names in one request.
pub const MAX_TRIGGER_NAMES: usize = 64;
/// Longest trigger (or producer) name.
pub const MAX_NAME_BYTES: usize = 256;

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
        names: Vec<String>,
        producer: String,
    },
    Query {},
    Stop {},
    /// Start a `deferred_start` session.
    Start {},
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("request larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    #[error("request is not one JSON line: {0}")]
    Malformed(String),
    #[error("invalid name {0:?}: 1 to {MAX_NAME_BYTES} printable, non-space ASCII characters")]
    BadName(String),
    #[error("no trigger names given, or more than {MAX_TRIGGER_NAMES}")]
    NameCount,
    #[error("this socket accepts triggers only")]
    NotAllowedHere,
    #[error("permission denied: only the session's owner or root may do this")]
    PermissionDenied,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_BYTES && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Decodes and checks one request line (without or with its newline).
pub fn decode_request(untrusted: &[u8], endpoint: Endpoint) -> Result<Request, Refusal> {
    if untrusted.len() > MAX_REQUEST_BYTES {
        return Err(Refusal::TooLarge);
    }
    let line = untrusted.strip_suffix(b"\n").unwrap_or(untrusted);
    if line.contains(&b'\n') {
        return Err(Refusal::Malformed("more than one line".into()));
    }
    let req: Request =
        serde_json::from_slice(line).map_err(|e| Refusal::Malformed(e.to_string()))?;
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
        Request::Query {} | Request::Stop {} | Request::Start {}
            if endpoint == Endpoint::Trigger =>
        {
            return Err(Refusal::NotAllowedHere);
        }
        Request::Query {} | Request::Stop {} | Request::Start {} => {}
    }
    Ok(req)
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
    pub name: String,
    pub accepted: bool,
    /// Why not, when refused (`not_listed`, `skipped`, `rate_limited`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One buffer's live figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BufferStatus {
    pub index: u32,
    pub policy: String,
    pub size_bytes: u64,
    pub buffered_bytes: u64,
    pub bytes_written: u64,
    pub bytes_overwritten: u64,
    pub bytes_discarded: u64,
    pub packets_lost: u64,
}

/// A live session's status, as `recorder query` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub pid: u32,
    pub uid: u32,
    pub config: String,
    pub output: String,
    /// `waiting for trigger`, `recording`, `stopping`.
    pub state: String,
    pub elapsed_ms: u64,
    pub bytes_written: u64,
    pub buffers: Vec<BufferStatus>,
    pub control_requests_refused: u64,
}

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Triggers(Vec<TriggerOutcome>),
    Status(SessionStatus),
    Stopping,
    /// A `deferred_start` session started.
    Started,
    Refused(String),
}

/// Encodes a reply as one line.
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut v = serde_json::to_vec(reply).unwrap_or_default();
    v.push(b'\n');
    v
}

/// Decodes a reply line.
pub fn decode_reply(untrusted: &[u8]) -> Result<Reply, String> {
    let line = untrusted.strip_suffix(b"\n").unwrap_or(untrusted);
    serde_json::from_slice(line).map_err(|e| e.to_string())
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
            Reply::Triggers(vec![TriggerOutcome {
                name: "t".into(),
                accepted: false,
                reason: Some("skipped".into()),
            }]),
            Reply::Status(SessionStatus {
                pid: 7,
                ..Default::default()
            }),
        ] {
            assert_eq!(decode_reply(&encode_reply(&r)), Ok(r));
        }
    }
}
