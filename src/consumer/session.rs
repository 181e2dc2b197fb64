//! One consumer's session: built by [`app::build_served`] on an in-memory
//! file and an in-process control, run by the event loop on a thread of its
//! own. Its end is reported once, with the error if it failed.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::registry::{Refusal, Registry, SessionEntry, SessionState};
use crate::app::{self, RunOptions, Served};
use crate::config::spec::{RecorderSpec, SourceKind};
use crate::control::server::{ControlServer, InProcessControl};
use crate::sources::ftrace::remote::FtraceRequest;
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::{IoChoice, OutputPath};

/// Why a session did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Build(String),
}

/// Why a reserved session could not be built and begun.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("in-memory trace file: {0}")]
    Memfd(#[source] std::io::Error),
    #[error("session thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
    #[error(transparent)]
    App(#[from] app::AppError),
}

/// Whether the session has ended, and how.
#[derive(Default)]
pub struct Done {
    /// `Some(error)` once ended; the error is empty on success.
    ended: Mutex<Option<String>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, error: String) {
        let mut g = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        *g = Some(error);
        self.cv.notify_all();
    }

    /// Waits up to `limit` for the end; true once it ended.
    pub fn wait(&self, limit: Duration) -> bool {
        let g = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .cv
            .wait_timeout_while(g, limit, |e| e.is_none())
            .unwrap_or_else(|p| p.into_inner());
        g.is_some()
    }

    pub fn ended(&self) -> bool {
        self.ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// A running (or ended) session of one connection.
pub struct Running {
    pub id: u64,
    pub control: InProcessControl,
    pub done: Arc<Done>,
    /// The session's in-memory file, for ReadBuffers once it ended; none
    /// when it streams into the client's file.
    pub file: Option<File>,
    /// How long the session waits for its sources' flush acks.
    pub flush_timeout: Duration,
}

impl Running {
    /// A session handed over already ended: a clone, another session's
    /// buffers copied into `file`, read as a session of its own.
    pub fn read_only(id: u64, file: File) -> Result<Self, StartError> {
        // Nothing runs it: requests to its control find no loop.
        let (_, control) =
            ControlServer::in_process().map_err(|e| StartError::Build(app::chain(&e)))?;
        let done = Arc::new(Done::default());
        done.set(String::new());
        Ok(Running {
            id,
            control,
            done,
            file: Some(file),
            flush_timeout: Duration::ZERO,
        })
    }
}

/// What the client is told when the session ends: its error, empty on
/// success.
pub type OnEnd = Box<dyn FnOnce(&str) + Send>;

/// Told the session's id and the trigger's name when a CLONE_SNAPSHOT
/// trigger asks for a snapshot: the consumer clones the session.
pub type CloneHit = Box<dyn FnMut(u64, &str) + Send>;

/// What the session tells its consumer.
pub struct Told {
    /// Its end, once.
    pub end: OnEnd,
    /// Each CLONE_SNAPSHOT hit, when the consumer observes them.
    pub clone_hit: Option<CloneHit>,
}

/// Whether the session needs the producer socket: a data source no
/// built-in source of a served session provides (linux.ftrace when the
/// service prepares no tracefs, or asks what the built-in source does not
/// serve), or triggers (which `trigger_perfetto` sends there).
fn needs_producers(spec: &RecorderSpec, builtin_ftrace: bool) -> bool {
    spec.trigger.is_some()
        || spec.data_sources.iter().any(|d| match &d.kind {
            SourceKind::TrackEvent | SourceKind::Other => true,
            SourceKind::Ftrace(f) => !builtin_ftrace || FtraceRequest::from_spec(f).is_err(),
            _ => false,
        })
}

/// Starts `spec` for consumer `uid`, into `output` (the client's file, for
/// `write_into_file`) or else memory; `told.end` runs on the session's thread
/// when it ended.
pub fn start(
    spec: &RecorderSpec,
    uid: u32,
    registry: &Arc<Registry>,
    output: Option<OwnedFd>,
    told: Told,
) -> Result<Running, StartError> {
    let entry = SessionEntry {
        id: 0,
        uid,
        unique_name: spec.unique_session_name.clone(),
        buffer_kb: spec
            .buffers
            .iter()
            .map(|b| u32::try_from(b.size.0 / 1024).unwrap_or(u32::MAX))
            .collect(),
        buffer_bytes: spec.buffers.iter().map(|b| b.size.0).sum(),
        duration_ms: spec
            .duration
            .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
        data_sources: spec.data_sources.len() as u32,
        start_realtime_ns: crate::clock::realtime_ms() as i64 * 1_000_000,
        state: SessionState::Configured,
        control: None,
        producers: needs_producers(spec, registry.ftrace().is_some()),
    };
    let (id, producers) = registry.reserve(entry)?;
    match build_and_run(spec, uid, id, producers, registry, output, told) {
        Ok(r) => Ok(r),
        Err(e) => {
            registry.release(id);
            Err(StartError::Build(app::chain(&e)))
        }
    }
}

fn build_and_run(
    spec: &RecorderSpec,
    uid: u32,
    id: u64,
    producers: Option<Arc<crate::ipc::host::ProducerService>>,
    registry: &Arc<Registry>,
    output: Option<OwnedFd>,
    told: Told,
) -> Result<Running, BuildError> {
    let Told {
        end: on_end,
        clone_hit: on_clone_hit,
    } = told;
    let name = format!("recorder-session-{id}");
    let (fd, file) = match output {
        Some(fd) => (fd, None),
        None => {
            let memfd = rustix::fs::memfd_create(&name, rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(|e| BuildError::Memfd(e.into()))?;
            let file = File::from(memfd.try_clone().map_err(BuildError::Memfd)?);
            (memfd, Some(file))
        }
    };
    let (control, handle) = ControlServer::in_process()?;
    let label = format!("session {id} of uid {uid}");
    let opts = RunOptions {
        output: OutputPath::File(PathBuf::from(&label)),
        no_clobber: false,
        io: IoChoice::Auto,
        config_label: format!("consumer uid {uid}"),
        status_line: false,
        compression: None,
        rotation: RotationPolicy::default(),
        // O_DIRECT where the client's file takes it (storage decides).
        direct_io: registry.direct_io(),
        producer_socket: None,
    };
    let served = Served {
        output: fd,
        output_label: label.clone(),
        control,
        producers,
        consumer_uid: uid,
        ftrace: registry.ftrace(),
    };
    let mut rec = app::build_served(spec, &opts, served)?;
    // Prepared now (tracefs through the broker), armed when it starts.
    app::begin(&mut rec, None)?;
    rec.on_snapshot = on_clone_hit.map(|mut hit| {
        Box::new(
            move |_: u32, t: Option<&crate::trace::service::TriggerRecord>| {
                hit(id, t.map_or("", |t| t.name.as_str()))
            },
        ) as crate::event_loop::SnapshotHook
    });
    registry.attach_control(id, handle.clone());
    let waiting = spec.deferred_start
        || matches!(
            spec.trigger.as_ref().map(|t| t.mode),
            Some(crate::config::spec::TriggerMode::StartTracing)
        );
    registry.set_state(
        id,
        if waiting {
            SessionState::Configured
        } else {
            SessionState::Started
        },
    );
    let done = Arc::new(Done::default());
    let (d, reg) = (done.clone(), registry.clone());
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let outcome = crate::event_loop::run(rec, None);
            let error = if outcome.reason.is_failure() {
                format!("the session failed: {}", outcome.reason)
            } else {
                String::new()
            };
            log::info!(
                "{label} ended ({}): {} bytes",
                outcome.reason,
                outcome.bytes_written
            );
            reg.set_state(id, SessionState::Disabled);
            d.set(error.clone());
            on_end(&error);
        })
        .map_err(BuildError::Thread)?;
    Ok(Running {
        id,
        control: handle,
        done,
        file,
        flush_timeout: spec.flush_timeout,
    })
}
