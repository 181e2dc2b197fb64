//! The main job: `recorder --config FILE -o OUT`.

use std::path::Path;

use crate::app::{self, RunOptions};
use crate::cli::{EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, MainArgs};
use crate::config::RecorderSpec;
use crate::storage::{IoChoice, OutputPath};
use crate::sys::daemon::{Forked, fork_detached};

/// Records as `spec` says; returns the exit code.
pub fn run(spec: &RecorderSpec, args: &MainArgs) -> u8 {
    if !spec.activate_triggers.is_empty() {
        // As with Perfetto's cmdline: such a config only fires its triggers.
        return super::control::fire(&spec.activate_triggers, "perfetto_cmd_producer");
    }
    let Some(out) = args.out.as_deref() else {
        eprintln!("error: no output: give -o OUT (or -o - for stdout)");
        return EXIT_USAGE;
    };
    let output = if out == Path::new("-") {
        OutputPath::Stdout
    } else {
        OutputPath::File(app::absolute_output(out))
    };
    if args.background && output == OutputPath::Stdout {
        eprintln!("error: --background cannot write the trace to stdout");
        return EXIT_USAGE;
    }
    let io = match std::env::var("RECORDER_IO").as_deref() {
        Ok("io_uring") => IoChoice::IoUring,
        Ok("pwritev") => IoChoice::Pwritev,
        _ => IoChoice::Auto,
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
        .unwrap_or_default();
    let opts = RunOptions {
        output,
        no_clobber: args.no_clobber,
        io,
        config_label,
        status_line: !args.background,
    };

    let mut report = None;
    if args.background {
        match fork_detached() {
            Ok(Forked::Parent { child, status }) => {
                return match status {
                    Ok(()) => {
                        println!("{child}");
                        EXIT_OK
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        EXIT_RUNTIME
                    }
                };
            }
            Ok(Forked::Child(r)) => report = Some(r),
            Err(e) => {
                eprintln!("error: cannot go to the background: {e}");
                return EXIT_RUNTIME;
            }
        }
    }

    let rec = match app::build(spec, &opts) {
        Ok(r) => r,
        Err(e) => {
            if let Some(r) = report.as_mut() {
                r.failed(&e.to_string());
            }
            eprintln!("error: {e}");
            return EXIT_RUNTIME;
        }
    };
    if let Some(r) = report.as_mut() {
        r.ok();
    }
    let timeline = rec.session.timeline().clone();
    let outcome = crate::event_loop::run(rec);
    eprintln!("{}", crate::summary::render(&outcome, &timeline));
    if outcome.reason.is_failure() {
        EXIT_RUNTIME
    } else {
        EXIT_OK
    }
}
