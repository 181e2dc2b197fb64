//! The composition root: builds the runtime objects of a session from a
//! validated [`RecorderSpec`] — buffers, data sources (each on its own
//! sequence), the output sink, the service packets, the control endpoints —
//! and hands them to the event loop. The only module that knows every
//! concrete type.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::raw::ServiceFields;
use crate::config::spec::{self, RecorderSpec, SourceKind};
use crate::control::history::TriggerHistory;
use crate::control::runtime_dir;
use crate::control::server::ControlServer;
use crate::event_loop::{Recording, SessionBuffer};
use crate::ipc::filter::ProducerFilter;
use crate::ipc::host::{ProducerHost, WantedSource};
use crate::ipc::socket_path::{self, Opening, SocketPathError};
use crate::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
use crate::session::{Session, Timeline, TimelineError, TriggerMode, anchored};
use crate::sources::for_testing::{ForTesting, TestOptions};
use crate::sources::ftrace::{FtraceOptions, ReadMode};
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
/// producers, the producer socket. Such a session records no ftrace
/// itself (it runs unprivileged): producers provide `linux.ftrace`.
pub struct Served {
    pub sink: Box<dyn storage::FileSink>,
    pub output_label: String,
    pub control: ControlServer,
    /// The listening producer socket and its path.
    pub producers: Option<(std::os::unix::net::UnixListener, PathBuf)>,
    /// The consumer's uid, written as the trace's trusted uid.
    pub consumer_uid: u32,
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
                Some(s.sink),
                Some(s.output_label),
                Some(s.control),
                s.producers,
                Some(s.consumer_uid),
            ),
            None => (None, None, None, None, None),
        };
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
            transfer_on_clone: b.transfer_on_clone,
            clear_before_clone: b.clear_before_clone,
        });
    }

    let filters = producer_filters(spec)?;
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
        match &ds.kind {
            SourceKind::ForTesting(t) => {
                let writer = buffer.writer(WriterId(next_seq));
                next_seq += 1;
                let opts = TestOptions {
                    message_count: t.message_count as u64,
                    max_messages_per_second: t.max_messages_per_second,
                    message_size: t.message_size,
                    seed: t.seed,
                    send_batch_on_register: t.send_batch_on_register,
                };
                sources.push(Box::new(ForTesting::new(&ds.name, opts, writer)));
            }
            SourceKind::ProcessStats(p) => {
                let src = ProcessStatsSource::new(p.clone(), HostPaths::default(), next_seq);
                let writer = buffer.writer(WriterId(next_seq));
                next_seq += 1;
                sources.push(Box::new(
                    PolledDataSource::new(&ds.name, src, writer).route_pids(pid_route.clone()),
                ));
            }
            SourceKind::Ftrace(_) if is_served => log::info!(
                "data source {:?}: served by producers (a served session has no tracefs access)",
                ds.name
            ),
            SourceKind::Ftrace(f) => {
                let writer = buffer.writer(WriterId(next_seq));
                let read_mode = ReadMode::from_env().map_err(|why| AppError::Source {
                    index,
                    name: ds.name.clone(),
                    source: why.into(),
                })?;
                let opts = FtraceOptions {
                    spec: f.clone(),
                    sequence_id: next_seq,
                    read_mode,
                    ..FtraceOptions::default()
                };
                next_seq += 1;
                let src = FtraceDataSource::new(&ds.name, opts, writer, pid_route.clone())
                    .map_err(|e| AppError::Source {
                        index,
                        name: ds.name.clone(),
                        source: Box::new(e),
                    })?;
                sources.push(Box::new(src));
            }
            SourceKind::SysStats(s) => {
                let src = SysStatsSource::new(s, HostPaths::default(), next_seq).map_err(|e| {
                    AppError::Source {
                        index,
                        name: ds.name.clone(),
                        source: Box::new(e),
                    }
                })?;
                let writer = buffer.writer(WriterId(next_seq));
                next_seq += 1;
                sources.push(Box::new(PolledDataSource::new(&ds.name, src, writer)));
            }
            _ => log::info!(
                "data source {:?} has no built-in provider here: nothing recorded for it",
                ds.name
            ),
        }
    }

    let uuid = spec.trace_uuid.unwrap_or_else(random_uuid);
    // Claimed before the output is opened: a refusal truncates nothing.
    let producers = match served_producers.take() {
        None if is_served => None,
        None => producer_host(spec, opts, filters, &buffers, next_seq, uuid)?,
        Some((listener, path)) => {
            let wanted = wanted_sources(spec, filters, uuid)?;
            let rings = buffers.iter().map(|b| b.buffer.clone()).collect();
            Some(ProducerHost::on_listener(
                listener, &path, wanted, rings, next_seq,
            ))
        }
    };
    let compression = opts.compression.unwrap_or(spec.compression);
    let compress = match compression {
        spec::Compression::None => None,
        spec::Compression::Zstd { level } => {
            Some(ZstdStage::new(level).map_err(AppError::Compression)?)
        }
    };
    // O_DIRECT for plain streaming (storage::direct): not under a size cap,
    // which its padding could overrun, nor for compressed passes, which are
    // copied whole anyway, nor for segments.
    let direct = opts.direct_io
        && spec.file.as_ref().is_some_and(|f| f.max_size.is_none())
        && compress.is_none()
        && !opts.rotation.rotates();
    let sink_opts = OpenOptions {
        no_clobber: opts.no_clobber,
        io: opts.io,
        direct,
    };
    let sink = if let Some(s) = served_sink.take() {
        Output::File(s)
    } else if opts.rotation.rotates() {
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
        Output::Segments(Box::new(w))
    } else {
        Output::File(
            storage::open_output(opts.output.clone(), sink_opts).map_err(AppError::Output)?,
        )
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
    let mut log = ServiceLog::new(uid, spec.config_bytes.clone(), uuid, SystemInfo::current());
    if matches!(sink, Output::Segments(_)) {
        log.begin_segment(0, segment_uuid(uuid, 0));
    }
    log.disable_clock_snapshotting = spec.builtin.disable_clock_snapshotting;
    log.disable_trace_config = spec.builtin.disable_trace_config;
    log.disable_system_info = spec.builtin.disable_system_info;
    log.disable_service_events = spec.builtin.disable_service_events;

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
        fsync_each_pass: spec.file.as_ref().is_some_and(|f| f.fdatasync_each_pass),
        control,
        history,
        producers,
        config_label: opts.config_label.clone(),
        status_line: opts.status_line,
        snapshot_dir,
        privileges: None,
        on_snapshot: None,
    })
}

/// The session's control socket and trigger history in the runtime
/// directory; optional unless the session waits for triggers.
fn control_server(
    needs_control: bool,
) -> Result<(Option<ControlServer>, Option<TriggerHistory>), AppError> {
    let uid = rustix::process::getuid().as_raw();
    Ok(match runtime_dir::for_server() {
        Ok(dir) => match ControlServer::start(&dir, std::process::id(), uid) {
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
    let wanted = wanted_sources(spec, filters, uuid)?;
    let rings = buffers.iter().map(|b| b.buffer.clone()).collect();
    Ok(Some(ProducerHost::listen(
        &path,
        wanted,
        rings,
        first_sequence,
    )?))
}

/// What producers may provide: every config data source, with its
/// DataSourceConfig as producers get it.
fn wanted_sources(
    spec: &RecorderSpec,
    filters: Vec<ProducerFilter>,
    uuid: (i64, i64),
) -> Result<Vec<WantedSource>, AppError> {
    let mut wanted = Vec::with_capacity(spec.data_sources.len());
    for (index, (ds, filter)) in spec.data_sources.iter().zip(filters).enumerate() {
        let buffer = ds.target_buffer.0 + 1;
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
