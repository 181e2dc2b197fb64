//! Oracle for the text config parser: never panics, and whatever parses
//! re-encodes to bytes that load back (as binary) to the same message, whose
//! printed text parses back to the same bytes again.

use recorder::config;

/// Checks one input.
pub fn check(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    // Lossy mode must not panic either; its result is checked like strict's.
    for lossy in [false, true] {
        let Ok(loaded) = config::load_text(src, "fuzz", lossy) else {
            continue;
        };
        let bytes = loaded.bytes.clone();
        let bin =
            config::load_binary(&bytes, "fuzz").expect("our own encoding must load as binary");
        assert_eq!(
            bin.canonical_bytes(),
            bytes,
            "binary reload re-encodes differently"
        );
        let text = bin.to_text();
        let again = config::load_text(&text, "printed", false).expect("printed text must parse");
        assert_eq!(
            again.bytes, bytes,
            "printed text encodes differently:\n{text}"
        );
        // Validation may refuse, but must not panic.
        let _ = loaded.validate();
    }
}
