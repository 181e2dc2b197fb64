//! Opening the trace output and choosing its sink.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{FileSink, PwritevSink, StorageError, StreamSink, UringSink, uring_sink};

/// Where the trace goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputPath {
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
    Pwritev,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// `O_EXCL`: refuse to replace an existing file.
    pub no_clobber: bool,
    pub io: IoChoice,
    /// Write with `O_DIRECT` where the file allows it (probed; the page
    /// cache otherwise, logged). For streaming sessions without compression
    /// or a size cap.
    pub direct: bool,
}

/// The io_uring probe: a real ring setup and a NOP. `Err` says why not.
pub fn io_uring_available() -> Result<(), String> {
    uring_sink::probe()
}

/// Opens the output (`O_CREAT|O_TRUNC`, `O_EXCL` with no-clobber, mode 0600
/// as Perfetto's cmdline does) and returns its sink.
pub fn open_output(path: OutputPath, opts: OpenOptions) -> Result<Box<dyn FileSink>, StorageError> {
    match path {
        OutputPath::Stdout => open_stdout(),
        OutputPath::File(path) => {
            let fd = open_file(&path, opts.no_clobber)?;
            if is_stream(&fd) {
                log::info!("trace output {} is a stream: plain writes", path.display());
                return Ok(Box::new(StreamSink::new(fd, false)));
            }
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
    }
}

/// The sink of a file opened elsewhere (`recorder serve`: a session's
/// in-memory file, or the file a client passed): written from offset 0,
/// never O_DIRECT; a pipe or socket is written as a stream.
pub fn sink_for_fd(fd: OwnedFd, io: IoChoice) -> Result<Box<dyn FileSink>, StorageError> {
    if is_stream(&fd) {
        return Ok(Box::new(StreamSink::new(fd, false)));
    }
    file_sink(fd, io, None)
}

fn open_file(path: &std::path::Path, no_clobber: bool) -> Result<OwnedFd, StorageError> {
    let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC;
    flags |= if no_clobber {
        OFlags::EXCL
    } else {
        OFlags::TRUNC
    };
    let fd = rustix::fs::open(path, flags, Mode::RUSR | Mode::WUSR).map_err(|e| match e {
        Errno::EXIST if no_clobber => StorageError::Exists {
            path: path.to_path_buf(),
        },
        e => StorageError::Open {
            path: path.to_path_buf(),
            source: e.into(),
        },
    })?;
    // The umask may have narrowed the mode, never widened it; an existing
    // file keeps its mode on O_TRUNC, so set 0600 explicitly (not on a
    // device or FIFO, whose mode is someone else's).
    if !is_stream(&fd)
        && let Err(e) = rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)
    {
        log::debug!("fchmod 0600 on {}: {e}", path.display());
    }
    Ok(fd)
}

/// A FIFO, a character device (a tty, `/dev/null`) or a socket: no offsets
/// to write at, nothing to fdatasync.
fn is_stream(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        matches!(
            FileType::from_raw_mode(st.st_mode),
            FileType::Fifo | FileType::CharacterDevice | FileType::Socket
        )
    })
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
        Err(e) if io == IoChoice::Auto => {
            let fd = spare.map_err(|se| StorageError::IoUringUnavailable(format!("{e}; {se}")))?;
            log::warn!("io_uring ring setup failed ({e}); writing the trace with pwritev");
            Ok(Box::new(PwritevSink::new(fd, 0).with_direct(direct)))
        }
        Err(e) => Err(StorageError::IoUringUnavailable(e.to_string())),
    }
}

fn open_stdout() -> Result<Box<dyn FileSink>, StorageError> {
    let fd = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map_err(StorageError::Stdout)?;
    let st = rustix::fs::fstat(&fd).map_err(|e| StorageError::Stdout(e.into()))?;
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    Ok(Box::new(StreamSink::new(fd, regular)))
}
