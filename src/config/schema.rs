//! The schema a config is read against: ours, plus the user's own `.proto`
//! files, compiled at load with protox (no `protoc`), or their compiled
//! descriptor sets.
//!
//! A user gives their own data source typed config fields by extending
//! `perfetto.protos.DataSourceConfig` within [`EXTENSION_RANGE`] (declared in
//! `protos/data_source_config.proto`). The text parser then takes
//! `[my.pkg.my_config] { … }` inside `data_sources { config { … } }`, and the
//! fields travel to the data source as encoded. TraceConfig declares no
//! extension range: the recorder reads every TraceConfig field itself, so a
//! custom one there would be accepted and then ignored.
//!
//! Our own files are importable by their names (`import
//! "data_source_config.proto";`), served from the descriptors built in.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use miette::Diagnostic;
use prost::Message;
use prost_reflect::{DescriptorPool, MessageDescriptor};
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use protox::file::{ChainFileResolver, DescriptorSetFileResolver, GoogleFileResolver};
use thiserror::Error;

use super::diagnostic::TextError;
use super::proto_input::{self, Budget, IncludeResolver, MAX_PROTO_NESTING};

/// The field numbers of `DataSourceConfig` left to users' own fields: far
/// above every number Perfetto uses there, and at most 2^24 - 1, the largest
/// field number the Perfetto SDK's decoder keeps (an app is handed its
/// config through it; larger numbers never reach it, measured with a real
/// SDK app). Perfetto cannot add fields past that either; its one reserved
/// number there (268435455, a retired id) is outside the range. Must match the `extensions` line of
/// `protos/data_source_config.proto` (a test checks).
pub(crate) const EXTENSION_RANGE: RangeInclusive<u32> = 10_000_000..=16_777_215;

/// The message users extend.
pub(crate) const EXTENDEE: &str = "perfetto.protos.DataSourceConfig";

/// Where the user's schema comes from (`--proto`, `--proto-path`,
/// `--descriptor-set`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserProtos {
    /// `.proto` files to compile.
    pub files: Vec<PathBuf>,
    /// Directories imports are looked up in, like `protoc -I`. Without any,
    /// each file's own directory is one.
    pub include_paths: Vec<PathBuf>,
    /// Serialized `FileDescriptorSet`s (`protoc --descriptor_set_out`,
    /// `buf build -o`).
    pub descriptor_sets: Vec<PathBuf>,
}

/// Errors of building a schema from the user's files.
#[derive(Debug, Error)]
pub enum SchemaError {
    /// A `.proto` file does not compile; `rendered` points into it.
    #[error("{rendered}")]
    Proto {
        /// `PATH:LINE:COL: error: …` with the line and a caret, or
        /// `PATH: error: …` when the compiler gives no position: text, as
        /// it is the compiler's error drawn over the user's own file.
        rendered: String,
        /// The compiler's error itself; not `source()`, as `rendered`
        /// already words it.
        compiler: Box<protox::Error>,
    },
    /// A `.proto` file or descriptor set could not be read (or all of them
    /// together are too large).
    #[error("{path}: error: {source}")]
    Input {
        /// The file, or the flags when the files together are refused.
        path: String,
        /// Why it could not be read.
        #[source]
        source: proto_input::InputError,
    },
    /// A `--proto-path` that is no directory.
    #[error("{path}: error: --proto-path names no directory")]
    NoIncludeDir {
        /// The directory given.
        path: String,
    },
    /// A descriptor set could not be read or decoded.
    #[error("{path}: not a FileDescriptorSet (as `protoc --descriptor_set_out` writes): {why}")]
    DescriptorSet {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        why: SetProblem,
    },
    /// A file of a descriptor set redefines part of our schema under a name
    /// we cannot map to one of our files.
    #[error(
        "{set}: file '{file}' defines package perfetto.protos, which is recorder's own; build the set against recorder's protos/ directory (-I protos) or leave the file out"
    )]
    OursRedefined {
        /// The descriptor set.
        set: String,
        /// The file in it.
        file: String,
    },
}

/// Why a descriptor set is not one.
#[derive(Debug, Error)]
pub enum SetProblem {
    #[error(transparent)]
    Input(#[from] proto_input::InputError),
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
    #[error("it holds no files")]
    Empty,
    /// The set's own text, escaped.
    #[error("dependency {0:?} is not a plain relative name")]
    Dependency(String),
}

/// A descriptor pool with our schema and possibly the user's extensions.
#[derive(Debug, Clone)]
pub struct Schema {
    pool: DescriptorPool,
    /// The user's files read to build it (imports included).
    inputs: Vec<proto_input::InputFile>,
}

fn our_set() -> &'static FileDescriptorSet {
    static SET: LazyLock<FileDescriptorSet> = LazyLock::new(|| {
        FileDescriptorSet::decode(crate::protos::DESCRIPTOR_SET)
            .expect("the descriptor set is produced by build.rs from our own protos")
    });
    &SET
}

impl Schema {
    /// Our schema alone.
    pub fn ours() -> Schema {
        Schema {
            pool: super::pool(),
            inputs: Vec::new(),
        }
    }

    /// Our schema with the user's files compiled in. With none given, ours.
    pub fn load(user: &UserProtos) -> Result<Schema, SchemaError> {
        if user.files.is_empty() && user.descriptor_sets.is_empty() {
            return Ok(Schema::ours());
        }
        // Each named file is checked first (a FIFO is refused at once,
        // before anything waits on it), and their sizes together before
        // anything is compiled.
        let mut named = 0u64;
        for f in user.files.iter().chain(&user.descriptor_sets) {
            let size = proto_input::open_regular(f)
                .and_then(|h| {
                    h.metadata()
                        .map(|m| m.len())
                        .map_err(|e| proto_input::InputError::io(&e))
                })
                .map_err(|source| SchemaError::Input {
                    path: f.display().to_string(),
                    source,
                })?;
            named = named.saturating_add(size);
        }
        if named > proto_input::MAX_PROTO_INPUT_BYTES {
            return Err(SchemaError::Input {
                path: "--proto/--descriptor-set".into(),
                source: proto_input::InputError::TooLarge,
            });
        }
        for d in &user.include_paths {
            if !d.is_dir() {
                return Err(SchemaError::NoIncludeDir {
                    path: d.display().to_string(),
                });
            }
        }
        let ours: HashSet<&str> = our_set().file.iter().map(|f| f.name()).collect();
        let budget = Budget::default();
        let mut set_files = Vec::new();
        for path in &user.descriptor_sets {
            set_files.extend(read_descriptor_set(path, &ours, &budget)?);
        }
        let includes: Vec<PathBuf> = if user.include_paths.is_empty() {
            let mut dirs: Vec<PathBuf> = Vec::new();
            for f in &user.files {
                let dir = match f.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
            dirs
        } else {
            user.include_paths.clone()
        };
        let mut resolver = ChainFileResolver::new();
        let include = IncludeResolver::new(includes.clone(), budget.clone());
        let parsed = include.parsed();
        resolver.add(include);
        resolver.add(DescriptorSetFileResolver::new(our_set().clone()));
        let set_names: Vec<String> = set_files.iter().map(|f| f.name().to_string()).collect();
        resolver.add(DescriptorSetFileResolver::new(FileDescriptorSet {
            file: set_files,
        }));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        let failed = |c: &protox::Compiler, e: protox::Error| {
            let at = placed(c, &e, &parsed);
            proto_error(e, &includes, at)
        };
        for name in &set_names {
            if let Err(e) = compiler.open_file(name) {
                return Err(failed(&compiler, e));
            }
        }
        for f in &user.files {
            if let Err(e) = compiler.open_file(f) {
                return Err(failed(&compiler, e));
            }
        }
        // Every file of ours, imported or not: the config is read against
        // the whole schema.
        for name in &ours {
            if let Err(e) = compiler.open_file(name) {
                return Err(failed(&compiler, e));
            }
        }
        Ok(Schema {
            pool: compiler.descriptor_pool(),
            inputs: budget.files(),
        })
    }

    /// The user's files read to build this schema (`--proto` files and
    /// their imports, descriptor sets), by identity.
    pub fn inputs(&self) -> &[proto_input::InputFile] {
        &self.inputs
    }

    /// The pool.
    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// Our `TraceConfig`, from this pool.
    pub fn trace_config(&self) -> MessageDescriptor {
        self.pool
            .get_message_by_name("perfetto.protos.TraceConfig")
            .expect("protos/trace_config.proto defines perfetto.protos.TraceConfig")
    }
}

/// Reads a descriptor set, drops the files that are ours (by name, or by
/// package under another name, their imports redirected to our file of the
/// same base name), and returns the rest.
fn read_descriptor_set(
    path: &Path,
    ours: &HashSet<&str>,
    budget: &Budget,
) -> Result<Vec<FileDescriptorProto>, SchemaError> {
    let shown = path.display().to_string();
    let bad = |why: SetProblem| SchemaError::DescriptorSet {
        path: shown.clone(),
        why,
    };
    let bytes = proto_input::read_regular(path, budget).map_err(|e| bad(e.into()))?;
    // prost's decoder stops at 100 levels of nesting itself; the walk
    // below holds the set to the same bound as .proto text.
    let set = FileDescriptorSet::decode(bytes.as_slice()).map_err(|e| bad(e.into()))?;
    drop(bytes);
    if set.file.is_empty() {
        return Err(bad(SetProblem::Empty));
    }
    if set
        .file
        .iter()
        .any(|f| proto_input::nesting_depth(f) > MAX_PROTO_NESTING)
    {
        return Err(bad(proto_input::InputError::TooDeep.into()));
    }
    for f in &set.file {
        budget.take_declarations(f).map_err(|e| bad(e.into()))?;
    }
    // A dependency is a file of this set, of ours, or one found inside an
    // include path: a name that climbs out (`../../etc/shadow`) is refused
    // here, before anything looks for it.
    if let Some(dep) =
        set.file.iter().flat_map(|f| f.dependency.iter()).find(|d| {
            d.is_empty() || d.starts_with('/') || d.split('/').any(|c| c == ".." || c == ".")
        })
    {
        return Err(bad(SetProblem::Dependency(dep.escape_debug().to_string())));
    }
    let mut renamed: Vec<(String, String)> = Vec::new();
    let mut kept = Vec::new();
    for f in set.file {
        if ours.contains(f.name()) {
            continue;
        }
        if f.package() == "perfetto.protos" {
            let base = f.name().rsplit('/').next().unwrap_or_default();
            if ours.contains(base) {
                renamed.push((f.name().to_string(), base.to_string()));
                continue;
            }
            return Err(SchemaError::OursRedefined {
                set: shown,
                file: f.name().to_string(),
            });
        }
        kept.push(f);
    }
    for f in &mut kept {
        for dep in &mut f.dependency {
            if let Some((_, to)) = renamed.iter().find(|(from, _)| from == dep) {
                *dep = to.clone();
            }
        }
    }
    Ok(kept)
}

/// Where a file the compiler names lives on disk, if inside an include
/// path (never outside one: its text is quoted in the error).
fn on_disk(name: &str, includes: &[PathBuf]) -> Option<PathBuf> {
    includes
        .iter()
        .find_map(|d| proto_input::inside(d, name))
        .filter(|p| proto_input::open_regular(p).is_ok())
}

/// A compiler error as a diagnostic pointing into the user's file, with
/// clearer words for the errors about our extension range.
/// Where the compiler's first error is in its file, as (source, byte
/// offset, length), found in linear time: the file's descriptor is checked
/// again against the pool the compiler had built before it (the same check,
/// now answering with the element's path), and that path is looked up once
/// among the positions kept aside ([`proto_input::Parsed`]).
fn placed(
    compiler: &protox::Compiler,
    e: &protox::Error,
    parsed: &proto_input::ParsedFiles,
) -> Option<(String, usize, usize)> {
    let name = e.file()?;
    let p = parsed.lock().ok()?.get(name)?.clone();
    let mut pool = compiler.descriptor_pool();
    let err = pool.add_file_descriptor_proto(p.descriptor).err()?;
    let path = err.path()?;
    let span = &p.info.location.iter().find(|l| l.path == path)?.span;
    let (line, col, end_line, end_col) = match span[..] {
        [l, c, ec] => (l, c, l, ec),
        [l, c, el, ec] => (l, c, el, ec),
        _ => return None,
    };
    let offset = |line: i32, col: i32| -> Option<usize> {
        let start = if line == 0 {
            0
        } else {
            p.source
                .match_indices('\n')
                .nth(usize::try_from(line).ok()? - 1)?
                .0
                + 1
        };
        let rest = &p.source[start..];
        // Columns count characters (tabs as the parser counts them: one).
        let by_chars = rest
            .char_indices()
            .nth(usize::try_from(col).ok()?)
            .map_or(rest.len(), |(i, _)| i);
        Some(start + by_chars)
    };
    let at = offset(line, col)?;
    let end = offset(end_line, end_col).unwrap_or(at + 1);
    Some((p.source, at, end.saturating_sub(at).max(1)))
}

fn proto_error(
    e: protox::Error,
    includes: &[PathBuf],
    at: Option<(String, usize, usize)>,
) -> SchemaError {
    let mut message = e.to_string();
    // The first error is shown; how many more there are is counted.
    let more = e.related().map_or(0, |r| r.count());
    if more > 0 {
        message.push_str(&format!(" (and {more} more error(s) in the .proto files)"));
    }
    let mut help = None;
    if let Some((extendee, number)) = range_violation(&message) {
        (message, help) = range_message(&extendee, number);
    } else if message.ends_with("is not in any include path") {
        help = Some("add the directory it is under (or one above) with --proto-path".into());
    } else if message.starts_with("import '") && message.ends_with("' not found") {
        help = Some(format!(
            "imports are looked up in {}, then among recorder's own files ({})",
            if includes.is_empty() {
                "no directory".to_string()
            } else {
                includes
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            our_set()
                .file
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let file = e.file().map(str::to_string);
    let path = file.as_deref().and_then(|n| on_disk(n, includes));
    // A parse error carries its position; a check error was placed above
    // (its file went to the compiler without positions).
    let from_parser = e
        .labels()
        .and_then(|mut l| l.next())
        .map(|l| (l.offset(), l.len()));
    let offset = at
        .map(|(src, at, len)| (Some(src), at, len))
        .or(from_parser.map(|(at, len)| (None, at, len)));
    let rendered = match (&file, &path, offset) {
        (_, Some(p), Some((src, at, len))) => {
            match src.map_or_else(|| std::fs::read_to_string(p), Ok) {
                Ok(src) => TextError::new(at, len, message)
                    .with_help(help)
                    .render(&p.display().to_string(), &src),
                Err(_) => plain(&p.display().to_string(), &message, help.as_deref()),
            }
        }
        (_, Some(p), None) => plain(&p.display().to_string(), &message, help.as_deref()),
        (Some(n), None, _) => plain(n, &message, help.as_deref()),
        (None, None, _) => plain("--proto", &message, help.as_deref()),
    };
    SchemaError::Proto {
        rendered,
        compiler: Box::new(e),
    }
}

fn plain(origin: &str, message: &str, help: Option<&str>) -> String {
    let mut s = format!("{origin}: error: {message}");
    if let Some(h) = help {
        s.push_str("\nnote: ");
        s.push_str(h);
    }
    s
}

/// `(extendee, number)` of the compiler's complaint that a message does not
/// take `number` as an extension.
fn range_violation(message: &str) -> Option<(String, i64)> {
    static RE: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(r"^message '([\w.]+)' does not define '(-?\d+)' as an extension number$")
            .expect("a valid pattern")
    });
    let c = RE.captures(message)?;
    Some((c[1].to_string(), c[2].parse().ok()?))
}

/// The words for an extension numbered outside what `extendee` allows.
fn range_message(extendee: &str, number: i64) -> (String, Option<String>) {
    let (lo, hi) = (EXTENSION_RANGE.start(), EXTENSION_RANGE.end());
    let range = format!("custom fields of DataSourceConfig take numbers {lo} to {hi}");
    if extendee != EXTENDEE {
        let why = if extendee.starts_with("perfetto.protos.") {
            "recorder reads every field of it itself"
        } else {
            "it declares no extension range"
        };
        return (
            format!("{extendee} cannot be extended: {why}"),
            Some(format!(
                "extend perfetto.protos.DataSourceConfig instead ({range}); its fields reach the data source"
            )),
        );
    }
    let own = super::pool()
        .get_message_by_name(EXTENDEE)
        .and_then(|m| u32::try_from(number).ok().and_then(|n| m.get_field(n)));
    match own {
        Some(f) => (
            format!(
                "field number {number} is DataSourceConfig's own '{}'; a custom field cannot take it",
                f.name()
            ),
            Some(range),
        ),
        None => (
            format!("field number {number} is outside DataSourceConfig's range for custom fields"),
            Some(range),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_the_one_the_proto_declares() {
        let ds = super::super::pool()
            .get_message_by_name(EXTENDEE)
            .expect("ours");
        let ranges: Vec<_> = ds.extension_ranges().collect();
        assert_eq!(
            ranges,
            vec![*EXTENSION_RANGE.start()..*EXTENSION_RANGE.end() + 1]
        );
        // Above everything DataSourceConfig uses; within what the SDK's
        // decoder keeps (2^24 - 1), so past Perfetto's one reserved number.
        let top = ds.fields().map(|f| f.number()).max().expect("fields");
        assert!(top < *EXTENSION_RANGE.start());
        assert!(*EXTENSION_RANGE.end() < 1 << 24);
        assert!(*EXTENSION_RANGE.end() < 268_435_455);
        let tc = super::super::trace_config_descriptor();
        assert_eq!(tc.extension_ranges().count(), 0);
    }

    #[test]
    fn range_messages_name_the_field_and_the_range() {
        let (m, h) = range_message(EXTENDEE, 100);
        assert!(m.contains("own 'ftrace_config'"), "{m}");
        assert!(h.expect("help").contains("10000000 to 16777215"));
        let (m, _) = range_message(EXTENDEE, 5000);
        assert!(m.contains("outside"), "{m}");
        let (m, _) = range_message("perfetto.protos.TraceConfig", 10_000_000);
        assert!(m.contains("TraceConfig cannot be extended"), "{m}");
        assert_eq!(
            range_violation(
                "message 'perfetto.protos.DataSourceConfig' does not define '7' as an extension number"
            ),
            Some((EXTENDEE.to_string(), 7))
        );
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;
    use crate::config::{self, ConfigError, LoadOptions};

    const CONFIG: &str = r#"
syntax = "proto2";
package acme.audio;
import "data_source_config.proto";
message AudioConfig {
  optional uint32 sample_rate_hz = 1;
}
extend perfetto.protos.DataSourceConfig {
  optional AudioConfig audio_config = NUMBER;
}
"#;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn schema_of(text: &str) -> (tempfile::TempDir, Result<Schema, SchemaError>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(dir.path(), "audio.proto", text);
        let s = Schema::load(&UserProtos {
            files: vec![f],
            ..Default::default()
        });
        (dir, s)
    }

    fn refused(text: &str) -> String {
        let (dir, s) = schema_of(text);
        let e = s.expect_err("refused").to_string();
        e.replace(&dir.path().display().to_string(), "DIR")
    }

    #[test]
    fn extension_numbers_outside_the_range_are_refused_by_name() {
        let e = refused(&CONFIG.replace("NUMBER", "100"));
        assert!(
            e.starts_with("DIR/audio.proto:9:39: error: field number 100 is DataSourceConfig's own 'ftrace_config'"),
            "{e}"
        );
        assert!(
            e.contains("note: custom fields of DataSourceConfig take numbers 10000000 to 16777215"),
            "{e}"
        );
        let e = refused(&CONFIG.replace("NUMBER", "5000"));
        assert!(
            e.contains("field number 5000 is outside DataSourceConfig's range"),
            "{e}"
        );
        let e = refused(
            &CONFIG
                .replace("NUMBER", "10000000")
                .replace("DataSourceConfig {", "TraceConfig {")
                .replace("data_source_config.proto", "trace_config.proto"),
        );
        assert!(
            e.contains("perfetto.protos.TraceConfig cannot be extended"),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_and_missing_imports_point_into_the_file() {
        let e = refused(
            &CONFIG
                .replace("NUMBER", "10000000;")
                .replace("optional uint32", "optinal uint32"),
        );
        assert!(e.starts_with("DIR/audio.proto:6:"), "{e}");
        assert!(e.contains('^'), "{e}");
        let e = refused(
            &CONFIG
                .replace("NUMBER", "10000000")
                .replace("import \"data", "import \"nodata"),
        );
        assert!(
            e.starts_with(
                "DIR/audio.proto:4:1: error: import 'nodata_source_config.proto' not found"
            ),
            "{e}"
        );
        assert!(
            e.contains("note: imports are looked up in DIR, then among recorder's own files"),
            "{e}"
        );
    }

    #[test]
    fn text_errors_inside_extensions() {
        let (_dir, s) = schema_of(&CONFIG.replace("NUMBER", "10000000"));
        let schema = s.expect("compiles");
        let load = |body: &str| {
            let src = format!(
                "buffers {{ size_kb: 64 }}\ndata_sources {{ config {{\n  name: \"a\"\n  {body}\n}} }}\n"
            );
            match config::load_bytes_in(src.as_bytes(), "c.cfg", LoadOptions::default(), &schema) {
                Err(ConfigError::Text { rendered, .. }) => rendered,
                other => panic!("{other:?}"),
            }
        };
        let e = load("[acme.audio.audio_confg] { sample_rate_hz: 1 }");
        assert!(
            e.starts_with(
                "c.cfg:4:4: error: unknown extension '[acme.audio.audio_confg]' in DataSourceConfig"
            ),
            "{e}"
        );
        assert!(
            e.ends_with("note: did you mean '[acme.audio.audio_config]'?"),
            "{e}"
        );
        let e = load("[acme.audio.audio_config] { sample_rate_hz: \"fast\" }");
        assert!(
            e.starts_with(
                "c.cfg:4:47: error: expected an integer for 'sample_rate_hz', found a string"
            ),
            "{e}"
        );
        let e = load("[acme.audio.audio_config] { sample_rate: 1 }");
        assert!(
            e.contains("unknown field 'sample_rate' in AudioConfig"),
            "{e}"
        );
        assert!(e.ends_with("did you mean 'sample_rate_hz'?"), "{e}");
        let e = load("[acme.audio.audio_config]: 5");
        assert!(
            e.contains("expected '{' to open '[acme.audio.audio_config]'"),
            "{e}"
        );
        let e = load("[type.googleapis.com/acme.audio.AudioConfig] { }");
        assert!(
            e.contains("Any fields ('[type.url/Message]') are not supported"),
            "{e}"
        );
        let e = load("[acme.audio.audio_config] { } [acme.audio.audio_config] { }");
        assert!(
            e.contains("field '[acme.audio.audio_config]' is set twice"),
            "{e}"
        );
        // Lossy mode skips an unknown extension and says which.
        let src =
            "buffers { size_kb: 64 }\ndata_sources { config { name: \"a\" [acme.nope] { x: 1 } } }";
        let l = config::load_bytes_in(
            src.as_bytes(),
            "c.cfg",
            LoadOptions {
                force_text: true,
                lossy: true,
            },
            &schema,
        )
        .expect("lossy loads");
        assert_eq!(l.skipped_fields, ["data_sources.config.[acme.nope]"]);
        // Without the .proto, the name is unknown and the note says how to load it.
        let src = "data_sources { config { [acme.audio.audio_config] { } } }";
        let Err(ConfigError::Text { rendered, .. }) = config::load_text(src, "c.cfg", false) else {
            panic!("refused");
        };
        assert!(
            rendered.contains("pass the .proto that declares them with --proto FILE"),
            "{rendered}"
        );
    }
}
