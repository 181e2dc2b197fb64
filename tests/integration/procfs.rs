//! linux.process_stats and linux.sys_stats on the captured procfs fixture
//! (exact values) and on the real /proc, decoded with `perfetto_protos`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::harness::*;
use perfetto_protos::process_tree::ProcessTree;
use perfetto_protos::sys_stats::SysStats;
use perfetto_protos::trace_packet::TracePacket;
use protobuf::{Enum, Message};
use recorder::config::spec::{ProcessStatsSpec, SourceKind, SysStatsSpec};
use recorder::sources::process_stats::ProcessStatsSource;
use recorder::sources::procfs::HostPaths;
use recorder::sources::sys_stats::{Group, Schedule, SysStatsError, SysStatsSource};

const SEQ: u32 = 7;
// The captured workload (tests/fixtures/proc/PIDS).
const APP: i32 = 12272;
const THREAD_A: i32 = 12316;
const THREAD_B: i32 = 12317;
const ZOMBIE: i32 = 12318;
const NS_PARENT: i32 = 12273;
const NS_CHILD: i32 = 12275;

fn fixture() -> HostPaths {
    let f = repo_root().join("tests/fixtures");
    HostPaths::at(f.join("proc"), f.join("sys"), 100)
}

fn fixture_file(name: &str) -> String {
    let p: PathBuf = repo_root().join("tests/fixtures/proc").join(name);
    std::fs::read_to_string(&p).expect("fixture file")
}

fn decode(packets: &[Vec<u8>]) -> Vec<TracePacket> {
    packets
        .iter()
        .map(|p| TracePacket::parse_from_bytes(p).expect("a valid TracePacket"))
        .collect()
}

/// The validated sys_stats spec of a `sys_stats_config { TEXT }`.
fn sys_spec(text: &str) -> Result<SysStatsSpec, String> {
    let cfg = format!(
        "buffers {{ size_kb: 64 }} data_sources {{ config {{ name: \"linux.sys_stats\" sys_stats_config {{ {text} }} }} }}"
    );
    let spec = recorder::config::load_text(&cfg, "t", false)
        .map_err(|e| e.to_string())?
        .validate()
        .map_err(|e| e.to_string())?;
    match &spec.data_sources[0].kind {
        SourceKind::SysStats(s) => Ok(s.clone()),
        k => panic!("{k:?}"),
    }
}

fn all_periods(ms: u32) -> SysStatsSpec {
    let text: String = [
        "meminfo",
        "vmstat",
        "stat",
        "devfreq",
        "cpufreq",
        "buddyinfo",
        "diskstat",
        "psi",
        "thermal",
        "cpuidle",
    ]
    .iter()
    .map(|g| format!("{g}_period_ms: {ms} "))
    .collect();
    sys_spec(&text).expect("valid")
}

fn one_tick(opts: &SysStatsSpec) -> SysStats {
    let mut src = SysStatsSource::new(opts, fixture(), SEQ).expect("valid periods");
    let mut out: Vec<Vec<u8>> = Vec::new();
    src.write_tick(&mut out);
    let pkts = decode(&out);
    assert_eq!(pkts.len(), 1, "one packet per tick");
    let p = &pkts[0];
    assert_eq!(p.trusted_packet_sequence_id(), SEQ);
    assert!(p.has_sys_stats());
    let s = p.sys_stats().clone();
    assert!(p.timestamp() > 0 && s.collection_end_timestamp() >= p.timestamp());
    s
}

/// An independent reading of `key value` files: every pair, in order.
fn key_values(text: &str, strip_colon: bool) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            let k = if strip_colon {
                k.trim_end_matches(':')
            } else {
                k
            };
            Some((k.to_string(), v))
        })
        .collect()
}

#[test]
fn sys_stats_fixture_meminfo_and_vmstat_exact() {
    let s = one_tick(&all_periods(100));

    // meminfo: every line whose key is a MeminfoCounters name, in file order.
    let expected: Vec<(String, u64)> = key_values(&fixture_file("meminfo"), true)
        .into_iter()
        .filter(|(k, _)| {
            recorder::sources::sys_stats::MEMINFO_KEYS
                .iter()
                .any(|(n, _)| n == k)
        })
        .collect();
    let got: Vec<(String, u64)> = s
        .meminfo
        .iter()
        .map(|m| {
            let id = m.key().value() as u32;
            let (name, _) = recorder::sources::sys_stats::MEMINFO_KEYS
                .iter()
                .find(|(_, n)| *n == id)
                .expect("known id");
            (name.to_string(), m.value())
        })
        .collect();
    assert_eq!(got, expected);
    assert!(got.contains(&("MemTotal".to_string(), 24_683_584)));
    assert!(got.contains(&("Active(anon)".to_string(), 1564)));
    assert!(got.contains(&("Committed_AS".to_string(), 83028)));

    // vmstat: the key is the enum name, lower-cased, without VMSTAT_.
    let expected: Vec<(String, u64)> = key_values(&fixture_file("vmstat"), false)
        .into_iter()
        .filter(|(k, _)| {
            perfetto_protos::sys_stats_counters::VmstatCounters::VALUES
                .iter()
                .any(|c| {
                    format!("{c:?}")
                        .strip_prefix("VMSTAT_")
                        .map(str::to_lowercase)
                        .as_deref()
                        == Some(k)
                })
        })
        .collect();
    let got: Vec<(String, u64)> = s
        .vmstat
        .iter()
        .map(|v| {
            let name = format!("{:?}", v.key());
            (
                name.strip_prefix("VMSTAT_").expect("prefix").to_lowercase(),
                v.value(),
            )
        })
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(got, expected);
    assert!(got.contains(&("nr_free_pages".to_string(), 1_285_645)));
    assert!(got.contains(&("pgfault".to_string(), 13_463_198)));
}

#[test]
fn vmstat_table_matches_the_decoder_enum() {
    for (key, id) in recorder::sources::sys_stats::VMSTAT_KEYS {
        let c = perfetto_protos::sys_stats_counters::VmstatCounters::from_i32(*id as i32)
            .expect("a known number");
        assert_eq!(format!("{c:?}").to_lowercase(), format!("vmstat_{key}"));
    }
    assert_eq!(recorder::sources::sys_stats::VMSTAT_KEYS.len(), 188);
    for (key, id) in recorder::sources::sys_stats::MEMINFO_KEYS {
        assert!(
            perfetto_protos::sys_stats_counters::MeminfoCounters::from_i32(*id as i32).is_some(),
            "{key}"
        );
    }
}

#[test]
fn sys_stats_fixture_stat_exact() {
    let s = one_tick(&all_periods(100));
    // USER_HZ = 100: 10 ms per tick. The all-CPU "cpu" line is not written.
    assert_eq!(s.cpu_stat.len(), 2);
    let c0 = &s.cpu_stat[0];
    let ms = 10_000_000u64;
    assert_eq!(
        (
            c0.cpu_id(),
            c0.user_ns(),
            c0.user_nice_ns(),
            c0.system_mode_ns(),
            c0.idle_ns(),
            c0.io_wait_ns(),
            c0.irq_ns(),
            c0.softirq_ns(),
            c0.steal_ns()
        ),
        (
            0,
            21411 * ms,
            0,
            2380 * ms,
            49287 * ms,
            140 * ms,
            0,
            16 * ms,
            26 * ms
        )
    );
    assert_eq!(
        (s.cpu_stat[1].cpu_id(), s.cpu_stat[1].user_ns()),
        (1, 23525 * ms)
    );
    assert_eq!(s.num_irq_total(), 359_420);
    let irqs: Vec<(i32, u64)> = s.num_irq.iter().map(|i| (i.irq(), i.count())).collect();
    assert_eq!(
        irqs,
        vec![
            (24, 1),
            (25, 1),
            (26, 16),
            (31, 146),
            (32, 35),
            (34, 24),
            (35, 1),
            (36, 41889),
            (38, 4307),
            (39, 3781),
            (41, 1586),
            (42, 3046),
            (43, 1)
        ],
        "only non-zero interrupt counts"
    );
    assert_eq!(s.num_softirq_total(), 162_416);
    let soft: Vec<u64> = s.num_softirq.iter().map(|i| i.count()).collect();
    assert_eq!(
        soft,
        vec![0, 22107, 4, 7993, 41889, 0, 77, 37907, 0, 52439],
        "every softirq"
    );
    assert_eq!(s.num_softirq[9].irq(), 9);
    assert_eq!(s.num_forks(), 12412);
}

#[test]
fn sys_stats_fixture_psi_disk_buddy_and_sysfs_exact() {
    let s = one_tick(&all_periods(100));
    let psi: Vec<(i32, u64)> = s
        .psi
        .iter()
        .map(|p| (p.resource().value(), p.total_ns()))
        .collect();
    assert_eq!(
        psi,
        vec![
            (1, 17_005_037_000),
            (2, 0),
            (3, 3_064_294_000),
            (4, 1_374_118_000),
            (5, 0),
            (6, 0)
        ]
    );

    assert_eq!(s.disk_stat.len(), fixture_file("diskstats").lines().count());
    let vda = s
        .disk_stat
        .iter()
        .find(|d| d.device_name() == "vda")
        .expect("vda");
    assert_eq!(
        (
            vda.read_sectors(),
            vda.read_time_ms(),
            vda.write_sectors(),
            vda.write_time_ms(),
            vda.discard_sectors(),
            vda.discard_time_ms(),
            vda.flush_count(),
            vda.flush_time_ms()
        ),
        (2_095_882, 15511, 5_676_656, 43002, 365_752, 492, 122, 2)
    );

    let zones: Vec<(String, String, Vec<u32>)> = s
        .buddy_info
        .iter()
        .map(|b| {
            (
                b.node().to_string(),
                b.zone().to_string(),
                b.order_pages.clone(),
            )
        })
        .collect();
    assert_eq!(zones.len(), 3);
    assert_eq!(
        zones[0],
        (
            "0".into(),
            "DMA".into(),
            vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 3]
        )
    );
    assert_eq!(zones[2].1, "Normal");
    assert_eq!(zones[2].2[0], 16618);

    // The synthetic sysfs tree: cpu1 has no cpufreq and reads as 0.
    assert_eq!(s.cpufreq_khz, vec![2_400_000, 0]);
    let tz: Vec<(String, u64, String)> = s
        .thermal_zone
        .iter()
        .map(|z| (z.name().to_string(), z.temp(), z.type_().to_string()))
        .collect();
    assert_eq!(
        tz,
        vec![
            ("thermal_zone0".into(), 45, "x86_pkg_temp".into()),
            ("thermal_zone1".into(), 38, "acpitz".into())
        ]
    );
    assert_eq!(s.cpuidle_state.len(), 1);
    let idle = &s.cpuidle_state[0];
    let states: Vec<(String, u64)> = idle
        .cpuidle_state_entry
        .iter()
        .map(|e| (e.state().to_string(), e.duration_us()))
        .collect();
    assert_eq!(
        (idle.cpu_id(), states),
        (0, vec![("POLL".into(), 1234), ("C1".into(), 987_654)])
    );
    let devfreq: Vec<(String, u64)> = s
        .devfreq
        .iter()
        .map(|d| (d.key().to_string(), d.value()))
        .collect();
    assert_eq!(devfreq, vec![("gpu0".into(), 585_000_000)]);
}

#[test]
fn sys_stats_counter_filters_and_tick_multiples() {
    let opts = sys_spec(
        "meminfo_period_ms: 50 meminfo_counters: MEMINFO_MEM_TOTAL \
         meminfo_counters: MEMINFO_MEM_AVAILABLE vmstat_period_ms: 100 \
         vmstat_counters: VMSTAT_NR_FREE_PAGES stat_period_ms: 150 stat_counters: STAT_FORK_COUNT",
    )
    .expect("valid");
    let mut src = SysStatsSource::new(&opts, fixture(), SEQ).expect("valid");
    assert_eq!(src.schedule().map(|s| s.tick_ms), Some(50));
    let mut out: Vec<Vec<u8>> = Vec::new();
    for _ in 0..4 {
        src.write_tick(&mut out);
    }
    let ticks: Vec<SysStats> = decode(&out).iter().map(|p| p.sys_stats().clone()).collect();
    assert_eq!(ticks.len(), 4);
    let shape: Vec<(usize, usize, bool, usize)> = ticks
        .iter()
        .map(|s| {
            (
                s.meminfo.len(),
                s.vmstat.len(),
                s.has_num_forks(),
                s.cpu_stat.len(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (2, 1, true, 0),
            (2, 0, false, 0),
            (2, 1, false, 0),
            (2, 0, true, 0)
        ],
        "meminfo every tick, vmstat every 2nd, stat every 3rd, only the listed counters"
    );
    let keys: Vec<i32> = ticks[0].meminfo.iter().map(|m| m.key().value()).collect();
    assert_eq!(keys, vec![1, 3]);
    assert!(!ticks[0].has_num_irq_total());
}

#[test]
fn sys_stats_periods_that_are_not_multiples_are_refused() {
    // Validation raises 3 ms to 10 and refuses 25 ms beside it, by field path.
    let e = sys_spec("meminfo_period_ms: 3 psi_period_ms: 25").expect_err("refused");
    assert!(
        e.contains("sys_stats_config: every *_period_ms must be a multiple of the smallest (10 ms); 25 ms is not"),
        "{e}"
    );
    // The source keeps its own invariant for specs built by hand.
    let hand = SysStatsSpec {
        meminfo_period: Some(Duration::from_millis(10)),
        psi_period: Some(Duration::from_millis(25)),
        ..SysStatsSpec::default()
    };
    match SysStatsSource::new(&hand, fixture(), SEQ) {
        Err(SysStatsError::PeriodNotMultiple {
            field,
            period_ms,
            tick_ms,
        }) => assert_eq!((field, period_ms, tick_ms), ("psi_period_ms", 25, 10)),
        Ok(_) => panic!("25 ms is not a multiple of the 10 ms tick"),
    }
    let ok =
        Schedule::from_spec(&sys_spec("meminfo_period_ms: 3 psi_period_ms: 30").expect("valid"))
            .expect("valid")
            .expect("scheduled");
    assert_eq!(
        (ok.tick_ms, ok.every(Group::Meminfo), ok.every(Group::Psi)),
        (10, 1, 3)
    );
    // Nothing configured: nothing scheduled and no packet.
    let mut idle = SysStatsSource::new(&SysStatsSpec::default(), fixture(), SEQ).expect("valid");
    let mut out: Vec<Vec<u8>> = Vec::new();
    idle.write_tick(&mut out);
    assert!(out.is_empty());
}

/// Process and thread entries of several ProcessTree packets, by id.
#[derive(Default)]
struct Tree {
    processes: BTreeMap<i32, perfetto_protos::process_tree::process_tree::Process>,
    threads: BTreeMap<i32, perfetto_protos::process_tree::process_tree::Thread>,
}

fn tree_of(pkts: &[TracePacket]) -> Tree {
    let mut t = Tree::default();
    for p in pkts.iter().filter(|p| p.has_process_tree()) {
        let pt: &ProcessTree = p.process_tree();
        assert!(pt.collection_end_timestamp() >= p.timestamp());
        for proc_ in &pt.processes {
            assert!(
                t.processes.insert(proc_.pid(), proc_.clone()).is_none(),
                "pid {} twice",
                proc_.pid()
            );
        }
        for th in &pt.threads {
            assert!(
                t.threads.insert(th.tid(), th.clone()).is_none(),
                "tid {} twice",
                th.tid()
            );
        }
    }
    t
}

fn scan_all(record_thread_names: bool) -> (ProcessStatsSource, Vec<Vec<u8>>) {
    let opts = ProcessStatsSpec {
        scan_all_processes_on_start: true,
        record_thread_names,
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts, fixture(), SEQ);
    let mut out = Vec::new();
    src.write_all_processes(&mut out);
    (src, out)
}

#[test]
fn process_tree_fixture_scan_all_exact() {
    let (_, out) = scan_all(true);
    let pkts = decode(&out);
    assert_eq!(pkts.len(), 1);
    assert!(pkts.iter().all(|p| p.trusted_packet_sequence_id() == SEQ));
    let t = tree_of(&pkts);
    // The thread id present at the top level is not a process.
    assert_eq!(
        t.processes.keys().copied().collect::<Vec<_>>(),
        vec![2, 14, APP, NS_PARENT, NS_CHILD, ZOMBIE]
    );
    let app = &t.processes[&APP];
    assert_eq!(app.ppid(), 12267);
    assert_eq!(app.uid(), 0);
    assert_eq!(
        app.cmdline[1..],
        ["/tmp/fixture_app.Fv58IQ.py", "--mode=fixture", "two words"].map(String::from)
    );
    assert!(app.cmdline[0].ends_with("/bin/python3"));
    assert!(!app.cmdline_is_comm() && app.has_is_kthread() && !app.is_kthread());
    assert!(app.nspid.is_empty());

    let kthreadd = &t.processes[&2];
    assert_eq!(
        (
            kthreadd.cmdline.clone(),
            kthreadd.cmdline_is_comm(),
            kthreadd.is_kthread()
        ),
        (vec!["kthreadd".to_string()], true, true)
    );
    assert_eq!(t.processes[&14].ppid(), 2);
    assert_eq!(t.processes[&14].cmdline, vec!["ksoftirqd/0".to_string()]);

    let zombie = &t.processes[&ZOMBIE];
    assert_eq!(
        (
            zombie.cmdline.clone(),
            zombie.cmdline_is_comm(),
            zombie.is_kthread(),
            zombie.ppid()
        ),
        (vec!["python3".to_string()], true, false, APP)
    );

    let ns = &t.processes[&NS_CHILD];
    assert_eq!(
        (ns.ppid(), ns.nspid.clone(), ns.cmdline.clone()),
        (
            NS_PARENT,
            vec![1],
            vec!["sleep".to_string(), "60".to_string()]
        )
    );

    let names: Vec<(i32, i32, String)> = t
        .threads
        .values()
        .map(|th| (th.tid(), th.tgid(), th.name().to_string()))
        .collect();
    assert_eq!(
        names,
        vec![
            (THREAD_A, APP, "worker-a".into()),
            (THREAD_B, APP, "worker-b".into())
        ]
    );

    // Without record_thread_names the threads carry no name.
    let (_, out) = scan_all(false);
    let t = tree_of(&decode(&out));
    assert_eq!(t.threads.len(), 2);
    assert!(t.threads.values().all(|th| !th.has_name()));
}

#[test]
fn process_tree_splits_into_small_packets() {
    let (_, whole) = scan_all(true);
    let opts = ProcessStatsSpec {
        record_thread_names: true,
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts, fixture(), SEQ);
    src.set_soft_packet_limit(256);
    let mut out = Vec::new();
    src.write_all_processes(&mut out);
    assert!(out.len() >= 2, "{} packets", out.len());
    assert!(
        out.iter().all(|p| p.len() <= 256),
        "{:?}",
        out.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let (a, b) = (tree_of(&decode(&whole)), tree_of(&decode(&out)));
    assert_eq!(a.processes, b.processes);
    assert_eq!(a.threads, b.threads);
    assert_eq!(src.counters().tree_packets, out.len() as u64);
}

#[test]
fn on_demand_pids_are_written_once_until_cleared() {
    let opts = ProcessStatsSpec {
        record_thread_names: true,
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts.clone(), fixture(), SEQ);
    let mut out = Vec::new();
    // A thread id: its process comes first, then the thread; 0 and unknown
    // pids are ignored.
    src.on_pids_seen(&[THREAD_A, 0, 999_999, THREAD_A], &mut out);
    let pkts = decode(&out);
    assert_eq!(pkts.len(), 1);
    let t = tree_of(&pkts);
    assert_eq!(t.processes.keys().copied().collect::<Vec<_>>(), vec![APP]);
    assert_eq!(t.threads[&THREAD_A].name(), "worker-a");
    assert_eq!(t.threads[&THREAD_A].tgid(), APP);
    assert!(!pkts[0].incremental_state_cleared());

    // Already seen: nothing. The main thread's pid counts as its process.
    out.clear();
    src.on_pids_seen(&[THREAD_A, APP], &mut out);
    assert!(out.is_empty());

    // A new thread of a known process: only the thread.
    src.on_pids_seen(&[THREAD_B], &mut out);
    let t = tree_of(&decode(&out));
    assert!(t.processes.is_empty());
    assert_eq!(
        t.threads.keys().copied().collect::<Vec<_>>(),
        vec![THREAD_B]
    );

    // After a clear everything is new again, and the packet says so.
    out.clear();
    src.clear_incremental_state();
    src.on_pids_seen(&[APP], &mut out);
    let pkts = decode(&out);
    assert_eq!(pkts.len(), 1);
    assert!(pkts[0].incremental_state_cleared());
    assert_eq!(tree_of(&pkts).processes.len(), 1);

    // DISABLE_ON_DEMAND: reported pids are ignored.
    let mut off = ProcessStatsSource::new(
        ProcessStatsSpec {
            disable_on_demand: true,
            ..opts
        },
        fixture(),
        SEQ,
    );
    out.clear();
    off.on_pids_seen(&[APP, THREAD_A], &mut out);
    assert!(out.is_empty());
}

fn stats_of(
    pkts: &[TracePacket],
) -> BTreeMap<i32, perfetto_protos::process_stats::process_stats::Process> {
    let mut m = BTreeMap::new();
    for p in pkts.iter().filter(|p| p.has_process_stats()) {
        assert!(p.process_stats().collection_end_timestamp() >= p.timestamp());
        for pr in &p.process_stats().processes {
            assert!(m.insert(pr.pid(), pr.clone()).is_none());
        }
    }
    m
}

#[test]
fn process_stats_poll_fixture_exact_and_cached() {
    let opts = ProcessStatsSpec {
        poll_period: Some(Duration::from_millis(100)),
        cache_ttl: Some(Duration::from_millis(10_000)),
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts, fixture(), SEQ);
    let mut out = Vec::new();
    src.write_process_stats(&mut out);
    let pkts = decode(&out);
    // Kernel threads and the zombie have no memory counters.
    let stats = stats_of(&pkts);
    assert_eq!(
        stats.keys().copied().collect::<Vec<_>>(),
        vec![APP, NS_PARENT, NS_CHILD]
    );
    let u = &stats[&NS_PARENT];
    assert_eq!(
        (
            u.vm_size_kb(),
            u.vm_rss_kb(),
            u.rss_anon_kb(),
            u.rss_file_kb(),
            u.rss_shmem_kb(),
            u.vm_swap_kb(),
            u.vm_locked_kb(),
            u.vm_hwm_kb(),
            u.oom_score_adj()
        ),
        (2960, 1844, 108, 1736, 0, 0, 0, 1844, 0)
    );
    assert!(
        u.has_vm_swap_kb() && u.has_oom_score_adj(),
        "zero values are written the first time"
    );
    assert_eq!(stats[&APP].vm_size_kb(), 164_060);
    // The poll also writes the tree of processes not seen yet (all of them).
    let t = tree_of(&pkts);
    assert_eq!(
        t.processes.keys().copied().collect::<Vec<_>>(),
        vec![APP, NS_PARENT, NS_CHILD]
    );
    assert!(
        pkts[0].has_process_stats(),
        "stats come before the tree entries"
    );

    // Nothing changed and the cache is fresh: no packet at all.
    out.clear();
    src.write_process_stats(&mut out);
    assert!(out.is_empty(), "{} packets", out.len());

    // A cache that lives one poll: every counter again, no tree.
    let mut every = ProcessStatsSource::new(
        ProcessStatsSpec {
            poll_period: Some(Duration::from_millis(100)),
            ..ProcessStatsSpec::default()
        },
        fixture(),
        SEQ,
    );
    every.write_process_stats(&mut out);
    out.clear();
    every.write_process_stats(&mut out);
    let pkts = decode(&out);
    assert_eq!(stats_of(&pkts).len(), 3);
    assert!(pkts.iter().all(|p| !p.has_process_tree()));
}

#[test]
fn the_loop_driven_source_runs_process_stats_on_the_fixture() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use recorder::sources::DataSource;
    use recorder::sources::polled::{PidRoute, PolledDataSource};
    let opts = ProcessStatsSpec {
        scan_all_processes_on_start: true,
        poll_period: Some(Duration::from_millis(3_600_000)),
        ..ProcessStatsSpec::default()
    };
    let buffer = Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("buffer");
    let route = PidRoute::default();
    let mut src = PolledDataSource::new(
        "linux.process_stats",
        ProcessStatsSource::new(opts, fixture(), SEQ),
        buffer.writer(WriterId(SEQ)),
    )
    .route_pids(route.clone());
    assert_eq!(src.next_due(), None, "nothing before the start");
    src.start().expect("start");
    // The next tick is the next wall-clock multiple of the hour: not now,
    // and within the period (close to it only just before a whole hour).
    let next = src.next_due().expect("the next tick");
    let now = std::time::Instant::now();
    assert!(
        next > now && next <= now + Duration::from_secs(3600),
        "{:?}",
        next - now
    );
    src.flush(Duration::from_secs(60)).expect("flush");
    src.clear_incremental_state();
    // A pid ftrace saw makes the source due at once.
    route.push(&[APP]);
    let due = src.next_due().expect("due");
    assert!(due <= std::time::Instant::now());
    src.run(std::time::Instant::now(), false).expect("run");
    src.stop().expect("stop");
    let mut out = Vec::new();
    for item in buffer.take_flush().items() {
        if let FlushItem::Data(d) = item {
            out.extend(recorder::wire::framing::frames(d).map(|f| f.packet.to_vec()));
        }
    }
    let pkts = decode(&out);
    // Start dump, then the first poll (stats only: every pid is seen), then
    // after the clear the whole tree again (scan_all_processes_on_start: a
    // reader starting there, a new segment, needs it), which already holds
    // the pid seen next.
    assert!(pkts[0].has_process_tree());
    assert_eq!(tree_of(&pkts[..1]).processes.len(), 6);
    assert!(pkts[1].has_process_stats());
    let last = pkts.last().expect("packets");
    assert!(last.incremental_state_cleared());
    assert_eq!(last.process_tree().processes.len(), 6);
    assert!(last.process_tree().processes.iter().any(|p| p.pid() == APP));
}

#[test]
fn real_proc_tree_has_this_process_and_its_threads() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::Builder::new()
        .name("procfs-probe".into())
        .spawn(move || {
            let _ = rx.recv();
        })
        .expect("spawn");
    // The new thread names itself once it runs: wait for that before scanning.
    let named = || {
        std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "procfs-probe")
            })
    };
    crate::harness::poll(std::time::Duration::from_secs(5), || named().then_some(()));
    let opts = ProcessStatsSpec {
        scan_all_processes_on_start: true,
        record_thread_names: true,
        poll_period: Some(Duration::from_millis(100)),
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts, HostPaths::default(), SEQ);
    let mut out = Vec::new();
    src.write_all_processes(&mut out);
    let pkts = decode(&out);
    let t = tree_of(&pkts);
    let me = std::process::id() as i32;
    let p = t.processes.get(&me).expect("this process is in the tree");
    let args: Vec<String> = std::env::args().filter(|a| !a.is_empty()).collect();
    assert_eq!(p.cmdline, args);
    assert!(!p.is_kthread());
    let probe = t
        .threads
        .values()
        .find(|th| th.name() == "procfs-probe")
        .expect("the named thread");
    assert_eq!(probe.tgid(), me);
    assert!(t.processes.get(&2).is_none_or(|k| k.is_kthread()));

    out.clear();
    src.write_process_stats(&mut out);
    let stats = stats_of(&decode(&out));
    assert!(stats.get(&me).expect("this process is polled").vm_rss_kb() > 0);
    let _ = tx.send(());
    worker.join().expect("joins");
}

#[test]
fn real_sys_stats_tick_decodes() {
    let mut src = SysStatsSource::new(&all_periods(10), HostPaths::default(), SEQ).expect("valid");
    let mut out: Vec<Vec<u8>> = Vec::new();
    src.write_tick(&mut out);
    let s = decode(&out)[0].sys_stats().clone();
    assert!(
        s.meminfo
            .iter()
            .any(|m| m.key().value() == 1 && m.value() > 0),
        "MemTotal"
    );
    assert!(!s.vmstat.is_empty());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(s.cpu_stat.len() >= cpus, "one CpuTimes per online CPU");
    assert!(s.num_forks() > 0);
}

/// The packets a buffer holds, decoded by the independent decoder.
fn drain_buffer(buffer: &std::sync::Arc<recorder::ringbuf::Buffer>) -> Vec<TracePacket> {
    use recorder::ringbuf::FlushItem;
    let batch = buffer.take_flush();
    let mut file = Vec::new();
    for item in batch.items() {
        if let FlushItem::Data(d) = item {
            file.extend_from_slice(d);
        }
    }
    batch.release();
    perfetto_protos::trace::Trace::parse_from_bytes(&file)
        .expect("the independent decoder reads the buffer")
        .packet
}

/// `DataSource::clear_incremental_state` on the running process_stats
/// source (as the session calls it every `clear_period_ms`): the next packet
/// carries `incremental_state_cleared`, and from it on a reader that lost
/// everything before has the whole tree again (every live process with its
/// cmdline) and every counter, not only those that changed; pids ftrace
/// reports are dumped again.
#[test]
fn process_stats_clear_through_the_data_source_trait() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
    use recorder::sources::DataSource;
    use recorder::sources::polled::PolledDataSource;

    let buffer = Buffer::new(BufferParams::new(4 << 20, FillPolicy::RingBuffer)).expect("buffer");
    let spec = ProcessStatsSpec {
        scan_all_processes_on_start: true,
        poll_period: Some(Duration::from_millis(100)),
        cache_ttl: Some(Duration::from_secs(3600)),
        ..ProcessStatsSpec::default()
    };
    let src = ProcessStatsSource::new(spec, fixture(), SEQ);
    let mut ds = PolledDataSource::new("linux.process_stats", src, buffer.writer(WriterId(SEQ)));
    // The loop's part, without waiting: each run at the time it asks for.
    let ticks = |ds: &mut PolledDataSource<ProcessStatsSource>| {
        for _ in 0..2 {
            let due = ds.next_due().expect("a next tick");
            ds.run(due, false).expect("tick");
        }
    };
    ds.clear_incremental_state(); // before start: nothing to forget
    ds.start().expect("start");
    ticks(&mut ds);
    ds.flush(Duration::from_secs(10)).expect("flush");
    ds.clear_incremental_state();
    ticks(&mut ds);
    ds.flush(Duration::from_secs(10)).expect("flush");
    // Stopping hands the writer's last chunk to the buffer.
    ds.stop().expect("stop");
    let after = drain_buffer(&buffer);
    let first = after
        .iter()
        .position(|p| p.incremental_state_cleared())
        .expect("a packet says the state was cleared");
    assert_eq!(
        after
            .iter()
            .filter(|p| p.incremental_state_cleared())
            .count(),
        1
    );
    let before = &after[..first];
    assert!(
        before.iter().any(|p| p.has_process_stats()),
        "polls before the clear"
    );
    assert_eq!(tree_of(before).processes.len(), 6);
    let tail = &after[first..];
    let tree = tree_of(tail);
    // With scan_all_processes_on_start the clear rescans like the start did,
    // so a segment that begins here is self-contained: kernel threads and
    // the zombie included, each once.
    assert_eq!(
        tree.processes.keys().copied().collect::<Vec<_>>(),
        tree_of(before)
            .processes
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        "the whole tree again after the clear"
    );
    assert!(tree.processes.values().all(|p| !p.cmdline.is_empty()));
    // The first poll after the clear: every process with memory counters,
    // every counter, not only those that changed.
    let polls = tail
        .iter()
        .skip_while(|p| !p.has_process_stats())
        .take_while(|p| p.has_process_stats())
        .cloned()
        .collect::<Vec<_>>();
    let stats = stats_of(&polls);
    assert_eq!(
        stats.keys().copied().collect::<Vec<_>>(),
        vec![APP, NS_PARENT, NS_CHILD],
        "a poll after the clear"
    );
    assert!(
        stats.values().all(|p| p.has_vm_rss_kb()),
        "every counter again, not only changed ones"
    );
    assert!(tail.iter().all(|p| p.trusted_packet_sequence_id() == SEQ));
}

/// `record_process_age`, `record_process_runtime` and `scan_smaps_rollup`
/// on the real /proc: this process's tree entry has its start time, and
/// its stats its CPU times and proportional set sizes.
#[test]
fn real_proc_age_runtime_and_smaps_rollup() {
    let spec = ProcessStatsSpec {
        scan_all_processes_on_start: true,
        poll_period: Some(Duration::from_millis(100)),
        record_process_age: true,
        record_process_runtime: true,
        scan_smaps_rollup: true,
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(spec, HostPaths::default(), SEQ);
    let mut out = Vec::new();
    src.write_all_processes(&mut out);
    // Some CPU time to count.
    let mut x = 0u64;
    for i in 0..5_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    std::hint::black_box(x);
    src.write_process_stats(&mut out);
    let pkts = decode(&out);
    let me = std::process::id() as i32;
    let now = recorder::clock::boottime_ns();
    let start = tree_of(&pkts).processes[&me].process_start_from_boot();
    assert!(start > 0 && start < now, "start {start} now {now}");
    let stats = stats_of(&pkts);
    let s = &stats[&me];
    assert!(s.runtime_user_mode() + s.runtime_kernel_mode() > 0);
    assert!(s.smr_rss_kb() > 0 && s.smr_pss_kb() <= s.smr_rss_kb());
    assert!(s.has_smr_pss_anon_kb() && s.has_smr_pss_file_kb() && s.has_smr_swap_pss_kb());
    // Without the options, none of it.
    let mut plain = ProcessStatsSource::new(
        ProcessStatsSpec {
            scan_all_processes_on_start: true,
            poll_period: Some(Duration::from_millis(100)),
            ..ProcessStatsSpec::default()
        },
        HostPaths::default(),
        SEQ,
    );
    let mut out = Vec::new();
    plain.write_all_processes(&mut out);
    plain.write_process_stats(&mut out);
    let pkts = decode(&out);
    assert!(!tree_of(&pkts).processes[&me].has_process_start_from_boot());
    let s = &stats_of(&pkts)[&me];
    assert!(!s.has_runtime_user_mode() && !s.has_smr_rss_kb());
}

/// The fixture's processes, memory counters and system counters as trace
/// processor reads them from the packets the sources wrote: the tables hold
/// the fixture's values (pids, parents, command lines, thread names, kB as
/// bytes, meminfo, vmstat, CPU times, forks).
#[test]
fn fixture_packets_read_the_same_in_trace_processor() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_, mut out) = scan_all(true);
    let mut src = ProcessStatsSource::new(
        ProcessStatsSpec {
            poll_period: Some(Duration::from_millis(100)),
            ..ProcessStatsSpec::default()
        },
        fixture(),
        SEQ + 1,
    );
    src.write_process_stats(&mut out);
    let mut sys = SysStatsSource::new(&all_periods(100), fixture(), SEQ + 2).expect("valid");
    sys.write_tick(&mut out);
    let Some(tp) = trace_processor::open_packets(dir.path(), "fixture.pftrace", &out) else {
        return;
    };
    let pkts = decode(&out);
    assert!(tp.assert_no_errors().is_empty());
    trace_processor::assert_process_view(&tp, &pkts);
    assert!(trace_processor::assert_sys_stats_view(&tp, &pkts) > 50);
    // Spot values straight from the fixture files.
    let one = |sql: &str| tp.query(sql).scalar().int();
    assert_eq!(
        one(
            "select max(c.value) from counter c join counter_track t on c.track_id = t.id \
             where t.name = 'MemTotal'"
        ),
        24_683_584 * 1024
    );
    assert_eq!(
        one(&format!(
            "select c.value from counter c join process_counter_track t on c.track_id = t.id \
             join process using (upid) where pid = {NS_PARENT} and t.name = 'mem.virt'"
        )),
        2960 * 1024
    );
    assert_eq!(
        one(&format!(
            "select count(*) from thread t join process p using (upid) \
             where p.pid = {APP} and t.name in ('worker-a', 'worker-b')"
        )),
        2
    );
}
