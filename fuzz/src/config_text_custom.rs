//! Oracle for the text config parser with a user's schema in play (the
//! example of `configs/custom`: extensions of DataSourceConfig with nested
//! messages, enums, repeated fields, an import): never panics; what parses
//! re-encodes to bytes that load back (as binary) to the same bytes, whose
//! printed text parses back to them, with the user's schema and without it
//! (custom fields then travel by number). Anything else is a diagnostic.
//!
//! `cd fuzz && cargo +nightly fuzz run config_text_custom --
//! -max_total_time=300` ran clean: 559,924 inputs in 301 s (2026-12-02, two
//! cores shared with other builds, load average about 9).

use std::path::Path;
use std::sync::LazyLock;

use recorder::config::{self, Schema, UserProtos};

fn schema() -> &'static Schema {
    static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/custom");
        Schema::load(&UserProtos {
            files: vec![dir.join("acme/audio.proto")],
            include_paths: vec![dir],
            descriptor_sets: Vec::new(),
        })
        .expect("the example's .proto files compile")
    });
    &SCHEMA
}

/// Checks one input.
pub fn check(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let schema = schema();
    for lossy in [false, true] {
        let loaded = match config::load_text_in(src, "fuzz", lossy, schema) {
            Ok(l) => l,
            Err(e) => {
                // A diagnostic, with a position inside the input.
                if let config::ConfigError::Text { error, .. } = &e {
                    assert!(error.offset <= src.len(), "{e}");
                }
                continue;
            }
        };
        let bytes = loaded.bytes.clone();
        let bin = config::load_binary_in(&bytes, "fuzz", schema)
            .expect("our own encoding must load as binary");
        assert_eq!(
            bin.canonical_bytes(),
            bytes,
            "binary reload re-encodes differently"
        );
        let text = bin.to_text();
        let again = config::load_text_in(&text, "printed", false, schema)
            .unwrap_or_else(|e| panic!("printed text must parse: {e}\n{text}"));
        assert_eq!(
            again.bytes, bytes,
            "printed text encodes differently:\n{text}"
        );
        // Without the user's schema: custom fields by number, same bytes.
        let plain = config::load_binary(&bytes, "plain").expect("loads without the schema");
        let by_number = plain.to_text();
        let back = config::load_text(&by_number, "by number", false)
            .unwrap_or_else(|e| panic!("text by number must parse: {e}\n{by_number}"));
        assert_eq!(
            back.bytes, bytes,
            "by-number text encodes differently:\n{by_number}"
        );
        // Validation may refuse, but must not panic.
        let _ = loaded.validate();
    }
}
