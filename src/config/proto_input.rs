//! Reading the user's `.proto` files and descriptor sets (`--proto`,
//! `--proto-path`, `--descriptor-set`) as untrusted input: regular files
//! only, opened non-blocking and checked with fstat (a FIFO or a device is
//! refused at once, never waited on), at most [`MAX_PROTO_INPUT_BYTES`] over
//! all of them, nesting checked before the compiler recurses, and imports
//! resolved only inside the include paths (a name with `..`, an absolute
//! one, or one that leads out through a link is not found, and nothing of
//! it is read).

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prost_types::{DescriptorProto, FileDescriptorProto};
use protox::file::{File, FileResolver};
use rustix::fs::{FileType, Mode, OFlags};

/// Bytes read over every `.proto` file and descriptor set of one load.
/// With [`MAX_PROTO_DECLARATIONS`] it bounds the compiler's time and memory
/// (a load at the caps runs within 768 MiB of address space, tested).
pub(crate) const MAX_PROTO_INPUT_BYTES: u64 = 4 * 1024 * 1024;

/// Messages nested deeper than this (in `.proto` text, braces; in a
/// descriptor set, nested types) are refused before compiling: the
/// compiler and the decoders recurse once per level.
pub(crate) const MAX_PROTO_NESTING: usize = 64;

/// Declarations (messages, fields, enums, enum values, services, methods,
/// extensions) over every `.proto` file and descriptor set of one load, at
/// most. The compiler's memory grows with them (some 2 KiB each), more
/// than with bytes: 4 MiB of dense nested messages is 336,000 of them.
/// Counted on the parsed files before anything is compiled.
pub(crate) const MAX_PROTO_DECLARATIONS: u64 = 65_536;

/// Why an input could not be used. Never carries the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The system's refusal, kept as its errno (an `io::Error` is neither
    /// `Clone` nor `Eq`, which a config error is).
    #[error("cannot read: {}", std::io::Error::from(*.0))]
    Io(rustix::io::Errno),
    #[error("not a regular file (a FIFO, device or directory is not read)")]
    NotRegular,
    #[error("the .proto files and descriptor sets together exceed {MAX_PROTO_INPUT_BYTES} bytes")]
    TooLarge,
    #[error("messages nested more than {MAX_PROTO_NESTING} deep")]
    TooDeep,
    #[error(
        "the .proto files and descriptor sets together declare more than {MAX_PROTO_DECLARATIONS} messages, fields, enums, values, services and methods"
    )]
    TooManyDeclarations,
    #[error("not UTF-8 text")]
    NotText,
}

impl InputError {
    /// A read's failure as its errno (EIO where the error has none).
    pub fn io(e: &std::io::Error) -> Self {
        InputError::Io(rustix::io::Errno::from_io_error(e).unwrap_or(rustix::io::Errno::IO))
    }
}

/// What is left of [`MAX_PROTO_INPUT_BYTES`] for this load, shared by the
/// descriptor sets and the compiler's file resolver; and every file read
/// against it, by identity (so that `-o` can never name one).
#[derive(Debug, Clone)]
pub(crate) struct Budget(
    Arc<AtomicU64>,
    /// The files read (a holder only pushes one: whole even if poisoned).
    Arc<std::sync::Mutex<Vec<InputFile>>>,
    /// Declarations left ([`MAX_PROTO_DECLARATIONS`]).
    Arc<AtomicU64>,
);

/// A file read as input: its device, inode and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    pub dev: u64,
    pub(crate) ino: u64,
    pub path: PathBuf,
}

impl Default for Budget {
    fn default() -> Self {
        Budget(
            Arc::new(AtomicU64::new(MAX_PROTO_INPUT_BYTES)),
            Arc::default(),
            Arc::new(AtomicU64::new(MAX_PROTO_DECLARATIONS)),
        )
    }
}

impl Budget {
    /// The files read so far.
    pub(crate) fn files(&self) -> Vec<InputFile> {
        // A list pushed to one whole entry at a time: whatever a panicking
        // holder left is valid.
        self.1
            .lock()
            .map(|v| v.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn note(&self, f: &std::fs::File, path: &Path) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = f.metadata() {
            let file = InputFile {
                dev: m.dev(),
                ino: m.ino(),
                path: path.to_path_buf(),
            };
            // As in `files`: each holder pushes one whole entry at most.
            let mut v = self.1.lock().unwrap_or_else(|p| p.into_inner());
            if !v.contains(&file) {
                v.push(file);
            }
        }
    }

    /// Declarations still allowed.
    pub(crate) fn declarations_left(&self) -> u64 {
        self.2.load(Ordering::SeqCst)
    }

    /// Charges `file`'s declarations ([`declarations`]).
    pub(crate) fn take_declarations(&self, file: &FileDescriptorProto) -> Result<(), InputError> {
        let n = declarations(file);
        self.2
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(n)
            })
            .map(|_| ())
            .map_err(|_| InputError::TooManyDeclarations)
    }

    fn take(&self, n: u64) -> Result<(), InputError> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(n)
            })
            .map(|_| ())
            .map_err(|_| InputError::TooLarge)
    }

    fn left(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Opens `path` without blocking (O_NONBLOCK: a FIFO with no writer would
/// otherwise hang the open) and refuses anything but a regular file.
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File, InputError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(InputError::Io)?;
    let st = rustix::fs::fstat(&fd).map_err(InputError::Io)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(InputError::NotRegular);
    }
    Ok(std::fs::File::from(fd))
}

/// Reads a regular file within what is left of `budget`.
pub(crate) fn read_regular(path: &Path, budget: &Budget) -> Result<Vec<u8>, InputError> {
    let f = open_regular(path)?;
    budget.note(&f, path);
    let mut bytes = Vec::new();
    f.take(budget.left() + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError::io(&e))?;
    budget.take(bytes.len() as u64)?;
    Ok(bytes)
}

/// How deep braces nest in `.proto` text, outside comments and strings.
#[cfg(test)]
pub(crate) fn brace_depth(text: &str) -> usize {
    shape(text).0
}

/// How deep braces nest in `.proto` text and how many statements it holds
/// (each `;` and `{` outside comments and strings: every declaration is
/// one, so they bound the declarations before the text is parsed, whose
/// memory grows with them).
pub(crate) fn shape(text: &str) -> (usize, u64) {
    let b = text.as_bytes();
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
    let mut statements = 0u64;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 1;
            }
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'{' | b'<' | b'[' => {
                depth += 1;
                max = max.max(depth);
                statements += u64::from(b[i] == b'{');
            }
            b'}' | b'>' | b']' => depth = depth.saturating_sub(1),
            b';' => statements += 1,
            _ => {}
        }
        i += 1;
    }
    (max, statements)
}

/// How deep message types nest in a descriptor set's file, walked without
/// recursion.
pub(crate) fn nesting_depth(file: &FileDescriptorProto) -> usize {
    let mut max = 0;
    let mut stack: Vec<(&DescriptorProto, usize)> =
        file.message_type.iter().map(|m| (m, 1)).collect();
    while let Some((m, d)) = stack.pop() {
        max = max.max(d);
        if d > MAX_PROTO_NESTING {
            break;
        }
        stack.extend(m.nested_type.iter().map(|n| (n, d + 1)));
    }
    max
}

/// The declarations of one file: messages (nested too), their fields,
/// extensions and oneofs, enums and their values, services and their
/// methods. Walked without recursion.
pub(crate) fn declarations(file: &FileDescriptorProto) -> u64 {
    let enums = |e: &[prost_types::EnumDescriptorProto]| {
        e.iter().map(|e| 1 + e.value.len() as u64).sum::<u64>()
    };
    let mut n = file.extension.len() as u64
        + enums(&file.enum_type)
        + file
            .service
            .iter()
            .map(|s| 1 + s.method.len() as u64)
            .sum::<u64>();
    let mut stack: Vec<&DescriptorProto> = file.message_type.iter().collect();
    while let Some(m) = stack.pop() {
        n += 1
            + m.field.len() as u64
            + m.extension.len() as u64
            + m.oneof_decl.len() as u64
            + enums(&m.enum_type);
        stack.extend(m.nested_type.iter());
    }
    n
}

/// `name` as a path under an include directory: relative, plain
/// components only (no `..`, no root).
fn plain_relative(name: &str) -> Option<&Path> {
    let p = Path::new(name);
    let plain = !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then_some(p)
}

/// Where `name` lives under `dir`, if it does: its real path stays inside
/// the real `dir` (a link out of it does not count).
pub(crate) fn inside(dir: &Path, name: &str) -> Option<PathBuf> {
    let rel = plain_relative(name)?;
    let root = dir.canonicalize().ok()?;
    let path = dir.join(rel);
    let real = path.canonicalize().ok()?;
    real.starts_with(&root).then_some(path)
}

/// protox's include-path lookup, with the rules above: names resolved only
/// inside the directories, regular files only, the shared budget, and the
/// nesting checked before parsing.
///
/// Each file goes to the compiler without its source and without the
/// positions of its elements (`source_code_info`), which are kept aside
/// ([`Parsed`]): the checker looks positions up once per error by a linear
/// search, so with them a file of `n` errors (duplicate field numbers, say)
/// costs `n²`; without them each error costs the same whatever the file's
/// size, and the one error reported is placed afterwards
/// (`schema::proto_error`).
pub(crate) struct IncludeResolver {
    dirs: Vec<PathBuf>,
    budget: Budget,
    parsed: ParsedFiles,
}

/// A user's `.proto` file as parsed: its text, the positions of its
/// elements, and the descriptor the compiler was given (without them).
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub source: String,
    pub info: prost_types::SourceCodeInfo,
    pub descriptor: FileDescriptorProto,
}

/// The files an [`IncludeResolver`] parsed, by name. A poisoned map is
/// only read for error positions, and skipped (each holder inserts once).
pub(crate) type ParsedFiles = Arc<std::sync::Mutex<std::collections::HashMap<String, Parsed>>>;

impl IncludeResolver {
    pub(crate) fn new(dirs: Vec<PathBuf>, budget: Budget) -> Self {
        IncludeResolver {
            dirs,
            budget,
            parsed: ParsedFiles::default(),
        }
    }

    /// The files parsed so far (shared: still filled while compiling).
    pub(crate) fn parsed(&self) -> ParsedFiles {
        self.parsed.clone()
    }
}

impl FileResolver for IncludeResolver {
    fn resolve_path(&self, path: &Path) -> Option<String> {
        let real = path.canonicalize().ok()?;
        self.dirs.iter().find_map(|d| {
            let root = d.canonicalize().ok()?;
            let rel = real.strip_prefix(&root).ok()?;
            let parts: Option<Vec<&str>> = rel
                .components()
                .map(|c| match c {
                    Component::Normal(s) => s.to_str(),
                    _ => None,
                })
                .collect();
            let name = parts?.join("/");
            (!name.is_empty()).then_some(name)
        })
    }

    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let Some(path) = self.dirs.iter().find_map(|d| inside(d, name)) else {
            return Err(protox::Error::file_not_found(name));
        };
        let refuse = |e: InputError| protox::Error::new(format!("{name}: {e}"));
        let bytes = read_regular(&path, &self.budget).map_err(refuse)?;
        let text = String::from_utf8(bytes).map_err(|_| refuse(InputError::NotText))?;
        let (depth, statements) = shape(&text);
        if depth > MAX_PROTO_NESTING {
            return Err(refuse(InputError::TooDeep));
        }
        // Bounded before the parser builds anything for them.
        if statements > self.budget.declarations_left() {
            return Err(refuse(InputError::TooManyDeclarations));
        }
        let mut descriptor = File::from_source(name, &text)?
            .file_descriptor_proto()
            .clone();
        self.budget.take_declarations(&descriptor).map_err(refuse)?;
        let info = descriptor.source_code_info.take().unwrap_or_default();
        if let Ok(mut p) = self.parsed.lock() {
            p.insert(
                name.to_string(),
                Parsed {
                    source: text,
                    info,
                    descriptor: descriptor.clone(),
                },
            );
        }
        Ok(File::from_file_descriptor_proto(descriptor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_braces_outside_comments_and_strings() {
        assert_eq!(brace_depth("message A { message B { } }"), 2);
        assert_eq!(brace_depth("// {{{{\nmessage A { }"), 1);
        assert_eq!(
            brace_depth("/* {{{{ */ message A { option x = \"{{{\"; }"),
            1
        );
        let deep = "message M { ".repeat(3000) + &"}".repeat(3000);
        assert_eq!(brace_depth(&deep), 3000);
        assert_eq!(
            shape(
                "syntax = \"proto2\"; message A { optional int32 a = 1; // x;\n enum E { Z = 0; } }"
            ),
            (2, 5)
        );
    }

    #[test]
    fn names_stay_inside_their_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.proto"), "x").expect("write");
        std::fs::create_dir(dir.path().join("in")).expect("mkdir");
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("in/out.proto")).expect("link");
        assert!(inside(dir.path(), "a.proto").is_some());
        for bad in [
            "../a.proto",
            "in/../a.proto",
            "/etc/passwd",
            "../../../../etc/shadow",
            "in/out.proto",
            "",
        ] {
            assert_eq!(inside(dir.path(), bad), None, "{bad}");
        }
    }

    #[test]
    fn a_fifo_is_refused_at_once_and_the_budget_is_shared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        crate::trace::untrusted::tests::make_fifo(&fifo);
        let budget = Budget::default();
        assert_eq!(read_regular(&fifo, &budget), Err(InputError::NotRegular));
        assert_eq!(
            read_regular(dir.path(), &budget),
            Err(InputError::NotRegular)
        );
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b' '; (MAX_PROTO_INPUT_BYTES / 2 + 1) as usize]).expect("write");
        assert!(read_regular(&big, &budget).is_ok());
        assert_eq!(read_regular(&big, &budget), Err(InputError::TooLarge));
    }
}
