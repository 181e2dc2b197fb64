//! Command-line surface (clap derive) and exit codes. No logic lives here: it
//! parses arguments, calls the library, prints, and maps outcomes to exit codes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::{self, ConfigError, ConfigForm, LoadOptions, RecorderSpec};

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: a runtime failure (I/O error, full disk, tracefs refused).
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code: bad usage or a config error.
pub const EXIT_USAGE: u8 = 2;

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  runtime failure (I/O error, full disk, kernel refused)
  2  usage or config error (unlike Perfetto, a rejected config is not a success)

Configs are Perfetto TraceConfigs, text (.cfg, .pbtx) or binary; the form is
detected unless --txt is given.";

/// Records Linux traces in the Perfetto format, storage-first.
#[derive(Debug, Parser)]
// Not `args_conflicts_with_subcommands`: clap counts global flags as main-job
// arguments there, which refused `recorder -q bench`; the main job's own
// arguments are refused beside a subcommand by `MainArgs::given` instead.
#[command(name = "recorder", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// A subcommand; without one, the main job runs (`--config`).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The main job's arguments.
    #[command(flatten)]
    pub main: MainArgs,
    /// More logging (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Less logging (-q warnings only, -qq errors only).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub quiet: u8,
}

/// Arguments of the main job: record a trace as the config says.
#[derive(Debug, Clone, Args)]
pub struct MainArgs {
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
    pub txt_lossy: bool,
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
    pub max_segments: Option<u32>,
    /// Keep the segments within BYTES of disk (deleting the oldest closed ones).
    #[arg(long, value_name = "BYTES", value_parser = crate::storage::segment::policy::parse_size)]
    pub max_disk: Option<u64>,
    /// Run CMD with each closed segment's path as its last argument (in the background).
    #[arg(long, value_name = "CMD")]
    pub on_segment_closed: Option<String>,
    /// Listen for Perfetto SDK apps here instead of where they look by default
    /// (/run/perfetto/traced-producer.sock or /tmp/perfetto-producer;
    /// PERFETTO_PRODUCER_SOCK_NAME also overrides it).
    #[arg(long, value_name = "PATH")]
    pub producer_socket: Option<PathBuf>,
}

impl MainArgs {
    /// The first main-job argument given, if any (they mean nothing beside a
    /// subcommand).
    pub fn given(&self) -> Option<&'static str> {
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
            (self.producer_socket.is_some(), "--producer-socket"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }
}

impl Cli {
    /// Parses `args`, refusing main-job arguments beside a subcommand.
    pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
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
pub enum Command {
    /// Check or convert a config.
    Config(ConfigArgs),
    /// Read a trace: packets by kind and sequence, stats, losses (a torn tail is tolerated).
    Inspect {
        /// The trace file, or a directory of segments.
        file: PathBuf,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
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
    /// Start a session configured with `deferred_start` (its owner or root).
    Start {
        /// The session's PID (optional when only one runs).
        pid: Option<u32>,
        /// Start every session you may start.
        #[arg(long, conflicts_with = "pid")]
        all: bool,
    },
    /// Measure buffer policies, sizes and write periods under a load.
    Bench(crate::command::bench::BenchArgs),
    /// Open a trace in the Perfetto UI: serve it once on 127.0.0.1, print (and open) the link.
    Open {
        /// The trace file.
        file: PathBuf,
        /// Local port to serve on (ui.perfetto.dev fetches only from 9001).
        #[arg(long, default_value_t = crate::command::open::DEFAULT_PORT)]
        port: u16,
        /// Print the link only; start no browser.
        #[arg(long)]
        no_browser: bool,
        /// The UI's origin, for a self-hosted Perfetto UI.
        #[arg(long, default_value = crate::command::open::DEFAULT_ORIGIN, value_name = "URL")]
        origin: String,
    },
}

/// `recorder config …`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// How to read a config file.
#[derive(Debug, Clone, Args)]
pub struct FormArgs {
    /// Parse as text (no detection).
    #[arg(long, conflicts_with = "txt_lossy")]
    pub txt: bool,
    /// Parse as text and skip unknown fields.
    #[arg(long)]
    pub txt_lossy: bool,
}

impl FormArgs {
    fn options(&self) -> LoadOptions {
        LoadOptions {
            force_text: self.txt,
            lossy: self.txt_lossy,
        }
    }
}

/// Output form of `config convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetForm {
    /// Protobuf binary (what `protoc --encode` makes).
    Binary,
    /// Protobuf text format.
    Text,
}

/// `recorder config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
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

fn init_logging(verbose: u8, quiet: u8) {
    let level = match i16::from(verbose) - i16::from(quiet) {
        i16::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .target(env_logger::Target::Stderr)
        .format_timestamp(None)
        .try_init();
}

fn report(e: &ConfigError) -> u8 {
    eprintln!("{e}");
    EXIT_USAGE
}

fn warn_all(spec: &RecorderSpec) {
    for n in &spec.notes {
        log::info!("{n}");
    }
    for w in &spec.warnings {
        log::warn!("{w}");
    }
}

/// Runs the binary: parse arguments, dispatch, return the exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::parse_args(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { EXIT_OK });
        }
    };
    // The bench opens one trace per configuration and prints its own table:
    // per-run info lines (which sink, ...) would only interleave with it.
    let quiet = cli
        .quiet
        .saturating_add(u8::from(matches!(cli.command, Some(Command::Bench(_)))));
    init_logging(cli.verbose, quiet);
    ExitCode::from(run(cli))
}

/// Dispatches parsed arguments; returns the exit code.
pub fn run(cli: Cli) -> u8 {
    match cli.command {
        Some(Command::Config(ConfigArgs { action })) => match action {
            ConfigAction::Check {
                file,
                explain,
                form,
            } => config_check(&file, form.options(), explain),
            ConfigAction::Convert {
                file,
                to,
                out,
                form,
            } => config_convert(&file, to, out.as_deref(), form.options()),
        },
        Some(Command::Inspect { file, json }) => crate::command::inspect::run(&file, json),
        Some(Command::Trigger { names, producer }) => {
            crate::command::control::fire(&names, &producer)
        }
        Some(Command::Query { json }) => crate::command::control::query(json),
        Some(Command::Stop { pid, all }) => crate::command::control::stop(pid, all),
        Some(Command::Start { pid, all }) => crate::command::control::start(pid, all),
        Some(Command::Bench(args)) => crate::command::bench::run(&args),
        Some(Command::Open {
            file,
            port,
            no_browser,
            origin,
        }) => crate::command::open::run(&crate::command::open::OpenRequest {
            trace: &file,
            port,
            browser: !no_browser,
            origin: &origin,
        }),
        None => {
            let Some(path) = cli.main.config.clone() else {
                eprintln!("error: nothing to do: give --config FILE (or a subcommand); see --help");
                return EXIT_USAGE;
            };
            let opts = LoadOptions {
                force_text: cli.main.txt,
                lossy: cli.main.txt_lossy,
            };
            match config::load_spec(&path, opts) {
                Ok(spec) => {
                    warn_all(&spec);
                    run_main_job(&spec, &cli.main)
                }
                Err(e) => report(&e),
            }
        }
    }
}

/// The main job: record as `spec` says.
pub fn run_main_job(spec: &RecorderSpec, args: &MainArgs) -> u8 {
    crate::command::record::run(spec, args)
}

fn config_check(file: &Path, opts: LoadOptions, explain: bool) -> u8 {
    let loaded = match config::load_path(file, opts) {
        Ok(l) => l,
        Err(e) => return report(&e),
    };
    match loaded.validate() {
        Ok(spec) => {
            let form = match loaded.form {
                ConfigForm::Text => "text",
                ConfigForm::Binary => "binary",
            };
            println!("{}: valid {form} config", loaded.origin);
            print!("{}", config::plan::describe(&spec));
            if file != Path::new("-") {
                match config::segments::load_adjacent(file) {
                    Ok(Some((path, policy))) => {
                        print!("{}", config::segments::describe(&policy, Some(&path)));
                        if policy.check().is_err() {
                            return EXIT_USAGE;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("error: {e}");
                        return EXIT_USAGE;
                    }
                }
            }
            if explain {
                println!("fields:");
                print!(
                    "{}",
                    config::fields::explain(&spec.fields, &spec.unknown_fields)
                );
            }
            EXIT_OK
        }
        Err(e) => report(&e),
    }
}

fn config_convert(
    file: &Path,
    to: Option<TargetForm>,
    out: Option<&Path>,
    opts: LoadOptions,
) -> u8 {
    let loaded = match config::load_path(file, opts) {
        Ok(l) => l,
        Err(e) => return report(&e),
    };
    let to = to.unwrap_or(match loaded.form {
        ConfigForm::Text => TargetForm::Binary,
        ConfigForm::Binary => TargetForm::Text,
    });
    let bytes = match to {
        TargetForm::Binary => loaded.bytes.clone(),
        TargetForm::Text => {
            let (text, dropped) = loaded.to_text();
            if dropped > 0 {
                log::warn!(
                    "{dropped} field(s) our schema does not know have no text form and were left out: {}",
                    loaded.unknown_fields.join(", ")
                );
            }
            text.into_bytes()
        }
    };
    let result = match out {
        None => std::io::stdout().write_all(&bytes),
        Some(p) if p == Path::new("-") => std::io::stdout().write_all(&bytes),
        Some(p) => std::fs::write(p, &bytes),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: cannot write output: {e}");
            EXIT_RUNTIME
        }
    }
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
}
