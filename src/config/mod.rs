//! TraceConfig loading (text and binary) and validation into typed specs.
//!
//! ```text
//! bytes (file | stdin) ──form detection──► text::parse ─┐
//!                                   └────► binary decode ┴─► DynamicMessage
//!        (unknown fields kept) ──encode──► config bytes ──validate──► RecorderSpec
//! ```
//!
//! Both forms end as one serialized TraceConfig: for binary input, the bytes as
//! given; for text, their encoding. Each data source's `DataSourceConfig` is cut
//! out of those bytes at the wire level ([`wire`]), so it reaches the source
//! exactly as written; only the service-owned fields are rewritten
//! ([`DataSourceSpec::config_for_source`]).
//!
//! Data source names: `linux.ftrace`, `linux.process_stats`, `linux.sys_stats`
//! and the synthetic `for_testing` source, which is also accepted under the name
//! of Perfetto's test producer, `android.perfetto.FakeProducer`.

pub mod diagnostic;
pub mod fields;
pub mod plan;
pub mod segments;
pub mod spec;
pub mod text;
pub mod token;
pub mod validate;
pub mod wire;

use std::io::Read;
use std::path::Path;
use std::sync::LazyLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};
use thiserror::Error;

pub use diagnostic::TextError;
pub use spec::*;
pub use validate::Invalid;
pub use wire::ServiceFields;

/// Our schema, for reflection.
pub fn pool() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        DescriptorPool::decode(crate::protos::DESCRIPTOR_SET)
            .expect("the descriptor set is produced by build.rs from our own protos")
    });
    &POOL
}

/// The `TraceConfig` descriptor.
pub fn trace_config_descriptor() -> MessageDescriptor {
    pool()
        .get_message_by_name("perfetto.protos.TraceConfig")
        .expect("protos/trace_config.proto defines perfetto.protos.TraceConfig")
}

/// Which encoding a config is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigForm {
    /// Protobuf text format.
    Text,
    /// Protobuf binary.
    Binary,
}

/// How to read a config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Parse as text even if the bytes do not look like text (`--txt`).
    pub force_text: bool,
    /// Skip unknown text fields instead of failing (`--txt-lossy`; implies text).
    pub lossy: bool,
}

/// Errors of loading and validating a config.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file (or stdin) could not be read.
    #[error("{origin}: cannot read: {source}")]
    Io {
        /// File name or `<stdin>`.
        origin: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A text config did not parse; `rendered` is the full diagnostic.
    #[error("{rendered}")]
    Text {
        /// The positioned error.
        error: TextError,
        /// `FILE:LINE:COL: error: …`, the line and a caret.
        rendered: String,
    },
    /// A binary config did not decode.
    #[error("{origin}: not a valid binary TraceConfig: {message}{hint}")]
    Binary {
        /// File name.
        origin: String,
        /// The decoder's complaint.
        message: String,
        /// A hint when the bytes look like text.
        hint: &'static str,
    },
    /// The config is well-formed but not acceptable.
    #[error("{origin}: invalid config:\n{}", .errors.iter().map(|e| format!("  error: {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// File name.
        origin: String,
        /// Every problem found.
        errors: Vec<Invalid>,
    },
}

/// A config read and decoded, not yet validated.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// Where it came from (for messages).
    pub origin: String,
    /// Its form.
    pub form: ConfigForm,
    /// The message, unknown fields included.
    pub message: DynamicMessage,
    /// Serialized TraceConfig: the input itself for binary, the encoding for text.
    pub bytes: Vec<u8>,
    /// Text fields skipped in lossy mode.
    pub skipped_fields: Vec<String>,
    /// Paths of fields our schema does not know (binary input).
    pub unknown_fields: Vec<String>,
}

/// Whether bytes are plausibly a text config: UTF-8 with no control
/// characters but tab, CR and LF. Binary TraceConfigs almost always start with
/// a tag followed by a small length byte, which fails this.
pub fn looks_like_text(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => s
            .chars()
            .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r')),
        Err(_) => false,
    }
}

/// Reads a config from a file, or stdin for `-`.
pub fn read_source(path: &Path) -> Result<(String, Vec<u8>), ConfigError> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|source| ConfigError::Io {
                origin: "<stdin>".into(),
                source,
            })?;
        return Ok(("<stdin>".into(), buf));
    }
    let origin = path.display().to_string();
    let buf = std::fs::read(path).map_err(|source| ConfigError::Io {
        origin: origin.clone(),
        source,
    })?;
    Ok((origin, buf))
}

/// Loads a config from a file or stdin (`-`).
pub fn load_path(path: &Path, opts: LoadOptions) -> Result<LoadedConfig, ConfigError> {
    let (origin, bytes) = read_source(path)?;
    load_bytes(&bytes, &origin, opts)
}

/// Loads a config from bytes; `origin` names it in messages.
pub fn load_bytes(
    bytes: &[u8],
    origin: &str,
    opts: LoadOptions,
) -> Result<LoadedConfig, ConfigError> {
    if opts.force_text || opts.lossy || looks_like_text(bytes) {
        let src = std::str::from_utf8(bytes).map_err(|e| {
            let error = TextError::new(e.valid_up_to(), 1, "the config is not valid UTF-8 text");
            let rendered = error.render(origin, &String::from_utf8_lossy(bytes));
            ConfigError::Text { error, rendered }
        })?;
        load_text(src, origin, opts.lossy)
    } else {
        load_binary(bytes, origin)
    }
}

/// Loads a text config.
pub fn load_text(src: &str, origin: &str, lossy: bool) -> Result<LoadedConfig, ConfigError> {
    let parsed = text::parse(src, trace_config_descriptor(), lossy).map_err(|error| {
        let rendered = error.render(origin, src);
        ConfigError::Text { error, rendered }
    })?;
    let bytes = parsed.message.encode_to_vec();
    Ok(LoadedConfig {
        origin: origin.to_string(),
        form: ConfigForm::Text,
        message: parsed.message,
        bytes,
        skipped_fields: parsed.skipped,
        unknown_fields: Vec::new(),
    })
}

/// Loads a binary config; fields our schema lacks are kept.
pub fn load_binary(bytes: &[u8], origin: &str) -> Result<LoadedConfig, ConfigError> {
    let message = DynamicMessage::decode(trace_config_descriptor(), bytes).map_err(|e| {
        ConfigError::Binary {
            origin: origin.to_string(),
            message: e.to_string(),
            hint: if looks_like_text(bytes) {
                " (it looks like text: try --txt)"
            } else {
                ""
            },
        }
    })?;
    let mut unknown = Vec::new();
    unknown_paths(&message, "", &mut unknown);
    Ok(LoadedConfig {
        origin: origin.to_string(),
        form: ConfigForm::Binary,
        message,
        bytes: bytes.to_vec(),
        skipped_fields: Vec::new(),
        unknown_fields: unknown,
    })
}

/// Paths of every unknown field in `msg`, e.g. `data_sources[0].config.#5000`.
pub fn unknown_paths(msg: &DynamicMessage, path: &str, out: &mut Vec<String>) {
    for u in msg.unknown_fields() {
        let p = if path.is_empty() {
            format!("#{}", u.number())
        } else {
            format!("{path}.#{}", u.number())
        };
        out.push(p);
    }
    for (f, v) in msg.fields() {
        let base = if path.is_empty() {
            f.name().to_string()
        } else {
            format!("{path}.{}", f.name())
        };
        match v {
            Value::Message(m) => unknown_paths(m, &base, out),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Message(m) = item {
                        unknown_paths(m, &format!("{base}[{i}]"), out);
                    }
                }
            }
            _ => {}
        }
    }
}

impl LoadedConfig {
    /// Validates into a spec.
    pub fn validate(&self) -> Result<RecorderSpec, ConfigError> {
        let mut spec = validate::validate(&self.bytes, self.unknown_fields.clone(), pool())
            .map_err(|errors| ConfigError::Invalid {
                origin: self.origin.clone(),
                errors,
            })?;
        if !self.skipped_fields.is_empty() {
            spec.warnings.insert(
                0,
                Warning {
                    path: String::new(),
                    message: format!(
                        "--txt-lossy skipped unknown fields: {}",
                        self.skipped_fields.join(", ")
                    ),
                },
            );
        }
        Ok(spec)
    }

    /// The message encoded afresh (canonical field order; unknown fields kept).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        self.message.encode_to_vec()
    }

    /// The config as text (what `config convert --to text` prints), and how
    /// many unknown fields had no text form.
    pub fn to_text(&self) -> (String, usize) {
        text::print(&self.message)
    }
}

/// Loads and validates in one step.
pub fn load_spec(path: &Path, opts: LoadOptions) -> Result<RecorderSpec, ConfigError> {
    load_path(path, opts)?.validate()
}

fn all_counters(enum_name: &str) -> Vec<Counter> {
    pool()
        .get_enum_by_name(enum_name)
        .map(|ed| {
            ed.values()
                .filter(|v| v.number() != 0)
                .map(|v| Counter {
                    id: v.number(),
                    name: v.name().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every meminfo counter our schema knows (what an empty
/// `meminfo_counters` list means), in enum order.
pub fn all_meminfo_counters() -> Vec<Counter> {
    all_counters("perfetto.protos.MeminfoCounters")
}

/// Every vmstat counter our schema knows (what an empty `vmstat_counters`
/// list means), in enum order.
pub fn all_vmstat_counters() -> Vec<Counter> {
    all_counters("perfetto.protos.VmstatCounters")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_tables_are_complete() {
        let m = all_meminfo_counters();
        assert_eq!(m.len(), 38);
        assert_eq!(m[0].name, "MEMINFO_MEM_TOTAL");
        let v = all_vmstat_counters();
        assert_eq!(v.len(), 188);
        assert_eq!(v[0].vmstat_key(), "nr_free_pages");
        assert_eq!(
            v.last().map(Counter::vmstat_key).as_deref(),
            Some("workingset_restore_file")
        );
    }

    #[test]
    fn text_detection() {
        assert!(looks_like_text(b"buffers { size_kb: 1 }\n\t"));
        assert!(!looks_like_text(&[0x0a, 0x03, 0x08, 0x80, 0x08]));
        assert!(!looks_like_text(&[0xff, 0xfe]));
    }
}
