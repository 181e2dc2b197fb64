//! What the recorder writes of its own in each write pass, and in which
//! order (ARCHITECTURE.md §8.4): on the first pass the initial clock snapshot,
//! `trace_config`, `trace_uuid` and `system_info`; on every pass the queued
//! clock snapshots, the sync marker when due, received triggers and the
//! pending service events sorted by time; after the buffers,
//! `read_tracing_buffers_completed` and, when due, `trace_stats`.
//!
//! Segmented output ([`ServiceLog::begin_segment`]) makes every segment
//! open as the first pass does: a fresh initial clock snapshot, the sync
//! marker, `trace_config`, the segment's `trace_uuid`, a `trace_attributes`
//! packet naming the session and the segment index, and `system_info`; the
//! closing `trace_stats` of a segment is [`ServiceLog::segment_tail`].

use crate::clock::{self, ClockReadings};
use crate::trace::service::{
    self, AttributeValue, ServiceEvent, SystemInfo, TraceStatsRecord, TriggerRecord,
};

/// The segment a log's next head opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SegmentHead {
    index: u64,
    uuid: (i64, i64),
}

/// `trace_attributes` keys of segmented output.
pub(crate) const ATTR_SESSION_UUID: &str = "recorder.session_uuid";
pub(crate) const ATTR_SEGMENT_INDEX: &str = "recorder.segment_index";

/// The service packets of one session.
#[derive(Debug)]
pub(crate) struct ServiceLog {
    uid: u32,
    config_bytes: Vec<u8>,
    uuid: (i64, i64),
    system_info: SystemInfo,
    first_pass_done: bool,
    initial_snapshot: Option<ClockReadings>,
    queued_snapshots: Vec<ClockReadings>,
    events: Vec<(u64, ServiceEvent)>,
    /// `slow_starting_data_sources` events not written yet.
    slow_starts: Vec<(u64, Vec<(String, String)>)>,
    triggers: Vec<TriggerRecord>,
    sync_due: bool,
    stats_due: bool,
    /// Leave out trace_config and triggers (`disable_trace_config`).
    pub(crate) disable_trace_config: bool,
    /// Leave out system_info (`disable_system_info`).
    pub(crate) disable_system_info: bool,
    /// Leave out service events (`disable_service_events`).
    pub(crate) disable_service_events: bool,
    /// Leave out clock snapshots (`disable_clock_snapshotting`).
    pub(crate) disable_clock_snapshotting: bool,
    segment: Option<SegmentHead>,
}

/// Most queued clock snapshots kept between passes (as the service does).
const MAX_QUEUED_SNAPSHOTS: usize = 16;

impl ServiceLog {
    pub(crate) fn new(
        uid: u32,
        config_bytes: Vec<u8>,
        uuid: (i64, i64),
        system_info: SystemInfo,
    ) -> Self {
        Self {
            uid,
            config_bytes,
            uuid,
            system_info,
            first_pass_done: false,
            initial_snapshot: None,
            queued_snapshots: Vec::new(),
            events: Vec::new(),
            slow_starts: Vec::new(),
            triggers: Vec::new(),
            sync_due: true,
            stats_due: true,
            disable_trace_config: false,
            disable_system_info: false,
            disable_service_events: false,
            disable_clock_snapshotting: false,
            segment: None,
        }
    }

    /// The next pass heads segment `index` (trace UUID `uuid`): it begins
    /// with what a reader needs, as the first pass of a file does. For
    /// segment 0, call it before the first pass.
    pub(crate) fn begin_segment(&mut self, index: u64, uuid: (i64, i64)) {
        self.segment = Some(SegmentHead { index, uuid });
        if self.first_pass_done {
            self.first_pass_done = false;
            self.initial_snapshot = Some(clock::snapshot());
            self.sync_due = true;
            self.stats_due = true;
        }
    }

    /// The packets that close a segment after its last pass: `trace_stats`,
    /// so each segment carries the buffers' figures at its end.
    pub(crate) fn segment_tail(&self, stats: &TraceStatsRecord) -> Vec<Vec<u8>> {
        service::stats_packets(self.uid, clock::boottime_ns(), stats)
    }

    /// Tracing started: the initial clock snapshot and `tracing_started`.
    pub(crate) fn started(&mut self) {
        self.initial_snapshot = Some(clock::snapshot());
        self.event(ServiceEvent::TracingStarted);
    }

    /// Records a lifecycle event now.
    pub(crate) fn event(&mut self, ev: ServiceEvent) {
        self.events.push((clock::boottime_ns(), ev));
        if matches!(
            ev,
            ServiceEvent::AllDataSourcesFlushed | ServiceEvent::TracingDisabled
        ) {
            self.add_snapshot();
        }
    }

    /// Records that these (producer, data source) pairs had not
    /// acknowledged their start by the deadline.
    pub(crate) fn slow_starting(&mut self, slow: Vec<(String, String)>) {
        self.slow_starts.push((clock::boottime_ns(), slow));
    }

    /// Records an accepted trigger.
    pub(crate) fn trigger(&mut self, t: TriggerRecord) {
        self.triggers.push(t);
        self.add_snapshot();
    }

    /// The periodic tick (every 10 s): a clock snapshot, and the sync marker
    /// and trace_stats on the next pass.
    pub(crate) fn tick(&mut self) {
        self.add_snapshot();
        self.sync_due = true;
        self.stats_due = true;
    }

    /// Asks for trace_stats and a sync marker on the next pass (the final one).
    pub(crate) fn want_stats(&mut self) {
        self.sync_due = true;
        self.stats_due = true;
    }

    fn add_snapshot(&mut self) {
        if self.queued_snapshots.len() < MAX_QUEUED_SNAPSHOTS {
            self.queued_snapshots.push(clock::snapshot());
        }
    }

    /// The framed packets that go before the buffers in this pass.
    pub(crate) fn head(&mut self) -> Vec<Vec<u8>> {
        let now = clock::boottime_ns();
        let mut out = Vec::new();
        if !self.disable_clock_snapshotting {
            // In the order taken: a snapshot queued before the start (a
            // START_TRACING trigger's) precedes the initial one, and trace
            // processor refuses clocks that go back between snapshots
            // (`invalid_clock_snapshots`).
            let mut snaps: Vec<ClockReadings> = self.initial_snapshot.take().into_iter().collect();
            snaps.append(&mut self.queued_snapshots);
            snaps.sort_by_key(|r| {
                r.0.iter()
                    .find(|(c, _)| *c == clock::BuiltinClock::Boottime)
                    .map_or(0, |(_, ts)| *ts)
            });
            for s in &snaps {
                out.push(service::clock_snapshot(self.uid, s));
            }
        } else {
            self.initial_snapshot = None;
            self.queued_snapshots.clear();
        }
        if std::mem::take(&mut self.sync_due) {
            out.push(service::sync_marker(self.uid));
        }
        let first = !self.first_pass_done;
        self.first_pass_done = true;
        if !self.disable_trace_config {
            if first {
                out.push(service::trace_config(self.uid, now, &self.config_bytes));
            }
            for t in self.triggers.drain(..) {
                out.push(service::trigger(self.uid, &t, false));
            }
        } else {
            self.triggers.clear();
        }
        if first {
            let uuid = self.segment.map_or(self.uuid, |s| s.uuid);
            out.push(service::trace_uuid(self.uid, now, uuid.0, uuid.1));
            if let Some(s) = self.segment {
                let session = crate::storage::segment::sidecar::uuid_text(self.uuid.0, self.uuid.1);
                out.push(service::trace_attributes(
                    self.uid,
                    now,
                    &[
                        (ATTR_SESSION_UUID, AttributeValue::Text(session)),
                        (
                            ATTR_SEGMENT_INDEX,
                            AttributeValue::Long(i64::try_from(s.index).unwrap_or(i64::MAX)),
                        ),
                    ],
                ));
            }
            if !self.disable_system_info {
                out.push(service::system_info(self.uid, now, &self.system_info));
            }
        }
        if !self.disable_service_events {
            self.events.sort_by_key(|(ts, _)| *ts);
            for (ts, ev) in self.events.drain(..) {
                out.push(service::service_event(self.uid, ts, ev));
            }
            for (ts, slow) in self.slow_starts.drain(..) {
                out.push(service::slow_starting(self.uid, ts, &slow));
            }
        } else {
            self.events.clear();
            self.slow_starts.clear();
        }
        out
    }

    /// The framed packets that go after the buffers in this pass;
    /// `carried`: something comes before them in it. A pass that carried
    /// nothing and owes no `trace_stats` gets no tail at all: its
    /// `read_tracing_buffers_completed` would follow the last one with
    /// nothing between them, where trace processor's sorting does nothing
    /// (ARCHITECTURE.md §8.4), and an idle stream then writes nothing.
    pub(crate) fn tail(
        &mut self,
        carried: bool,
        stats: impl FnOnce() -> TraceStatsRecord,
    ) -> Vec<Vec<u8>> {
        if !carried && !self.stats_due {
            return Vec::new();
        }
        let now = clock::boottime_ns();
        let mut out = Vec::new();
        if !self.disable_service_events {
            out.push(service::service_event(
                self.uid,
                now,
                ServiceEvent::ReadTracingBuffersCompleted,
            ));
        }
        if std::mem::take(&mut self.stats_due) {
            out.extend(service::stats_packets(self.uid, now, &stats()));
        }
        out
    }

    /// The packets that head a snapshot file (CLONE_SNAPSHOT): a fresh
    /// clock snapshot, the config, the trigger, uuid and system info.
    pub(crate) fn snapshot_head(&self, trigger: Option<&TriggerRecord>) -> Vec<Vec<u8>> {
        let now = clock::boottime_ns();
        let mut out = vec![
            service::clock_snapshot(self.uid, &clock::snapshot()),
            service::sync_marker(self.uid),
        ];
        if !self.disable_trace_config {
            out.push(service::trace_config(self.uid, now, &self.config_bytes));
            if let Some(t) = trigger {
                out.push(service::trigger(self.uid, t, true));
            }
        }
        out.push(service::trace_uuid(self.uid, now, self.uuid.0, self.uuid.1));
        if !self.disable_system_info {
            out.push(service::system_info(self.uid, now, &self.system_info));
        }
        out.push(service::service_event(
            self.uid,
            now,
            ServiceEvent::CloneStarted,
        ));
        out
    }

    /// The session's uid (the trusted_uid of service packets).
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }
}

/// A random version-4 UUID as (msb, lsb).
pub(crate) fn random_uuid() -> (i64, i64) {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let msb = i64::from_be_bytes(b[..8].try_into().unwrap_or([0; 8]));
    let lsb = i64::from_be_bytes(b[8..].try_into().unwrap_or([0; 8]));
    (msb, lsb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::reader::{PacketInfo, frames};

    fn kinds(packets: &[Vec<u8>]) -> Vec<u32> {
        packets
            .iter()
            .flat_map(|p| frames(p).map(|f| PacketInfo::decode(f.packet).expect("decodes")))
            .filter_map(|i| i.kind)
            .collect()
    }

    #[test]
    fn every_segment_opens_like_a_first_pass() {
        let mut log = ServiceLog::new(0, vec![0x08, 0x01], (7, 8), SystemInfo::default());
        log.begin_segment(0, (7, 8));
        log.started();
        let first = kinds(&log.head());
        // clock_snapshot, sync marker, trace_config, trace_uuid, attributes,
        // system_info, then tracing_started.
        assert_eq!(first, vec![6, 36, 33, 89, 126, 45, 69]);
        assert!(kinds(&log.head()).is_empty(), "later passes repeat nothing");
        log.begin_segment(1, (7, 9));
        let second = log.head();
        assert_eq!(kinds(&second), vec![6, 36, 33, 89, 126, 45]);
        let uuid = second
            .iter()
            .find(|p| kinds(&[p.to_vec()]) == vec![89])
            .expect("uuid packet")
            .clone();
        // TraceUuid { msb: 7, lsb: 9 } is the packet's last field.
        assert!(uuid.ends_with(&[0x08, 7, 0x10, 9]), "{uuid:?}");
        let tail = log.tail(true, TraceStatsRecord::default);
        assert_eq!(kinds(&tail), vec![69, 35], "stats are due in a new segment");
        assert_eq!(
            kinds(&log.segment_tail(&TraceStatsRecord::default())),
            vec![35]
        );
    }

    #[test]
    fn a_pass_that_carried_nothing_gets_a_tail_only_when_stats_are_due() {
        let mut log = ServiceLog::new(0, Vec::new(), (1, 2), SystemInfo::default());
        // Stats are due on the first pass, carried or not.
        assert_eq!(
            kinds(&log.tail(false, TraceStatsRecord::default)),
            vec![69, 35]
        );
        assert!(log.tail(false, TraceStatsRecord::default).is_empty());
        assert_eq!(kinds(&log.tail(true, TraceStatsRecord::default)), vec![69]);
        log.want_stats();
        assert_eq!(
            kinds(&log.tail(false, TraceStatsRecord::default)),
            vec![69, 35]
        );
        log.disable_service_events = true;
        assert!(log.tail(true, TraceStatsRecord::default).is_empty());
    }
}
