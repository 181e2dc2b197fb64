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

/// An `ftrace_events` entry that is not `GROUP/NAME`, `GROUP/*` or `NAME`:
/// the entry as the config (or the peer) wrote it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error(
    "{0:?} is not an event: GROUP/NAME, GROUP/* or NAME, each of letters, digits, '_', '-' and '.'"
)]
pub struct NotAnEvent(pub String);

/// Why an `ftrace_events` entry (`GROUP/NAME`, `GROUP/*` or `NAME`) is not
/// one, if it is not.
pub fn event_spec_problem(spec: &str) -> Option<NotAnEvent> {
    let ok = match spec.split_once('/') {
        Some((g, n)) => is_plain_name(g) && (n == "*" || is_plain_name(n)),
        None => is_plain_name(spec),
    };
    (!ok).then(|| NotAnEvent(spec.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_specs_are_plain_names() {
        for bad in [
            "../x",
            "..",
            "sched/../../x",
            "a/b/c",
            "",
            "sched/",
            "/sched",
            "x\n",
        ] {
            assert!(event_spec_problem(bad).is_some(), "{bad:?}");
        }
        for good in [
            "sched/sched_switch",
            "sched/*",
            "sched_switch",
            "ftrace/print",
        ] {
            assert_eq!(event_spec_problem(good), None, "{good:?}");
        }
    }

    /// Every name a config turns into a tracefs path is held to the same
    /// grammar at load: events, the instance, kprobe functions and option
    /// names (`.` and `..` included).
    #[test]
    fn names_that_would_leave_tracefs_are_refused_at_load() {
        for (set, path) in [
            ("instance_name: \"..\"", "ftrace_config.instance_name"),
            ("instance_name: \".\"", "ftrace_config.instance_name"),
            (
                "tracefs_options { name: \"..\" state: STATE_ENABLED }",
                "ftrace_config.tracefs_options[0].name",
            ),
            (
                "kprobe_events { probe: \"..\" type: KPROBE_TYPE_KPROBE }",
                "ftrace_config.kprobe_events[0].probe",
            ),
            (
                "ftrace_events: \"sched/..\"",
                "ftrace_config.ftrace_events[0]",
            ),
        ] {
            let text = format!(
                "buffers {{ size_kb: 64 }} data_sources {{ config {{ name: \"linux.ftrace\" ftrace_config {{ {set} }} }} }}"
            );
            let err = crate::config::load_text(&text, "t", false)
                .expect("parses")
                .validate()
                .expect_err("refused");
            assert!(err.to_string().contains(path), "{set}: {err}");
        }
    }
}
