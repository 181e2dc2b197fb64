//! From command-line lists (or a config) to the configurations to run: the
//! cartesian product of the swept values.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::BenchError;
use super::run::{BenchConfig, BufferSetup, OutputTarget};
use super::workload::{WriterPlan, filler_for};
use crate::config::spec::{self, RecorderSpec, SourceKind};
use crate::config::validate::{DEFAULT_WRITE_PERIOD_MS, write_period_ms};
use crate::ringbuf::FillPolicy;
use crate::storage::IoChoice;

/// First sequence id of the bench writers (1 is the recorder's own).
pub(crate) const FIRST_SEQUENCE: u32 = 2;

/// When a configuration ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StopAt {
    /// After this long.
    Duration(Duration),
    /// When this many packets (over all writers) have been offered.
    Packets(u64),
}

/// Where traces go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputPlan {
    /// Keep them: this path for a single configuration, `stem.N.ext` for a sweep.
    Keep(PathBuf),
    /// Temporary files, verified and removed.
    Temporary,
    /// Nowhere (`--no-output`).
    Discard,
}

/// The sweep the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    /// Writer threads per configuration, all on the one buffer.
    pub writers: usize,
    pub(crate) packet_sizes: Vec<usize>,
    /// Fill policies to sweep.
    pub policies: Vec<FillPolicy>,
    /// Buffer sizes to sweep, in KiB.
    pub buffer_kb: Vec<u64>,
    /// Empty: the engine's default chunk size for each buffer size.
    pub(crate) chunk_kb: Vec<u64>,
    pub(crate) write_period_ms: Vec<u64>,
    /// Total offered rate; `None` is as fast as possible.
    pub(crate) rate_pps: Option<f64>,
    /// When each configuration ends.
    pub stop: StopAt,
    /// Where the traces go.
    pub output: OutputPlan,
    /// Which sink writes the trace files.
    pub io: IoChoice,
}

/// The write period the recorder itself would use (the config's rule:
/// [`write_period_ms`]), with a warning when changed.
pub(crate) fn effective_write_period_ms(ms: u64) -> (u64, Option<String>) {
    let (v, how) = write_period_ms(ms.min(u64::from(u32::MAX)) as u32);
    (u64::from(v), how.map(|h| format!("write period: {h}")))
}

/// `trace.pftrace` → `trace.3.pftrace` (a sweep keeps one file per configuration).
pub(crate) fn numbered_path(path: &Path, index: usize, count: usize) -> PathBuf {
    if count <= 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{index}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{index}"),
    };
    path.with_file_name(name)
}

fn target(plan: &OutputPlan, index: usize, count: usize) -> OutputTarget {
    match plan {
        OutputPlan::Keep(p) => OutputTarget::Keep(numbered_path(p, index, count)),
        OutputPlan::Temporary => OutputTarget::Temporary(std::env::temp_dir().join(format!(
            "recorder-bench-{}-{index}.pftrace",
            std::process::id()
        ))),
        OutputPlan::Discard => OutputTarget::Discard,
    }
}

/// Splits `total` into `n` near-equal parts.
fn split(total: u64, n: usize, i: usize) -> u64 {
    let n = n as u64;
    total / n + u64::from((i as u64) < total % n)
}

impl Sweep {
    /// Every configuration, in the order packet size, policy, buffer size,
    /// chunk size, write period (the last varies fastest).
    pub fn configs(&self) -> Result<(Vec<BenchConfig>, Vec<String>), BenchError> {
        let mut warnings = Vec::new();
        if self.writers == 0 {
            return Err(BenchError::Usage("--writers must be at least 1"));
        }
        for (name, empty) in [
            ("--packet-size", self.packet_sizes.is_empty()),
            ("--policy", self.policies.is_empty()),
            ("--buffer-kb", self.buffer_kb.is_empty()),
            ("--write-period-ms", self.write_period_ms.is_empty()),
        ] {
            if empty {
                return Err(BenchError::NoValue(name));
            }
        }
        let chunks: Vec<Option<u64>> = if self.chunk_kb.is_empty() {
            vec![None]
        } else {
            self.chunk_kb.iter().map(|&c| Some(c)).collect()
        };
        let mut periods = Vec::new();
        for &p in &self.write_period_ms {
            let (ms, warning) = effective_write_period_ms(p);
            warnings.extend(warning);
            periods.push(ms);
        }
        let count = self.packet_sizes.len()
            * self.policies.len()
            * self.buffer_kb.len()
            * chunks.len()
            * periods.len();
        let mut out = Vec::with_capacity(count);
        for &size in &self.packet_sizes {
            let filler = filler_for(size);
            for &policy in &self.policies {
                for &kb in &self.buffer_kb {
                    for &chunk in &chunks {
                        for &period in &periods {
                            let index = out.len();
                            let writers = (0..self.writers)
                                .map(|i| WriterPlan {
                                    buffer: 0,
                                    sequence_id: FIRST_SEQUENCE + i as u32,
                                    filler_len: filler,
                                    rate_pps: self.rate_pps.map(|r| r / self.writers as f64),
                                    packets: match self.stop {
                                        StopAt::Packets(n) => Some(split(n, self.writers, i)),
                                        StopAt::Duration(_) => None,
                                    },
                                    seed: i as u32 + 1,
                                })
                                .collect();
                            out.push(BenchConfig {
                                index,
                                buffers: vec![BufferSetup {
                                    size_bytes: (kb * 1024) as usize,
                                    chunk_size: chunk.map(|c| (c * 1024) as usize),
                                    policy,
                                }],
                                writers,
                                packet_size: Some(size),
                                rate_pps: self.rate_pps,
                                write_period: Duration::from_millis(period),
                                duration: match self.stop {
                                    StopAt::Duration(d) => Some(d),
                                    StopAt::Packets(_) => None,
                                },
                                output: target(&self.output, index, count),
                                io: self.io,
                            });
                        }
                    }
                }
            }
        }
        Ok((out, warnings))
    }
}

/// The one configuration a `TraceConfig` describes: its buffers and write
/// period, one writer per `for_testing` source (its message size, rate,
/// count and seed). Stops at the config's duration, else at `stop`, else
/// when every source has written its count.
pub fn from_spec(
    spec: &RecorderSpec,
    stop: Option<StopAt>,
    output: &OutputPlan,
    io: IoChoice,
) -> Result<BenchConfig, BenchError> {
    let buffers: Vec<BufferSetup> = spec
        .buffers
        .iter()
        .map(|b| BufferSetup {
            size_bytes: b.size.0 as usize,
            chunk_size: None,
            policy: match b.fill_policy {
                spec::FillPolicy::RingBuffer => FillPolicy::RingBuffer,
                spec::FillPolicy::Discard => FillPolicy::Discard,
            },
        })
        .collect();
    let mut writers = Vec::new();
    for ds in &spec.data_sources {
        if let SourceKind::ForTesting(t) = &ds.kind {
            let rate = (t.max_messages_per_second > 0 && !t.send_batch_on_register)
                .then_some(f64::from(t.max_messages_per_second));
            writers.push(WriterPlan {
                buffer: ds.target_buffer.0 as usize,
                sequence_id: FIRST_SEQUENCE + writers.len() as u32,
                filler_len: t.message_size as usize,
                rate_pps: rate,
                packets: (t.message_count > 0).then_some(u64::from(t.message_count)),
                seed: t.seed,
            });
        }
    }
    if writers.is_empty() {
        return Err(BenchError::Usage(
            "the config has no for_testing data source to drive",
        ));
    }
    if let Some(w) = writers.iter().find(|w| w.buffer >= buffers.len()) {
        return Err(BenchError::NoSuchBuffer(w.buffer));
    }
    let duration = spec.duration.or(match stop {
        Some(StopAt::Duration(d)) => Some(d),
        _ => None,
    });
    if let Some(StopAt::Packets(n)) = stop {
        let count = writers.len();
        for (i, w) in writers.iter_mut().enumerate() {
            w.packets = Some(split(n, count, i));
        }
    }
    if duration.is_none() && writers.iter().any(|w| w.packets.is_none()) {
        return Err(BenchError::Usage(
            "a for_testing source without message_count needs duration_ms in the config or --duration/--packets",
        ));
    }
    let write_period = spec.file.as_ref().map_or(
        Duration::from_millis(u64::from(DEFAULT_WRITE_PERIOD_MS)),
        |f| f.write_period,
    );
    let rate: Option<f64> = writers.iter().map(|w| w.rate_pps).sum();
    Ok(BenchConfig {
        index: 0,
        buffers,
        writers,
        packet_size: None,
        rate_pps: rate,
        write_period,
        duration,
        output: target(output, 0, 1),
        io,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep() -> Sweep {
        Sweep {
            writers: 3,
            packet_sizes: vec![64, 1024],
            policies: vec![FillPolicy::RingBuffer, FillPolicy::Discard],
            buffer_kb: vec![4096, 65536],
            chunk_kb: vec![],
            write_period_ms: vec![50, 1000],
            rate_pps: Some(300.0),
            stop: StopAt::Packets(10),
            output: OutputPlan::Keep(PathBuf::from("/tmp/t.pftrace")),
            io: IoChoice::Auto,
        }
    }

    #[test]
    fn cartesian_product_in_order() {
        let (configs, warnings) = sweep().configs().expect("valid");
        assert_eq!(configs.len(), 16);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let c = &configs[5];
        // 5 = size 64, discard (1), buffer 4096 (0), period 1000 (1).
        assert_eq!(c.packet_size, Some(64));
        assert_eq!(c.buffers[0].policy, FillPolicy::Discard);
        assert_eq!(c.buffers[0].size_bytes, 4096 * 1024);
        assert_eq!(c.write_period, Duration::from_millis(1000));
        assert_eq!(configs[0].write_period, Duration::from_millis(100));
        assert_eq!(
            c.output,
            OutputTarget::Keep(PathBuf::from("/tmp/t.5.pftrace"))
        );
        let counts: Vec<u64> = c.writers.iter().map(|w| w.packets.unwrap_or(0)).collect();
        assert_eq!(counts, vec![4, 3, 3]);
        assert_eq!(c.writers[2].sequence_id, 4);
        assert_eq!(c.writers[0].rate_pps, Some(100.0));
    }

    #[test]
    fn numbered_paths() {
        let p = Path::new("/x/trace.pftrace");
        assert_eq!(numbered_path(p, 0, 1), PathBuf::from("/x/trace.pftrace"));
        assert_eq!(numbered_path(p, 2, 4), PathBuf::from("/x/trace.2.pftrace"));
        assert_eq!(
            numbered_path(Path::new("out"), 1, 2),
            PathBuf::from("out.1")
        );
    }

    #[test]
    fn empty_lists_are_refused() {
        let mut s = sweep();
        s.policies.clear();
        assert!(s.configs().is_err());
    }
}
