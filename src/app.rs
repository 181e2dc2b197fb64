//! The composition root: builds the runtime objects of a session from a
//! validated [`RecorderSpec`] — buffers, data sources (each on its own
//! sequence), the output sink, the service packets, the control endpoints —
//! and hands them to the event loop. The only module that knows every
//! concrete type.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::raw::ServiceFields;
use crate::config::spec::{self, RecorderSpec, SourceKind};
use crate::control::history::TriggerHistory;
use crate::control::runtime_dir;
use crate::control::server::ControlServer;
use crate::event_loop::rules::RuleBook;
use crate::event_loop::{Recording, SessionBuffer};
use crate::privilege::{Privileges, Registration};
use crate::producer::filter::ProducerFilter;
use crate::producer::host::{HostError, ProducerHost, ProducerService, QuotaView, WantedSource};
use crate::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};
use crate::session::{Session, Timeline, TimelineError, TriggerMode, anchored};
use crate::sources::counter_watch::CounterWatch;
use crate::sources::for_testing::{ForTesting, TestOptions};
use crate::sources::ftrace::remote::{FtraceRequest, RemoteTracefs};
use crate::sources::ftrace::{FtraceOptions, ReadMode, SubbufSize};
use crate::sources::ftrace_source::FtraceDataSource;
use crate::sources::polled::{PidRoute, PolledDataSource};
use crate::sources::process_stats::ProcessStatsSource;
use crate::sources::procfs::HostPaths;
use crate::sources::rules::RulePlan;
use crate::sources::sys_stats::SysStatsSource;
use crate::sources::{DataSource, PRODUCER_NAME};
use crate::storage::compress::ZstdStage;
use crate::storage::create::{CreateError, OutputDir};
use crate::storage::segment::names::SegmentNames;
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::segment::{Output, SegmentIdentity, SegmentWriter, segment_uuid};
use crate::storage::{self, IoChoice, OpenOptions, OutputPath};
use crate::trace::service::SystemInfo;
use crate::trace::service_log::{ServiceLog, random_uuid};
use crate::transport::socket_path::{self, Opening, SocketPathError};

/// Errors of building a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
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
    #[error("data_sources[{index}].producer_name_regex_filter: {source}")]
    ProducerFilter {
        index: usize,
        #[source]
        source: regex::Error,
    },
    #[error("--ring-dir")]
    RingDir(#[source] RingDirError),
}

/// Where a session's buffers live: anonymous memory (the default), a memfd
/// shared with the process that saves them if the recorder dies, or a file
/// each in `--ring-dir`.
#[derive(Clone, Debug, Default)]
pub(crate) struct RingOptions {
    /// `--ring-dir`: one file per buffer in this directory.
    pub dir: Option<PathBuf>,
    /// `--ring-sync`: how often the ring files are written back to disk.
    pub sync: Option<Duration>,
    /// Shared memory (a sealed memfd), handed to the process that saves
    /// the buffers when the recorder dies; ignored with `dir`, whose files
    /// are shared anyway.
    pub shared: bool,
}

/// The session's ring files, once made: their directory, held open, and
/// their names (buffer `i`'s is `names[i]`).
#[derive(Debug)]
pub(crate) struct RingDir {
    pub dir: OutputDir,
    pub names: Vec<String>,
}

/// What `build_recording` made besides the recording: the ring files, and
/// the thread that writes them back every `--ring-sync` period.
#[derive(Debug, Default)]
pub(crate) struct Rings {
    pub dir: Option<RingDir>,
    pub sync: Option<Duration>,
    syncer: Option<RingSync>,
}

impl Rings {
    /// Starts writing the ring files back every `sync` period (from now,
    /// so after the privilege drop: the thread needs no rights).
    pub(crate) fn start_sync(&mut self, buffers: &[SessionBuffer]) {
        if let (Some(period), Some(_), None) = (self.sync, &self.dir, &self.syncer) {
            let buffers = buffers.iter().map(|b| b.buffer.clone()).collect();
            match RingSync::start(buffers, period) {
                Ok(s) => self.syncer = Some(s),
                Err(e) => log::warn!("--ring-sync: cannot start its thread: {e}"),
            }
        }
    }

    /// The session is over: the syncing stops; after a clean end the ring
    /// files go (what they held is in the trace), after a failure they stay
    /// for `recorder recover`, and the caller is told where.
    pub(crate) fn finish(mut self, failed: bool) -> Option<String> {
        if let Some(s) = self.syncer.take() {
            s.stop();
        }
        let d = self.dir.take()?;
        if failed {
            return Some(format!(
                "the buffers' ring files stay in {} (recorder recover {} -o OUT)",
                d.dir.path().display(),
                d.dir.path().display()
            ));
        }
        for n in &d.names {
            if let Err(e) = d.dir.remove(n) {
                log::warn!("removing the ring file {}: {e}", d.dir.join(n).display());
            }
        }
        None
    }
}

/// Writes file-backed buffers back to their files every period
/// (`msync(MS_SYNC)`), on a thread of its own: a write pass or a writer
/// never waits for it.
#[derive(Debug)]
struct RingSync {
    /// Dropped to stop the thread.
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl RingSync {
    fn start(buffers: Vec<Arc<Buffer>>, period: Duration) -> std::io::Result<RingSync> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ring-sync".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(period)
                {
                    for (i, b) in buffers.iter().enumerate() {
                        if let Err(e) = b.sync_to_file() {
                            log::warn!("--ring-sync: buffer {i}: {e}");
                        }
                    }
                }
            })?;
        Ok(RingSync { stop, thread })
    }

    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// A `--ring-dir` that cannot take the session's buffers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RingDirError {
    #[error(transparent)]
    Dir(CreateError),
    /// A ring file is there already: an earlier session's (to be
    /// recovered), or something another user planted.
    #[error(
        "{path} is there already ({what}): {advice}",
        path = path.display()
    )]
    Taken {
        path: PathBuf,
        what: RingOccupant,
        advice: &'static str,
    },
}

/// What holds a ring file's name.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RingOccupant {
    /// An entry as `stat` sees it: its kind and owner.
    #[error("{kind} of uid {uid}")]
    Entry { kind: &'static str, uid: u32 },
    /// An entry `stat` refused to look at.
    #[error("unexaminable: {0}")]
    Unexaminable(#[source] rustix::io::Errno),
}

/// Checks `dir` for a session's ring files: a directory files may be made
/// in ([`OutputDir::open`]'s rules), holding none of the names the
/// session's `count` buffers take. A name already taken is refused, never
/// opened: an earlier session's ring (to recover first) or an entry another
/// user planted (a link, a FIFO) alike.
pub(crate) fn check_ring_dir(dir: &Path, count: usize) -> Result<OutputDir, RingDirError> {
    let od = OutputDir::open(dir).map_err(RingDirError::Dir)?;
    for i in 0..count {
        let name = crate::ringbuf::layout::file_name(i as u32);
        if od.has(&name) {
            return Err(taken(&od, &name));
        }
    }
    Ok(od)
}

/// The refusal for `name` in `dir`, saying what is there.
fn taken(dir: &OutputDir, name: &str) -> RingDirError {
    use rustix::fs::{AtFlags, FileType};
    let me = rustix::process::geteuid().as_raw();
    let (what, advice) = match rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => {
            let kind = match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => "a file",
                FileType::Symlink => "a symbolic link",
                FileType::Fifo => "a FIFO",
                FileType::Socket => "a socket",
                FileType::Directory => "a directory",
                _ => "a device",
            };
            let ours =
                st.st_uid == me && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
            let what = RingOccupant::Entry {
                kind,
                uid: st.st_uid,
            };
            if ours {
                (
                    what,
                    "the ring of an earlier session that did not end; recover it (recorder recover DIR -o OUT) or remove it, or give another --ring-dir",
                )
            } else {
                (
                    what,
                    "not a ring this session made, and never opened; remove it or give another --ring-dir",
                )
            }
        }
        Err(e) => (RingOccupant::Unexaminable(e), "give another --ring-dir"),
    };
    RingDirError::Taken {
        path: dir.join(name),
        what,
        advice,
    }
}

/// How to run, from the command line.
#[derive(Clone, Debug)]
pub(crate) struct RunOptions {
    pub output: OutputPath,
    pub no_clobber: bool,
    pub io: IoChoice,
    /// The config's path (or `stdin`), for `recorder query`.
    pub(crate) config_label: String,
    /// Draw a live status line when stderr is a terminal.
    pub(crate) status_line: bool,
    /// Replaces the config's compression (`--compress`).
    pub compression: Option<spec::Compression>,
    /// Segmented output; inactive unless it rotates.
    pub rotation: RotationPolicy,
    /// O_DIRECT may be used where it applies (`RECORDER_DIRECT_IO=off`
    /// says no).
    pub(crate) direct_io: bool,
    /// Where SDK apps connect (`--producer-socket`); else the environment's
    /// or the default path.
    pub(crate) producer_socket: Option<PathBuf>,
    /// The trigger rules the recorder fires itself (`--trigger-rule`),
    /// checked against the config already.
    pub rules: Vec<crate::config::rule::Rule>,
}

/// The first sequence id of data sources; 1 is the recorder's own.
const FIRST_SOURCE_SEQUENCE: u32 = 2;

/// What `recorder serve` hands a session instead of what `build` opens
/// itself: the output, the control endpoint and, when the session serves
/// producers, the producer socket. Such a session runs unprivileged: it
/// records `linux.ftrace` itself only on instances `ftrace` (the root
/// broker) prepares; without it producers (traced_probes) provide it.
pub(crate) struct Served<'a> {
    pub output: ServedOutput,
    pub(crate) output_label: String,
    /// The service's producer socket, which the session attaches to.
    pub producers: Option<&'a ProducerService>,
    /// The consumer's uid, written as the trace's trusted uid.
    pub consumer_uid: u32,
    pub ftrace: Option<Arc<dyn RemoteTracefs>>,
    /// Buffers on memfds, so that the service's broker can save them if
    /// the service dies ([`save_served_at_death`]).
    pub(crate) shared_rings: bool,
}

/// Where a served session writes.
pub(crate) enum ServedOutput {
    /// A file (the client's, or the session's in-memory one); its sink is
    /// chosen as for a file the recorder opens (`direct_wanted`).
    File(OwnedFd),
    /// A stream, with the sink the service chose for it.
    Stream(Box<dyn crate::storage::FileSink>),
}

/// Builds every runtime object of the session, its buffers where `rings`
/// says; returns the ring files made, if any.
pub(crate) fn build_recording(
    spec: &RecorderSpec,
    opts: &RunOptions,
    rings: &RingOptions,
) -> Result<(Recording, Rings), AppError> {
    build_with(spec, opts, None, rings)
}

/// Builds a session of `recorder serve` on what the service hands it.
pub(crate) fn build_served(
    spec: &RecorderSpec,
    opts: &RunOptions,
    served: Served<'_>,
) -> Result<Recording, AppError> {
    let rings = RingOptions {
        shared: served.shared_rings,
        ..RingOptions::default()
    };
    build_with(spec, opts, Some(served), &rings).map(|(rec, _)| rec)
}

/// Hands `recorder serve`'s broker what it saves of served session
/// `session` if the service dies while it records (§5.6 PV6): its buffers'
/// memfds, its trace file, its ftrace instances' leftovers. Nothing when
/// the session has no file of its own to save to (a stream, or the
/// in-memory file a client reads back, which dies with the service).
pub(crate) fn save_served_at_death(
    rec: &Recording,
    broker: &crate::privilege::Broker,
    session: u64,
) -> Result<(), AppError> {
    let rings = Rings::default();
    let mut reg = Registration::default();
    rescue_registration(rec, &rings, &mut reg);
    broker
        .save_served(session, reg)
        .map_err(AppError::Privilege)
}

fn build_with(
    spec: &RecorderSpec,
    opts: &RunOptions,
    served: Option<Served<'_>>,
    ring_opts: &RingOptions,
) -> Result<(Recording, Rings), AppError> {
    let is_served = served.is_some();
    let (mut served_sink, served_label, mut served_producers, consumer_uid) = match served {
        Some(s) => (
            Some(s.output),
            Some(s.output_label),
            s.producers,
            Some((s.consumer_uid, s.ftrace)),
        ),
        None => (None, None, None, None),
    };
    let uuid = spec.trace_uuid.unwrap_or_else(random_uuid);
    let trusted_uid = consumer_uid
        .as_ref()
        .map_or_else(|| rustix::process::getuid().as_raw(), |(uid, _)| *uid);
    let (buffers, ring_dir) = session_buffers(spec, ring_opts, uuid, trusted_uid)?;
    let filters = producer_filters(spec)?;
    // A served session's rules are its consumers' triggers: none here.
    let plan = (!is_served && !opts.rules.is_empty()).then(|| RulePlan::new(opts.rules.clone()));
    let (sources, next_seq) = builtin_sources(
        spec,
        &buffers,
        &filters,
        consumer_uid.as_ref(),
        plan.as_ref(),
    )?;
    let consumer_uid = consumer_uid.map(|(uid, _)| uid);

    // Claimed before the output is opened: a refusal truncates nothing.
    let producers = match served_producers.take() {
        None if is_served => None,
        None => producer_host(spec, opts, filters, &buffers, next_seq, uuid)?,
        Some(service) => {
            let host = ProducerHost::attach(service, buffers.len()).map_err(host_error)?;
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
    // The runtime directory checked and the control endpoints bound before
    // the output is opened: a refusal there (another user's directory,
    // names planted where this session's sockets go) touches no output.
    let timeline = Timeline::from_spec(spec)?
        .with_rotation(opts.rotation.clone())
        .with_snapshot_disk(opts.rotation.max_disk.filter(|_| !opts.rotation.rotates()))
        .with_snapshot_owner(consumer_uid.unwrap_or_else(|| rustix::process::getuid().as_raw()));
    let needs_control = timeline.mode != TriggerMode::None;
    // A ring overwritten before a streaming session wrote it lost data.
    let rules = plan.map(|p| RuleBook::new(p, spec, timeline.write_period.is_some()));
    // A served session is reached through the service, not the runtime
    // directory.
    let (control, history) = if is_served {
        (None, None)
    } else {
        control_server(needs_control)?
    };
    let sink = match served_sink.take() {
        Some(ServedOutput::File(fd)) => Output::File(
            storage::sink_for_fd(fd, opts.io, direct_wanted(spec, opts, compress.is_some()))
                .map_err(AppError::Output)?,
        ),
        Some(ServedOutput::Stream(sink)) => Output::File(sink),
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

    let rings = Rings {
        dir: ring_dir,
        sync: ring_opts.sync,
        syncer: None,
    };
    let rec = Recording {
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
        snapshots_to_host: false,
        rules,
    };
    Ok((rec, rings))
}

/// The session's ring buffers, as the config sizes them, where `rings`
/// says; each names the session in its header (`uuid`, `uid`, the config,
/// a clock snapshot), so that it can be read back without the recorder.
fn session_buffers(
    spec: &RecorderSpec,
    rings: &RingOptions,
    uuid: (i64, i64),
    uid: u32,
) -> Result<(Vec<SessionBuffer>, Option<RingDir>), AppError> {
    let mut buffers = Vec::with_capacity(spec.buffers.len());
    let dir = match &rings.dir {
        Some(d) => Some(check_ring_dir(d, spec.buffers.len()).map_err(AppError::RingDir)?),
        None => None,
    };
    let mut names = Vec::new();
    let identity = RingIdentity {
        index: 0,
        count: spec.buffers.len() as u32,
        uuid,
        uid,
        pid: std::process::id(),
        boot_id: crate::clock::boot_id(),
        created_realtime_ns: crate::clock::BuiltinClock::Realtime.now_ns(),
        clocks: crate::clock::snapshot()
            .0
            .into_iter()
            .map(|(c, ts)| (c as u32, ts))
            .collect(),
        config: spec.config_bytes.clone(),
    };
    let made = (|| {
        for (index, b) in spec.buffers.iter().enumerate() {
            let policy = match b.fill_policy {
                spec::FillPolicy::RingBuffer => FillPolicy::RingBuffer,
                spec::FillPolicy::Discard => FillPolicy::Discard,
            };
            let params = BufferParams::new(b.size.0 as usize, policy);
            let backing = match &dir {
                Some(d) => {
                    let name = crate::ringbuf::layout::file_name(index as u32);
                    let fd = d.create_new(&name).map_err(|e| {
                        AppError::RingDir(match e {
                            CreateError::Exists { .. } => taken(d, &name),
                            e => RingDirError::Dir(e),
                        })
                    })?;
                    names.push(name);
                    Backing::File(fd)
                }
                None if rings.shared => Backing::Memfd,
                None => Backing::Anonymous,
            };
            let identity = RingIdentity {
                index: index as u32,
                ..identity.clone()
            };
            let buffer = match Buffer::create(params, backing, &identity) {
            Err(e) if rings.shared && rings.dir.is_none() => {
                log::warn!(
                    "buffers[{index}]: no shared memory ({e}): its data is lost if the recorder dies"
                );
                Buffer::create(params, Backing::Anonymous, &identity)
            }
            r => r,
        }
        .map_err(|source| AppError::Buffer { index, source })?;
            buffers.push(SessionBuffer {
                buffer,
                policy: match policy {
                    FillPolicy::RingBuffer => "RING_BUFFER",
                    FillPolicy::Discard => "DISCARD",
                },
            });
        }
        Ok(())
    })();
    if let Err(e) = made {
        // What was made of a failed session goes: no ring of it is left
        // for a later session to refuse.
        if let Some(d) = &dir {
            for n in &names {
                let _ = d.remove(n);
            }
        }
        return Err(e);
    }
    let ring_dir = dir.map(|dir| RingDir { dir, names });
    Ok((buffers, ring_dir))
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
    rules: Option<&RulePlan>,
) -> Result<(Vec<Box<dyn DataSource>>, u32), AppError> {
    let mut sources: Vec<Box<dyn DataSource>> = Vec::new();
    let mut next_seq = FIRST_SOURCE_SEQUENCE;
    // ftrace tells process_stats which pids it saw, once that poller runs.
    let pid_route = PidRoute::default();
    // Each kind of source evaluates the rules once: the first of its kind.
    let (mut ftrace_rules, mut process_rules, mut system_rules) = (rules, rules, rules);
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
                    PolledDataSource::new(&ds.name, src, writer())
                        .route_pids(pid_route.clone())
                        .watch_counters(
                            process_rules
                                .take()
                                .and_then(|p| CounterWatch::new(p, true)),
                        ),
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
                    rules: ftrace_rules.take().cloned(),
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
                Box::new(
                    PolledDataSource::new(&ds.name, src, writer()).watch_counters(
                        system_rules
                            .take()
                            .and_then(|p| CounterWatch::new(p, false)),
                    ),
                )
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
pub(crate) fn begin(rec: &mut Recording, privileges: Option<Privileges>) -> Result<(), AppError> {
    begin_recording(rec, privileges, None, &mut Rings::default())
}

/// [`begin`] for a session whose buffers `rings` made: their directory is
/// registered with the broker too (its files are removed through it after
/// the drop), and `--ring-sync` starts. What the broker — or, for a session
/// that keeps its own rights, its `keeper` — is to save if the recorder
/// dies is registered with it: the shared buffers, the trace file, the ring
/// files, the tracefs recording directories.
pub(crate) fn begin_recording(
    rec: &mut Recording,
    privileges: Option<Privileges>,
    keeper: Option<&Arc<crate::privilege::Broker>>,
    rings: &mut Rings,
) -> Result<(), AppError> {
    for s in &mut rec.sources {
        s.prepare();
    }
    if let Some(p) = privileges {
        give_up_root(rec, &p, rings)?;
    } else if let Some(k) = keeper {
        let mut reg = Registration::default();
        rescue_registration(rec, rings, &mut reg);
        k.register(reg).map_err(AppError::Privilege)?;
    }
    rings.start_sync(&rec.buffers);
    if let Some(c) = &mut rec.control {
        c.serve().map_err(AppError::Control)?;
    }
    Ok(())
}

/// Registers with the broker what the session will need done as root
/// later — new files in its output directories, the tracefs teardown, the
/// sockets to remove, the hook — and gives up root for the whole process.
fn give_up_root(rec: &mut Recording, p: &Privileges, rings: &mut Rings) -> Result<(), AppError> {
    let runtime = rec
        .control
        .as_ref()
        .and_then(|_| crate::control::runtime_dir::for_server().ok());
    let producer_dir = rec
        .producers
        .as_ref()
        .and_then(|h| crate::storage::create::open_parent(h.path()));
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
    // Which registered directory is which.
    #[derive(Clone, Copy, PartialEq)]
    enum Dir {
        Segments,
        Snapshots,
        Rings,
    }
    let mut which = Vec::new();
    if let Output::Segments(w) = &rec.sink {
        reg.dirs.push((
            w.dir().fd(),
            vec![format!("{}-", w.names().stem)],
            w.files_made(),
        ));
        which.push(Dir::Segments);
        if let Some((cmd, timeout)) = w.hook_command() {
            reg.hook = Some((cmd.to_string(), reg.dirs.len() - 1, timeout));
        }
    }
    if let Some((dir, base)) = &rec.snapshot_dir {
        reg.dirs
            .push((dir.fd(), vec![format!("{base}.")], Vec::new()));
        which.push(Dir::Snapshots);
    }
    let ring_dir = rings.dir.as_ref().map(|d| (d.dir.clone(), d.names.clone()));
    if let Some((d, names)) = &ring_dir {
        // Made before the drop: the broker may remove these, by identity.
        reg.dirs
            .push((d.fd(), vec!["buffer-".to_string()], names.clone()));
        which.push(Dir::Rings);
    }
    rescue_registration(rec, rings, &mut reg);
    if let Some(rt) = &runtime {
        let (a, b) = crate::control::server::endpoint_names(std::process::id());
        reg.leftovers.push((rt.fd(), a));
        reg.leftovers.push((rt.fd(), b));
    }
    if let Some((fd, name)) = &producer_dir {
        reg.leftovers.push((fd.as_fd(), name.clone()));
    }
    let ids = p.drop_now(reg).map_err(AppError::Privilege)?;
    for (id, dir) in ids.into_iter().zip(which) {
        match dir {
            Dir::Segments => {
                if let Output::Segments(w) = &mut rec.sink {
                    w.dir_mut().delegate_to(p.broker.clone(), id);
                    w.hand_hooks_to(p.broker.clone());
                }
            }
            Dir::Snapshots => {
                if let Some((dir, _)) = &mut rec.snapshot_dir {
                    dir.delegate_to(p.broker.clone(), id);
                }
            }
            Dir::Rings => {
                if let Some(d) = &mut rings.dir {
                    d.dir.delegate_to(p.broker.clone(), id);
                }
            }
        }
    }
    Ok(())
}

/// What the broker or keeper saves if the recorder dies: each shared
/// buffer's file, where it goes (the trace file, a regular file the
/// session writes at offsets, not a stream; or the segments' directory,
/// for the next segment), the ring files to remove once saved, and the
/// tracefs recording directories whose leftover the kernel still holds.
/// Nothing when there is nowhere to save to.
fn rescue_registration<'a>(rec: &'a Recording, rings: &'a Rings, reg: &mut Registration<'a>) {
    let pid = std::process::id();
    match &rec.sink {
        Output::File(sink) => match sink.file() {
            Some(out) => reg.save_to = Some((out, rec.output_label.clone(), pid)),
            None => return,
        },
        Output::Segments(w) => {
            reg.save_to_segments = Some((w.dir().fd(), w.names().clone(), pid));
        }
    }
    for (i, b) in rec.buffers.iter().enumerate() {
        if let Some(fd) = b.buffer.shared_file() {
            reg.rings.push((i as u32, fd));
        }
    }
    if reg.rings.is_empty() {
        reg.save_to = None;
        reg.save_to_segments = None;
        return;
    }
    if let Some(d) = &rings.dir {
        reg.ring_files = Some((d.dir.fd(), d.names.clone()));
    }
    reg.drains = rec.sources.iter().filter_map(|s| s.leftover()).collect();
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
                .map_err(|source| AppError::ProducerFilter { index, source })?;
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
pub(crate) fn producer_opening(
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
pub(crate) fn absolute_output(p: &std::path::Path) -> PathBuf {
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
