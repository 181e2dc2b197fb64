//! ftrace prepared by someone else: an unprivileged service (`recorder
//! serve`) asks the privileged side for a tracefs instance set up to a small
//! typed request and gets back its descriptors and what it needs to decode
//! (page layout and event formats, as text) — never the raw TraceConfig.
//!
//! ```text
//!  service (unprivileged)               privileged side
//!  FtraceRequest::from_spec ──request──► check (grammar, bounds, per-uid limits)
//!                                        FtraceSource::prepare, export
//!  FtraceSource::from_prepared ◄─fds──── tracing_on, trace_pipe_raw×N, stats×N
//!  arm, read, stop                       teardown on release, or when the
//!  release ─────────────────────────────► service is gone
//! ```

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use crate::config::event_name::{event_spec_problem, is_plain_name};
use crate::config::spec::{ByteSize, FtraceSpec};

/// Events a request may name at most.
pub(crate) const MAX_EVENTS: usize = 512;
/// Trace options a request may set at most.
pub(crate) const MAX_OPTIONS: usize = 64;
/// The largest per-CPU buffer a request may ask for (KiB).
pub(crate) const MAX_BUFFER_KB: u32 = 64 * 1024;

/// Why a request fails the privileged side's check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("1 to {MAX_EVENTS} events, not {0}")]
    EventCount(usize),
    /// An entry the event grammar refuses.
    #[error(transparent)]
    Event(#[from] crate::config::event_name::NotAnEvent),
    #[error("at most {MAX_OPTIONS} tracefs options")]
    TooManyOptions,
    #[error("tracefs option {0:?} is not a plain name")]
    OptionName(String),
    #[error("buffer size: 1 to {MAX_BUFFER_KB} KiB per CPU")]
    BufferSize,
    #[error("drain_buffer_percent over 100")]
    DrainPercent,
}

/// Why the privileged side gave no instance.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Its reason, as it sent it (typed by the side that sends it).
    #[error("{0}")]
    Refused(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The way to it failed.
    #[error(transparent)]
    Channel(Box<dyn std::error::Error + Send + Sync>),
}

/// What a served session asks of tracefs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FtraceRequest {
    /// `group/name`, `group/*` or `name`, in the config's grammar.
    pub events: Vec<String>,
    /// `group/name` of the atrace categories' events: enabled where the
    /// kernel has them, never unknown.
    #[serde(default)]
    pub category_events: Vec<String>,
    /// Per CPU; `None`: the default for the machine.
    pub buffer_size_kb: Option<u32>,
    pub buffer_size_lower_bound: bool,
    pub use_monotonic_raw_clock: bool,
    pub drain_buffer_percent: u32,
    pub throttle_rss_stat: bool,
    pub disable_generic_events: bool,
    /// `options/NAME` switches.
    pub tracefs_options: Vec<(String, bool)>,
}

/// A config a served session cannot record, and why.
#[derive(Debug, thiserror::Error)]
#[error(
    "linux.ftrace under recorder serve: {0} is not served (record it with `recorder --config`, or run `recorder serve --no-builtin-ftrace` with traced_probes)"
)]
pub(crate) struct Unsupported(pub &'static str);

impl FtraceRequest {
    /// The request for `spec`; fields that need more than an instance with
    /// events and options (kprobes, function_graph, syscall filters, a named
    /// instance, CPU mask, pid filter, a preserved buffer) are refused by
    /// name rather than ignored.
    pub(crate) fn from_spec(spec: &FtraceSpec) -> Result<Self, Unsupported> {
        let refused = [
            ("kprobe_events", !spec.kprobe_events.is_empty()),
            ("enable_function_graph", spec.enable_function_graph),
            ("syscall_events", !spec.syscall_events.is_empty()),
            ("instance_name", spec.instance_name.is_some()),
            ("tracing_cpumask", spec.tracing_cpumask.is_some()),
            ("tids_to_trace", !spec.tids_to_trace.is_empty()),
            ("preserve_ftrace_buffer", spec.preserve_ftrace_buffer),
        ];
        if let Some((field, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(Unsupported(field));
        }
        let mut events = spec.events.clone();
        if (!spec.atrace_categories.is_empty() || !spec.atrace_apps.is_empty())
            && !events.iter().any(|e| e == "ftrace/print" || e == "print")
        {
            events.push("ftrace/print".into());
        }
        Ok(Self {
            events,
            category_events: spec.category_events.clone(),
            buffer_size_kb: spec
                .buffer_size
                .map(|b| u32::try_from(b.kb()).unwrap_or(u32::MAX)),
            buffer_size_lower_bound: spec.buffer_size_lower_bound,
            use_monotonic_raw_clock: spec.use_monotonic_raw_clock,
            drain_buffer_percent: spec.drain_buffer_percent,
            throttle_rss_stat: spec.throttle_rss_stat,
            disable_generic_events: spec.disable_generic_events,
            tracefs_options: spec.tracefs_options.clone(),
        })
    }

    /// The privileged side's own check: the event grammar, plain option
    /// names, and bounds on every list and size.
    pub(crate) fn check(&self) -> Result<(), RequestError> {
        if self.events.is_empty() || self.events.len() > MAX_EVENTS {
            return Err(RequestError::EventCount(self.events.len()));
        }
        if self.category_events.len() > MAX_EVENTS {
            return Err(RequestError::EventCount(self.category_events.len()));
        }
        for e in self.events.iter().chain(&self.category_events) {
            if let Some(why) = event_spec_problem(e) {
                return Err(RequestError::Event(why));
            }
        }
        if self.tracefs_options.len() > MAX_OPTIONS {
            return Err(RequestError::TooManyOptions);
        }
        if let Some((n, _)) = self.tracefs_options.iter().find(|(n, _)| !is_plain_name(n)) {
            return Err(RequestError::OptionName(n.clone()));
        }
        if self
            .buffer_size_kb
            .is_some_and(|kb| kb == 0 || kb > MAX_BUFFER_KB)
        {
            return Err(RequestError::BufferSize);
        }
        if self.drain_buffer_percent > 100 {
            return Err(RequestError::DrainPercent);
        }
        Ok(())
    }

    /// The spec the privileged side prepares (the request's fields only).
    pub(crate) fn to_spec(&self) -> FtraceSpec {
        FtraceSpec {
            events: self.events.clone(),
            category_events: self.category_events.clone(),
            buffer_size: self.buffer_size_kb.map(|kb| ByteSize(u64::from(kb) * 1024)),
            buffer_size_lower_bound: self.buffer_size_lower_bound,
            use_monotonic_raw_clock: self.use_monotonic_raw_clock,
            drain_buffer_percent: self.drain_buffer_percent,
            throttle_rss_stat: self.throttle_rss_stat,
            disable_generic_events: self.disable_generic_events,
            tracefs_options: self.tracefs_options.clone(),
            ..FtraceSpec::default()
        }
    }
}

/// What a prepared instance's user needs besides its descriptors: the
/// descriptors come in the order `tracing_on`, each CPU's
/// `trace_pipe_raw`, each CPU's `stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct PreparedInfo {
    pub cpus: Vec<u32>,
    pub header_page: String,
    pub(crate) header_event: String,
    /// (group, name, format text) of each enabled event.
    pub formats: Vec<(String, String, String)>,
    pub unknown_events: Vec<String>,
    pub failed_events: Vec<String>,
    pub buffer_size_kb: u32,
    pub watermark: bool,
}

impl PreparedInfo {
    /// How many descriptors come with it.
    pub(crate) fn fd_count(&self) -> usize {
        1 + 2 * self.cpus.len()
    }
}

/// An instance prepared elsewhere, as its user holds it.
pub(crate) struct Prepared {
    /// The privileged side's name for it (for the release).
    pub key: u64,
    pub info: PreparedInfo,
    pub(crate) fds: Vec<OwnedFd>,
}

/// The privileged side, as a served session's ftrace source sees it.
pub(crate) trait RemoteTracefs: Send + Sync {
    /// Prepares an instance for `request`, charged to consumer `uid`.
    fn prepare(&self, uid: u32, request: &FtraceRequest) -> Result<Prepared, RemoteError>;
    /// Undoes instance `key` (its descriptors closed first).
    fn release(&self, key: u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unserved_fields_are_refused_by_name_and_bad_requests_by_the_check() {
        let spec = FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            tids_to_trace: vec![1],
            ..FtraceSpec::default()
        };
        let e = FtraceRequest::from_spec(&spec).expect_err("refused");
        assert!(e.to_string().contains("tids_to_trace"), "{e}");
        let ok = FtraceRequest::from_spec(&FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            ..FtraceSpec::default()
        })
        .expect("served");
        ok.check().expect("valid");
        assert_eq!(ok.to_spec().events, ["sched/sched_switch"]);
        for bad in [
            FtraceRequest {
                events: vec!["../../x/y".into()],
                ..ok.clone()
            },
            FtraceRequest {
                events: vec![],
                ..ok.clone()
            },
            FtraceRequest {
                events: vec!["sched/x".into(); MAX_EVENTS + 1],
                ..ok.clone()
            },
            FtraceRequest {
                buffer_size_kb: Some(MAX_BUFFER_KB + 1),
                ..ok.clone()
            },
            FtraceRequest {
                tracefs_options: vec![("../tracing_on".into(), true)],
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
