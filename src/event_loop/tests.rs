//! The executor against fake data sources and a fake sink that write down
//! what they are asked, in order, with real buffers and real files where
//! an action makes one (snapshots, segments): each action does what it
//! carries, and only that.

use std::sync::Mutex;

use super::super::SessionBuffer;
use super::*;
use crate::ringbuf::{BufferParams, FillPolicy, WriterId};
use crate::session::Timeline;
use crate::session::{Session, Timer};
use crate::sources::DataSource;
use crate::sources::SourceError;
use crate::storage::OpenOptions as SinkOpenOptions;
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::write_pass::PassFailure;
use crate::storage::{FileSink, IoChoice, SinkError, SinkKind, WriteList};
use crate::trace::service::SystemInfo;
use crate::trace::service_log::ServiceLog;

/// What a fake was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Start(&'static str),
    Flush(&'static str),
    Stop(&'static str),
    Clear(&'static str),
    Write,
    Sync,
}

/// What every fake was asked, in order.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<Op>>>);

impl Journal {
    fn note(&self, op: Op) {
        self.0.lock().expect("journal").push(op);
    }

    fn ops(&self) -> Vec<Op> {
        self.0.lock().expect("journal").clone()
    }

    /// The ops so far, forgotten.
    fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.0.lock().expect("journal"))
    }
}

/// A data source that notes its calls and fails where told.
struct FakeSource {
    name: &'static str,
    journal: Journal,
    fail_start: bool,
    fail_flush: bool,
    fail_stop: bool,
}

impl FakeSource {
    fn new(name: &'static str, journal: &Journal) -> Self {
        Self {
            name,
            journal: journal.clone(),
            fail_start: false,
            fail_flush: false,
            fail_stop: false,
        }
    }

    fn answer(&self, fail: bool, what: &str) -> Result<(), SourceError> {
        if !fail {
            return Ok(());
        }
        Err(SourceError::Failed {
            source_name: self.name.to_string(),
            cause: format!("{what} refused").into(),
        })
    }
}

impl DataSource for FakeSource {
    fn name(&self) -> &str {
        self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        self.journal.note(Op::Start(self.name));
        self.answer(self.fail_start, "start")
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        self.journal.note(Op::Flush(self.name));
        self.answer(self.fail_flush, "flush")
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        self.journal.note(Op::Stop(self.name));
        self.answer(self.fail_stop, "stop")
    }

    fn clear_incremental_state(&mut self) {
        self.journal.note(Op::Clear(self.name));
    }
}

/// A sink that keeps what it is given and notes writes and syncs; with
/// `fail`, every call fails as a full disk would.
struct FakeSink {
    journal: Journal,
    bytes: Arc<Mutex<Vec<u8>>>,
    fail: Option<SinkError>,
}

impl FileSink for FakeSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Stream
    }

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        self.journal.note(Op::Write);
        if let Some(e) = self.fail {
            return Err(e);
        }
        let mut bytes = self.bytes.lock().expect("bytes");
        let before = bytes.len();
        loop {
            let step = list.peek(usize::MAX, usize::MAX);
            if step.is_empty() {
                break;
            }
            let n: usize = step.iter().map(|s| s.len()).sum();
            for s in step {
                bytes.extend_from_slice(s);
            }
            list.advance(n);
        }
        let n = (bytes.len() - before) as u64;
        list.written(n);
        Ok(n)
    }

    fn sync_data(&mut self) -> Result<(), SinkError> {
        self.journal.note(Op::Sync);
        self.fail.map_or(Ok(()), Err)
    }

    fn bytes_written(&self) -> u64 {
        self.bytes.lock().expect("bytes").len() as u64
    }
}

const FULL_DISK: SinkError = SinkError::Write {
    errno: rustix::io::Errno::NOSPC,
    offset: 0,
};

/// A loop over `sources`, `buffers` real buffers and a fake sink, with
/// what they were asked and what the sink holds.
struct Fixture {
    l: Runner,
    journal: Journal,
    file: Arc<Mutex<Vec<u8>>>,
}

impl Fixture {
    fn new(timeline: Timeline, sources: &[&'static str], buffers: usize) -> Self {
        Self::with(timeline, sources, buffers, |_| {})
    }

    /// As [`Fixture::new`], with the sources (and sink) adjusted first.
    fn with(
        timeline: Timeline,
        sources: &[&'static str],
        buffers: usize,
        adjust: impl FnOnce(&mut Vec<FakeSource>),
    ) -> Self {
        let journal = Journal::default();
        let file = Arc::new(Mutex::new(Vec::new()));
        let mut fakes: Vec<FakeSource> = sources
            .iter()
            .map(|n| FakeSource::new(n, &journal))
            .collect();
        adjust(&mut fakes);
        let sink = FakeSink {
            journal: journal.clone(),
            bytes: file.clone(),
            fail: None,
        };
        let rec = Recording {
            session: Session::new(timeline),
            buffers: (0..buffers)
                .map(|_| SessionBuffer {
                    buffer: Buffer::new(BufferParams::new(1 << 16, FillPolicy::RingBuffer))
                        .expect("buffer"),
                    policy: "RING_BUFFER",
                })
                .collect(),
            sources: fakes
                .into_iter()
                .map(|s| Box::new(s) as Box<dyn DataSource>)
                .collect(),
            sink: Output::File(Box::new(sink)),
            compress: None,
            output_label: "fake".into(),
            snapshot_base: None,
            snapshot_open: SinkOpenOptions {
                io: IoChoice::Pwritev,
                ..SinkOpenOptions::default()
            },
            log: ServiceLog::new(0, Vec::new(), (1, 2), SystemInfo::default()),
            max_file_size: None,
            control: None,
            history: None,
            producers: None,
            quota_view: crate::producer::host::QuotaView::All,
            snapshots_to_host: false,
            rules: None,
            config_label: "test".into(),
            status_line: false,
            snapshot_dir: None,
        };
        let mut l = Runner::new(rec);
        // Each test begins the session itself, where it needs it.
        l.queue.clear();
        Self { l, journal, file }
    }

    /// The sink now fails every call.
    fn break_sink(&mut self) {
        let Output::File(_) = &self.l.rec.sink else {
            panic!("a fake sink");
        };
        self.l.rec.sink = Output::File(Box::new(FakeSink {
            journal: self.journal.clone(),
            bytes: self.file.clone(),
            fail: Some(FULL_DISK),
        }));
    }

    /// Writes `packet` into buffer `i` (one writer per buffer).
    fn put(&self, i: usize, packet: &[u8]) {
        let mut w = self.l.rec.buffers[i].buffer.writer(WriterId(1));
        w.write_packet(packet).expect("fits");
        w.flush();
    }

    fn buffered(&self, i: usize) -> u64 {
        self.l.rec.buffers[i].buffer.stats().bytes_buffered
    }

    /// The events the executed actions queued, taken.
    fn events(&mut self) -> Vec<Event> {
        self.l.queue.drain(..).collect()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_stop_flushes_the_sources_stops_them_then_writes_and_syncs() {
    let mut f = Fixture::new(Timeline::plain(), &["a", "b"], 1);
    f.l.queue.push_back(Event::Begin { wall_ms: 0 });
    f.l.settle();
    assert_eq!(f.journal.take(), vec![Op::Start("a"), Op::Start("b")]);
    f.put(0, b"before the stop");

    f.l.queue.push_back(Event::Signal);
    f.l.settle();
    let ops = f.journal.ops();
    assert_eq!(
        ops[..4],
        [Op::Flush("a"), Op::Flush("b"), Op::Stop("a"), Op::Stop("b")]
    );
    // The final pass, then its fdatasync, last of all.
    assert_eq!(ops[4..], [Op::Write, Op::Sync]);
    assert!(contains(&f.file.lock().expect("file"), b"before the stop"));
    assert_eq!(f.buffered(0), 0);
    assert_eq!(f.l.exit, Some(StopReason::Signal));
}

#[test]
fn a_session_with_nothing_due_asks_for_no_wake_up() {
    let mut f = Fixture::new(Timeline::plain(), &["a"], 1);
    assert_eq!(f.l.next_due(), None, "no timer, no source work");
    f.l.execute(Action::StartSources);
    assert_eq!(f.journal.take(), vec![Op::Start("a")]);
    assert_eq!(
        f.l.next_due(),
        None,
        "a source with nothing due wakes nothing"
    );
    f.l.execute(Action::SetTimer(Timer::Stats, Duration::from_secs(10)));
    assert!(f.l.next_due().is_some(), "a timer is a wake-up");
}

#[test]
fn a_pass_syncs_only_when_its_action_says_so() {
    let mut f = Fixture::new(Timeline::plain(), &[], 1);
    f.put(0, b"first pass");
    f.l.execute(Action::WritePass {
        pass: Pass::Periodic,
        sync: false,
    });
    assert_eq!(f.journal.take(), vec![Op::Write]);
    assert_eq!(f.buffered(0), 0, "a pass consumes what it writes");
    assert_eq!(
        f.events(),
        vec![Event::PassWritten {
            cap_reached: false,
            segment: None,
        }]
    );

    f.put(0, b"second pass");
    f.l.execute(Action::WritePass {
        pass: Pass::Periodic,
        sync: true,
    });
    assert_eq!(f.journal.take(), vec![Op::Write, Op::Sync]);
    let file = f.file.lock().expect("file");
    assert!(contains(&file, b"first pass") && contains(&file, b"second pass"));
    assert_eq!(f.l.passes, 2);
}

/// The file's `read_tracing_buffers_completed` packets: service events
/// (TracePacket field 69) whose event, their last field, is field 4 = true.
fn read_done(file: &[u8]) -> Vec<usize> {
    use crate::trace::reader::{PacketInfo, frames};
    frames(file)
        .enumerate()
        .filter(|(_, f)| {
            PacketInfo::decode(f.packet).is_ok_and(|i| i.kind == Some(69))
                && f.packet.ends_with(&[0x20, 0x01])
        })
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn a_pass_that_finds_nothing_makes_no_write_and_the_session_still_hears_of_it() {
    let frames_in = |file: &[u8]| crate::trace::reader::frames(file).count();
    let mut f = Fixture::new(Timeline::plain(), &[], 1);
    let pass = |f: &mut Fixture| {
        f.l.execute(Action::WritePass {
            pass: Pass::Periodic,
            sync: false,
        });
        f.events()
    };
    let written = vec![Event::PassWritten {
        cap_reached: false,
        segment: None,
    }];
    // The first pass writes the head and its marker.
    assert_eq!(pass(&mut f), written);
    assert_eq!(f.journal.take(), vec![Op::Write]);
    let first = f.file.lock().expect("file").clone();
    assert_eq!(read_done(&first).len(), 1);
    for _ in 0..3 {
        assert_eq!(pass(&mut f), written);
    }
    assert_eq!(f.journal.take(), vec![], "an empty pass calls no sink");
    assert_eq!(*f.file.lock().expect("file"), first);
    // Data again: one write, ending with the marker.
    f.put(0, b"later");
    assert_eq!(pass(&mut f), written);
    assert_eq!(f.journal.take(), vec![Op::Write]);
    let file = f.file.lock().expect("file").clone();
    assert!(contains(&file, b"later"));
    let markers = read_done(&file);
    assert_eq!(markers.len(), 2);
    assert_eq!(
        markers[1] + 1,
        frames_in(&file),
        "the pass ends with its marker"
    );
    // A sync asked of an empty pass is still done.
    f.l.execute(Action::WritePass {
        pass: Pass::Periodic,
        sync: true,
    });
    assert_eq!(f.journal.take(), vec![Op::Sync]);
    assert_eq!(f.l.passes, 6);
}

#[test]
fn a_failed_write_is_reported_to_the_session_and_nothing_is_synced() {
    let mut f = Fixture::new(Timeline::plain(), &[], 1);
    f.put(0, b"lost");
    f.break_sink();
    f.l.execute(Action::WritePass {
        pass: Pass::Final,
        sync: true,
    });
    assert_eq!(f.journal.take(), vec![Op::Write]);
    let ev = f.events();
    assert!(
        matches!(&ev[..], [Event::OutputFailed(OutputError::Pass(e))]
            if e.source == PassFailure::Sink(FULL_DISK)),
        "{ev:?}"
    );
    assert!(
        f.l.warnings
            .iter()
            .any(|w| w.starts_with("final write failed"))
    );
}

#[test]
fn sync_output_syncs_and_writes_nothing() {
    let mut f = Fixture::new(Timeline::plain(), &["a"], 1);
    f.put(0, b"stays");
    f.l.execute(Action::SyncOutput);
    assert_eq!(f.journal.take(), vec![Op::Sync]);
    assert!(f.buffered(0) > 0);
    assert_eq!(f.events(), vec![Event::OutputSynced]);
    // A failed sync is the session's to hear: it fails the session.
    f.break_sink();
    f.l.execute(Action::SyncOutput);
    assert!(matches!(f.events()[..], [Event::OutputFailed(_)]));
}

#[test]
fn a_snapshot_takes_each_buffer_as_its_action_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = Fixture::new(Timeline::plain(), &["a"], 2);
    f.l.rec.snapshot_base = Some(dir.path().join("t.pftrace"));
    f.put(0, b"copied by the snapshot");
    f.put(1, b"handed to the snapshot");
    f.l.execute(Action::Snapshot {
        n: 3,
        takes: vec![Take::Snapshot, Take::Consume],
    });
    let path = dir.path().join("t.pftrace.3");
    assert_eq!(f.l.snapshots, vec![path.clone()]);
    let written = std::fs::read(&path).expect("the snapshot file");
    assert!(contains(&written, b"copied by the snapshot"));
    assert!(contains(&written, b"handed to the snapshot"));
    assert!(f.buffered(0) > 0, "a copied buffer keeps its data");
    assert_eq!(f.buffered(1), 0, "a transferred buffer is consumed");
    // The session's own output is not touched.
    assert!(f.journal.ops().is_empty());
    assert!(f.events().is_empty());
}

#[test]
fn preparing_a_snapshot_clears_only_the_listed_buffers() {
    let mut f = Fixture::new(Timeline::plain(), &[], 3);
    for i in 0..3 {
        f.put(i, b"data");
    }
    f.l.execute(Action::PrepareSnapshot {
        n: 0,
        clear: vec![1, 7],
    });
    assert!(f.buffered(0) > 0);
    assert_eq!(f.buffered(1), 0);
    assert!(f.buffered(2) > 0);
}

#[test]
fn a_flush_asks_every_source_and_reports_one_that_failed() {
    let mut f = Fixture::with(Timeline::plain(), &["a", "b", "c"], 1, |s| {
        s[1].fail_flush = true;
    });
    let id = FlushId(4);
    f.l.execute(Action::FlushSources {
        id,
        timeout: Duration::from_secs(1),
        for_stop: false,
    });
    assert_eq!(
        f.journal.take(),
        vec![Op::Flush("a"), Op::Flush("b"), Op::Flush("c")]
    );
    assert_eq!(
        f.events(),
        vec![Event::SourcesFlushed {
            id,
            complete: false,
        }]
    );
    assert!(f.l.warnings.iter().any(|w| w.contains("flush refused")));

    let mut f = Fixture::new(Timeline::plain(), &["a"], 1);
    f.l.execute(Action::FlushSources {
        id,
        timeout: Duration::from_secs(1),
        for_stop: true,
    });
    assert_eq!(
        f.events(),
        vec![Event::SourcesFlushed { id, complete: true }]
    );
}

#[test]
fn a_source_that_cannot_start_fails_the_start_and_the_rest_wait() {
    let mut f = Fixture::with(Timeline::plain(), &["a", "b"], 1, |s| {
        s[0].fail_start = true;
    });
    f.l.execute(Action::StartSources);
    assert_eq!(f.journal.take(), vec![Op::Start("a")]);
    let ev = f.events();
    assert!(
        matches!(&ev[..], [Event::SourceFailed(s)]
            if s.source == "a" && s.phase == SourcePhase::Starting && s.cause.cause_text() == "start refused"),
        "{ev:?}"
    );
}

#[test]
fn stopping_stops_every_source_even_after_one_fails() {
    let mut f = Fixture::with(Timeline::plain(), &["a", "b"], 1, |s| {
        s[0].fail_stop = true;
    });
    f.l.execute(Action::StopSources);
    assert_eq!(f.journal.take(), vec![Op::Stop("a"), Op::Stop("b")]);
    assert_eq!(f.events(), vec![Event::SourcesStopped]);
    assert!(f.l.warnings.iter().any(|w| w.contains("stop refused")));
}

#[test]
fn clearing_incremental_state_reaches_every_source() {
    let mut f = Fixture::new(Timeline::plain(), &["a", "b"], 1);
    f.l.execute(Action::ClearIncrementalState);
    assert_eq!(f.journal.take(), vec![Op::Clear("a"), Op::Clear("b")]);
}

#[test]
fn rotation_closes_the_segment_and_opens_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = Fixture::new(Timeline::plain(), &[], 1);
    let w = crate::storage::segment::tests::test_writer(
        &dir.path().join("t.pftrace"),
        RotationPolicy {
            size: Some(1 << 20),
            ..RotationPolicy::default()
        },
        vec![f.l.rec.buffers[0].buffer.clone()],
    );
    f.l.rec.sink = Output::Segments(Box::new(w));
    f.put(0, b"in segment zero");
    f.l.execute(Action::WritePass {
        pass: Pass::Periodic,
        sync: false,
    });
    assert!(matches!(
        &f.events()[..],
        [Event::PassWritten {
            segment: Some(_),
            ..
        }]
    ));
    f.l.execute(Action::Rotate(RotateReason::Size));
    assert!(f.events().is_empty(), "the rotation succeeded");
    let Output::Segments(w) = &f.l.rec.sink else {
        panic!("segments");
    };
    assert_eq!(w.index(), 1);
    let st = w.status();
    assert_eq!(st.segments.len(), 2);
    // Segment 0 is closed under its final name, with what was written.
    let closed = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.to_string_lossy().ends_with("t-000000.pftrace"))
        .expect("segment 0 under its final name");
    assert!(contains(
        &std::fs::read(closed).expect("segment 0"),
        b"in segment zero"
    ));
}

#[test]
fn rotation_of_a_single_file_does_nothing() {
    let mut f = Fixture::new(Timeline::plain(), &[], 1);
    f.l.execute(Action::Rotate(RotateReason::Period));
    assert!(f.journal.ops().is_empty());
    assert!(f.events().is_empty());
}

#[test]
fn a_clone_trigger_snapshots_each_buffer_as_the_config_says() {
    use crate::session::{CloneRule, TriggerArrival, TriggerMode, TriggerName, TriggerRule};
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Timeline {
        mode: TriggerMode::CloneSnapshot,
        trigger_timeout: Duration::from_secs(60),
        rules: vec![TriggerRule {
            name: "snap".into(),
            producer_regex: None,
            stop_delay: Duration::ZERO,
            max_per_24h: 0,
            skip_probability: 0.0,
        }],
        // Buffer 0 is copied, buffer 1 handed over.
        clone: vec![
            CloneRule::default(),
            CloneRule {
                transfer: true,
                clear_first: false,
            },
        ],
        ..Timeline::plain()
    };
    let mut f = Fixture::new(t, &["a"], 2);
    f.l.rec.snapshot_base = Some(dir.path().join("t.pftrace"));
    f.l.queue.push_back(Event::Begin { wall_ms: 0 });
    f.l.settle();
    f.put(0, b"kept in the ring");
    f.put(1, b"moved out");
    f.l.queue.push_back(Event::Triggers(TriggerArrival {
        request: None,
        producer: "p".into(),
        uid: 0,
        names: vec![TriggerName {
            name: "snap".into(),
            draw: 0.5,
            matches_last_24h: 0,
        }],
        at_ns: None,
    }));
    f.l.settle();
    // The snapshot's flush, then the snapshot; the session's own output
    // stays untouched.
    assert_eq!(f.journal.take(), vec![Op::Start("a"), Op::Flush("a")]);
    let path = dir.path().join("t.pftrace.0");
    assert_eq!(f.l.snapshots, vec![path.clone()]);
    let written = std::fs::read(&path).expect("the snapshot");
    assert!(contains(&written, b"kept in the ring") && contains(&written, b"moved out"));
    assert!(f.buffered(0) > 0);
    assert_eq!(f.buffered(1), 0);
    assert!(f.l.exit.is_none());
}
