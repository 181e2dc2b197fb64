//! The command-line surface: argument types only (clap derive), validated
//! once here. What each command does lives in [`crate::command`].

use std::path::PathBuf;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::{LoadOptions, UserProtos};

/// The port `recorder open` serves on: the Perfetto UI may fetch from
/// 127.0.0.1:9001 only (its content security policy).
pub(crate) const OPEN_DEFAULT_PORT: u16 = 9001;
/// The public Perfetto UI, where `recorder open` points by default.
pub(crate) const OPEN_DEFAULT_ORIGIN: &str = "https://ui.perfetto.dev";

const AFTER_HELP: &str = "\
Exit codes:
  0  success (also a recording stopped by SIGINT/SIGTERM, even during set-up)
  1  runtime failure (I/O error, full disk, kernel refused)
  2  usage or config error (unlike Perfetto, a rejected config is not a success)
  3  recover: a valid trace was written, but damaged parts of the rings were left out

Configs are Perfetto TraceConfigs, text (.cfg, .pbtx) or binary; the form is
detected unless --txt is given.";

/// Records Linux traces in the Perfetto format, storage-first.
#[derive(Debug, Parser)]
// Not `args_conflicts_with_subcommands`: clap counts global flags as main-job
// arguments there, which refused `recorder -q bench`; the main job's own
// arguments are refused beside a subcommand by `MainArgs::given` instead.
#[command(name = "recorder", version, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// A subcommand; without one, the main job runs (`--config`).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The main job's arguments.
    #[command(flatten)]
    pub main: MainArgs,
    /// More logging (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    /// Less logging (-q warnings only, -qq errors only).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub quiet: u8,
}

/// Arguments of the main job: record a trace as the config says.
#[derive(Debug, Clone, Args)]
pub(crate) struct MainArgs {
    /// The TraceConfig, text or binary; `-` reads stdin.
    #[arg(short = 'c', long, value_name = "FILE|-")]
    pub config: Option<PathBuf>,
    /// Where the trace goes; `-` is stdout.
    #[arg(short = 'o', long = "out", value_name = "OUT|-")]
    pub out: Option<PathBuf>,
    /// Parse the config as text (no detection).
    #[arg(long, conflicts_with = "txt_lossy")]
    pub txt: bool,
    /// Parse as text and skip unknown fields, listing them in one warning.
    #[arg(long)]
    pub(crate) txt_lossy: bool,
    /// The user's own config fields.
    #[command(flatten)]
    pub protos: ProtoArgs,
    /// Detach and run in the background; prints the PID.
    #[arg(short = 'd', long)]
    pub background: bool,
    /// Refuse to overwrite an existing output file.
    #[arg(long)]
    pub no_clobber: bool,
    /// Compress with zstd at LEVEL (default 3), as `compression { zstd { level } }` would.
    #[arg(long, value_name = "LEVEL", num_args = 0..=1, require_equals = true,
          default_missing_value = "3", allow_negative_numbers = true)]
    pub compress: Option<i32>,
    /// Cut the output into numbered, self-contained segments of about BYTES (256M, 2G).
    #[arg(long, value_name = "BYTES", value_parser = crate::storage::segment::policy::parse_size)]
    pub rotate_size: Option<u64>,
    /// Cut a new segment every DURATION (10m, 1h).
    #[arg(long, value_name = "DURATION", value_parser = crate::storage::segment::policy::parse_duration)]
    pub rotate_period: Option<std::time::Duration>,
    /// Keep only the newest N segments (the one being written included).
    #[arg(long, value_name = "N")]
    pub(crate) max_segments: Option<u32>,
    /// Keep the segments within BYTES of disk (deleting the oldest closed ones).
    #[arg(long, value_name = "BYTES", value_parser = crate::storage::segment::policy::parse_size)]
    pub(crate) max_disk: Option<u64>,
    /// Run CMD with each closed segment's path as its last argument (in the background).
    #[arg(long, value_name = "CMD")]
    pub(crate) on_segment_closed: Option<String>,
    /// Kill an --on-segment-closed command's process group after DURATION (default 5m).
    #[arg(long, value_name = "DURATION", value_parser = crate::storage::segment::policy::parse_duration)]
    pub hook_timeout: Option<std::time::Duration>,
    /// Record for DURATION (ms, s, m, h; default 10s; 0: until stopped).
    #[arg(short = 't', long = "time", value_name = "DURATION", conflicts_with = "config",
          value_parser = crate::config::light::parse_time_ms, help_heading = LIGHT)]
    pub(crate) time_ms: Option<u64>,
    /// One ring buffer of SIZE (kb, mb, gb; default 32mb).
    #[arg(short = 'b', long = "buffer", value_name = "SIZE", conflicts_with = "config",
          value_parser = crate::config::light::parse_size_kb, help_heading = LIGHT)]
    pub buffer_kb: Option<u64>,
    /// Stream to the file while recording, and stop when it reaches SIZE (kb, mb, gb).
    #[arg(short = 's', long = "size", value_name = "SIZE", conflicts_with = "config",
          value_parser = crate::config::light::parse_size_kb, help_heading = LIGHT)]
    pub(crate) max_file_size_kb: Option<u64>,
    /// ftrace events (GROUP/NAME, GROUP/*) and categories (sched, freq, idle, irq, disk, …).
    #[arg(value_name = "EVENT|CATEGORY", conflicts_with = "config", help_heading = LIGHT,
          value_hint = clap::ValueHint::Other)]
    pub events: Vec<String>,
    /// Print the config (the one built, or --config's) and its plan, as `config check` does; record nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Let Perfetto SDK apps connect, at PATH. Without it the producer socket
    /// opens only when the config names a data source no built-in source
    /// provides, where apps look by default (/run/perfetto/traced-producer.sock
    /// or /tmp/perfetto-producer; PERFETTO_PRODUCER_SOCK_NAME moves it but
    /// never opens it).
    #[arg(long, value_name = "PATH")]
    pub(crate) producer_socket: Option<PathBuf>,
    /// Keep each buffer in a file in DIR (a tmpfs, or a disk to outlive a
    /// machine crash): if every process of the session is gone, `recorder
    /// recover DIR -o OUT` makes a trace of what they held. DIR must exist,
    /// be yours or root's (sticky if others may write it) and hold no ring
    /// files; they are removed when the session ends.
    #[arg(long, value_name = "DIR")]
    pub(crate) ring_dir: Option<PathBuf>,
    /// With --ring-dir: write the ring files back to disk every PERIOD
    /// (msync), so that a machine crash loses at most that much.
    #[arg(long, value_name = "PERIOD", requires = "ring_dir",
          value_parser = crate::storage::segment::policy::parse_duration)]
    pub(crate) ring_sync: Option<std::time::Duration>,
    /// The trigger rules the recorder fires itself.
    #[command(flatten)]
    pub rules: RuleArgs,
}

/// Trigger rules: when the recorder fires one of the config's triggers
/// itself (docs/rules.md).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct RuleArgs {
    /// Fire a trigger of the config when RULE holds: 'NAME: event GROUP/EVENT [if FILTER]',
    /// 'NAME: latency sched > 50ms', 'NAME: counter meminfo.MemAvailable < 200M', 'NAME: loss', … (repeatable).
    #[arg(long = "trigger-rule", value_name = "RULE")]
    pub(crate) trigger_rule: Vec<String>,
    /// Read rules from FILE, one a line (# comments) (repeatable).
    #[arg(long = "trigger-rules", value_name = "FILE")]
    pub(crate) trigger_rules: Vec<PathBuf>,
}

impl RuleArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.trigger_rule.is_empty() && self.trigger_rules.is_empty()
    }
}

/// The help heading of light mode's arguments.
const LIGHT: &str = "Light mode (no config: Perfetto's `-t 10s -b 32mb sched freq idle`)";

impl MainArgs {
    /// Whether light mode was asked for: a light-mode flag or a word.
    pub(crate) fn light(&self) -> bool {
        self.time_ms.is_some()
            || self.buffer_kb.is_some()
            || self.max_file_size_kb.is_some()
            || !self.events.is_empty()
    }

    /// What light mode is asked to build.
    pub(crate) fn light_request(&self) -> crate::config::light::LightRequest {
        crate::config::light::LightRequest {
            time_ms: self.time_ms,
            buffer_kb: self.buffer_kb,
            max_file_size_kb: self.max_file_size_kb,
            words: self.events.clone(),
        }
    }

    /// The first main-job argument given, if any (they mean nothing beside a
    /// subcommand).
    pub(crate) fn given(&self) -> Option<&'static str> {
        [
            (self.config.is_some(), "--config"),
            (self.out.is_some(), "--out"),
            (self.txt, "--txt"),
            (self.txt_lossy, "--txt-lossy"),
            (self.background, "--background"),
            (self.no_clobber, "--no-clobber"),
            (self.compress.is_some(), "--compress"),
            (self.rotate_size.is_some(), "--rotate-size"),
            (self.rotate_period.is_some(), "--rotate-period"),
            (self.max_segments.is_some(), "--max-segments"),
            (self.max_disk.is_some(), "--max-disk"),
            (self.on_segment_closed.is_some(), "--on-segment-closed"),
            (self.hook_timeout.is_some(), "--hook-timeout"),
            (!self.protos.files.is_empty(), "--proto"),
            (!self.protos.include_paths.is_empty(), "--proto-path"),
            (!self.protos.descriptor_sets.is_empty(), "--descriptor-set"),
            (self.producer_socket.is_some(), "--producer-socket"),
            (!self.rules.trigger_rule.is_empty(), "--trigger-rule"),
            (!self.rules.trigger_rules.is_empty(), "--trigger-rules"),
            (self.time_ms.is_some(), "--time"),
            (self.buffer_kb.is_some(), "--buffer"),
            (self.max_file_size_kb.is_some(), "--size"),
            (!self.events.is_empty(), "EVENT|CATEGORY"),
            (self.dry_run, "--dry-run"),
            (self.ring_dir.is_some(), "--ring-dir"),
            (self.ring_sync.is_some(), "--ring-sync"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }
}

impl Cli {
    /// Parses `args`, refusing main-job arguments beside a subcommand.
    pub(crate) fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        if let (Some(_), Some(flag)) = (&cli.command, cli.main.given()) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("{flag} belongs to the main job and cannot be used with a subcommand"),
            ));
        }
        Ok(cli)
    }
}

/// Subcommands. Room is left for `inspect`, `trigger`, `query`, `stop`, `bench`.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check or convert a config.
    Config(ConfigArgs),
    /// Make a trace of what a dead session's buffers held, from its ring
    /// files (`--ring-dir`). Every byte is checked: what is damaged is left
    /// out and reported (exit 3), what a writer had not finished is left
    /// out and counted; the rest is kept.
    Recover {
        /// The session's `--ring-dir`.
        dir: PathBuf,
        /// Where the trace goes: a new file (an existing one is replaced,
        /// never written through).
        #[arg(short = 'o', long = "out", value_name = "OUT")]
        out: PathBuf,
        /// Refuse to overwrite an existing OUT.
        #[arg(long)]
        no_clobber: bool,
    },
    /// Read a trace: packets by kind and sequence, stats, losses (a torn tail is tolerated).
    Inspect {
        /// The trace file, a directory of segments, or a store (segments of
        /// many sessions and hosts below it, e.g. HOST/BOOT/SESSION/…: each
        /// checked against its sidecar).
        file: PathBuf,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List a store's segments from their sidecars, one JSON object a line
    /// (host, boot id, session, index, times, bytes, loss, sha256, path), each
    /// checked: ok, missing, corrupt, duplicated, no_sidecar.
    Index {
        /// A store (a tree of segments and sidecars), an output directory, or one segment.
        path: PathBuf,
        /// List only the ok segments STORE holds no matching copy of (what is left to ship).
        #[arg(long, value_name = "STORE")]
        unshipped: Option<PathBuf>,
        /// Print each row as TEMPLATE, `{field}` standing for a field ('{store_path}').
        #[arg(long, value_name = "TEMPLATE")]
        format: Option<String>,
    },
    /// Fire triggers at every running session (any user may).
    Trigger {
        /// Trigger names.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// The producer name the triggers come from (matched by `producer_name_regex`).
        #[arg(long, default_value = "recorder_trigger")]
        producer: String,
    },
    /// List the running sessions with live statistics.
    Query {
        /// One JSON array instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop a running session gracefully (its owner or root).
    Stop {
        /// The session's PID (optional when only one runs).
        pid: Option<u32>,
        /// Stop every session you may stop.
        #[arg(long, conflicts_with = "pid")]
        all: bool,
    },
    /// Close a segmented session's current segment now and start the next (its owner or root).
    Rotate {
        /// The session's PID (optional when only one runs).
        pid: Option<u32>,
        /// Rotate every session you may.
        #[arg(long, conflicts_with = "pid")]
        all: bool,
    },
    /// Start a session configured with `deferred_start` (its owner or root).
    Start {
        /// The session's PID (optional when only one runs).
        pid: Option<u32>,
        /// Start every session you may start.
        #[arg(long, conflicts_with = "pid")]
        all: bool,
    },
    /// Serve Perfetto's consumer and producer sockets, as `traced` does: the stock `perfetto` client records through the recorder.
    Serve(ServeArgs),
    /// Measure buffer policies, sizes and write periods under a load.
    Bench(BenchArgs),
    /// Print the shell completion script for SHELL (from these very definitions).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (recorder.1 and one per subcommand) into DIR.
    ManPages {
        /// The directory (made if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Open a trace in the Perfetto UI: serve it once on 127.0.0.1, print (and open) the link.
    Open {
        /// The trace file.
        file: PathBuf,
        /// Local port to serve on (ui.perfetto.dev fetches only from 9001).
        #[arg(long, default_value_t = OPEN_DEFAULT_PORT)]
        port: u16,
        /// Print the link only; start no browser.
        #[arg(long)]
        no_browser: bool,
        /// The UI's origin, for a self-hosted Perfetto UI.
        #[arg(long, default_value = OPEN_DEFAULT_ORIGIN, value_name = "URL")]
        origin: String,
    },
}

/// `recorder config …`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// How to read a config file.
#[derive(Debug, Clone, Args)]
pub(crate) struct FormArgs {
    /// Parse as text (no detection).
    #[arg(long, conflicts_with = "txt_lossy")]
    pub txt: bool,
    /// Parse as text and skip unknown fields.
    #[arg(long)]
    pub(crate) txt_lossy: bool,
    /// The user's own config fields.
    #[command(flatten)]
    pub protos: ProtoArgs,
}

/// Where the config's custom fields (extensions of DataSourceConfig, in the
/// user's own `.proto` files) are declared.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ProtoArgs {
    /// Compile FILE, your .proto extending DataSourceConfig, for the config's custom fields (repeatable).
    #[arg(long = "proto", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Find the --proto files' imports in DIR, like protoc -I (repeatable; default: each file's directory).
    #[arg(long = "proto-path", value_name = "DIR", requires = "files")]
    pub include_paths: Vec<PathBuf>,
    /// Read compiled descriptors from FILE, a FileDescriptorSet as protoc or buf write it (repeatable).
    #[arg(long = "descriptor-set", value_name = "FILE")]
    pub descriptor_sets: Vec<PathBuf>,
}

impl ProtoArgs {
    /// What `config::Schema::load` takes.
    pub(crate) fn user_protos(&self) -> UserProtos {
        UserProtos {
            files: self.files.clone(),
            include_paths: self.include_paths.clone(),
            descriptor_sets: self.descriptor_sets.clone(),
        }
    }
}

impl FormArgs {
    /// How `config::load_path` should read the file.
    pub(crate) fn options(&self) -> LoadOptions {
        LoadOptions {
            force_text: self.txt,
            lossy: self.txt_lossy,
        }
    }
}

/// Output form of `config convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TargetForm {
    /// Protobuf binary (what `protoc --encode` makes).
    Binary,
    /// Protobuf text format.
    Text,
}

/// `recorder config` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigAction {
    /// Validate a config and print the plan: buffers, sources, timeline, warnings.
    Check {
        /// The config; `-` reads stdin.
        #[arg(value_name = "FILE|-")]
        file: PathBuf,
        /// Also list every field the config sets, by path: applied, applied
        /// with changes (how) or ignored (why).
        #[arg(long)]
        explain: bool,
        /// Form options.
        #[command(flatten)]
        form: FormArgs,
        /// Trigger rules to check with the config, as `recorder --config` takes them.
        #[command(flatten)]
        rules: RuleArgs,
    },
    /// Convert a config between text and binary.
    Convert {
        /// The config; `-` reads stdin.
        #[arg(value_name = "FILE|-")]
        file: PathBuf,
        /// Target form (default: the other one).
        #[arg(long, value_enum)]
        to: Option<TargetForm>,
        /// Output file (default stdout).
        #[arg(short = 'o', long = "out", value_name = "OUT|-")]
        out: Option<PathBuf>,
        /// Form options.
        #[command(flatten)]
        form: FormArgs,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        for args in [
            &["recorder", "-q", "bench", "--no-output"][..],
            &["recorder", "bench", "-q", "--no-output"],
            &["recorder", "--quiet", "-q", "inspect", "t.pftrace"],
            &["recorder", "-v", "config", "check", "x.cfg", "-q"],
        ] {
            let cli = Cli::parse_args(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(cli.command.is_some(), "{args:?}");
            assert!(cli.quiet + cli.verbose > 0, "{args:?}");
        }
        let cli = Cli::parse_args(["recorder", "-qq", "bench"]).expect("parses");
        assert_eq!(cli.quiet, 2);
    }

    #[test]
    fn main_job_arguments_are_refused_beside_a_subcommand() {
        for args in [
            &["recorder", "--config", "x.cfg", "bench"][..],
            &["recorder", "-o", "t.pftrace", "inspect", "t.pftrace"],
            &["recorder", "--no-clobber", "query"],
            &["recorder", "--proto", "a.proto", "query"],
        ] {
            let e = Cli::parse_args(args).expect_err("refused");
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{args:?}"
            );
        }
        // The main job alone still parses.
        let cli = Cli::parse_args(["recorder", "-q", "-c", "x.cfg", "-o", "t"]).expect("parses");
        assert!(cli.command.is_none() && cli.main.config.is_some());
    }

    #[test]
    fn light_mode_takes_perfettos_flags_and_words_beside_the_subcommands() {
        let cli = Cli::parse_args([
            "recorder",
            "-o",
            "t",
            "-t",
            "3s",
            "-b",
            "8mb",
            "-s",
            "1gb",
            "sched/sched_switch",
            "sched",
            "-d",
        ])
        .expect("parses");
        assert!(cli.command.is_none() && cli.main.light() && cli.main.background);
        let r = cli.main.light_request();
        assert_eq!(
            (r.time_ms, r.buffer_kb, r.max_file_size_kb),
            (Some(3000), Some(8192), Some(1024 * 1024))
        );
        assert_eq!(r.words, ["sched/sched_switch", "sched"]);
        // Subcommands are still subcommands.
        for args in [
            &["recorder", "bench"][..],
            &["recorder", "query"],
            &["recorder", "completions", "bash"],
        ] {
            let cli = Cli::parse_args(args).expect("parses");
            assert!(cli.command.is_some(), "{args:?}");
        }
        // Not with a config, not beside a subcommand, not with a bad unit.
        for (args, kind) in [
            (
                &["recorder", "-c", "x.cfg", "-t", "1s"][..],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &["recorder", "-c", "x.cfg", "sched"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &["recorder", "-t", "1s", "query"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &["recorder", "-t", "10"],
                clap::error::ErrorKind::ValueValidation,
            ),
            (
                &["recorder", "-b", "1tb"],
                clap::error::ErrorKind::ValueValidation,
            ),
        ] {
            let e = Cli::parse_args(args).expect_err("refused");
            assert_eq!(e.kind(), kind, "{args:?}");
        }
    }

    #[test]
    fn proto_flags_repeat_on_the_main_job_and_config_commands() {
        let cli = Cli::parse_args([
            "recorder",
            "-c",
            "x.cfg",
            "--proto",
            "a.proto",
            "--proto",
            "b.proto",
            "--proto-path",
            "d",
            "--descriptor-set",
            "s.pb",
        ])
        .expect("parses");
        let p = cli.main.protos.user_protos();
        assert_eq!(
            p.files,
            [PathBuf::from("a.proto"), PathBuf::from("b.proto")]
        );
        assert_eq!(p.include_paths, [PathBuf::from("d")]);
        assert_eq!(p.descriptor_sets, [PathBuf::from("s.pb")]);
        for action in ["check", "convert"] {
            let cli = Cli::parse_args([
                "recorder",
                "config",
                action,
                "x.cfg",
                "--descriptor-set",
                "s.pb",
            ])
            .expect("parses");
            let Some(Command::Config(ConfigArgs { action })) = cli.command else {
                panic!("config");
            };
            let form = match action {
                ConfigAction::Check { form, .. } | ConfigAction::Convert { form, .. } => form,
            };
            assert_eq!(form.protos.descriptor_sets, [PathBuf::from("s.pb")]);
        }
        // An include path alone compiles nothing: refused.
        let e = Cli::parse_args(["recorder", "config", "check", "x.cfg", "--proto-path", "d"])
            .expect_err("refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }
}

/// A fill policy on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// RING_BUFFER: overwrite the oldest unflushed data.
    Ring,
    /// DISCARD: drop new data while full.
    Discard,
}

/// The sink for the trace files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum IoArg {
    /// io_uring when the kernel allows it, else pwritev.
    Auto,
    IoUring,
    Pwritev,
}

/// `recorder bench` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// Take buffers, write period and for_testing sources from this TraceConfig.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["writers", "packet_size", "policy", "buffer_kb", "chunk_kb", "write_period_ms", "rate", "max_rate"])]
    pub config: Option<PathBuf>,
    /// Writer threads.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// TracePacket sizes in bytes (comma list; each is swept).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64",
        value_name = "B[,B…]"
    )]
    pub(crate) packet_size: Vec<usize>,
    /// Fill policies (comma list).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "ring",
        value_name = "ring,discard"
    )]
    pub policy: Vec<PolicyArg>,
    /// Buffer sizes in KiB (comma list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16384",
        value_name = "KB[,…]"
    )]
    pub buffer_kb: Vec<u64>,
    /// Chunk sizes in KiB (comma list; default: the engine's choice per size).
    #[arg(long, value_delimiter = ',', value_name = "KB[,…]")]
    pub(crate) chunk_kb: Vec<u64>,
    /// Write periods in ms (comma list; under 100 is raised to 100 as when recording).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000",
        value_name = "MS[,…]"
    )]
    pub(crate) write_period_ms: Vec<u64>,
    /// Offered packets per second, over all writers.
    #[arg(long, value_name = "PPS", conflicts_with = "max_rate")]
    pub rate: Option<f64>,
    /// Offer as fast as the writers can (the default).
    #[arg(long)]
    pub(crate) max_rate: bool,
    /// Seconds per configuration (default 3).
    #[arg(long, value_name = "S", conflicts_with = "packets")]
    pub duration: Option<f64>,
    /// Packets per configuration, over all writers.
    #[arg(long, value_name = "N")]
    pub packets: Option<u64>,
    /// Keep the trace here (`NAME.N.EXT` per configuration in a sweep).
    #[arg(short = 'o', long, value_name = "FILE", conflicts_with = "no_output")]
    pub output: Option<PathBuf>,
    /// Run the passes without writing a file (no disk cost; nothing verified).
    #[arg(long)]
    pub(crate) no_output: bool,
    /// The sink to use.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoArg,
    /// One JSON object per configuration on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw retained % and throughput per configuration into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// `recorder serve` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// Where consumers (the `perfetto` client) connect; else
    /// PERFETTO_CONSUMER_SOCK_NAME, else /run/perfetto/traced-consumer.sock
    /// where /run/perfetto exists, else /tmp/perfetto-consumer.
    #[arg(long, value_name = "PATH")]
    pub(crate) consumer_socket: Option<PathBuf>,
    /// Where producers (SDK apps, traced_probes) connect; else
    /// PERFETTO_PRODUCER_SOCK_NAME, else /run/perfetto/traced-producer.sock
    /// where /run/perfetto exists, else /tmp/perfetto-producer.
    #[arg(long, value_name = "PATH")]
    pub(crate) producer_socket: Option<PathBuf>,
    /// The unprivileged user (name or uid) the service becomes when started
    /// as root; else RECORDER_USER, the `recorder` system user, or an
    /// unused uid of systemd's dynamic range, held while it runs. Never root nor nobody.
    #[arg(long, value_name = "NAME|UID")]
    pub user: Option<String>,
    /// Leave linux.ftrace to producers (Perfetto's traced_probes) instead
    /// of recording it with the built-in source, whose tracefs instances a
    /// root broker prepares (only when started as root).
    #[arg(long)]
    pub(crate) no_builtin_ftrace: bool,
    /// Tracing sessions the service hosts at once, in all (default 15, as
    /// Perfetto's traced).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub(crate) max_sessions: Option<u16>,
    /// Tracing sessions one uid may run at once (default 5, as Perfetto's
    /// traced); at most --max-sessions.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub(crate) max_sessions_per_uid: Option<u16>,
}
