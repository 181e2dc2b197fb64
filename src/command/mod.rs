//! The commands (layer 5, beside `cli`): each takes parsed arguments, calls
//! the library, prints for people and returns an [`ExitCode`].

pub(crate) mod bench;
pub(crate) mod completions;
pub(crate) mod config;
pub(crate) mod control;
mod exit;
pub(crate) mod index;
pub(crate) mod inspect;
pub mod man_pages;
pub(crate) mod open;
pub(crate) mod record;
pub(crate) mod recover;
pub(crate) mod serve;

pub use exit::ExitCode;

use crate::cli::{Cli, Command, ConfigAction, ConfigArgs};

/// Runs the binary: parse arguments, set up logging, dispatch.
pub fn main() -> std::process::ExitCode {
    let cli = match Cli::parse_args(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            let code = if e.use_stderr() {
                ExitCode::Usage
            } else {
                ExitCode::Success // --help, --version
            };
            return code.into();
        }
    };
    // The bench opens one trace per configuration and prints its own table:
    // per-run info lines (which sink, ...) would only interleave with it.
    let quiet = cli
        .quiet
        .saturating_add(u8::from(matches!(cli.command, Some(Command::Bench(_)))));
    init_logging(cli.verbose, quiet);
    run(cli).into()
}

/// Dispatches parsed arguments to their command.
pub(crate) fn run(cli: Cli) -> ExitCode {
    let Some(command) = cli.command else {
        return record::run_main_job(&cli.main);
    };
    match command {
        Command::Config(ConfigArgs { action }) => match action {
            ConfigAction::Check {
                file,
                explain,
                form,
                rules,
            } => config::check(&file, &form, explain, &rules),
            ConfigAction::Convert {
                file,
                to,
                out,
                form,
            } => config::convert(&file, to, out.as_deref(), &form),
        },
        Command::Inspect { file, json } => inspect::run(&file, json),
        Command::Recover {
            dir,
            out,
            no_clobber,
        } => recover::run(&dir, &out, no_clobber),
        Command::Index {
            path,
            unshipped,
            format,
        } => index::run(&path, unshipped.as_deref(), format.as_deref()),
        Command::Trigger { names, producer } => control::fire(&names, &producer),
        Command::Query { json } => control::query(json),
        Command::Stop { pid, all } => control::stop(pid, all),
        Command::Start { pid, all } => control::start(pid, all),
        Command::Rotate { pid, all } => control::rotate(pid, all),
        Command::Serve(args) => serve::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Completions { shell } => completions::run(shell),
        Command::ManPages { dir } => man_pages::run(&dir),
        Command::Open {
            file,
            port,
            no_browser,
            origin,
        } => open::run(&open::OpenRequest {
            trace: &file,
            port,
            browser: !no_browser,
            origin: &origin,
        }),
    }
}

/// Writes `text` to stdout. `Err` carries the exit code to end with: a
/// reader that went away (`recorder inspect T | head`) ends the command
/// quietly with success, as other Unix tools do; any other write error is a
/// runtime failure, said once.
pub(crate) fn print_out(text: impl std::fmt::Display) -> Result<(), ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::Success),
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            Err(ExitCode::Runtime)
        }
    }
}

pub use crate::app::chain;

fn init_logging(verbose: u8, quiet: u8) {
    let level = match i16::from(verbose) - i16::from(quiet) {
        i16::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    // A second initialisation (tests calling `run`) keeps the first logger.
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .target(env_logger::Target::Stderr)
        .format_timestamp(None)
        .try_init();
}
