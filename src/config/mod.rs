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
//! out of those bytes at the wire level ([`raw`]), so it reaches the source
//! exactly as written; only the service-owned fields are rewritten
//! ([`DataSourceSpec::config_for_source`]).
//!
//! A config can also come from a command line: [`light`] builds Perfetto's
//! light-mode config as text, loaded like a file. [`categories`] holds the
//! kernel events each atrace category enables on Linux.
//!
//! Data source names: `linux.ftrace`, `linux.process_stats`, `linux.sys_stats`
//! and the synthetic `for_testing` source, which is also accepted under the name
//! of Perfetto's test producer, `android.perfetto.FakeProducer`.

pub mod categories;
pub(crate) mod diagnostic;
pub(crate) mod event_name;
pub(crate) mod fields;
pub(crate) mod light;
pub(crate) mod pattern;
pub(crate) mod plan;
pub(crate) mod proto_input;
pub mod raw;
pub(crate) mod resources;
pub mod rule;
pub(crate) mod schema;
pub(crate) mod segments;
pub mod spec;
pub(crate) mod text;
pub(crate) mod token;
pub mod validate;

use std::io::Read;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use thiserror::Error;

pub use diagnostic::TextError;
pub use raw::ServiceFields;
pub use schema::{Schema, SchemaError, UserProtos};
pub use spec::*;
pub use validate::Invalid;

/// Our schema once decoded (about 6 MiB of descriptors), until
/// [`release_pool`]. A poisoned pool holds a whole handle or none.
static POOL: Mutex<Option<DescriptorPool>> = Mutex::new(None);

/// Our schema, for reflection: decoded on first use and kept for the next
/// (a handle: cloning it is cheap).
pub fn pool() -> DescriptorPool {
    // Poison is harmless: the pool holds a whole handle or none.
    let mut kept = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    kept.get_or_insert_with(|| {
        DescriptorPool::decode(crate::protos::DESCRIPTOR_SET)
            .expect("the descriptor set is produced by build.rs from our own protos")
    })
    .clone()
}

/// Lets go of the decoded schema: a session whose config is a spec needs
/// none of it. Its memory is freed once the last handle is dropped; a later
/// [`pool`] decodes it again.
pub(crate) fn release_pool() {
    // As in `pool`: a whole handle or none, whatever a panic left.
    POOL.lock().unwrap_or_else(PoisonError::into_inner).take();
}

/// The `TraceConfig` descriptor.
#[cfg(test)]
pub(crate) fn trace_config_descriptor() -> prost_reflect::MessageDescriptor {
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
    pub(crate) force_text: bool,
    /// Skip unknown text fields instead of failing (`--txt-lossy`; implies text).
    pub lossy: bool,
}

/// The largest config read, in bytes. Perfetto's own service takes a
/// config over a 128 KiB IPC frame; this leaves room while bounding the
/// memory a hostile input can make the parser use (tens of MiB at most).
pub(crate) const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// The most data sources one config may list.
pub(crate) const MAX_DATA_SOURCES: usize = 1024;

/// Errors of loading and validating a config.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The input is larger than [`MAX_CONFIG_BYTES`] (or endless).
    #[error(
        "{origin}: the config is larger than {limit} bytes, the limit (Perfetto's service takes a config in one 128 KiB IPC frame): is this the right file?"
    )]
    TooLarge {
        /// File name or `<stdin>`.
        origin: String,
        /// The limit.
        limit: usize,
    },
    /// The config lists more of something than is allowed.
    #[error("{origin}: {count} {what}; at most {limit} are allowed")]
    TooMany {
        /// File name or `<stdin>`.
        origin: String,
        /// What there are too many of (`data_sources`).
        what: &'static str,
        /// How many there are.
        count: usize,
        /// The limit.
        limit: usize,
    },
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
        /// `FILE:LINE:COL: error: …`, the line and a caret: text, as it
        /// quotes the user's config (`error` is its typed form).
        rendered: String,
    },
    /// A binary config did not decode.
    #[error("{origin}: not a valid binary TraceConfig: {source}{hint}")]
    Binary {
        /// File name.
        origin: String,
        /// The decoder's complaint.
        #[source]
        source: prost::DecodeError,
        /// A hint when the bytes look like text.
        hint: &'static str,
    },
    /// The user's `.proto` files or descriptor sets do not make a schema.
    #[error(transparent)]
    Schema(#[from] SchemaError),
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
    /// Paths of fields the schema does not know.
    pub unknown_fields: Vec<String>,
    /// The schema it was read against (ours, or ours and the user's).
    pub schema: Schema,
}

/// Whether `b` is whitespace in the protobuf text format (space, tab, LF,
/// CR, vertical tab, form feed).
fn is_text_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Whether bytes are plausibly a text config: UTF-8 with no control
/// characters but protobuf-text whitespace. Binary TraceConfigs almost
/// always start with a tag followed by a small length byte, which fails this.
pub(crate) fn looks_like_text(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => s
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) || b >= 0x80 || is_text_blank(b)),
        Err(_) => false,
    }
}

/// Whether bytes are text with a few bytes that do not belong in it (a
/// NUL, a Latin-1 letter): they start like text (a letter, `_` or `#` after
/// blanks) and at least 9 in 10 are printable ASCII or blanks. Such input is
/// diagnosed as text, at the offending byte, unless it decodes as binary.
pub(crate) fn mostly_text(bytes: &[u8]) -> bool {
    let texty = bytes
        .iter()
        .filter(|b| (0x20..0x7f).contains(*b) || is_text_blank(**b))
        .count();
    starts_like_text(bytes) && texty * 10 >= bytes.len() * 9
}

/// Whether the first byte that is not blank starts a field name or a comment.
fn starts_like_text(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !is_text_blank(**b))
        .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_' || *b == b'#')
}

/// The first byte of `bytes` that cannot appear in a text config: a
/// control character that is not blank, or the start of invalid UTF-8.
fn first_bad_text_byte(bytes: &[u8]) -> Option<TextError> {
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => s.len(),
        Err(e) => e.valid_up_to(),
    };
    if let Some(at) = bytes[..valid]
        .iter()
        .position(|b| (*b < 0x20 && !is_text_blank(*b)) || *b == 0x7f)
    {
        let what = match bytes[at] {
            0 => "a NUL byte".to_string(),
            b => format!("the control character 0x{b:02X}"),
        };
        return Some(TextError::new(
            at,
            1,
            format!("{what} cannot appear in a text config"),
        ));
    }
    (valid < bytes.len()).then(|| {
        TextError::new(
            valid,
            1,
            format!(
                "byte 0x{:02X} is not UTF-8: text configs are UTF-8 (convert a Latin-1 file with `iconv -f latin1 -t utf-8`)",
                bytes[valid]
            ),
        )
    })
}

/// Reads at most [`MAX_CONFIG_BYTES`] (one more tells it is too large).
fn read_capped(r: impl Read, origin: &str) -> Result<Vec<u8>, ConfigError> {
    let mut buf = Vec::new();
    r.take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| ConfigError::Io {
            origin: origin.to_string(),
            source,
        })?;
    if buf.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            origin: origin.to_string(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    Ok(buf)
}

/// Reads a config from a file, or stdin for `-`, up to [`MAX_CONFIG_BYTES`].
pub(crate) fn read_source(path: &Path) -> Result<(String, Vec<u8>), ConfigError> {
    if path == Path::new("-") {
        let origin = "<stdin>".to_string();
        let buf = read_capped(std::io::stdin().lock(), &origin)?;
        return Ok((origin, buf));
    }
    let origin = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| ConfigError::Io {
        origin: origin.clone(),
        source,
    })?;
    let buf = read_capped(f, &origin)?;
    Ok((origin, buf))
}

/// Loads a config from a file or stdin (`-`).
pub fn load_path(path: &Path, opts: LoadOptions) -> Result<LoadedConfig, ConfigError> {
    load_path_in(path, opts, &Schema::ours())
}

/// Loads a config from a file or stdin (`-`) against `schema`.
pub fn load_path_in(
    path: &Path,
    opts: LoadOptions,
    schema: &Schema,
) -> Result<LoadedConfig, ConfigError> {
    let (origin, bytes) = read_source(path)?;
    load_bytes_in(&bytes, &origin, opts, schema)
}

/// Loads a config from bytes; `origin` names it in messages. The form is
/// told by what the bytes are: text, binary, or text with bytes that do not
/// belong there (diagnosed at those bytes).
pub fn load_bytes(
    bytes: &[u8],
    origin: &str,
    opts: LoadOptions,
) -> Result<LoadedConfig, ConfigError> {
    load_bytes_in(bytes, origin, opts, &Schema::ours())
}

/// [`load_bytes`] against `schema`.
pub(crate) fn load_bytes_in(
    bytes: &[u8],
    origin: &str,
    opts: LoadOptions,
    schema: &Schema,
) -> Result<LoadedConfig, ConfigError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            origin: origin.to_string(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    let text = opts.force_text || opts.lossy || looks_like_text(bytes);
    let loaded = if text || (mostly_text(bytes) && load_binary_in(bytes, origin, schema).is_err()) {
        if let Some(error) = first_bad_text_byte(bytes) {
            let rendered = error.render(origin, &String::from_utf8_lossy(bytes));
            return Err(ConfigError::Text { error, rendered });
        }
        let src = std::str::from_utf8(bytes).map_err(|e| {
            let error = TextError::new(e.valid_up_to(), 1, "the config is not valid UTF-8 text");
            let rendered = error.render(origin, &String::from_utf8_lossy(bytes));
            ConfigError::Text { error, rendered }
        })?;
        load_text_in(src, origin, opts.lossy, schema)?
    } else {
        load_binary_in(bytes, origin, schema)?
    };
    check_counts(&loaded)?;
    Ok(loaded)
}

/// Bounds what a config may list beyond its byte size. Checked at the load
/// (before anything reads further) and again by [`LoadedConfig::validate`],
/// so every way in (the command line, the consumer socket) has it.
fn check_counts(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    let count = loaded
        .message
        .get_field_by_name("data_sources")
        .and_then(|v| v.as_list().map(<[Value]>::len))
        .unwrap_or(0);
    if count > MAX_DATA_SOURCES {
        return Err(ConfigError::TooMany {
            origin: loaded.origin.clone(),
            what: "data_sources",
            count,
            limit: MAX_DATA_SOURCES,
        });
    }
    Ok(())
}

/// Loads a text config.
pub fn load_text(src: &str, origin: &str, lossy: bool) -> Result<LoadedConfig, ConfigError> {
    load_text_in(src, origin, lossy, &Schema::ours())
}

/// Loads a text config against `schema`.
pub fn load_text_in(
    src: &str,
    origin: &str,
    lossy: bool,
    schema: &Schema,
) -> Result<LoadedConfig, ConfigError> {
    let parsed = text::parse(src, schema.trace_config(), lossy).map_err(|error| {
        let rendered = error.render(origin, src);
        ConfigError::Text { error, rendered }
    })?;
    let bytes = parsed.message.encode_to_vec();
    let mut unknown = Vec::new();
    unknown_paths(&parsed.message, "", &mut unknown);
    Ok(LoadedConfig {
        origin: origin.to_string(),
        form: ConfigForm::Text,
        message: parsed.message,
        bytes,
        skipped_fields: parsed.skipped,
        unknown_fields: unknown,
        schema: schema.clone(),
    })
}

/// Loads a binary config; fields our schema lacks are kept.
pub fn load_binary(bytes: &[u8], origin: &str) -> Result<LoadedConfig, ConfigError> {
    load_binary_in(bytes, origin, &Schema::ours())
}

/// Loads a binary config against `schema`; fields it lacks are kept.
pub fn load_binary_in(
    bytes: &[u8],
    origin: &str,
    schema: &Schema,
) -> Result<LoadedConfig, ConfigError> {
    let message =
        DynamicMessage::decode(schema.trace_config(), bytes).map_err(|e| ConfigError::Binary {
            origin: origin.to_string(),
            source: e,
            hint: if starts_like_text(bytes) {
                " (it starts like text: if it is, --txt shows where it goes wrong)"
            } else {
                ""
            },
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
        schema: schema.clone(),
    })
}

/// Paths of every unknown field in `msg`, e.g. `data_sources[0].config.#5000`.
pub(crate) fn unknown_paths(msg: &DynamicMessage, path: &str, out: &mut Vec<String>) {
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
        check_counts(self)?;
        let mut spec =
            validate::validate(&self.bytes, self.unknown_fields.clone(), self.schema.pool())
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

    /// The config as text (what `config convert --to text` prints): fields
    /// the schema does not know are printed by number, so nothing is lost.
    pub fn to_text(&self) -> String {
        text::print(&self.message)
    }
}

/// Loads and validates in one step.
pub fn load_spec(path: &Path, opts: LoadOptions) -> Result<RecorderSpec, ConfigError> {
    load_path(path, opts)?.validate()
}

#[cfg(test)]
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
#[cfg(test)]
pub(crate) fn all_meminfo_counters() -> Vec<Counter> {
    all_counters("perfetto.protos.MeminfoCounters")
}

/// Every vmstat counter our schema knows (what an empty `vmstat_counters`
/// list means), in enum order.
#[cfg(test)]
pub(crate) fn all_vmstat_counters() -> Vec<Counter> {
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
        // Form feed and vertical tab are protobuf-text whitespace.
        assert!(looks_like_text(b"buffers {\x0c size_kb: 1 }\x0b"));
        assert!(mostly_text(b"buffers { size_kb: 1 }\x00\n"));
        assert!(!mostly_text(&[0x0a, 0x03, 0x08, 0x80, 0x08]));
    }

    #[test]
    fn text_with_stray_bytes_is_diagnosed_as_text() {
        for (bytes, want) in [
            (
                &b"duration_ms: 1\n\x00buffers { size_kb: 1 }\n"[..],
                "2:1: error: a NUL byte",
            ),
            (
                b"# caf\xe9\nbuffers { size_kb: 1 }\n",
                "1:6: error: byte 0xE9 is not UTF-8",
            ),
        ] {
            let e = load_bytes(bytes, "c.cfg", LoadOptions::default())
                .expect_err("refused")
                .to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains("binary"), "{e}");
        }
        let ok = load_bytes(
            b"buffers {\x0c size_kb: 1 }\x0c\n",
            "c.cfg",
            LoadOptions::default(),
        )
        .expect("form feed is whitespace");
        assert_eq!(ok.form, ConfigForm::Text);
    }

    #[test]
    fn size_and_counts_are_capped() {
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert!(matches!(
            load_bytes(&big, "c", LoadOptions::default()),
            Err(ConfigError::TooLarge { .. })
        ));
        let many = "data_sources { config { name: \"x\" } }\n".repeat(MAX_DATA_SOURCES + 1);
        assert!(matches!(
            load_bytes(many.as_bytes(), "c", LoadOptions::default()),
            Err(ConfigError::TooMany { count, .. }) if count == MAX_DATA_SOURCES + 1
        ));
        // A binary config (as the consumer socket brings) meets the same
        // bound at its validation.
        let one = load_text("data_sources { config { name: \"x\" } }", "c", false).expect("one");
        let bytes: Vec<u8> = one.canonical_bytes().repeat(MAX_DATA_SOURCES + 1);
        let binary = load_binary(&bytes, "consumer uid 1000").expect("loads");
        assert!(matches!(
            binary.validate(),
            Err(ConfigError::TooMany { count, .. }) if count == MAX_DATA_SOURCES + 1
        ));
    }
}
