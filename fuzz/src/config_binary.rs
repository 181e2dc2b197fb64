//! Oracle for the binary config loader: never panics; what loads re-encodes
//! to bytes that load to the same message; without unknown fields, its text
//! form parses back to those bytes; validation never panics, and what it
//! accepts keeps each data source's config bytes as a slice of the input.

use recorder::config;

/// Checks one input.
pub fn check(data: &[u8]) {
    let Ok(loaded) = config::load_binary(data, "fuzz") else {
        return;
    };
    let canonical = loaded.canonical_bytes();
    let again = config::load_binary(&canonical, "canonical").expect("re-encoding must load");
    assert_eq!(again.message, loaded.message, "re-encoded message differs");
    if loaded.unknown_fields.is_empty() {
        let (text, dropped) = loaded.to_text();
        assert_eq!(dropped, 0);
        let parsed = config::load_text(&text, "printed", false).expect("printed text must parse");
        assert_eq!(
            parsed.bytes, canonical,
            "text form encodes differently:\n{text}"
        );
    }
    if let Ok(spec) = loaded.validate() {
        assert_eq!(spec.config_bytes, data);
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
