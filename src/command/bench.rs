//! `recorder bench`: parses the sweep, runs each configuration with a
//! progress bar on a TTY, prints the table (or JSON lines) and the plot.

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::{self, ConfigReport, OutputPlan, StopAt, Sweep};

use super::ExitCode;
use crate::cli::{BenchArgs, IoArg, PolicyArg};
use crate::config::{self, LoadOptions};
use crate::ringbuf::FillPolicy;
use crate::storage::IoChoice;

/// A run length `recorder bench` cannot use (exit code 2).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
enum StopAtError {
    #[error("--duration {0}: must be positive")]
    Duration(f64),
    #[error("--packets must be at least 1")]
    NoPackets,
}

fn stop_at(args: &BenchArgs) -> Result<Option<StopAt>, StopAtError> {
    match (args.duration, args.packets) {
        (Some(s), _) if !(s.is_finite() && s > 0.0) => Err(StopAtError::Duration(s)),
        (Some(s), _) => Ok(Some(StopAt::Duration(Duration::from_secs_f64(s)))),
        (None, Some(0)) => Err(StopAtError::NoPackets),
        (None, Some(n)) => Ok(Some(StopAt::Packets(n))),
        (None, None) => Ok(None),
    }
}

/// Runs `recorder bench`; returns the exit code.
pub(crate) fn run(args: &BenchArgs) -> ExitCode {
    let stop = match stop_at(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::Usage;
        }
    };
    if let Some(r) = args.rate
        && !(r.is_finite() && r > 0.0)
    {
        eprintln!("error: --rate {r}: must be positive");
        return ExitCode::Usage;
    }
    let output = match (&args.output, args.no_output) {
        (Some(p), _) => OutputPlan::Keep(p.clone()),
        (None, true) => OutputPlan::Discard,
        (None, false) => OutputPlan::Temporary,
    };
    let io = match args.io {
        IoArg::Auto => IoChoice::Auto,
        IoArg::IoUring => IoChoice::IoUring,
        IoArg::Pwritev => IoChoice::Pwritev,
    };
    let configs = match &args.config {
        Some(path) => {
            let spec = match config::load_spec(path, LoadOptions::default()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::Usage;
                }
            };
            for w in &spec.warnings {
                log::warn!("{w}");
            }
            match bench::from_spec(&spec, stop, &output, io) {
                Ok(c) => vec![c],
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::Usage;
                }
            }
        }
        None => {
            let sweep = Sweep {
                writers: args.writers,
                packet_sizes: args.packet_size.clone(),
                policies: args
                    .policy
                    .iter()
                    .map(|p| match p {
                        PolicyArg::Ring => FillPolicy::RingBuffer,
                        PolicyArg::Discard => FillPolicy::Discard,
                    })
                    .collect(),
                buffer_kb: args.buffer_kb.clone(),
                chunk_kb: args.chunk_kb.clone(),
                write_period_ms: args.write_period_ms.clone(),
                rate_pps: args.rate,
                stop: stop.unwrap_or(StopAt::Duration(Duration::from_secs(3))),
                output,
                io,
            };
            match sweep.configs() {
                Ok((c, warnings)) => {
                    for w in warnings {
                        log::warn!("{w}");
                    }
                    c
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::Usage;
                }
            }
        }
    };

    // indicatif draws to stderr and stays hidden when it is not a terminal.
    let bar = ProgressBar::new(configs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reports: Vec<ConfigReport> = Vec::with_capacity(configs.len());
    let mut failed = false;
    let stdout = std::io::stdout();
    for cfg in &configs {
        let b = &cfg.buffers[0];
        bar.set_message(format!(
            "#{} {:?} {} KiB, {} writer(s)",
            cfg.index,
            b.policy,
            b.size_bytes / 1024,
            cfg.writers.len()
        ));
        match bench::run_config(cfg) {
            Ok(r) => {
                for w in &r.warnings {
                    bar.suspend(|| eprintln!("configuration {}: warning: {w}", r.index));
                }
                if !r.verify.ok && r.verify.checked {
                    failed = true;
                    bar.suspend(|| {
                        eprintln!(
                            "configuration {}: verification failed: {}",
                            r.index,
                            r.verify.problems.join("; ")
                        )
                    });
                }
                if args.json {
                    match serde_json::to_string(&r) {
                        Ok(line) => {
                            let _ = bar.suspend(|| writeln!(stdout.lock(), "{line}"));
                        }
                        Err(e) => log::error!("cannot serialize the report: {e}"),
                    }
                }
                reports.push(r);
            }
            Err(e) => {
                bar.suspend(|| eprintln!("configuration {}: {e}", cfg.index));
                failed = true;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !args.json {
        let sink = reports.first().map_or("-", |r| r.sink);
        println!("sink: {sink}");
        print!("{}", bench::table::sweep_table(&reports));
    }
    if let Some(path) = &args.plot
        && let Err(e) =
            crate::storage::create::write_file(path, bench::plot::svg(&reports).as_bytes())
    {
        eprintln!("error: cannot write {}: {e}", path.display());
        failed = true;
    }
    if failed {
        ExitCode::Runtime
    } else {
        ExitCode::Success
    }
}
