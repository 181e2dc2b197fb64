//! `recorder bench`: parses the sweep, runs each configuration with a
//! progress bar on a TTY, prints the table (or JSON lines) and the plot.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::{self, ConfigReport, OutputPlan, StopAt, Sweep};

use super::ExitCode;
use crate::config::{self, LoadOptions};
use crate::ringbuf::FillPolicy;
use crate::storage::IoChoice;

/// A fill policy on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// RING_BUFFER: overwrite the oldest unflushed data.
    Ring,
    /// DISCARD: drop new data while full.
    Discard,
}

/// The sink for the trace files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoArg {
    /// io_uring when the kernel allows it, else pwritev.
    Auto,
    IoUring,
    Pwritev,
}

/// `recorder bench` arguments.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
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
    pub packet_size: Vec<usize>,
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
    pub chunk_kb: Vec<u64>,
    /// Write periods in ms (comma list; under 100 is raised to 100 as when recording).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000",
        value_name = "MS[,…]"
    )]
    pub write_period_ms: Vec<u64>,
    /// Offered packets per second, over all writers.
    #[arg(long, value_name = "PPS", conflicts_with = "max_rate")]
    pub rate: Option<f64>,
    /// Offer as fast as the writers can (the default).
    #[arg(long)]
    pub max_rate: bool,
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
    pub no_output: bool,
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

fn stop_at(args: &BenchArgs) -> Result<Option<StopAt>, String> {
    match (args.duration, args.packets) {
        (Some(s), _) if !(s.is_finite() && s > 0.0) => {
            Err(format!("--duration {s}: must be positive"))
        }
        (Some(s), _) => Ok(Some(StopAt::Duration(Duration::from_secs_f64(s)))),
        (None, Some(0)) => Err("--packets must be at least 1".into()),
        (None, Some(n)) => Ok(Some(StopAt::Packets(n))),
        (None, None) => Ok(None),
    }
}

/// Runs `recorder bench`; returns the exit code.
pub fn run(args: &BenchArgs) -> ExitCode {
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
