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

/// Bytes read over every `.proto` file and descriptor set of one load. The
/// compiler's memory grows with its input, about 120 times its size; this
/// bounds both (a load at the cap runs within 768 MiB of address space,
/// tested).
pub const MAX_PROTO_INPUT_BYTES: u64 = 4 * 1024 * 1024;

/// Messages nested deeper than this (in `.proto` text, braces; in a
/// descriptor set, nested types) are refused before compiling: the
/// compiler and the decoders recurse once per level.
pub const MAX_PROTO_NESTING: usize = 64;

/// Why an input could not be used. Never carries the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("cannot read: {0}")]
    Io(String),
    #[error("not a regular file (a FIFO, device or directory is not read)")]
    NotRegular,
    #[error("the .proto files and descriptor sets together exceed {MAX_PROTO_INPUT_BYTES} bytes")]
    TooLarge,
    #[error("messages nested more than {MAX_PROTO_NESTING} deep")]
    TooDeep,
    #[error("not UTF-8 text")]
    NotText,
}

/// What is left of [`MAX_PROTO_INPUT_BYTES`] for this load, shared by the
/// descriptor sets and the compiler's file resolver.
#[derive(Debug, Clone)]
pub struct Budget(Arc<AtomicU64>);

impl Default for Budget {
    fn default() -> Self {
        Budget(Arc::new(AtomicU64::new(MAX_PROTO_INPUT_BYTES)))
    }
}

impl Budget {
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
pub fn open_regular(path: &Path) -> Result<std::fs::File, InputError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| InputError::Io(std::io::Error::from(e).to_string()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| InputError::Io(e.to_string()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(InputError::NotRegular);
    }
    Ok(std::fs::File::from(fd))
}

/// Reads a regular file within what is left of `budget`.
pub fn read_regular(path: &Path, budget: &Budget) -> Result<Vec<u8>, InputError> {
    let f = open_regular(path)?;
    let mut bytes = Vec::new();
    f.take(budget.left() + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError::Io(e.to_string()))?;
    budget.take(bytes.len() as u64)?;
    Ok(bytes)
}

/// How deep braces nest in `.proto` text, outside comments and strings.
pub fn brace_depth(text: &str) -> usize {
    let b = text.as_bytes();
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
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
            }
            b'}' | b'>' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    max
}

/// How deep message types nest in a descriptor set's file, walked without
/// recursion.
pub fn nesting_depth(file: &FileDescriptorProto) -> usize {
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

/// `name` as a path under an include directory: relative, plain
/// components only (no `..`, no root).
fn plain_relative(name: &str) -> Option<&Path> {
    let p = Path::new(name);
    let plain = !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then_some(p)
}

/// Where `name` lives under `dir`, if it does: its real path stays inside
/// the real `dir` (a link out of it does not count).
pub fn inside(dir: &Path, name: &str) -> Option<PathBuf> {
    let rel = plain_relative(name)?;
    let root = dir.canonicalize().ok()?;
    let path = dir.join(rel);
    let real = path.canonicalize().ok()?;
    real.starts_with(&root).then_some(path)
}

/// protox's include-path lookup, with the rules above: names resolved only
/// inside the directories, regular files only, the shared budget, and the
/// nesting checked before parsing.
pub struct IncludeResolver {
    dirs: Vec<PathBuf>,
    budget: Budget,
}

impl IncludeResolver {
    pub fn new(dirs: Vec<PathBuf>, budget: Budget) -> Self {
        IncludeResolver { dirs, budget }
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
        if brace_depth(&text) > MAX_PROTO_NESTING {
            return Err(refuse(InputError::TooDeep));
        }
        File::from_source(name, &text)
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
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
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
