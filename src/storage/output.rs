//! Opening the trace output and choosing its sink.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::FileType;

use super::create::{self, OutputDir};
use super::uring_sink::{self, UringUnavailable};
use super::{FileSink, PwritevSink, StorageError, StreamSink, UringSink};

/// Where the trace goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputPath {
    /// A path: a new file (replacing what is there unless no-clobber), or a
    /// stream where it names a FIFO, device, socket or `/dev/fd/N`.
    File(PathBuf),
    /// `-o -`: a pipe or a redirected file; written as a stream.
    Stdout,
}

/// Which positioned sink to use for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoChoice {
    /// io_uring when the probe passes, else `pwritev` (logged).
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// `pwritev(2)`, even where io_uring would do.
    Pwritev,
}

/// How to open the output and which sink to write it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// `O_EXCL`: refuse to replace an existing file.
    pub no_clobber: bool,
    /// Which positioned sink writes a file.
    pub io: IoChoice,
    /// Write with `O_DIRECT` where the file allows it (probed; the page
    /// cache otherwise, logged). For traces without compression
    /// or a size cap.
    pub direct: bool,
}

/// The io_uring probe: a real ring setup and a NOP. `Err` says why not.
pub fn io_uring_available() -> Result<(), UringUnavailable> {
    uring_sink::probe()
}

/// Opens the output and returns its sink: a FIFO, device or socket the
/// path names is written as a stream; anything else is a new file (mode
/// 0600, as Perfetto's cmdline makes it) made through [`create`]: with
/// no-clobber an existing name is refused, else it is replaced (never
/// written through).
pub fn open_output(path: OutputPath, opts: OpenOptions) -> Result<Box<dyn FileSink>, StorageError> {
    match path {
        OutputPath::Stdout => open_stdout(),
        OutputPath::File(path) => {
            if let Some(n) = create::descriptor_path(&path) {
                log::info!(
                    "trace output {} is descriptor {n}: written through it",
                    path.display()
                );
                return open_descriptor(n, &path);
            }
            if let Some(fd) = create::open_stream(&path)? {
                log::info!("trace output {} is a stream: plain writes", path.display());
                return Ok(Box::new(StreamSink::new(fd, false)));
            }
            let (dir, name) = OutputDir::of_file(&path)?;
            open_in(&dir, &name, opts)
        }
    }
}

/// The sink of a file opened elsewhere (`recorder serve`: a session's
/// in-memory file, or the file a client passed): written from offset 0; a
/// pipe or socket is written as a stream. With `direct` (the session
/// streams, as [`OpenOptions::direct`]) an empty regular file on a disk
/// file system is written with `O_DIRECT` when it takes it
/// ([`super::direct::enable_passed`]); anything else through the page
/// cache, logged.
pub fn sink_for_fd(
    fd: OwnedFd,
    io: IoChoice,
    direct: bool,
) -> Result<Box<dyn FileSink>, StorageError> {
    if create::is_stream(&fd) {
        return Ok(Box::new(StreamSink::new(fd, false)));
    }
    let align = if direct {
        match super::direct::enable_passed(&fd) {
            Ok(align) => {
                log::info!("passed trace file: O_DIRECT, {align}-byte blocks");
                Some(align)
            }
            Err(e) => {
                log::info!("passed trace file: through the page cache, O_DIRECT unused ({e})");
                None
            }
        }
    } else {
        None
    };
    file_sink(fd, io, align)
}

/// Creates `name` in the checked directory `dir` (see [`open_output`]) and
/// returns its sink.
pub fn open_in(
    dir: &OutputDir,
    name: &str,
    opts: OpenOptions,
) -> Result<Box<dyn FileSink>, StorageError> {
    let fd = if opts.no_clobber {
        dir.create_new(name)?
    } else {
        dir.replace(name)?
    };
    sink_for(fd, &dir.join(name), opts)
}

/// Names tried for one numbered file before giving up.
const MAX_TAKEN_NAMES: u32 = 64;

/// A new file `BASE.K` in `dir` for the first `K` from `from` whose name
/// can take a file: an entry another user put there that a new file cannot
/// replace (a directory) is skipped with a warning, never written into.
/// Returns `K` and the sink.
pub fn open_numbered(
    dir: &OutputDir,
    base: &str,
    from: u32,
    opts: OpenOptions,
) -> Result<(u32, Box<dyn FileSink>), StorageError> {
    let is_dir = |name: &str| {
        rustix::fs::statat(dir.fd(), name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
    };
    let mut k = from;
    loop {
        let name = format!("{base}.{k}");
        let taken = is_dir(&name);
        if !taken {
            match open_in(dir, &name, opts) {
                Ok(sink) => return Ok((k, sink)),
                // Made a directory meanwhile: the next name.
                Err(_) if is_dir(&name) => {}
                Err(e) => return Err(e),
            }
        }
        log::warn!(
            "{} is a directory someone put there: the next name is used",
            dir.join(&name).display()
        );
        k += 1;
        if k - from >= MAX_TAKEN_NAMES {
            return Err(StorageError::Open {
                path: dir.join(&name),
                source: std::io::Error::other(format!(
                    "{MAX_TAKEN_NAMES} names in a row were taken by directories"
                )),
            });
        }
    }
}

/// The sink for a new file `fd` (named `path` in messages).
pub(super) fn sink_for(
    fd: OwnedFd,
    path: &std::path::Path,
    opts: OpenOptions,
) -> Result<Box<dyn FileSink>, StorageError> {
    let direct = if opts.direct {
        match super::direct::enable(&fd) {
            Ok(align) => {
                log::info!(
                    "trace file {}: O_DIRECT, {align}-byte blocks",
                    path.display()
                );
                Some(align)
            }
            Err(e) => {
                log::info!(
                    "trace file {}: through the page cache, O_DIRECT unavailable ({e})",
                    path.display()
                );
                None
            }
        }
    } else {
        None
    };
    file_sink(fd, opts.io, direct)
}

fn file_sink(
    fd: OwnedFd,
    io: IoChoice,
    direct: Option<usize>,
) -> Result<Box<dyn FileSink>, StorageError> {
    let use_uring = match io {
        IoChoice::Pwritev => false,
        IoChoice::IoUring => {
            io_uring_available().map_err(StorageError::IoUringUnavailable)?;
            true
        }
        IoChoice::Auto => match io_uring_available() {
            Ok(()) => true,
            Err(why) => {
                log::warn!("io_uring unavailable ({why}); writing the trace with pwritev");
                false
            }
        },
    };
    if !use_uring {
        log::info!("trace file: pwritev");
        return Ok(Box::new(PwritevSink::new(fd, 0).with_direct(direct)));
    }
    // Keep a duplicate so a failed ring setup after the probe can still fall back.
    let spare = fd.try_clone();
    match UringSink::new(fd, 0) {
        Ok(sink) => {
            log::info!("trace file: io_uring");
            Ok(Box::new(sink.with_direct(direct)))
        }
        Err(e) if io == IoChoice::Auto => match spare {
            Ok(fd) => {
                log::warn!("io_uring ring setup failed ({e}); writing the trace with pwritev");
                Ok(Box::new(PwritevSink::new(fd, 0).with_direct(direct)))
            }
            Err(dup) => Err(StorageError::IoUringUnavailable(
                UringUnavailable::NoFallback { ring: e, dup },
            )),
        },
        Err(e) => Err(StorageError::IoUringUnavailable(UringUnavailable::Setup(e))),
    }
}

fn open_stdout() -> Result<Box<dyn FileSink>, StorageError> {
    let fd = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map_err(StorageError::Stdout)?;
    stream_of(fd).map_err(StorageError::Stdout)
}

/// A sink writing through this process's descriptor `n` (a copy of it),
/// as `-o -` writes through stdout.
fn open_descriptor(n: i32, path: &std::path::Path) -> Result<Box<dyn FileSink>, StorageError> {
    let open = |e: std::io::Error| StorageError::Open {
        path: path.to_path_buf(),
        source: e,
    };
    let fd = crate::sys::fd::dup_numbered(n).map_err(open)?;
    stream_of(fd).map_err(open)
}

fn stream_of(fd: OwnedFd) -> std::io::Result<Box<dyn FileSink>> {
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        return Err(std::io::Error::other("it is a directory"));
    }
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    Ok(Box::new(StreamSink::new(fd, regular)))
}
