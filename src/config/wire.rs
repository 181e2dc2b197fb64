//! Wire-level access to config bytes, for what must not go through a decode and
//! re-encode: each data source's `DataSourceConfig` reaches the source exactly as
//! the user wrote it (unknown fields, field order and all), apart from the
//! service-owned core fields (facts §2), which are rewritten here.

use thiserror::Error;

/// A malformed protobuf byte string.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum WireError {
    /// A varint ran past the end of the input or over 10 bytes.
    #[error("truncated or overlong varint at byte {0}")]
    BadVarint(usize),
    /// A length-delimited or fixed-size field ran past the end of the input.
    #[error("field at byte {0} runs past the end of the message")]
    Truncated(usize),
    /// A stray end-group tag, or wire types 6 and 7 (which do not exist).
    #[error("unsupported wire type {wire_type} at byte {at}")]
    WireType {
        /// The wire type found.
        wire_type: u8,
        /// Offset of the tag.
        at: usize,
    },
}

/// One top-level field of a message, as byte ranges into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawField {
    /// Field number.
    pub number: u32,
    /// Wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
    pub wire_type: u8,
    /// The whole field: tag and value.
    pub whole: (usize, usize),
    /// The value only (for length-delimited fields, without the length).
    pub value: (usize, usize),
}

fn read_varint(buf: &[u8], mut pos: usize) -> Result<(u64, usize), WireError> {
    let start = pos;
    let mut v: u64 = 0;
    for shift in (0..70).step_by(7) {
        let b = *buf.get(pos).ok_or(WireError::BadVarint(start))?;
        pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((v, pos));
        }
    }
    Err(WireError::BadVarint(start))
}

/// Skips the body of group `number` starting at `pos`; returns the offset just
/// past its end-group tag.
fn skip_group(buf: &[u8], mut pos: usize, number: u32) -> Result<usize, WireError> {
    let start = pos;
    let mut depth = vec![number];
    while let Some(&open) = depth.last() {
        if pos >= buf.len() {
            return Err(WireError::Truncated(start));
        }
        let tag_at = pos;
        let (tag, p) = read_varint(buf, pos)?;
        pos = p;
        let n = u32::try_from(tag >> 3).map_err(|_| WireError::BadVarint(tag_at))?;
        match tag & 7 {
            0 => pos = read_varint(buf, pos)?.1,
            1 | 5 => {
                let len = if tag & 7 == 1 { 8 } else { 4 };
                if buf.len() - pos < len {
                    return Err(WireError::Truncated(tag_at));
                }
                pos += len;
            }
            2 => {
                let (len, p) = read_varint(buf, pos)?;
                let len = usize::try_from(len).map_err(|_| WireError::Truncated(tag_at))?;
                if buf.len() - p < len {
                    return Err(WireError::Truncated(tag_at));
                }
                pos = p + len;
            }
            3 => depth.push(n),
            4 if n == open => {
                depth.pop();
            }
            w => {
                return Err(WireError::WireType {
                    wire_type: w as u8,
                    at: tag_at,
                });
            }
        }
    }
    Ok(pos)
}

/// Splits a message into its top-level fields, in wire order.
pub fn fields(buf: &[u8]) -> Result<Vec<RawField>, WireError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let (tag, p) = read_varint(buf, pos)?;
        pos = p;
        let wire_type = (tag & 7) as u8;
        let number = u32::try_from(tag >> 3).map_err(|_| WireError::BadVarint(start))?;
        let value = match wire_type {
            0 => {
                let (_, p) = read_varint(buf, pos)?;
                (pos, p)
            }
            1 | 5 => {
                let n = if wire_type == 1 { 8 } else { 4 };
                if buf.len() - pos < n {
                    return Err(WireError::Truncated(start));
                }
                (pos, pos + n)
            }
            2 => {
                let (len, p) = read_varint(buf, pos)?;
                let len = usize::try_from(len).map_err(|_| WireError::Truncated(start))?;
                if buf.len() - p < len {
                    return Err(WireError::Truncated(start));
                }
                (p, p + len)
            }
            // A group (deprecated, but valid protobuf and kept by the decoder
            // as an unknown field): everything up to its matching end tag.
            3 => (pos, skip_group(buf, pos, number)?),
            _ => {
                return Err(WireError::WireType {
                    wire_type,
                    at: start,
                });
            }
        };
        pos = value.1;
        out.push(RawField {
            number,
            wire_type,
            whole: (start, pos),
            value,
        });
    }
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The raw `DataSourceConfig` bytes of every `data_sources[i].config` of a
/// serialized TraceConfig, in order. A data source without a config yields an
/// empty config; a config given more than once is concatenated (which is how
/// protobuf merges repeated occurrences).
pub fn data_source_configs(trace_config: &[u8]) -> Result<Vec<Vec<u8>>, WireError> {
    let mut out = Vec::new();
    for f in fields(trace_config)? {
        if f.number != 2 || f.wire_type != 2 {
            continue;
        }
        let ds = &trace_config[f.value.0..f.value.1];
        let mut cfg = Vec::new();
        for g in fields(ds)? {
            if g.number == 1 && g.wire_type == 2 {
                cfg.extend_from_slice(&ds[g.value.0..g.value.1]);
            }
        }
        out.push(cfg);
    }
    Ok(out)
}

/// The `DataSourceConfig` fields the tracing service owns and rewrites before a
/// data source sees its config. `None` leaves whatever the user wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceFields {
    /// Field 2: the buffer the source writes into.
    pub target_buffer: Option<u32>,
    /// Field 3: the session's duration_ms.
    pub trace_duration_ms: Option<u32>,
    /// Field 4.
    pub tracing_session_id: Option<u64>,
    /// Field 6.
    pub enable_extra_guardrails: Option<bool>,
    /// Field 7.
    pub stop_timeout_ms: Option<u32>,
    /// Field 8 (0 unspecified, 1 trusted system).
    pub session_initiator: Option<i32>,
    /// Field 122: only ever written when true, as the service does.
    pub prefer_suspend_clock_for_duration: bool,
}

impl ServiceFields {
    fn owns(&self, number: u32) -> bool {
        match number {
            2 => self.target_buffer.is_some(),
            3 => self.trace_duration_ms.is_some(),
            4 => self.tracing_session_id.is_some(),
            6 => self.enable_extra_guardrails.is_some(),
            7 => self.stop_timeout_ms.is_some(),
            8 => self.session_initiator.is_some(),
            122 => self.prefer_suspend_clock_for_duration,
            _ => false,
        }
    }
}

/// Rewrites the service-owned fields of a serialized `DataSourceConfig`: every
/// occurrence of an owned field is dropped and the new values are appended
/// (last one wins on decode anyway). Every other byte is copied verbatim, in
/// order.
pub fn rewrite_service_fields(config: &[u8], svc: &ServiceFields) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(config.len() + 32);
    for f in fields(config)? {
        if !svc.owns(f.number) {
            out.extend_from_slice(&config[f.whole.0..f.whole.1]);
        }
    }
    let mut varint_field = |number: u32, v: u64| {
        put_varint(&mut out, u64::from(number) << 3);
        put_varint(&mut out, v);
    };
    if let Some(v) = svc.target_buffer {
        varint_field(2, u64::from(v));
    }
    if let Some(v) = svc.trace_duration_ms {
        varint_field(3, u64::from(v));
    }
    if let Some(v) = svc.tracing_session_id {
        varint_field(4, v);
    }
    if let Some(v) = svc.enable_extra_guardrails {
        varint_field(6, u64::from(v));
    }
    if let Some(v) = svc.stop_timeout_ms {
        varint_field(7, u64::from(v));
    }
    if let Some(v) = svc.session_initiator {
        // Negative enum values are sign-extended to 64 bits on the wire.
        varint_field(8, i64::from(v) as u64);
    }
    if svc.prefer_suspend_clock_for_duration {
        varint_field(122, 1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_keeps_other_bytes_in_order() {
        // name="x" (1), unknown field 5000 varint 7, target_buffer=3 (2), for_testing{} (1001)
        let mut cfg = vec![0x0a, 0x01, b'x'];
        cfg.extend_from_slice(&[0xc0, 0xb8, 0x02, 0x07]);
        cfg.extend_from_slice(&[0x10, 0x03]);
        cfg.extend_from_slice(&[0xca, 0x3e, 0x00]);
        let svc = ServiceFields {
            target_buffer: Some(9),
            tracing_session_id: Some(42),
            ..Default::default()
        };
        let out = rewrite_service_fields(&cfg, &svc).expect("well-formed");
        let mut want = vec![0x0a, 0x01, b'x', 0xc0, 0xb8, 0x02, 0x07, 0xca, 0x3e, 0x00];
        want.extend_from_slice(&[0x10, 0x09, 0x20, 0x2a]);
        assert_eq!(out, want);
    }

    #[test]
    fn groups_are_kept_whole() {
        // group 5 { field 1 varint 1; group 6 {} } then field 1 varint 2
        let buf = [0x2b, 0x08, 0x01, 0x33, 0x34, 0x2c, 0x08, 0x02];
        let f = fields(&buf).expect("well-formed");
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].number, f[0].wire_type, f[0].whole), (5, 3, (0, 6)));
        assert_eq!(fields(&[0x2b, 0x08, 0x01]), Err(WireError::Truncated(1)));
        assert!(fields(&[0x2c]).is_err(), "an end-group without a start");
    }

    #[test]
    fn truncated_input_is_an_error() {
        assert_eq!(fields(&[0x0a, 0x05, 1]), Err(WireError::Truncated(0)));
        assert_eq!(fields(&[0x08]), Err(WireError::BadVarint(1)));
    }

    #[test]
    fn data_source_configs_are_raw_slices() {
        // data_sources { config { name: "a" } } data_sources {}
        let tc = [0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'a', 0x12, 0x00];
        let cfgs = data_source_configs(&tc).expect("well-formed");
        assert_eq!(cfgs, vec![vec![0x0a, 0x01, b'a'], vec![]]);
    }
}
