//! Oracle for the client's reply parser: any input is either a well-formed
//! reply — within the size bound, and re-encoding it gives a line that
//! decodes to the same reply — or a typed refusal ([`BadReply`]) whose kind
//! matches the input. Never a panic.

use recorder::control::wire::{
    BadReply, MAX_REPLY_BYTES, MAX_REPLY_TEXT_BYTES, MAX_TRIGGER_NAMES, Reply, decode_reply,
    encode_reply,
};

pub fn check(data: &[u8]) {
    match decode_reply(data) {
        Ok(reply) => {
            assert!(data.len() <= MAX_REPLY_BYTES, "accepted an oversized reply");
            let line = encode_reply(&reply);
            assert_eq!(
                decode_reply(&line).as_ref(),
                Ok(&reply),
                "a re-encoded reply must decode the same"
            );
            match &reply {
                Reply::Triggers(o) => assert!(o.len() <= MAX_TRIGGER_NAMES),
                Reply::Refused(m) | Reply::Queued(m) => assert!(m.len() <= MAX_REPLY_TEXT_BYTES),
                Reply::Status(st) => assert!(st.config.len() <= MAX_REPLY_TEXT_BYTES),
                Reply::Stopping | Reply::Started | Reply::Rotated => {}
            }
        }
        Err(BadReply::TooLarge) => assert!(data.len() > MAX_REPLY_BYTES),
        Err(BadReply::NotOneLine) => {
            let line = data.strip_suffix(b"\n").unwrap_or(data);
            assert!(line.contains(&b'\n'));
        }
        Err(BadReply::Truncated) => assert!(data.is_empty() || data == b"\n"),
        Err(BadReply::Malformed(_) | BadReply::Invalid(_)) => {}
    }
}
