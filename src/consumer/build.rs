//! One consumer's session, built on what the service hands it: an
//! in-memory trace file (or the client's own, for `write_into_file`), the
//! service's producer socket when the session needs apps, and the broker's
//! tracefs instances for its built-in linux.ftrace. The result is a
//! [`Runner`] for the service's loop: nothing here starts a thread.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::app::{self, RunOptions, Served, ServedOutput};
use crate::config::spec::{RecorderSpec, SourceKind, TriggerMode};
use crate::event_loop::Runner;
use crate::privilege::Broker;
use crate::producer::host::ProducerService;
use crate::sources::ftrace::remote::{FtraceRequest, RemoteTracefs};
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::{IoChoice, OutputPath};

/// Why a reserved session could not be built and begun.
#[derive(Debug, thiserror::Error)]
pub(super) enum BuildError {
    #[error("in-memory trace file")]
    Memfd(#[source] std::io::Error),
    #[error("the output descriptor")]
    Output(#[source] crate::storage::BacklogError),
    #[error(transparent)]
    App(#[from] app::AppError),
}

/// A stream output (a pipe, a socket) holds at most this much the reader
/// has not taken, or the session's buffers' size if less.
pub(super) const MAX_STREAM_BACKLOG: u64 = 8 << 20;

/// Whether the session needs the producer socket: a data source no
/// built-in source of a served session provides (linux.ftrace when the
/// service prepares no tracefs, or asks what the built-in source does not
/// serve), or triggers (which `trigger_perfetto` sends there).
pub(super) fn needs_producers(spec: &RecorderSpec, builtin_ftrace: bool) -> bool {
    spec.trigger.is_some()
        || spec.data_sources.iter().any(|d| match &d.kind {
            SourceKind::TrackEvent | SourceKind::Other => true,
            SourceKind::Ftrace(f) => !builtin_ftrace || FtraceRequest::from_spec(f).is_err(),
            _ => false,
        })
}

/// Whether the session waits before its sources start (`deferred_start`,
/// or a START_TRACING trigger).
pub(super) fn waits_to_start(spec: &RecorderSpec) -> bool {
    spec.deferred_start
        || matches!(
            spec.trigger.as_ref().map(|t| t.mode),
            Some(TriggerMode::StartTracing)
        )
}

/// What the service hands a session it builds.
pub(super) struct Parts<'a> {
    pub id: u64,
    pub uid: u32,
    /// The client's file (`write_into_file`); none: an in-memory file.
    pub output: Option<OwnedFd>,
    /// The backlog bound of a stream output.
    pub(crate) stream_backlog: u64,
    pub producers: Option<&'a ProducerService>,
    pub ftrace: Option<Arc<dyn RemoteTracefs>>,
    pub(crate) direct_io: bool,
    /// The broker that saves a session writing into its client's file if
    /// the service dies (root `recorder serve`).
    pub(crate) saver: Option<Arc<Broker>>,
}

/// A built session: its runner, the in-memory file ReadBuffers reads
/// (none when it writes into the client's file), and whether the broker
/// holds what it saves of it at the service's death.
pub(super) struct Built {
    pub runner: Runner,
    pub file: Option<File>,
    pub(crate) saved_at_death: bool,
}

/// Builds `spec`'s session and prepares its sources (tracefs through the
/// broker); it begins at its runner's first settle.
pub(super) fn build(spec: &RecorderSpec, parts: Parts<'_>) -> Result<Built, BuildError> {
    let Parts {
        id,
        uid,
        output,
        stream_backlog,
        producers,
        ftrace,
        direct_io,
        saver,
    } = parts;
    // The session's own file is memory: a write there is a copy that never
    // waits for a disk, done at once by `pwritev`; io_uring handed each one
    // to a kernel worker thread, a thread more and a wake-up per pass.
    let (fd, file, io) = match output {
        Some(fd) => (fd, None, IoChoice::Auto),
        None => {
            let memfd = rustix::fs::memfd_create(
                format!("recorder-session-{id}"),
                rustix::fs::MemfdFlags::CLOEXEC,
            )
            .map_err(|e| BuildError::Memfd(e.into()))?;
            let file = File::from(memfd.try_clone().map_err(BuildError::Memfd)?);
            (memfd, Some(file), IoChoice::Pwritev)
        }
    };
    // A stream is written without ever waiting (the loop hosts every
    // session): its own non-blocking description, a bounded backlog.
    let output = if crate::storage::create::is_stream(&fd) {
        let bound = usize::try_from(stream_backlog).unwrap_or(usize::MAX);
        let sink = crate::storage::BacklogSink::new(fd, bound).map_err(BuildError::Output)?;
        ServedOutput::Stream(Box::new(sink))
    } else {
        ServedOutput::File(fd)
    };
    // Saved at the service's death: a session writing into its client's
    // file (the in-memory one dies with the service, a stream cannot be
    // cut back), with its buffers on memfds the broker can read.
    let saver = saver.filter(|_| file.is_none() && matches!(output, ServedOutput::File(_)));
    let label = format!("session {id} of uid {uid}");
    let opts = RunOptions {
        output: OutputPath::File(PathBuf::from(&label)),
        no_clobber: false,
        io,
        config_label: format!("consumer uid {uid}"),
        status_line: false,
        compression: None,
        rotation: RotationPolicy::default(),
        // O_DIRECT where the client's file takes it (storage decides).
        direct_io,
        producer_socket: None,
        // Rules are the main job's (`recorder --config`): a consumer's
        // session fires only the triggers its consumers send.
        rules: Vec::new(),
    };
    let served = Served {
        output,
        output_label: label.clone(),
        producers,
        consumer_uid: uid,
        ftrace,
        shared_rings: saver.is_some(),
    };
    let mut rec = app::build_served(spec, &opts, served)?;
    rec.snapshots_to_host = true;
    // Prepared now (tracefs through the broker), armed when it starts.
    app::begin(&mut rec, None)?;
    let saved_at_death = match &saver {
        Some(b) => match app::save_served_at_death(&rec, b, id) {
            Ok(()) => true,
            Err(e) => {
                // The session records all the same, only not saved.
                log::warn!("{label}: not saved if the service dies: {}", app::chain(&e));
                let _ = b.served_saved(id);
                false
            }
        },
        None => false,
    };
    Ok(Built {
        runner: Runner::new(rec),
        file,
        saved_at_death,
    })
}
