//! The main job: `recorder --config FILE -o OUT`.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ExitCode;
use crate::app::{self, RunOptions};
use crate::cli::MainArgs;
use crate::config::segments::SegmentsFileError;
use crate::config::{Compression, LoadOptions, LoadedConfig, RecorderSpec, Schema};
use crate::control::runtime_dir;
use crate::control::session_name::SessionNameLock;
use crate::storage::create::{self, OutputDir};
use crate::storage::segment::names::SegmentNames;
use crate::storage::segment::policy::{PolicyError, RotationPolicy};
use crate::storage::{IoChoice, OutputPath};
use crate::sys::daemon::{Forked, StartupReport, fork_detached};
use crate::sys::signals::Signals;

/// The main job from its arguments: load and validate the config (its notes
/// and warnings logged), then record.
///
/// SIGINT and SIGTERM are caught from here on, before anything is loaded or
/// set up: one that arrives during set-up (the config, the output, tracefs,
/// the sources' start) is seen by the event loop as soon as it runs, so the
/// session stops at once with a valid trace (possibly holding only the
/// recorder's own packets) and the exit code of any signal stop, 0.
pub(crate) fn run_main_job(args: &MainArgs) -> ExitCode {
    let signals = match Signals::install() {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("cannot install signal handlers: {e}");
            None
        }
    };
    // Room for the producer quotas and the control path's reserve.
    let open_files = crate::producer::quota::raise_open_file_limit();
    log::debug!("open-file limit: {open_files}");
    let loaded = match args.config.as_deref() {
        Some(path) => {
            let opts = LoadOptions {
                force_text: args.txt,
                lossy: args.txt_lossy,
            };
            super::config::load_with_inputs(path, opts, &args.protos)
        }
        None if args.light() => light_config(args).map(|l| (l, super::config::Inputs::default())),
        None => {
            eprintln!(
                "error: nothing to do: give --config FILE, events or categories \
                 (recorder -o OUT sched), or a subcommand; see --help"
            );
            return ExitCode::Usage;
        }
    };
    let (loaded, inputs) = match loaded {
        Ok(l) => l,
        Err(code) => return code,
    };
    let ctx = rule_context(args);
    if args.dry_run {
        return super::config::dry_run(&loaded, &args.rules, ctx);
    }
    let validated = loaded.validate();
    // The loaded message holds the schema: gone before the pool is released.
    drop(loaded);
    let spec = match validated {
        Ok(spec) => spec,
        Err(e) => return super::config::report(&e),
    };
    // -o never names an input: the config, a --proto file or one it
    // imports, a descriptor set (by identity, through any path or link).
    let out = args
        .out
        .clone()
        .or_else(|| {
            spec.file
                .as_ref()
                .and_then(|f| f.output_path.as_deref())
                .map(PathBuf::from)
        })
        .filter(|o| o != Path::new("-"));
    if let Some(out) = out
        && let Err(code) = super::config::refuse_input_as_output(&out, &inputs)
    {
        return code;
    }
    // Rules are checked before anything is set up: a refusal starts nothing.
    let rules = match super::config::rules_for(&spec, &args.rules, ctx) {
        Ok((rules, _)) => rules,
        Err(code) => return code,
    };
    for n in &spec.notes {
        log::info!("{n}");
    }
    for w in &spec.warnings {
        log::warn!("{w}");
    }
    // The schema served the config: a session of hours needs none of it,
    // and its pages go back before the buffers are mapped.
    crate::config::release_pool();
    crate::sys::heap::return_free_pages();
    run(&spec, args, signals, rules)
}

/// What the rules need to know of the session beyond its config: whether
/// it writes segments, and deletes them by a budget.
fn rule_context(args: &MainArgs) -> crate::config::rule::check::RuleContext {
    let p = rotation(args).unwrap_or_default();
    crate::config::rule::check::RuleContext {
        segmented: p.rotates(),
        segment_budget: p.rotates() && (p.max_disk.is_some() || p.max_segments.is_some()),
    }
}

/// What names light mode's config in messages.
pub(crate) const LIGHT_ORIGIN: &str = "light mode";

/// Light mode's config ([`crate::config::light`]), loaded like a file's; a
/// word that is neither a category nor an event is a usage error.
fn light_config(args: &MainArgs) -> Result<LoadedConfig, ExitCode> {
    use clap::CommandFactory;
    let kernel = kernel_events();
    let cli = crate::cli::Cli::command();
    let commands: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
    let text = crate::config::light::build(&args.light_request(), kernel.as_deref(), &commands)
        .map_err(|e| {
            eprintln!(
                "error: {}",
                crate::config::diagnostic::terminal_safe(&e.to_string())
            );
            ExitCode::Usage
        })?;
    let schema =
        Schema::load(&args.protos.user_protos()).map_err(|e| super::config::report(&e.into()))?;
    crate::config::load_text_in(&text, LIGHT_ORIGIN, false, &schema)
        .map_err(|e| super::config::report(&e))
}

/// Every `group/name` tracefs lists, when it is mounted and readable (as
/// root): light mode refuses events the kernel lacks. `None` otherwise;
/// the events are then checked when recording.
fn kernel_events() -> Option<Vec<String>> {
    use crate::sources::ftrace::tracefs::Tracefs;
    let t = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find_map(|r| Tracefs::at(r).ok())?;
    let mut all = Vec::new();
    for g in t.groups() {
        for n in t.events_of(&g) {
            all.push(format!("{g}/{n}"));
        }
    }
    (!all.is_empty()).then_some(all)
}

/// Records as `spec` says; `signals` are the handlers installed before the
/// set-up began (the event loop installs its own when `None`).
pub(crate) fn run(
    spec: &RecorderSpec,
    args: &MainArgs,
    signals: Option<Signals>,
    rules: Vec<crate::config::rule::Rule>,
) -> ExitCode {
    if !spec.activate_triggers.is_empty() {
        // As with Perfetto's cmdline: such a config only fires its triggers.
        return super::control::fire(&spec.activate_triggers, "perfetto_cmd_producer");
    }
    let opts = match run_options(spec, args) {
        Ok(o) => RunOptions { rules, ..o },
        Err(code) => return code,
    };
    let mut ring_opts = match ring_options(spec, args) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let saves = match saves_at_death(&opts) {
        Ok(s) => s,
        Err(code) => return code,
    };

    // Detached, stderr is /dev/null: the logs and the final summary go to a
    // file beside the trace instead (the broker's too).
    let log = match (&opts.output, args.background) {
        (OutputPath::File(p), true) => open_log(p),
        _ => None,
    };
    // A root session forks its privileged broker now, while the process is
    // single-threaded; it gives up root once set up ([`app::begin`]).
    let detached_stderr = args
        .background
        .then(|| log.as_ref().map(|(_, fd)| fd.as_fd()));
    let privileges = match crate::privilege::start(detached_stderr) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::Runtime;
        }
    };
    // A session that keeps its own rights gets a keeper, forked now too:
    // if the recorder dies, it saves the buffers (the broker does for a
    // root session).
    let keeper = match (&privileges, saves) {
        (None, true) => match crate::privilege::start_keeper(detached_stderr) {
            Ok(k) => Some(k),
            Err(e) => {
                log::warn!("{e}: the buffers are lost if the recorder dies");
                None
            }
        },
        _ => None,
    };
    // Shared with whoever outlives the recorder, when there is one.
    ring_opts.shared = saves && (privileges.is_some() || keeper.is_some());
    // Told at the end that the session is done (and, root, to tear down).
    let broker = privileges
        .as_ref()
        .map(|p| p.broker.clone())
        .or_else(|| keeper.clone());

    let mut report = None;
    if args.background {
        match detach(log.as_ref().map(|(p, _)| p.as_path())) {
            Ok(r) => report = Some(r),
            Err(code) => return code,
        }
        if let Some((_, fd)) = &log {
            let _ = rustix::stdio::dup2_stderr(fd);
        }
    }

    // From here on the broker cleans up after this process even if it is
    // killed during its set-up: tracefs (by pid), and the sockets it will
    // bind (removed only if nobody listens on them).
    if let Some(b) = &broker {
        early_registration(b, spec, args);
    }

    // Taken before the output is opened: a refused second session must not
    // truncate anything.
    let _name = match spec.unique_session_name.as_deref() {
        None => None,
        Some(name) => {
            match runtime_dir::for_server().and_then(|d| SessionNameLock::acquire(&d, name)) {
                Ok(lock) => {
                    // Removed by the broker at the end: after the drop this
                    // process cannot unlink root's file there.
                    if let Some(b) = privileges.as_ref().map(|p| &p.broker) {
                        let (dir, file) = lock.file();
                        if let Err(e) = b.register_name_lock(dir.fd(), file) {
                            log::warn!("the name lock stays after the session: {e}");
                        }
                    }
                    Some(lock)
                }
                Err(e) => {
                    if let Some(r) = report.as_mut() {
                        r.failed(&e.to_string());
                    }
                    eprintln!("error: {e}");
                    return ExitCode::Runtime;
                }
            }
        }
    };
    let (mut rec, mut rings) = match app::build_recording(spec, &opts, &ring_opts) {
        Ok(r) => r,
        Err(e) => {
            let line = super::chain(&e);
            if let Some(r) = report.as_mut() {
                r.failed(&line);
            }
            eprintln!("error: {line}");
            return ExitCode::Runtime;
        }
    };
    // Root is given up here, before the event loop reads a byte from
    // anyone: a session waiting for its trigger already runs unprivileged.
    if let Err(e) = app::begin_recording(&mut rec, privileges, keeper.as_ref(), &mut rings) {
        let line = super::chain(&e);
        if let Some(r) = report.as_mut() {
            r.failed(&line);
        }
        eprintln!("error: {line}");
        return ExitCode::Runtime;
    }
    if let Some(r) = report.as_mut() {
        r.ok();
    }
    let timeline = rec.session.timeline().clone();
    let outcome = crate::event_loop::run(rec, signals);
    // What the ring files held is in the trace now (or, after a failure,
    // still in them): removed, or kept and said so.
    let rings_kept = rings.finish(outcome.reason.is_failure());
    // The session's objects are gone (their tracefs files closed): the
    // broker undoes the tracefs changes and removes the sockets now.
    if let Some(b) = broker {
        b.teardown();
    }
    eprintln!("{}", crate::summary::render(&outcome, &timeline));
    if let Some(note) = rings_kept {
        eprintln!("{note}");
    }
    if outcome.reason.is_failure() {
        ExitCode::Runtime
    } else {
        ExitCode::Success
    }
}

/// Registers with the broker, before anything is set up, this process's
/// pid and the sockets it will bind: the control endpoints (named after the
/// pid) and the producer socket if the session opens one.
fn early_registration(b: &crate::privilege::Broker, spec: &RecorderSpec, args: &MainArgs) {
    let pid = std::process::id();
    let runtime = runtime_dir::for_server().ok();
    let producer = match app::producer_opening(spec, args.producer_socket.as_deref(), false) {
        Ok(crate::transport::socket_path::Opening::Open { path, .. }) => create::open_parent(&path),
        _ => None,
    };
    let mut leftovers: Vec<(std::os::fd::BorrowedFd<'_>, String)> = Vec::new();
    if let Some(rt) = &runtime {
        let (a, b) = crate::control::server::endpoint_names(pid);
        leftovers.push((rt.fd(), a));
        leftovers.push((rt.fd(), b));
    }
    if let Some((fd, name)) = &producer {
        leftovers.push((fd.as_fd(), name.clone()));
    }
    if let Err(e) = b.register_early(pid, &leftovers) {
        log::warn!("the privileged broker: {e}");
    }
}

/// Where the trace goes (`-o`, or the config's `output_path`) and whether
/// an existing file is refused; a usage error (printed) when the output
/// cannot be used.
fn output_of(spec: &RecorderSpec, args: &MainArgs) -> Result<(OutputPath, bool), ExitCode> {
    // The config's output_path, as Perfetto's service does: a new file only.
    let config_out = spec.file.as_ref().and_then(|f| f.output_path.as_deref());
    let (out, no_clobber) = match (args.out.as_deref(), config_out) {
        (Some(_), Some(p)) => {
            eprintln!("error: the config sets output_path ({p}); do not give -o as well");
            return Err(ExitCode::Usage);
        }
        (Some(out), None) => (out, args.no_clobber),
        (None, Some(p)) => (Path::new(p), true),
        (None, None) => {
            eprintln!("error: no output: give -o OUT (or -o - for stdout)");
            return Err(ExitCode::Usage);
        }
    };
    let output = if out == Path::new("-") {
        OutputPath::Stdout
    } else {
        OutputPath::File(app::absolute_output(out))
    };
    let descriptor = match &output {
        OutputPath::File(p) => create::descriptor_path(p),
        OutputPath::Stdout => Some(1),
    };
    if args.background && descriptor.is_some() {
        eprintln!(
            "error: --background cannot write the trace to stdout (or another descriptor of its own)"
        );
        return Err(ExitCode::Usage);
    }
    if let (OutputPath::File(out), Some(config)) = (&output, args.config.as_deref())
        && is_the_config(out, config)
    {
        eprintln!(
            "error: -o {} is the config file: refusing to overwrite it",
            out.display()
        );
        return Err(ExitCode::Usage);
    }
    if let OutputPath::File(out) = &output
        && let Some((flag, input)) = args
            .protos
            .files
            .iter()
            .map(|p| ("--proto", p))
            .chain(
                args.protos
                    .descriptor_sets
                    .iter()
                    .map(|p| ("--descriptor-set", p)),
            )
            .find(|(_, p)| is_the_config(out, p))
    {
        eprintln!(
            "error: -o {} is the {flag} input {}: refusing to overwrite it",
            out.display(),
            input.display()
        );
        return Err(ExitCode::Usage);
    }
    Ok((output, no_clobber))
}

/// The session's options from the flags and the environment; a usage
/// error (printed) when they cannot be used together.
fn run_options(spec: &RecorderSpec, args: &MainArgs) -> Result<RunOptions, ExitCode> {
    let (output, no_clobber) = output_of(spec, args)?;
    let (io, direct_io) = match (io_from_env(), direct_io_from_env()) {
        (Ok(io), Ok(direct)) => (io, direct),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return Err(ExitCode::Usage);
        }
    };
    let config_label = args
        .config
        .as_deref()
        .map(|p| {
            if p == Path::new("-") {
                "stdin".to_string()
            } else {
                app::absolute_output(p).display().to_string()
            }
        })
        .unwrap_or_else(|| LIGHT_ORIGIN.to_string());
    let rotation = match rotation(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(ExitCode::Usage);
        }
    };
    let clones = spec
        .trigger
        .as_ref()
        .is_some_and(|t| t.mode == crate::config::spec::TriggerMode::CloneSnapshot);
    if !rotation.rotates() && rotation.max_disk.is_some() && !clones {
        eprintln!(
            "error: --max-disk needs --rotate-size or --rotate-period (it bounds the segments), or a CLONE_SNAPSHOT config (it bounds the snapshots)"
        );
        return Err(ExitCode::Usage);
    }
    if rotation.rotates() && output == OutputPath::Stdout {
        eprintln!(
            "error: segments (--rotate-size, --rotate-period) need -o DIR/ or -o FILE, not stdout"
        );
        return Err(ExitCode::Usage);
    }
    // Every directory a file will be made in is checked before anything is
    // opened: a refusal touches nothing.
    if let OutputPath::File(out) = &output
        && let Err(e) = check_output_dir(out, rotation.rotates())
    {
        eprintln!("error: {e}");
        return Err(ExitCode::Usage);
    }
    let compression = args.compress.map(|level| {
        if spec.compression != Compression::None {
            log::info!("--compress replaces the config's compression setting");
        }
        Compression::Zstd { level }
    });
    Ok(RunOptions {
        output,
        no_clobber,
        io,
        config_label,
        status_line: !args.background,
        compression,
        rotation,
        direct_io,
        producer_socket: args.producer_socket.clone(),
        rules: Vec::new(),
    })
}

/// Whether what the buffers hold is saved to the trace if the recorder
/// dies: for a trace file written at offsets (not a stream) or segments,
/// unless `RECORDER_SAVE_AT_DEATH=off`; anything else there is a usage
/// error (printed).
fn saves_at_death(opts: &RunOptions) -> Result<bool, ExitCode> {
    let on = match std::env::var_os("RECORDER_SAVE_AT_DEATH") {
        None => true,
        Some(v) => match v.to_str() {
            Some("" | "on") => true,
            Some("off") => false,
            _ => {
                eprintln!(
                    "error: {}",
                    SettingsError::env("RECORDER_SAVE_AT_DEATH", &v, "on or off")
                );
                return Err(ExitCode::Usage);
            }
        },
    };
    let file = match &opts.output {
        OutputPath::File(p) => !create::is_named_stream(p),
        OutputPath::Stdout => false,
    };
    Ok(on && file)
}

/// Where the buffers live (`--ring-dir`, `--ring-sync`); a usage error
/// (printed) when the ring directory cannot take them.
fn ring_options(spec: &RecorderSpec, args: &MainArgs) -> Result<app::RingOptions, ExitCode> {
    if let Some(dir) = &args.ring_dir
        && let Err(e) = app::check_ring_dir(dir, spec.buffers.len())
    {
        eprintln!("error: --ring-dir {}: {e}", dir.display());
        return Err(ExitCode::Usage);
    }
    Ok(app::RingOptions {
        dir: args.ring_dir.as_deref().map(app::absolute_output),
        sync: args.ring_sync,
        shared: false,
    })
}

/// Goes to the background: the parent prints the child's pid once the
/// child reports its start (or the child's reason) and ends with the code
/// returned as `Err`; the child goes on with its report channel.
fn detach(log: Option<&Path>) -> Result<StartupReport, ExitCode> {
    match fork_detached() {
        Ok(Forked::Parent { child, status }) => Err(match status {
            Ok(()) => {
                println!("{child}");
                if let Some(path) = log {
                    eprintln!("recorder: logs and the summary go to {}", path.display());
                }
                ExitCode::Success
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::Runtime
            }
        }),
        Ok(Forked::Child(r)) => Ok(r),
        Err(e) => {
            eprintln!("error: cannot go to the background: {e}");
            Err(ExitCode::Runtime)
        }
    }
}

/// Settings from a file beside the config or from the environment that
/// cannot be used (a usage error).
#[derive(Debug, thiserror::Error)]
pub(super) enum SettingsError {
    #[error(transparent)]
    SegmentsFile(#[from] SegmentsFileError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("{name}={value}: expected {expected}")]
    Env {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl SettingsError {
    fn env(name: &'static str, value: &std::ffi::OsStr, expected: &'static str) -> Self {
        SettingsError::Env {
            name,
            value: value.to_string_lossy().into_owned(),
            expected,
        }
    }
}

/// The rotation policy: the settings file beside the config, then the flags.
fn rotation(args: &MainArgs) -> Result<RotationPolicy, SettingsError> {
    let from_file = match args.config.as_deref().filter(|p| *p != Path::new("-")) {
        Some(cfg) => match crate::config::segments::load_adjacent(cfg) {
            Ok(Some((path, p))) => {
                log::info!("segment settings from {}", path.display());
                p
            }
            Ok(None) => RotationPolicy::default(),
            Err(e) => return Err(e.into()),
        },
        None => RotationPolicy::default(),
    };
    let flags = RotationPolicy {
        size: args.rotate_size,
        period: args.rotate_period,
        max_segments: args.max_segments,
        max_disk: args.max_disk,
        on_closed: args.on_segment_closed.clone(),
        hook_timeout: args.hook_timeout,
    };
    let p = crate::config::segments::overlay(from_file, flags);
    p.check()?;
    Ok(p)
}

/// The output's directory (the segments' one when rotating) checked as
/// [`create`] will use it; a FIFO or device named by `-o` needs none.
fn check_output_dir(out: &Path, rotates: bool) -> Result<(), create::CreateError> {
    if rotates {
        return create::check_ahead(&SegmentNames::from_output(out).dir);
    }
    if create::is_named_stream(out) {
        return Ok(());
    }
    let (dir, _) = create::split(out)?;
    create::check_ahead(&dir)
}

/// Whether writing `out` would overwrite the config (`-` is stdin): the
/// same file, through a link or another path.
fn is_the_config(out: &Path, config: &Path) -> bool {
    let Ok(o) = std::fs::metadata(out) else {
        return false;
    };
    let c = if config == Path::new("-") {
        rustix::fs::fstat(rustix::stdio::stdin()).map(|st| (st.st_dev, st.st_ino))
    } else {
        std::fs::metadata(config)
            .map(|m| (m.dev(), m.ino()))
            .map_err(|_| rustix::io::Errno::NOENT)
    };
    c.is_ok_and(|c| c == (o.dev(), o.ino()))
}

/// `OUT.log` for a background session, made new (never through a link)
/// before the fork; `None`, with a warning, when it cannot be.
fn open_log(out: &Path) -> Option<(PathBuf, OwnedFd)> {
    let path = PathBuf::from(format!("{}.log", out.display()));
    let opened = OutputDir::of_file(&path).and_then(|(dir, name)| dir.replace(&name));
    match opened {
        Ok(fd) => Some((path, fd)),
        Err(e) => {
            eprintln!(
                "warning: cannot open {}: {e}; the background session's summary will be lost",
                path.display()
            );
            None
        }
    }
}

/// `RECORDER_DIRECT_IO`, read once here: `off` keeps streaming sessions in
/// the page cache even where O_DIRECT works.
pub(super) fn direct_io_from_env() -> Result<bool, SettingsError> {
    match std::env::var_os("RECORDER_DIRECT_IO") {
        None => Ok(true),
        Some(v) => match v.to_str() {
            Some("" | "auto" | "on") => Ok(true),
            Some("off") => Ok(false),
            _ => Err(SettingsError::env(
                "RECORDER_DIRECT_IO",
                &v,
                "off, on or auto",
            )),
        },
    }
}

/// `RECORDER_IO`, read once here: which sink writes a trace file.
fn io_from_env() -> Result<IoChoice, SettingsError> {
    match std::env::var_os("RECORDER_IO") {
        None => Ok(IoChoice::Auto),
        Some(v) => match v.to_str() {
            Some("" | "auto") => Ok(IoChoice::Auto),
            Some("io_uring") => Ok(IoChoice::IoUring),
            Some("pwritev") => Ok(IoChoice::Pwritev),
            _ => Err(SettingsError::env(
                "RECORDER_IO",
                &v,
                "io_uring, pwritev or auto",
            )),
        },
    }
}
