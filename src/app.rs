//! The composition root: builds the runtime objects of a session from a
//! validated [`RecorderSpec`] — buffers, data sources (each on its own
//! sequence), the output sink, the service packets, the control endpoints —
//! and hands them to the event loop. The only module that knows every
//! concrete type.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::spec::{self, RecorderSpec, SourceKind};
use crate::control::history::TriggerHistory;
use crate::control::runtime_dir;
use crate::control::server::ControlServer;
use crate::event_loop::{Recording, SessionBuffer};
use crate::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
use crate::session::{Session, Timeline, TimelineError, TriggerMode};
use crate::sources::DataSource;
use crate::sources::for_testing::{ForTesting, TestOptions};
use crate::sources::ftrace::FtraceOptions;
use crate::sources::ftrace::encode::{PrintFilter, PrintMatch, PrintRule};
use crate::sources::ftrace_source::FtraceDataSource;
use crate::sources::polled::{PidRoute, PolledDataSource};
use crate::sources::process_stats::{ProcessStatsOptions, ProcessStatsSource};
use crate::sources::procfs::HostPaths;
use crate::sources::sys_stats::{SysStatsOptions, SysStatsSource};
use crate::storage::{self, IoChoice, OpenOptions, OutputPath};
use crate::trace::service::SystemInfo;
use crate::trace::service_log::{ServiceLog, random_uuid};

/// Errors of building a session.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("buffers[{index}]: {msg}")]
    Buffer { index: usize, msg: String },
    #[error("output: {0}")]
    Output(String),
    #[error("data_sources[{index}] ({name}): {msg}")]
    Source {
        index: usize,
        name: String,
        msg: String,
    },
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    #[error("control socket: {0} (needed for triggers)")]
    Control(String),
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
}

/// The first sequence id of data sources; 1 is the recorder's own.
const FIRST_SOURCE_SEQUENCE: u32 = 2;

/// Builds every runtime object of the session.
pub fn build(spec: &RecorderSpec, opts: &RunOptions) -> Result<Recording, AppError> {
    let mut buffers = Vec::with_capacity(spec.buffers.len());
    for (index, b) in spec.buffers.iter().enumerate() {
        let policy = match b.fill_policy {
            spec::FillPolicy::RingBuffer => FillPolicy::RingBuffer,
            spec::FillPolicy::Discard => FillPolicy::Discard,
        };
        let params = BufferParams::new(b.size.0 as usize, policy);
        let buffer = Buffer::new(params).map_err(|e| AppError::Buffer {
            index,
            msg: e.to_string(),
        })?;
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

    let mut sources: Vec<Box<dyn DataSource>> = Vec::new();
    let mut next_seq = FIRST_SOURCE_SEQUENCE;
    // ftrace tells process_stats which pids it saw, once that poller runs.
    let pid_route: PidRoute = Arc::new(std::sync::Mutex::new(None));
    for (index, ds) in spec.data_sources.iter().enumerate() {
        let Some(target) = buffers.get(ds.target_buffer.0 as usize) else {
            return Err(AppError::Source {
                index,
                name: ds.name.clone(),
                msg: "target buffer missing".into(),
            });
        };
        let buffer: &Arc<Buffer> = &target.buffer;
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
                let src = ProcessStatsSource::new(
                    process_stats_options(p),
                    HostPaths::default(),
                    next_seq,
                );
                let writer = buffer.writer(WriterId(next_seq));
                next_seq += 1;
                sources.push(Box::new(
                    PolledDataSource::new(&ds.name, src, writer).route_pids(pid_route.clone()),
                ));
            }
            SourceKind::Ftrace(f) => {
                let writer = buffer.writer(WriterId(next_seq));
                let opts = ftrace_options(f, next_seq);
                next_seq += 1;
                let src = FtraceDataSource::new(&ds.name, opts, writer, pid_route.clone())
                    .map_err(|e| AppError::Source {
                        index,
                        name: ds.name.clone(),
                        msg: e.to_string(),
                    })?;
                sources.push(Box::new(src));
            }
            SourceKind::SysStats(s) => {
                let src =
                    SysStatsSource::new(&sys_stats_options(s), HostPaths::default(), next_seq)
                        .map_err(|e| AppError::Source {
                            index,
                            name: ds.name.clone(),
                            msg: e.to_string(),
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

    let sink = storage::open_output(
        opts.output.clone(),
        OpenOptions {
            no_clobber: opts.no_clobber,
            io: opts.io,
        },
    )
    .map_err(|e| AppError::Output(e.to_string()))?;
    let output_label = match &opts.output {
        OutputPath::File(p) => p.display().to_string(),
        OutputPath::Stdout => "stdout".to_string(),
    };
    let snapshot_base = match &opts.output {
        OutputPath::File(p) => Some(p.clone()),
        OutputPath::Stdout => None,
    };

    let uid = rustix::process::getuid().as_raw();
    let uuid = spec.trace_uuid.unwrap_or_else(random_uuid);
    let mut log = ServiceLog::new(uid, spec.config_bytes.clone(), uuid, SystemInfo::current());
    log.disable_clock_snapshotting = spec.builtin.disable_clock_snapshotting;
    log.disable_trace_config = spec.builtin.disable_trace_config;
    log.disable_system_info = spec.builtin.disable_system_info;
    log.disable_service_events = spec.builtin.disable_service_events;

    let timeline = Timeline::from_spec(spec)?;
    let needs_control = timeline.mode != TriggerMode::None;
    let (control, history) = match runtime_dir::for_server() {
        Ok(dir) => match ControlServer::start(&dir, std::process::id(), uid) {
            Ok(c) => (Some(c), Some(TriggerHistory::new(&dir))),
            Err(e) if needs_control => return Err(AppError::Control(e.to_string())),
            Err(e) => {
                log::warn!(
                    "control socket unavailable ({e}): `recorder query/stop` will not see this session"
                );
                (None, None)
            }
        },
        Err(e) if needs_control => return Err(AppError::Control(e.to_string())),
        Err(e) => {
            log::warn!(
                "no runtime directory ({e}): `recorder query/stop` will not see this session"
            );
            (None, None)
        }
    };

    Ok(Recording {
        session: Session::new(timeline),
        buffers,
        sources,
        sink,
        output_label,
        snapshot_base,
        snapshot_open: OpenOptions {
            no_clobber: false,
            io: opts.io,
        },
        log,
        max_file_size: spec.file.as_ref().and_then(|f| f.max_size.map(|s| s.0)),
        fsync_each_pass: spec.file.as_ref().is_some_and(|f| f.fdatasync_each_pass),
        control,
        history,
        config_label: opts.config_label.clone(),
        status_line: opts.status_line,
    })
}

/// The output path made absolute, so it survives `--background`'s chdir.
pub fn absolute_output(p: &std::path::Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn ms(d: Option<std::time::Duration>) -> u32 {
    d.map_or(0, |d| d.as_millis().min(u32::MAX as u128) as u32)
}

fn process_stats_options(p: &spec::ProcessStatsSpec) -> ProcessStatsOptions {
    ProcessStatsOptions {
        scan_all_processes_on_start: p.scan_all_processes_on_start,
        record_thread_names: p.record_thread_names,
        proc_stats_poll_ms: ms(p.poll_period),
        disable_on_demand: p.disable_on_demand,
        proc_stats_cache_ttl_ms: ms(p.cache_ttl),
    }
}

fn sys_stats_options(s: &spec::SysStatsSpec) -> SysStatsOptions {
    let ids = |c: &[spec::Counter]| c.iter().map(|c| c.id as u32).collect::<Vec<u32>>();
    SysStatsOptions {
        meminfo_period_ms: ms(s.meminfo_period),
        meminfo_counters: ids(&s.meminfo_counters),
        vmstat_period_ms: ms(s.vmstat_period),
        vmstat_counters: ids(&s.vmstat_counters),
        stat_period_ms: ms(s.stat_period),
        stat_counters: s
            .stat_counters
            .iter()
            .map(|c| match c {
                spec::StatCounter::CpuTimes => 1,
                spec::StatCounter::IrqCounts => 2,
                spec::StatCounter::SoftirqCounts => 3,
                spec::StatCounter::ForkCount => 4,
            })
            .collect(),
        devfreq_period_ms: ms(s.devfreq_period),
        cpufreq_period_ms: ms(s.cpufreq_period),
        buddyinfo_period_ms: ms(s.buddyinfo_period),
        diskstat_period_ms: ms(s.diskstat_period),
        psi_period_ms: ms(s.psi_period),
        thermal_period_ms: ms(s.thermal_period),
        cpuidle_period_ms: ms(s.cpuidle_period),
        gpufreq_period_ms: ms(s.gpufreq_period),
        slab_period_ms: ms(s.slab_period),
    }
}

fn print_filter(rules: &[spec::PrintRuleSpec]) -> PrintFilter {
    PrintFilter {
        rules: rules
            .iter()
            .map(|r| PrintRule {
                matches: match &r.matches {
                    spec::PrintMatchSpec::Prefix(p) => PrintMatch::Prefix(p.clone()),
                    spec::PrintMatchSpec::Atrace { kind, prefix } => PrintMatch::Atrace {
                        kind: kind.clone(),
                        prefix: prefix.clone(),
                    },
                },
                allow: r.allow,
            })
            .collect(),
    }
}

fn ftrace_options(f: &spec::FtraceSpec, sequence_id: u32) -> FtraceOptions {
    let defaults = FtraceOptions::default();
    FtraceOptions {
        events: f.events.clone(),
        buffer_size_kb: f
            .buffer_size
            .map_or(0, |b| (b.0 / 1024).min(u32::MAX as u64) as u32),
        drain_period: f.drain_period,
        drain_buffer_percent: f
            .drain_buffer_percent
            .unwrap_or(defaults.drain_buffer_percent),
        compact_sched: f.compact_sched,
        print_filter: print_filter(&f.print_filter),
        instance_name: f.instance_name.clone(),
        tracing_cpumask: f.tracing_cpumask.clone(),
        atrace_categories: f.atrace_categories.clone(),
        atrace_apps: f.atrace_apps.clone(),
        sequence_id,
        ..defaults
    }
}
