//! `recorder recover DIR -o OUT`: a trace of what a session's ring files
//! (`--ring-dir`) hold, after every process of the session is gone.
//!
//! The directory may be shared and the files damaged: only regular files
//! named as ring files are opened, read-only, never through a link and
//! never blocking (a FIFO planted there is skipped, not waited on), and
//! every byte of them is checked (`ringbuf::image`). OUT is made as any
//! output is (`storage::create`: replaced, never written through).
//!
//! Exit codes: 0, a trace of everything the rings held unread (or nothing
//! to recover: the session ended cleanly or was idle; OUT is then an empty,
//! valid trace); 3, a valid trace, but damaged parts, or whole buffers,
//! were left out (the report says which); 1, no ring file could be read,
//! or OUT could not be written; 2, usage (OUT is one of the ring files).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::ExitCode;
use crate::ringbuf::image::{Check, ImageError, RingImage};
use crate::ringbuf::layout::index_of_file;
use crate::storage::create::{CreateError, OutputDir};
use crate::trace::salvage::{self, Head, Ring, SalvageOptions, SavedBy};

/// Why nothing could be recovered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoverError {
    #[error("cannot read the directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: no ring files (buffer-NNN.ring) here")]
    NoRings(PathBuf),
    #[error("{0}: no ring file could be read")]
    NoneReadable(PathBuf),
    #[error("{out}")]
    Output {
        out: PathBuf,
        #[source]
        source: CreateError,
    },
    #[error("writing {out}: {source}")]
    Write {
        out: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A ring file of the directory: its name, and the file or why not.
struct Found {
    name: String,
    file: Result<OwnedFd, String>,
}

/// Runs the command; see the module docs for the exit codes.
pub(crate) fn run(dir: &Path, out: &Path, no_clobber: bool) -> ExitCode {
    match recover(dir, out, no_clobber) {
        Ok(code) => code,
        Err((code, e)) => {
            eprintln!("recorder recover: {}", super::chain(&e));
            code
        }
    }
}

fn recover(dir: &Path, out: &Path, no_clobber: bool) -> Result<ExitCode, (ExitCode, RecoverError)> {
    let runtime = |e| (ExitCode::Runtime, e);
    let found = list(dir).map_err(runtime)?;
    if found.is_empty() {
        return Err(runtime(RecoverError::NoRings(dir.to_path_buf())));
    }
    let mut problems = Vec::new();
    let mut images: Vec<(String, OwnedFd, RingImage)> = Vec::new();
    for f in found {
        match f.file {
            Err(why) => problems.push(format!("{}: {why}", f.name)),
            Ok(fd) => match RingImage::read(&fd) {
                Ok(image) => images.push((f.name, fd, image)),
                Err(e @ ImageError::Header { .. }) | Err(e @ ImageError::Io(_)) => {
                    problems.push(format!("{}: {e}", f.name))
                }
            },
        }
    }
    if images.is_empty() {
        for p in &problems {
            eprintln!("recorder recover: {p}");
        }
        return Err(runtime(RecoverError::NoneReadable(dir.to_path_buf())));
    }
    // One session: the one most files belong to; files of another are
    // reported and left out.
    let mut by_session: BTreeMap<(i64, i64), usize> = BTreeMap::new();
    for (_, _, i) in &images {
        *by_session.entry(i.header.uuid).or_default() += 1;
    }
    let session = by_session
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(u, _)| *u)
        .unwrap_or_default();
    let mut kept = Vec::new();
    for (name, fd, image) in images {
        if image.header.uuid == session {
            kept.push((name, fd, image));
        } else {
            problems.push(format!("{name}: belongs to another session: left out"));
        }
    }
    if let Some(same) = kept.iter().find(|(_, fd, _)| same_file(fd, out)) {
        eprintln!(
            "recorder recover: -o {} is the ring file {}: refusing to overwrite it",
            out.display(),
            same.0
        );
        return Ok(ExitCode::Usage);
    }
    let count = kept
        .iter()
        .map(|(_, _, i)| i.header.count)
        .max()
        .unwrap_or(0);
    let present: std::collections::BTreeSet<u32> =
        kept.iter().map(|(_, _, i)| i.header.index).collect();
    let missing = (0..count).filter(|i| !present.contains(i)).count() as u32;
    for i in (0..count).filter(|i| !present.contains(i)) {
        problems.push(format!("buffer {i} of the session: no readable ring file"));
    }
    let pid = kept.first().map(|(_, _, i)| i.header.pid);

    let file = create_out(out, no_clobber).map_err(|source| {
        runtime(RecoverError::Output {
            out: out.to_path_buf(),
            source,
        })
    })?;
    let mut rings: Vec<Ring<'_>> = kept
        .iter()
        .map(|(_, fd, image)| Ring {
            image: image.clone(),
            src: fd,
        })
        .collect();
    let opts = SalvageOptions {
        head: Head::Full,
        check: Check::Packets,
        by: SavedBy::Recover,
        pid,
        signal: None,
        segment: None,
    };
    let write_err = |source| {
        runtime(RecoverError::Write {
            out: out.to_path_buf(),
            source,
        })
    };
    // Unbuffered: the packets go in runs of whole regions.
    let mut w = &file;
    let report = salvage::salvage(&mut rings, missing, &mut w, &opts).map_err(write_err)?;
    file.sync_data().map_err(write_err)?;
    for p in &problems {
        eprintln!("recorder recover: {p}");
    }
    if report.written == 0 {
        eprintln!(
            "recorder recover: the rings in {} hold nothing unread (the session ended cleanly, or was idle): {} is an empty trace",
            dir.display(),
            out.display()
        );
    } else {
        eprintln!(
            "recorder recover: {}",
            report.summary(&out.display().to_string())
        );
    }
    let incomplete = report.damage.is_damaged() || !problems.is_empty();
    Ok(if incomplete {
        ExitCode::Partial
    } else {
        ExitCode::Success
    })
}

/// The ring files of `dir`, by name, each opened read-only (never through
/// a link, never blocking) if it is a regular file.
fn list(dir: &Path) -> Result<Vec<Found>, RecoverError> {
    use rustix::fs::{FileType, Mode, OFlags};
    let dir_err = |source: std::io::Error| RecoverError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    let dfd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| dir_err(e.into()))?;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(dir_err)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| index_of_file(n).is_some())
        .collect();
    names.sort();
    Ok(names
        .into_iter()
        .map(|name| {
            let file = rustix::fs::openat(
                &dfd,
                name.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("cannot open: {e}"))
            .and_then(|fd| {
                let st = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::RegularFile => Ok(fd),
                    other => Err(format!("not a regular file ({other:?}): skipped")),
                }
            });
            Found { name, file }
        })
        .collect())
}

/// Whether `path` names the file `fd` is.
fn same_file(fd: &OwnedFd, path: &Path) -> bool {
    let (Ok(a), Ok(b)) = (rustix::fs::fstat(fd), rustix::fs::stat(path)) else {
        return false;
    };
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
}

/// OUT, made new in its checked directory.
fn create_out(out: &Path, no_clobber: bool) -> Result<std::fs::File, CreateError> {
    let (dir, name) = OutputDir::of_file(out)?;
    let fd = if no_clobber {
        dir.create_new(&name)?
    } else {
        dir.replace(&name)?
    };
    Ok(std::fs::File::from(fd))
}
