//! Oracle for the binary config loader: never panics; what loads re-encodes
//! to bytes that load to the same message; its text form (unknown fields by
//! number) parses back to those bytes; validation never panics, and what it
//! accepts keeps each data source's config bytes as a slice of the input, and
//! records the config as loaded (a streaming session's flush period aside).

use recorder::config;

/// Checks one input.
pub fn check(data: &[u8]) {
    let Ok(loaded) = config::load_binary(data, "fuzz") else {
        return;
    };
    let canonical = loaded.canonical_bytes();
    let again = config::load_binary(&canonical, "canonical").expect("re-encoding must load");
    assert_eq!(again.message, loaded.message, "re-encoded message differs");
    let text = loaded.to_text();
    let parsed = config::load_text(&text, "printed", false).expect("printed text must parse");
    assert_eq!(
        parsed.bytes, canonical,
        "text form encodes differently:\n{text}"
    );
    if let Ok(spec) = loaded.validate() {
        // The config as run: the input, plus a streaming session's flush
        // period appended as field 13 (flush_period_ms); nothing else moves.
        assert!(spec.config_bytes.starts_with(data));
        if spec.config_bytes.len() > data.len() {
            assert_eq!(spec.config_bytes[data.len()], 0x68, "field 13, varint");
            let run = config::load_binary(&spec.config_bytes, "as run").expect("as run loads");
            let (mut a, mut b) = (loaded.message.clone(), run.message.clone());
            a.clear_field_by_number(13);
            b.clear_field_by_number(13);
            assert_eq!(a, b, "only flush_period_ms differs");
        }
        for ds in &spec.data_sources {
            let svc = config::ServiceFields {
                target_buffer: Some(ds.target_buffer.0),
                tracing_session_id: Some(1),
                ..Default::default()
            };
            ds.config_for_source(&svc)
                .expect("a config that validated is well-formed on the wire");
        }
    }
}
