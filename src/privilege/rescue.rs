//! Saved at death: what the process that outlives the recorder — the root
//! broker, or an unprivileged session's keeper — holds to write the
//! session's buffers as a trace if the recorder dies, and the save itself.
//!
//! ```text
//!  recorder                                   broker / keeper
//!   buffers on memfds or ring files ──fds──►   RegisterRing (each buffer)
//!   the trace file (OUT) ────────────fd───►    RegisterSaveTo (label, pid)
//!     or the segments' directory ────fd───►    RegisterSaveToSegments
//!   --ring-dir ──────────────────────fd───►    RegisterRingFiles (names)
//!   tracefs recording directory ─────────►    RegisterDrain (root only)
//!   ... records ...
//!   final pass written ──────────────────►    Teardown: done, nothing to save
//!   or: SIGKILL, SIGSEGV, abort, OOM kill ─►   its end closes without Teardown:
//!                                                drain the kernel's leftover,
//!                                                read every ring (untrusted),
//!                                                OUT cut back to its last whole
//!                                                packet, the trace appended
//!                                                (a full head if OUT is empty;
//!                                                segments: the next one, new),
//!                                                fdatasync, one summary line,
//!                                                ring files removed; then the
//!                                                tracefs teardown
//! ```
//!
//! The rings are read through their descriptors (`pread`), or, for a memfd
//! that can be sealed against writes once the recorder is gone (no
//! writable mapping of it left), mapped read-only and written from in
//! place (`image::SealedMap`, M6); a ring file is never mapped: it could be
//! truncated under the mapping, and a read past its end is only short.
//! What the recorder left there is hostile bytes (`ringbuf::image`): a crash can leave anything, and a root
//! broker reads what an unprivileged process wrote. Nothing is written when
//! no ring holds an unread byte: a death while idle (waiting for a start
//! trigger) or after the final pass writes nothing twice.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};

use crate::ringbuf::image::{Check, ReadAt, RingImage, SealedMap};
use crate::sources::ftrace::Leftover;
use crate::storage::IoChoice;
use crate::storage::create::OutputDir;
use crate::storage::segment::names::SegmentNames;
use crate::trace::salvage::{self, Gathered, Head, Piece, Ring, SalvageOptions, SavedBy};

/// Where the save goes.
#[derive(Debug)]
enum Target {
    /// The session's trace file, and its name for people.
    File { fd: OwnedFd, label: String },
    /// A segmented session's directory: the save is its next segment.
    Segments { dir: OwnedFd, names: SegmentNames },
}

/// What was registered for the save.
#[derive(Debug, Default)]
pub(crate) struct Rescue {
    /// Each shared buffer's file, by index.
    rings: Vec<(u32, OwnedFd)>,
    /// Where the save goes, and the recorder's pid.
    out: Option<(Target, u32)>,
    /// The ring directory and the session's files there.
    ring_files: Option<(OwnedFd, Vec<String>)>,
    /// Recording directories to read the kernel's leftover of.
    drains: Vec<Leftover>,
}

/// Most buffers a session registers (the config's limit).
pub(crate) const MAX_RINGS: usize = 128;

impl Rescue {
    pub(crate) fn add_ring(&mut self, index: u32, fd: OwnedFd) -> bool {
        if self.rings.len() >= MAX_RINGS {
            return false;
        }
        self.rings.push((index, fd));
        true
    }

    pub(crate) fn save_to(&mut self, fd: OwnedFd, label: String, pid: u32) {
        self.out = Some((Target::File { fd, label }, pid));
    }

    /// The save is to be the next segment of the session whose segments
    /// are `names` in `dir`.
    pub(crate) fn save_to_segments(&mut self, dir: OwnedFd, names: SegmentNames, pid: u32) {
        self.out = Some((Target::Segments { dir, names }, pid));
    }

    pub(crate) fn ring_files(&mut self, dir: OwnedFd, names: Vec<String>) {
        self.ring_files = Some((dir, names));
    }

    pub(crate) fn add_drain(&mut self, l: Leftover) {
        self.drains.push(l);
    }

    /// The recorder's end closed before it said it was done: writes what
    /// its buffers (and the kernel's leftover) held to its trace file, and
    /// prints one line saying so. Errors are printed; there is nobody left
    /// to return them to.
    pub(crate) fn save(&mut self, by: SavedBy) {
        let Some((target, pid)) = self.out.take() else {
            return;
        };
        if self.rings.is_empty() && self.drains.is_empty() {
            return;
        }
        let signal = death_signal(pid);
        let drained: Vec<Vec<u8>> = self
            .drains
            .iter()
            .filter_map(|l| match crate::sources::ftrace::drain_leftover(l) {
                Ok(b) => Some(b),
                Err(e) => {
                    log::warn!("reading the ftrace leftover in {}: {e}", l.dir.display());
                    None
                }
            })
            .filter(|b| !b.is_empty())
            .collect();
        let who = match signal {
            Some(s) => format!("recorder (pid {pid}) died of signal {s}"),
            None => format!("recorder (pid {pid}) died"),
        };
        let opts = SalvageOptions {
            head: Head::Full,
            check: Check::Packets,
            by,
            pid: Some(pid),
            signal,
            segment: None,
        };
        let saved = match &target {
            Target::File { fd, label } => {
                save_rings(fd, &self.rings, &drained, opts).map(|r| (r, label.clone()))
            }
            Target::Segments { dir, names } => {
                save_segment(dir, names, &self.rings, &drained, opts)
            }
        };
        let label = match &target {
            Target::File { label, .. } => label.clone(),
            Target::Segments { names, .. } => {
                format!("the next segment in {}", names.dir.display())
            }
        };
        match saved.map(|(report, written_to)| report.map(|r| (r, written_to))) {
            Ok(None) => {
                eprintln!(
                    "recorder: the {who} with nothing unread in its buffers: nothing to save to {label}"
                );
                self.remove_ring_files();
            }
            Ok(Some((report, written_to))) => {
                eprintln!(
                    "recorder: the {who} while recording; its buffers were saved: {}",
                    report.summary(&written_to)
                );
                self.remove_ring_files();
            }
            Err(e) => eprintln!(
                "recorder: the {who} while recording; saving its buffers to {label} failed: {e}"
            ),
        }
    }

    /// Removes the session's ring files once what they held is saved.
    fn remove_ring_files(&mut self) {
        if let Some((dir, names)) = self.ring_files.take() {
            for n in names {
                if crate::storage::create::check_name(&n).is_ok() {
                    let _ = rustix::fs::unlinkat(&dir, n.as_str(), rustix::fs::AtFlags::empty());
                }
            }
        }
    }
}

/// The save as the broker or keeper makes it when the recorder dies: the
/// trace of `rings` (buffer index, file) and `drained` (framed packets of
/// the kernel's leftover) written after the last whole packet of `out` (a
/// full head when that is its start), then synced. `None`, with nothing
/// written, when no ring holds an unread byte and nothing was drained.
pub fn save_rings(
    out: &OwnedFd,
    rings: &[(u32, OwnedFd)],
    drained: &[Vec<u8>],
    opts: SalvageOptions,
) -> std::io::Result<Option<salvage::SalvageReport>> {
    let mut unreadable = 0u32;
    // A memfd nobody can write any more is read in place; anything else
    // (a ring file, a memfd still mapped writable somewhere) through pread.
    let sealed: Vec<Option<SealedMap>> = rings
        .iter()
        .map(|(_, fd)| SealedMap::of(fd.as_fd()))
        .collect();
    let mut images: Vec<Ring<'_>> = Vec::new();
    for ((index, fd), map) in rings.iter().zip(&sealed) {
        let src: &dyn ReadAt = match map {
            Some(m) => m,
            None => fd,
        };
        match RingImage::read(src) {
            Ok(image) => images.push(Ring { image, src }),
            Err(e) => {
                log::warn!("buffer {index}: not readable after the recorder died: {e}");
                unreadable += 1;
            }
        }
    }
    if images.iter().all(|r| r.image.unread_bytes() == 0) && drained.is_empty() {
        return Ok(None);
    }
    write_save(out, &mut images, unreadable, drained, opts).map(Some)
}

/// The save as the next segment of a segmented session: after the highest
/// index in the directory (the one the recorder was writing, left under
/// its `.partial` name as any crash leaves it), made new, written, synced,
/// renamed to its final name. `None` when there is nothing to save (no
/// file is made). No sidecar: its figures were the recorder's.
fn save_segment(
    dir: &OwnedFd,
    names: &SegmentNames,
    rings: &[(u32, OwnedFd)],
    drained: &[Vec<u8>],
    mut opts: SalvageOptions,
) -> std::io::Result<(Option<salvage::SalvageReport>, String)> {
    let unread = rings
        .iter()
        .any(|(_, fd)| RingImage::read(fd).is_ok_and(|i| i.unread_bytes() > 0));
    if !unread && drained.is_empty() {
        return Ok((None, String::new()));
    }
    let mut next = 0u64;
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        if let Some(i) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|n| names.index_of(n))
        {
            next = next.max(i + 1);
        }
    }
    let od = OutputDir::from_fd(&names.dir, dir.try_clone()?).map_err(std::io::Error::other)?;
    let (partial, last) = (names.partial_name(next), names.file_name(next));
    let fd = od.create_new(&partial).map_err(std::io::Error::other)?;
    opts.segment = Some(next);
    let report = save_rings(&fd, rings, drained, opts)?;
    od.rename(&partial, &last).map_err(std::io::Error::other)?;
    od.sync()?;
    Ok((report, names.path(next).display().to_string()))
}

/// Writes the save after the last whole packet of `out`, and syncs.
fn write_save(
    out: &OwnedFd,
    rings: &mut [Ring<'_>],
    unreadable: u32,
    drained: &[Vec<u8>],
    mut opts: SalvageOptions,
) -> std::io::Result<salvage::SalvageReport> {
    // The recorder is gone: what follows is not block-aligned.
    let flags = rustix::fs::fcntl_getfl(out)?;
    if flags.contains(rustix::fs::OFlags::DIRECT) {
        rustix::fs::fcntl_setfl(out, flags - rustix::fs::OFlags::DIRECT)?;
    }
    let whole = whole_prefix(out)?;
    rustix::fs::ftruncate(out, whole)?;
    if whole > 0 {
        opts.head = Head::Append;
    } else if rings.iter().all(|r| r.src.slice(0, 0).is_some()) {
        return write_in_place(out, rings, unreadable, drained, &opts);
    }
    let file = std::fs::File::from(out.try_clone()?);
    // Unbuffered: the packets go in runs of whole regions, straight from
    // the rings (in place where sealed), with no copy of our own.
    let mut w = WriteFrom {
        file: &file,
        at: whole,
    };
    let report = salvage::salvage_with(rings, unreadable, drained, &mut w, &opts)?;
    file.sync_data()?;
    Ok(report)
}

/// A new trace of rings read in place (sealed memfds): the records go from
/// their mappings straight to the file, laid out in blocks where it takes
/// `O_DIRECT` (as a session's last pass is), else through the page cache.
fn write_in_place(
    out: &OwnedFd,
    rings: &mut [Ring<'_>],
    unreadable: u32,
    drained: &[Vec<u8>],
    opts: &SalvageOptions,
) -> std::io::Result<salvage::SalvageReport> {
    let mut gathered = Gathered::default();
    let report = salvage::salvage_into(rings, unreadable, drained, &mut gathered, opts)?;
    let mut iov = Vec::with_capacity(gathered.pieces.len());
    for p in &gathered.pieces {
        let bytes: &[u8] = match p {
            Piece::Owned(v) => v,
            Piece::InPlace { ring, at, len } => rings
                .get(*ring)
                .and_then(|r| r.src.slice(*at, *len))
                .ok_or_else(|| std::io::Error::other("a ring's records are no longer in place"))?,
        };
        iov.push(std::io::IoSlice::new(bytes));
    }
    let mut sink = crate::storage::sink_for_fd(out.try_clone()?, IoChoice::Auto, true)
        .map_err(std::io::Error::other)?;
    crate::storage::write_pass::write_last(sink.as_mut(), &iov).map_err(std::io::Error::other)?;
    Ok(report)
}

/// Where the last whole packet of the file ends: a torn tail, or what is
/// not a packet (a hole of zeros), is cut off.
fn whole_prefix(fd: &OwnedFd) -> std::io::Result<u64> {
    let file = std::fs::File::from(fd.try_clone()?);
    let reader = ReadFrom { file: &file, at: 0 };
    let end = crate::trace::reader::scan_reader(reader, "the trace", |_| {})
        .map_err(std::io::Error::other)?;
    Ok(match (&end.corruption, &end.torn_tail) {
        (Some(c), _) => c.offset(),
        (None, Some(t)) => t.offset,
        (None, None) => end.bytes,
    })
}

/// Positioned reads from the start of a file, as a `Read` (the descriptor's
/// own offset is shared with the trace's writer, and left alone).
/// Writes from `at` on with positioned writes, never at the file's own
/// offset: that offset is shared with every descriptor of the file's
/// opening, and the client that handed the file over may move it at any
/// moment (Perfetto's client seeks when its session ends, which is when
/// the save is written).
struct WriteFrom<'a> {
    file: &'a std::fs::File,
    at: u64,
}

impl Write for WriteFrom<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = std::os::unix::fs::FileExt::write_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct ReadFrom<'a> {
    file: &'a std::fs::File,
    at: u64,
}

impl std::io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The signal that ended process `pid`, when it is still a zombie to look
/// at (its parent has not reaped it yet): best effort, for the summary and
/// the trace's attributes. Its end of the socket closes before it becomes
/// a zombie, so this waits a little for that.
fn death_signal(pid: u32) -> Option<i32> {
    for _ in 0..50 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold anything) start
        // at the state, field 3; the exit code is field 52.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            let status: i32 = fields.get(49)?.parse().ok()?;
            return (status & 0x7f != 0).then_some(status & 0x7f);
        }
        std::thread::sleep(std::time::Duration::from_millis(4));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A memfd ring of `size` bytes wrapped once with 1 KiB packets; only
    /// its descriptor is kept, as after a death.
    fn dead_ring(size: usize) -> OwnedFd {
        let identity = RingIdentity {
            count: 1,
            uuid: (1, 2),
            ..RingIdentity::default()
        };
        let b = Buffer::create(
            BufferParams::new(size, FillPolicy::RingBuffer),
            Backing::Memfd,
            &identity,
        )
        .expect("a memfd ring");
        let mut w = b.writer(WriterId(2));
        // trusted_packet_sequence_id 2, then a bytes field filling 1 KiB.
        let mut p = vec![0x50, 2, 0xA2, 0x38];
        let body = 1024 - p.len() - 2;
        p.extend_from_slice(&[(body as u8) | 0x80, (body >> 7) as u8]);
        p.resize(1024, 0x5A);
        for _ in 0..(size / 1024 + size / 8192) {
            w.write_packet(&p).expect("a ring never refuses");
        }
        drop(w);
        let fd = b
            .shared_file()
            .expect("shared")
            .try_clone_to_owned()
            .expect("dup");
        drop(b);
        fd
    }

    /// The client that handed its file over shares the file's offset and
    /// may move it while the save is written after its head: the save
    /// lands where it belongs all the same, whole packet after whole packet.
    #[test]
    fn a_save_is_not_moved_by_others_seeking_the_shared_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("client.pftrace");
        // The head the recorder wrote: one packet.
        let head = [0x0A, 0x02, 0x50, 0x01];
        std::fs::write(&path, head).expect("head");
        let out: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open")
            .into();
        let client = out.try_clone().expect("the client's descriptor");
        let rings = [(0u32, dead_ring(4 << 20))];
        let stop = AtomicBool::new(false);
        let opts = SalvageOptions {
            head: Head::Full,
            check: Check::Packets,
            by: SavedBy::Broker,
            pid: None,
            signal: None,
            segment: None,
        };
        let report = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = rustix::fs::seek(&client, rustix::fs::SeekFrom::Start(0));
                }
            });
            let r = save_rings(&out, &rings, &[], opts);
            stop.store(true, Ordering::Relaxed);
            r
        })
        .expect("saved")
        .expect("the ring held data");
        let data = std::fs::read(&path).expect("read");
        assert_eq!(&data[..head.len()], head);
        assert_eq!(whole_prefix(&out).expect("scanned"), data.len() as u64);
        assert!(report.packets >= 3500, "{} packets", report.packets);
        assert!(data.len() as u64 > report.bytes, "{} bytes", data.len());
    }
}
