//! The grammar of ftrace event names in a config (`ftrace_events`): what a
//! root session may turn into a path under tracefs. Checked when the config
//! is validated, and again by the ftrace source before it touches tracefs.

/// Whether `s` can be one component of a tracefs path (an event or group
/// name): letters, digits, `_`, `-`, `.`, and not `.` or `..`. Names come
/// from configs; anything else could lead a root session out of tracefs.
pub fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Why an `ftrace_events` entry (`GROUP/NAME`, `GROUP/*` or `NAME`) is not
/// one, if it is not.
pub fn event_spec_problem(spec: &str) -> Option<String> {
    let ok = match spec.split_once('/') {
        Some((g, n)) => is_plain_name(g) && (n == "*" || is_plain_name(n)),
        None => is_plain_name(spec),
    };
    (!ok).then(|| {
        format!(
            "{spec:?} is not an event: GROUP/NAME, GROUP/* or NAME, each of letters, digits, '_', '-' and '.'"
        )
    })
}
