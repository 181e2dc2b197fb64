//! Why a configured ftrace feature was refused: by this kernel (it lacks
//! the tracer, the option or the file), by the system (a tracefs write or
//! mapping it forbids), or by the privileged side that prepares served
//! sessions' instances. Each keeps its cause; the messages say which config
//! field was refused and how to see why.

use super::remote::RemoteError;
use super::tracefs::TracefsError;
use crate::sys::trace_map::TraceMapError;

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "enable_function_graph: this kernel has no function_graph tracer (available_tracers: {available})"
    )]
    NoFunctionGraph { available: String },
    /// A tracefs write the config asked for.
    #[error("{field}: {source} (the kernel or this system forbids it)")]
    Setting {
        field: &'static str,
        #[source]
        source: TracefsError,
    },
    #[error("tracefs_options: this kernel has no trace option {0:?} (see options/ in tracefs)")]
    NoOption(String),
    #[error("{opened} of {cpus} per-CPU stats files could be opened")]
    StatsFiles { opened: usize, cpus: usize },
    /// `RECORDER_FTRACE_READ=mmap` and a CPU's buffer cannot be mapped.
    #[error("{}=mmap: cpu{cpu}: {source}", super::reader::READ_MODE_ENV)]
    Mmap {
        cpu: u32,
        #[source]
        source: TraceMapError,
    },
    #[error("the privileged side refused the tracefs instance: {0}")]
    Remote(#[source] RemoteError),
}
