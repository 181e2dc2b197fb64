//! The raw bytes of configs, for what must not go through a decode and
//! re-encode: each data source's `DataSourceConfig` reaches the source exactly
//! as the user wrote it (unknown fields, field order and all), apart from the
//! service-owned core fields (ARCHITECTURE.md §7.10), which are rewritten here.

use crate::wire::{
    Value, WireType, data_source_config as dsc, fields, key, trace_config,
    trace_config_data_source, varint,
};

pub use crate::wire::WireError;

/// The raw `DataSourceConfig` bytes of every `data_sources[i].config` of a
/// serialized TraceConfig, in order. A data source without a config yields an
/// empty config; a config given more than once is concatenated (which is how
/// protobuf merges repeated occurrences).
pub fn data_source_configs(trace_config: &[u8]) -> Result<Vec<Vec<u8>>, WireError> {
    let mut out = Vec::new();
    for f in fields(trace_config) {
        let f = f?;
        let (trace_config::DATA_SOURCES, Value::Len(ds)) = (f.number, f.value) else {
            continue;
        };
        let mut cfg = Vec::new();
        for g in fields(ds) {
            let g = g?;
            if let (trace_config_data_source::CONFIG, Value::Len(c)) = (g.number, g.value) {
                cfg.extend_from_slice(c);
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
            dsc::TARGET_BUFFER => self.target_buffer.is_some(),
            dsc::TRACE_DURATION_MS => self.trace_duration_ms.is_some(),
            dsc::TRACING_SESSION_ID => self.tracing_session_id.is_some(),
            dsc::ENABLE_EXTRA_GUARDRAILS => self.enable_extra_guardrails.is_some(),
            dsc::STOP_TIMEOUT_MS => self.stop_timeout_ms.is_some(),
            dsc::SESSION_INITIATOR => self.session_initiator.is_some(),
            dsc::PREFER_SUSPEND_CLOCK_FOR_DURATION => self.prefer_suspend_clock_for_duration,
            _ => false,
        }
    }
}

/// Rewrites the service-owned fields of a serialized `DataSourceConfig`: every
/// occurrence of an owned field is dropped and the new values are appended
/// (last one wins on decode anyway). Every other byte is copied verbatim, in
/// order.
pub(crate) fn rewrite_service_fields(
    config: &[u8],
    svc: &ServiceFields,
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(config.len() + 32);
    for f in fields(config) {
        let f = f?;
        if !svc.owns(f.number) {
            out.extend_from_slice(&config[f.start..f.end]);
        }
    }
    let mut varint_field = |number: u32, v: u64| {
        varint::push(&mut out, key(number, WireType::Varint));
        varint::push(&mut out, v);
    };
    if let Some(v) = svc.target_buffer {
        varint_field(dsc::TARGET_BUFFER, u64::from(v));
    }
    if let Some(v) = svc.trace_duration_ms {
        varint_field(dsc::TRACE_DURATION_MS, u64::from(v));
    }
    if let Some(v) = svc.tracing_session_id {
        varint_field(dsc::TRACING_SESSION_ID, v);
    }
    if let Some(v) = svc.enable_extra_guardrails {
        varint_field(dsc::ENABLE_EXTRA_GUARDRAILS, u64::from(v));
    }
    if let Some(v) = svc.stop_timeout_ms {
        varint_field(dsc::STOP_TIMEOUT_MS, u64::from(v));
    }
    if let Some(v) = svc.session_initiator {
        // Negative enum values are sign-extended to 64 bits on the wire.
        varint_field(dsc::SESSION_INITIATOR, i64::from(v) as u64);
    }
    if svc.prefer_suspend_clock_for_duration {
        varint_field(dsc::PREFER_SUSPEND_CLOCK_FOR_DURATION, 1);
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
    fn groups_and_malformed_configs() {
        // group 5 { field 1 varint 1; group 6 {} } then field 1 varint 2: kept whole.
        let cfg = [0x2b, 0x08, 0x01, 0x33, 0x34, 0x2c, 0x08, 0x02];
        let out = rewrite_service_fields(&cfg, &ServiceFields::default()).expect("well-formed");
        assert_eq!(out, cfg);
        assert_eq!(
            rewrite_service_fields(&[0x2b, 0x08, 0x01], &ServiceFields::default()),
            Err(WireError::Truncated(1))
        );
        assert_eq!(
            data_source_configs(&[0x12, 0x05, 1]),
            Err(WireError::Truncated(0))
        );
    }

    #[test]
    fn data_source_configs_are_raw_slices() {
        // data_sources { config { name: "a" } } data_sources {}
        let tc = [0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'a', 0x12, 0x00];
        let cfgs = data_source_configs(&tc).expect("well-formed");
        assert_eq!(cfgs, vec![vec![0x0a, 0x01, b'a'], vec![]]);
    }
}
