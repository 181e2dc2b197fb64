//! The composition root: builds the runtime objects of a session from a
//! validated [`RecorderSpec`] — buffers, data sources (each on its own
//! sequence), the output sink, the service packets, the control endpoints —
//! and hands them to the event loop. The only module that knows every
//! concrete type.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::raw::ServiceFields;
use crate::config::spec::{self, RecorderSpec, SourceKind};
use crate::control::history::TriggerHistory;
use crate::control::runtime_dir;
use crate::control::server::ControlServer;
use crate::event_loop::{Recording, SessionBuffer};
use crate::ipc::filter::ProducerFilter;
use crate::ipc::host::{HostError, ProducerHost, ProducerService, QuotaView, WantedSource};
use crate::ipc::socket_path::{self, Opening, SocketPathError};
use crate::privilege::{Privileges, Registration};
use crate::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
use crate::session::{Session, Timeline, TimelineError, TriggerMode, anchored};
use crate::sources::for_testing::{ForTesting, TestOptions};
use crate::sources::ftrace::remote::{FtraceRequest, RemoteTracefs};
use crate::sources::ftrace::{FtraceOptions, ReadMode, SubbufSize};
use crate::sources::ftrace_source::FtraceDataSource;
use crate::sources::polled::{PidRoute, PolledDataSource};
use crate::sources::process_stats::ProcessStatsSource;
use crate::sources::procfs::HostPaths;
use crate::sources::sys_stats::SysStatsSource;
use crate::sources::{DataSource, PRODUCER_NAME};
use crate::storage::compress::ZstdStage;
use crate::storage::segment::names::SegmentNames;
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::segment::{Output, SegmentIdentity, SegmentWriter, segment_uuid};
use crate::storage::{self, IoChoice, OpenOptions, OutputPath};
use crate::trace::service::SystemInfo;
use crate::trace::service_log::{ServiceLog, random_uuid};

/// Errors of building a session.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("buffers[{index}]")]
    Buffer {
        index: usize,
        #[source]
        source: crate::ringbuf::RingbufError,
    },
    #[error("data_sources[{index}] ({name}): target buffer {buffer} missing")]
    MissingBuffer {
        index: usize,
        name: String,
        buffer: u32,
    },
    #[error("data_sources[{index}] ({name})")]
    Source {
        index: usize,
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("compression")]
    Compression(#[source] crate::storage::compress::CompressError),
    #[error("segments")]
    Rotation(#[source] crate::storage::segment::policy::PolicyError),
    #[error("segments")]
    Segments(#[source] crate::storage::segment::SegmentError),
    #[error("{0}")]
    Refused(&'static str),
    #[error("output")]
    Output(#[source] crate::storage::StorageError),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    #[error("control socket (needed for triggers)")]
    Control(#[source] crate::control::ControlError),
    #[error("producer socket")]
    ProducerSocket(#[from] SocketPathError),
    #[error("producer socket")]
    Producers(#[source] HostError),
    #[error("giving up root")]
    Privilege(#[source] crate::privilege::PrivilegeError),
    #[error("data_sources[{index}].producer_name_regex_filter: {msg}")]
    ProducerFilter { index: usize, msg: String },
}

/// How to run, from the command line.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub output: OutputPath,
    pub no_clobber: bool,
    pub io: IoChoice,
    /// The config's path (or `stdin`), for `recorder query`.
    pub config_label: String,
    /// Draw a live status line when stderr is a terminal.
    pub status_line: bool,
    /// Replaces the config's compression (`--compress`).
    pub compression: Option<spec::Compression>,
    /// Segmented output; inactive unless it rotates.
    pub rotation: RotationPolicy,
    /// O_DIRECT may be used where it applies (`RECORDER_DIRECT_IO=off`
    /// says no).
    pub direct_io: bool,
    /// Where SDK apps connect (`--producer-socket`); else the environment's
    /// or the default path.
    pub producer_socket: Option<PathBuf>,
}

/// The first sequence id of data sources; 1 is the recorder's own.
const FIRST_SOURCE_SEQUENCE: u32 = 2;

/// What `recorder serve` hands a session instead of what `build` opens
/// itself: the output, the control endpoint and, when the session serves
/// producers, the producer socket. Such a session runs unprivileged: it
/// records `linux.ftrace` itself only on instances `ftrace` (the root
/// broker) prepares; without it producers (traced_probes) provide it.
pub struct Served {
    /// The trace file (the client's, or the session's in-memory one); its
    /// sink is chosen as for a file the recorder opens (`direct_wanted`).
    pub output: OwnedFd,
    pub output_label: String,
    pub control: ControlServer,
    /// The service's producer socket, which the session attaches to.
    pub producers: Option<Arc<ProducerService>>,
    /// The consumer's uid, written as the trace's trusted uid.
    pub consumer_uid: u32,
    pub ftrace: Option<Arc<dyn RemoteTracefs>>,
}

/// Builds every runtime object of the session.
pub fn build(spec: &RecorderSpec, opts: &RunOptions) -> Result<Recording, AppError> {
    build_with(spec, opts, None)
}

/// Builds a session of `recorder serve` on what the service hands it.
pub fn build_served(
    spec: &RecorderSpec,
    opts: &RunOptions,
    served: Served,
) -> Result<Recording, AppError> {
    build_with(spec, opts, Some(served))
}

fn build_with(
    spec: &RecorderSpec,
    opts: &RunOptions,
    served: Option<Served>,
) -> Result<Recording, AppError> {
    let is_served = served.is_some();
    let (mut served_sink, served_label, served_control, mut served_producers, consumer_uid) =
        match served {
            Some(s) => (
                Some(s.output),
                Some(s.output_label),
                Some(s.control),
                s.producers,
                Some((s.consumer_uid, s.ftrace)),
            ),
            None => (None, None, None, None, None),
        };
    let buffers = session_buffers(spec)?;
    let filters = producer_filters(spec)?;
    let (sources, next_seq) = builtin_sources(spec, &buffers, &filters, consumer_uid.as_ref())?;
    let consumer_uid = consumer_uid.map(|(uid, _)| uid);

    let uuid = spec.trace_uuid.unwrap_or_else(random_uuid);
    // Claimed before the output is opened: a refusal truncates nothing.
    let producers = match served_producers.take() {
        None if is_served => None,
        None => producer_host(spec, opts, filters, &buffers, next_seq, uuid)?,
        Some(service) => {
            let host = ProducerHost::attach(&service, buffers.len()).map_err(host_error)?;
            Some(serve_producers(
                host, spec, filters, &buffers, next_seq, uuid,
            )?)
        }
    };
    let compression = opts.compression.unwrap_or(spec.compression);
    let compress = match compression {
        spec::Compression::None => None,
        spec::Compression::Zstd { level } => {
            Some(ZstdStage::new(level).map_err(AppError::Compression)?)
        }
    };
    let sink = match served_sink.take() {
        Some(fd) => Output::File(
            storage::sink_for_fd(fd, opts.io, direct_wanted(spec, opts, compress.is_some()))
                .map_err(AppError::Output)?,
        ),
        None => output(spec, opts, &buffers, uuid, compression, compress.is_some())?,
    };
    let output_label = match (served_label, &opts.output) {
        (Some(l), _) => l,
        (None, OutputPath::File(p)) => p.display().to_string(),
        (None, OutputPath::Stdout) => "stdout".to_string(),
    };
    let snapshot_base = match &opts.output {
        OutputPath::File(p) if !is_served => Some(p.clone()),
        _ => None,
    };
    // Snapshots are made beside the output, in its directory checked now
    // (held open, so that they can be made after a privilege drop).
    let snapshot_dir = match (&snapshot_base, spec.trigger.as_ref().map(|t| t.mode)) {
        (Some(p), Some(spec::TriggerMode::CloneSnapshot)) => Some(
            crate::storage::create::OutputDir::of_file(p)
                .map_err(|e| AppError::Output(e.into()))?,
        ),
        _ => None,
    };

    let uid = consumer_uid.unwrap_or_else(|| rustix::process::getuid().as_raw());
    let log = service_log(spec, uid, uuid, matches!(sink, Output::Segments(_)));
    let timeline = Timeline::from_spec(spec)?
        .with_rotation(opts.rotation.clone())
        .with_snapshot_disk(opts.rotation.max_disk.filter(|_| !opts.rotation.rotates()));
    let needs_control = timeline.mode != TriggerMode::None;
    let (control, history) = match served_control {
        Some(c) => (Some(c), None),
        None => control_server(needs_control)?,
    };

    Ok(Recording {
        session: Session::new(timeline),
        buffers,
        sources,
        sink,
        compress,
        output_label,
        snapshot_base,
        snapshot_open: OpenOptions {
            no_clobber: false,
            io: opts.io,
            direct: false,
        },
        log,
        max_file_size: spec.file.as_ref().and_then(|f| f.max_size.map(|s| s.0)),
        control,
        history,
        producers,
        config_label: opts.config_label.clone(),
        status_line: opts.status_line,
        snapshot_dir,
        quota_view: QuotaView::for_consumer(consumer_uid),
        on_snapshot: None,
    })
}

/// The session's ring buffers, as the config sizes them.
fn session_buffers(spec: &RecorderSpec) -> Result<Vec<SessionBuffer>, AppError> {
    let mut buffers = Vec::with_capacity(spec.buffers.len());
    for (index, b) in spec.buffers.iter().enumerate() {
        let policy = match b.fill_policy {
            spec::FillPolicy::RingBuffer => FillPolicy::RingBuffer,
            spec::FillPolicy::Discard => FillPolicy::Discard,
        };
        let params = BufferParams::new(b.size.0 as usize, policy);
        let buffer = Buffer::new(params).map_err(|source| AppError::Buffer { index, source })?;
        buffers.push(SessionBuffer {
            buffer,
            policy: match policy {
                FillPolicy::RingBuffer => "RING_BUFFER",
                FillPolicy::Discard => "DISCARD",
            },
        });
    }
    Ok(buffers)
}

/// The built-in data sources the config asks for, each on its own
/// sequence; returns them and the next free sequence id (the producers').
/// `served`: a `recorder serve` session's consumer uid and who prepares
/// its tracefs instances.
fn builtin_sources(
    spec: &RecorderSpec,
    buffers: &[SessionBuffer],
    filters: &[ProducerFilter],
    served: Option<&(u32, Option<Arc<dyn RemoteTracefs>>)>,
) -> Result<(Vec<Box<dyn DataSource>>, u32), AppError> {
    let mut sources: Vec<Box<dyn DataSource>> = Vec::new();
    let mut next_seq = FIRST_SOURCE_SEQUENCE;
    // ftrace tells process_stats which pids it saw, once that poller runs.
    let pid_route: PidRoute = Arc::new(std::sync::Mutex::new(None));
    for (index, ds) in spec.data_sources.iter().enumerate() {
        let Some(target) = buffers.get(ds.target_buffer.0 as usize) else {
            return Err(AppError::MissingBuffer {
                index,
                name: ds.name.clone(),
                buffer: ds.target_buffer.0,
            });
        };
        let buffer: &Arc<Buffer> = &target.buffer;
        if !filters[index].admits(PRODUCER_NAME) {
            log::info!(
                "data_sources[{index}] ({}): its producer filters leave out the built-in {PRODUCER_NAME}",
                ds.name
            );
            continue;
        }
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| AppError::Source {
            index,
            name: ds.name.clone(),
            source: e,
        };
        // Made only for a source that is built: a writer names its sequence
        // in the buffer's stats.
        let writer = || buffer.writer(WriterId(next_seq));
        let source: Box<dyn DataSource> = match &ds.kind {
            SourceKind::ForTesting(t) => {
                let opts = TestOptions {
                    message_count: t.message_count as u64,
                    max_messages_per_second: t.max_messages_per_second,
                    message_size: t.message_size,
                    seed: t.seed,
                    send_batch_on_register: t.send_batch_on_register,
                };
                Box::new(ForTesting::new(&ds.name, opts, writer()))
            }
            SourceKind::ProcessStats(p) => {
                let src = ProcessStatsSource::new(p.clone(), HostPaths::default(), next_seq);
                Box::new(
                    PolledDataSource::new(&ds.name, src, writer()).route_pids(pid_route.clone()),
                )
            }
            SourceKind::Ftrace(_) if served.is_some_and(|(_, r)| r.is_none()) => {
                log::info!(
                    "data source {:?}: served by producers (this service prepares no tracefs)",
                    ds.name
                );
                continue;
            }
            // What the built-in source cannot serve stays with the producers
            // that can (traced_probes honours every field).
            SourceKind::Ftrace(f)
                if served.is_some()
                    && let Err(e) = FtraceRequest::from_spec(f) =>
            {
                log::info!("data source {:?}: left to producers: {e}", ds.name);
                continue;
            }
            SourceKind::Ftrace(f) => {
                let read_mode = ReadMode::from_env().map_err(|e| failed(Box::new(e)))?;
                let subbuf = SubbufSize::from_env().map_err(|e| failed(Box::new(e)))?;
                let opts = FtraceOptions {
                    spec: f.clone(),
                    sequence_id: next_seq,
                    read_mode,
                    subbuf,
                    ..FtraceOptions::default()
                };
                match served {
                    Some((uid, Some(remote))) => Box::new(FtraceDataSource::served(
                        &ds.name,
                        opts,
                        writer(),
                        pid_route.clone(),
                        remote.clone(),
                        *uid,
                    )),
                    _ => Box::new(
                        FtraceDataSource::new(&ds.name, opts, writer(), pid_route.clone())
                            .map_err(|e| failed(Box::new(e)))?,
                    ),
                }
            }
            SourceKind::SysStats(s) => {
                let src = SysStatsSource::new(s, HostPaths::default(), next_seq)
                    .map_err(|e| failed(Box::new(e)))?;
                Box::new(PolledDataSource::new(&ds.name, src, writer()))
            }
            _ => {
                log::info!(
                    "data source {:?} has no built-in provider here: nothing recorded for it",
                    ds.name
                );
                continue;
            }
        };
        sources.push(source);
        next_seq += 1;
    }
    Ok((sources, next_seq))
}

/// O_DIRECT for plain traces (storage::direct), streamed or written at the
/// end (a flight recorder's whole ring at its trigger: through the page
/// cache that pass fills the dirty limit and waits on writeback, then on
/// fdatasync). Not under a size cap, which its padding could overrun, nor
/// for compressed passes, which are copied whole anyway, nor for segments.
/// Storage still probes the file.
fn direct_wanted(spec: &RecorderSpec, opts: &RunOptions, compressed: bool) -> bool {
    opts.direct_io
        && spec.file.as_ref().is_none_or(|f| f.max_size.is_none())
        && !compressed
        && !opts.rotation.rotates()
}

/// The output: numbered segments when rotating, else one file (or stdout).
fn output(
    spec: &RecorderSpec,
    opts: &RunOptions,
    buffers: &[SessionBuffer],
    uuid: (i64, i64),
    compression: spec::Compression,
    compressed: bool,
) -> Result<Output, AppError> {
    let direct = direct_wanted(spec, opts, compressed);
    let sink_opts = OpenOptions {
        no_clobber: opts.no_clobber,
        io: opts.io,
        direct,
    };
    if !opts.rotation.rotates() {
        return Ok(Output::File(
            storage::open_output(opts.output.clone(), sink_opts).map_err(AppError::Output)?,
        ));
    }
    opts.rotation.check().map_err(AppError::Rotation)?;
    let OutputPath::File(out) = &opts.output else {
        return Err(AppError::Refused(
            "segments (--rotate-size, --rotate-period) need a file or directory output, not stdout",
        ));
    };
    if matches!(
        spec.trigger.as_ref().map(|t| t.mode),
        Some(spec::TriggerMode::CloneSnapshot)
    ) {
        return Err(AppError::Refused(
            "segments do not apply to CLONE_SNAPSHOT sessions (their snapshots are files of their own)",
        ));
    }
    let (host, boot_id) = storage::segment::sidecar::host_and_boot_id();
    let identity = SegmentIdentity {
        host,
        boot_id,
        session_uuid: uuid,
        compression: match compression {
            spec::Compression::None => "none".into(),
            spec::Compression::Zstd { level } => format!(
                "zstd level {}",
                if level == 0 {
                    storage::compress::DEFAULT_ZSTD_LEVEL
                } else {
                    level
                }
            ),
        },
    };
    let w = SegmentWriter::create(
        SegmentNames::from_output(out),
        opts.rotation.clone(),
        sink_opts,
        identity,
        buffers.iter().map(|b| b.buffer.clone()).collect(),
    )
    .map_err(AppError::Segments)?;
    Ok(Output::Segments(Box::new(w)))
}

/// The service packets' log, with the config's switches.
fn service_log(spec: &RecorderSpec, uid: u32, uuid: (i64, i64), segments: bool) -> ServiceLog {
    let mut log = ServiceLog::new(uid, spec.config_bytes.clone(), uuid, SystemInfo::current());
    if segments {
        log.begin_segment(0, segment_uuid(uuid, 0));
    }
    log.disable_clock_snapshotting = spec.builtin.disable_clock_snapshotting;
    log.disable_trace_config = spec.builtin.disable_trace_config;
    log.disable_system_info = spec.builtin.disable_system_info;
    log.disable_service_events = spec.builtin.disable_service_events;
    log
}

/// What the session does before its event loop reads a byte from anyone:
/// the sources' privileged preparation (tracefs), then — for a root
/// session — the drop to the service user, and only then the control
/// endpoints served. A failed drop ends the session before it serves.
pub fn begin(rec: &mut Recording, privileges: Option<Privileges>) -> Result<(), AppError> {
    for s in &mut rec.sources {
        s.prepare();
    }
    if let Some(p) = privileges {
        give_up_root(rec, &p)?;
    }
    if let Some(c) = &mut rec.control {
        c.serve().map_err(AppError::Control)?;
    }
    Ok(())
}

/// Registers with the broker what the session will need done as root
/// later — new files in its output directories, the tracefs teardown, the
/// sockets to remove, the hook — and gives up root for the whole process.
fn give_up_root(rec: &mut Recording, p: &Privileges) -> Result<(), AppError> {
    let runtime = rec
        .control
        .as_ref()
        .and_then(|_| crate::control::runtime_dir::for_server().ok());
    let producer_dir = rec.producers.as_ref().and_then(|h| {
        let (dir, name) = crate::storage::create::split(h.path()).ok()?;
        let fd = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        Some((fd, name))
    });
    if let Some(h) = &mut rec.history
        && let Err(e) = h.hold_open()
    {
        log::warn!("trigger history unavailable ({e}): max_per_24_h sees no earlier triggers");
    }
    let mut reg = Registration {
        teardowns: rec
            .sources
            .iter_mut()
            .filter_map(|s| s.hand_over_teardown())
            .collect(),
        ..Registration::default()
    };
    // Which registered directory is which: segments (true) or snapshots.
    let mut which = Vec::new();
    if let Output::Segments(w) = &rec.sink {
        reg.dirs
            .push((w.dir().fd(), vec![format!("{}-", w.names().stem)]));
        which.push(true);
        if let Some((cmd, timeout)) = w.hook_command() {
            reg.hook = Some((cmd.to_string(), w.names().dir.clone(), timeout));
        }
    }
    if let Some((dir, base)) = &rec.snapshot_dir {
        reg.dirs.push((dir.fd(), vec![format!("{base}.")]));
        which.push(false);
    }
    if let Some(rt) = &runtime {
        let (a, b) = crate::control::server::endpoint_names(std::process::id());
        reg.leftovers.push((rt.fd(), a));
        reg.leftovers.push((rt.fd(), b));
    }
    if let Some((fd, name)) = &producer_dir {
        reg.leftovers.push((fd.as_fd(), name.clone()));
    }
    let ids = p.drop_now(reg).map_err(AppError::Privilege)?;
    for (id, segments) in ids.into_iter().zip(which) {
        if segments {
            if let Output::Segments(w) = &mut rec.sink {
                w.dir_mut().delegate_to(p.broker.clone(), id);
                w.hand_hooks_to(p.broker.clone());
            }
        } else if let Some((dir, _)) = &mut rec.snapshot_dir {
            dir.delegate_to(p.broker.clone(), id);
        }
    }
    Ok(())
}

/// The session's control socket and trigger history in the runtime
/// directory; optional unless the session waits for triggers.
fn control_server(
    needs_control: bool,
) -> Result<(Option<ControlServer>, Option<TriggerHistory>), AppError> {
    let uid = rustix::process::getuid().as_raw();
    Ok(match runtime_dir::for_server() {
        // Served once the session has given up root ([`begin`]).
        Ok(dir) => match ControlServer::bind(&dir, std::process::id(), uid) {
            Ok(c) => (Some(c), Some(TriggerHistory::new(&dir))),
            Err(e) if needs_control => return Err(AppError::Control(e)),
            Err(e) => {
                log::warn!(
                    "control socket unavailable ({e}): `recorder query/stop` will not see this session"
                );
                (None, None)
            }
        },
        Err(e) if needs_control => return Err(AppError::Control(e)),
        Err(e) => {
            log::warn!(
                "no runtime directory ({e}): `recorder query/stop` will not see this session"
            );
            (None, None)
        }
    })
}

/// The producer filters of every config data source, patterns compiled
/// (validation checked them already).
fn producer_filters(spec: &RecorderSpec) -> Result<Vec<ProducerFilter>, AppError> {
    spec.data_sources
        .iter()
        .enumerate()
        .map(|(index, ds)| {
            let patterns = ds
                .producer_name_regex_filter
                .iter()
                .map(|p| anchored(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| AppError::ProducerFilter {
                    index,
                    msg: e.to_string(),
                })?;
            Ok(ProducerFilter {
                names: ds.producer_name_filter.clone(),
                patterns,
            })
        })
        .collect()
}

/// Whether this session opens the producer socket, and where: closed
/// unless the config names data sources only apps provide or
/// `--producer-socket` is given (`flag`); `PERFETTO_PRODUCER_SOCK_NAME`
/// only moves it. `recorder serve` is to pass `serve`.
pub fn producer_opening(
    spec: &RecorderSpec,
    flag: Option<&std::path::Path>,
    serve: bool,
) -> Result<Opening, SocketPathError> {
    let env = std::env::var(socket_path::ENV_VAR).ok();
    // A built-in source its producer filters leave out is for apps too.
    let filters = producer_filters(spec).unwrap_or_default();
    let app_sources: Vec<String> = spec
        .data_sources
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            matches!(d.kind, SourceKind::TrackEvent | SourceKind::Other)
                || filters.get(*i).is_some_and(|f| !f.admits(PRODUCER_NAME))
        })
        .map(|(_, d)| d.name.clone())
        .fold(Vec::new(), |mut v, n| {
            if !v.contains(&n) {
                v.push(n);
            }
            v
        });
    socket_path::decide(flag, env.as_deref(), &app_sources, serve)
}

/// The producer socket and what producers may provide, when the session
/// opens it ([`producer_opening`]); a session that does not claims nothing,
/// so a path squatted by anyone cannot affect it. Once it is to open, any
/// failure to claim the path is the session's.
fn producer_host(
    spec: &RecorderSpec,
    opts: &RunOptions,
    filters: Vec<ProducerFilter>,
    buffers: &[SessionBuffer],
    first_sequence: u32,
    uuid: (i64, i64),
) -> Result<Option<ProducerHost>, AppError> {
    // Not a service: `recorder serve` will open it for its apps.
    let path = match producer_opening(spec, opts.producer_socket.as_deref(), false)? {
        Opening::Closed => {
            log::debug!(
                "producer socket: closed (every data source is built in; \
                 --producer-socket PATH lets apps connect)"
            );
            return Ok(None);
        }
        Opening::Open { path, reason } => {
            log::debug!("producer socket opens: {reason}");
            path
        }
    };
    let host = ProducerHost::listen(&path, buffers.len()).map_err(host_error)?;
    Ok(Some(serve_producers(
        host,
        spec,
        filters,
        buffers,
        first_sequence,
        uuid,
    )?))
}

/// Tells `host` what the session wants of producers, with its buffer ids.
fn serve_producers(
    mut host: ProducerHost,
    spec: &RecorderSpec,
    filters: Vec<ProducerFilter>,
    buffers: &[SessionBuffer],
    first_sequence: u32,
    uuid: (i64, i64),
) -> Result<ProducerHost, AppError> {
    let wanted = wanted_sources(spec, filters, uuid, host.buffer_base())?;
    let rings = buffers.iter().map(|b| b.buffer.clone()).collect();
    host.serve(wanted, rings, first_sequence);
    Ok(host)
}

fn host_error(e: HostError) -> AppError {
    match e {
        HostError::Socket(e) => AppError::ProducerSocket(e),
        e => AppError::Producers(e),
    }
}

/// What producers may provide: every config data source, with its
/// DataSourceConfig as producers get it; buffer `i` has id `base + i + 1`
/// (unique among the sessions of `recorder serve`).
fn wanted_sources(
    spec: &RecorderSpec,
    filters: Vec<ProducerFilter>,
    uuid: (i64, i64),
    base: u32,
) -> Result<Vec<WantedSource>, AppError> {
    let mut wanted = Vec::with_capacity(spec.data_sources.len());
    for (index, (ds, filter)) in spec.data_sources.iter().zip(filters).enumerate() {
        let buffer = base + ds.target_buffer.0 + 1;
        let svc = ServiceFields {
            target_buffer: Some(buffer),
            trace_duration_ms: Some(spec.duration.map_or(0, |d| d.as_millis() as u32)),
            tracing_session_id: Some(uuid.1 as u64),
            stop_timeout_ms: Some(spec.data_source_stop_timeout.as_millis() as u32),
            ..ServiceFields::default()
        };
        let config = ds.config_for_source(&svc).map_err(|e| AppError::Source {
            index,
            name: ds.name.clone(),
            source: Box::new(e),
        })?;
        wanted.push(WantedSource {
            name: ds.name.clone(),
            filter,
            buffer,
            config,
        });
    }
    Ok(wanted)
}

/// The output path made absolute, so it survives `--background`'s chdir.
pub fn absolute_output(p: &std::path::Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// An error with its causes on one line (`output: /x: Permission denied`),
/// each cause once even where a message already repeats its source.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}
