//! The fleet recipe end to end: two recorder sessions standing in for two
//! machines (each in its own UTS namespace, so their sidecars carry
//! different host names) ship their closed segments with
//! `scripts/ship_segment.sh` (rclone, to a local remote) into one store laid
//! out HOST/BOOT/SESSION/; `recorder inspect` checks the store, `recorder
//! index --unshipped` finds what a failed hook left behind, and one
//! scheduling question is asked of every host at once with Perfetto's
//! BatchTraceProcessor (`scripts/fleet_query.py`), its answers checked
//! segment by segment with trace processor.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::harness::*;
use serde_json::Value;

const HOSTS: [&str; 2] = ["fleet-a", "fleet-b"];

/// Scheduling for ~4 s in segments of ~1 s: at least three closed segments
/// each, with a second to spare for a loaded machine's late rotations.
fn config() -> String {
    crate::harness::ftrace::sched_stream_config(4300)
}

/// The longest runnable wait of one trace, as the script asks it.
const RUNNABLE: &str = "select max(dur) as wait from thread_state \
                        where state in ('R', 'R+') and dur > 0";

/// Why the recipe cannot run here, if it cannot.
fn missing_parts() -> Option<need::Missing> {
    let runs = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    need::root()
        .or_else(|| {
            (!Path::new("/sys/kernel/tracing/events/sched/sched_switch").exists())
                .then(|| need::Missing::kernel("no tracefs"))
        })
        .or_else(|| {
            (!runs("unshare", &["--uts", "true"]))
                .then(|| need::Missing::kernel("unshare --uts fails"))
        })
        .or_else(rclone)
        .or_else(|| {
            (!runs(
                "python3",
                &["-c", "import pandas, perfetto.batch_trace_processor.api"],
            ))
            .then(|| {
                need::Missing::kernel("no Python perfetto and pandas (pip install perfetto pandas)")
            })
        })
}

/// Busy loops, so threads wait runnable while the hosts record.
struct Load(Vec<Child>);

impl Load {
    fn start(n: usize) -> Load {
        Load(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Fleet {
    dir: tempfile::TempDir,
    store: PathBuf,
    rclone_conf: PathBuf,
}

impl Fleet {
    fn new() -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).expect("store");
        // A named remote, as a user's S3 bucket would be; here a local one.
        let rclone_conf = dir.path().join("rclone.conf");
        std::fs::write(&rclone_conf, "[fleet]\ntype = local\n").expect("rclone.conf");
        std::fs::write(dir.path().join("fleet.cfg"), config()).expect("cfg");
        Fleet {
            dir,
            store,
            rclone_conf,
        }
    }

    fn out(&self, host: &str) -> PathBuf {
        self.dir.path().join(format!("out-{host}"))
    }

    /// The rclone destination of the store.
    fn dest(&self) -> String {
        format!("fleet:{}", self.store.display())
    }

    /// A command with what the shipping script needs.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("RCLONE_CONFIG", &self.rclone_conf)
            .env("RECORDER", recorder_bin());
        c
    }

    /// Records as `host` (its own UTS namespace), shipping with `hook`.
    fn record(&self, host: &str, hook: &str) -> Child {
        let mut c = self.command("unshare");
        c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", host])
            .arg(recorder_bin())
            .arg("--config")
            .arg(self.dir.path().join("fleet.cfg"))
            .arg("-o")
            .arg(self.out(host).join(""))
            .args(["--rotate-period", "1s", "--on-segment-closed", hook])
            .env(
                "RECORDER_RUNTIME_DIR",
                self.dir.path().join(format!("run-{host}")),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c.spawn().expect("unshare runs")
    }

    fn recorder(&self, args: &[&str], paths: &[&Path]) -> Output {
        let mut c = self.command(recorder_bin());
        c.args(args).args(paths);
        c.output().expect("recorder runs")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The closed segments a session left in its output directory.
fn closed_segments(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("out dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("trace-") && n.ends_with(".pftrace"))
        .collect()
}

fn rows(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// rclone, which `scripts/ship_segment.sh` ships with.
fn rclone() -> Option<need::Missing> {
    need::present(
        need::runs("rclone", &["version"]),
        "no rclone (apt-get install rclone)",
    )
}

#[test]
fn two_hosts_ship_into_one_store_and_answer_one_question() {
    // Trace processor is a peer the repository cannot carry; the rest is
    // the machine's.
    require!(missing_parts(), need::trace_processor());
    let fleet = Fleet::new();
    let script = repo_root().join("scripts/ship_segment.sh");
    let ship = format!("{} {}", script.display(), fleet.dest());
    // The second host's hook fails once (its network was down, say).
    let flaky =
        format!("f() {{ [ \"$RECORDER_SEGMENT_INDEX\" = 1 ] && return 75; {ship} \"$1\"; }}; f");
    let sessions = {
        let _load = Load::start(2);
        let a = fleet.record(HOSTS[0], &ship);
        let b = fleet.record(HOSTS[1], &flaky);
        [a, b].map(|c| c.wait_with_output().expect("waits"))
    };
    for (host, out) in HOSTS.iter().zip(&sessions) {
        assert!(out.status.success(), "{host}: {}", text(&out.stderr));
    }
    let local: BTreeMap<&str, BTreeSet<String>> = HOSTS
        .iter()
        .map(|h| (*h, closed_segments(&fleet.out(h))))
        .collect();
    for (h, segs) in &local {
        assert!(segs.len() >= 3, "{h}: {segs:?}");
    }

    // The store is checked: the failed hook's segment is named missing.
    let inspect = fleet.recorder(&["inspect"], &[&fleet.store]);
    let report = text(&inspect.stdout);
    assert_eq!(inspect.status.code(), Some(1), "{report}");
    let gap = report
        .lines()
        .find(|l| l.trim_start().starts_with("missing"))
        .unwrap_or_else(|| panic!("no missing segment named:\n{report}"));
    assert!(
        gap.contains(&format!("{}/", HOSTS[1])) && gap.contains("trace-000001.pftrace"),
        "{gap}"
    );

    // Shipping resumes from the sidecars: what the store lacks, shipped by hand.
    let out_b = fleet.out(HOSTS[1]);
    let left = fleet.recorder(
        &["index", "--format", "{path}", "--unshipped"],
        &[&fleet.store, &out_b],
    );
    assert!(left.status.success(), "{}", text(&left.stderr));
    assert_eq!(text(&left.stdout), "trace-000001.pftrace\n");
    let resumed = fleet
        .command(&script)
        .arg(fleet.dest())
        .arg(out_b.join("trace-000001.pftrace"))
        .output()
        .expect("ships");
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    // Shipping again changes nothing (retries are safe).
    let again = fleet
        .command(&script)
        .arg(fleet.dest())
        .arg(out_b.join("trace-000001.pftrace"))
        .output()
        .expect("ships");
    assert!(again.status.success(), "{}", text(&again.stderr));
    for host in HOSTS {
        let left = fleet.recorder(&["index", "--unshipped"], &[&fleet.store, &fleet.out(host)]);
        assert!(left.status.success(), "{}", text(&left.stderr));
        assert_eq!(text(&left.stdout), "", "{host}: nothing left to ship");
    }
    let inspect = fleet.recorder(&["inspect"], &[&fleet.store]);
    let report = text(&inspect.stdout);
    assert!(
        inspect.status.success(),
        "{report}{}",
        text(&inspect.stderr)
    );
    assert!(report.contains("sessions from 2 hosts"), "{report}");
    let json = fleet.recorder(&["inspect", "--json"], &[&fleet.store]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let doc: Value = serde_json::from_slice(&json.stdout).expect("one JSON document");

    // The index: every copy ok, laid out HOST/BOOT/SESSION/, one row per
    // segment each host closed, matching its local sidecar.
    let index = fleet.recorder(&["index"], &[&fleet.store]);
    assert!(index.status.success(), "{}", text(&index.stderr));
    let table = rows(&index);
    assert_eq!(
        doc["rows"].as_array(),
        Some(&table),
        "inspect --json, index: one table"
    );
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in &table {
        assert_eq!(r["status"], "ok", "{r}");
        let host = r["host"].as_str().expect("host");
        let path = r["path"].as_str().expect("path");
        assert_eq!(r["store_path"].as_str(), Some(path));
        let want = format!(
            "{host}/{}/{}/",
            r["boot_id"].as_str().expect("boot"),
            r["session_uuid"].as_str().expect("session")
        );
        assert!(path.starts_with(&want), "{path}");
        let file = path.rsplit('/').next().expect("file");
        let car: Value = serde_json::from_slice(
            &std::fs::read(fleet.out(host).join(format!("{file}.json"))).expect("local sidecar"),
        )
        .expect("json");
        assert_eq!(r["sha256"], car["sha256"]);
        assert!(r["first_realtime_ns"].as_u64().is_some(), "{r}");
        seen.entry(host.to_string())
            .or_default()
            .insert(file.to_string());
    }
    let local_named: BTreeMap<String, BTreeSet<String>> = local
        .iter()
        .map(|(h, s)| (h.to_string(), s.clone()))
        .collect();
    assert_eq!(seen, local_named);

    // A damaged copy is named corrupt (then put back).
    let victim = fleet.store.join(table[0]["path"].as_str().expect("path"));
    let good = std::fs::read(&victim).expect("read");
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&victim, &bad).expect("write");
    let inspect = fleet.recorder(&["inspect"], &[&fleet.store]);
    let report = text(&inspect.stdout);
    assert_eq!(inspect.status.code(), Some(1), "{report}");
    assert!(
        report.lines().any(|l| l.trim_start().starts_with("corrupt")
            && l.contains(table[0]["path"].as_str().expect("path"))),
        "{report}"
    );
    std::fs::write(&victim, &good).expect("restore");

    // One question of every host, from the time the later host's second
    // segment began: segments ending before it are not opened.
    let from = HOSTS
        .iter()
        .map(|h| {
            table
                .iter()
                .find(|r| r["host"] == *h && r["index"] == 1)
                .and_then(|r| r["first_realtime_ns"].as_u64())
                .expect("segment 1")
        })
        .max()
        .expect("hosts");
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &table {
        if r["last_realtime_ns"].as_u64().expect("last") >= from {
            want.entry(r["host"].as_str().expect("host").to_string())
                .or_default()
                .push(r["path"].as_str().expect("path").to_string());
        }
    }
    let index_file = fleet.dir.path().join("index.jsonl");
    std::fs::write(&index_file, &index.stdout).expect("index");
    let answer = Command::new("python3")
        .arg(repo_root().join("scripts/fleet_query.py"))
        .arg(&fleet.store)
        .arg(&index_file)
        .args(["--from", &from.to_string(), "--json", "--trace-processor"])
        .arg(trace_processor::query_program())
        .output()
        .expect("python3 runs");
    assert!(answer.status.success(), "{}", text(&answer.stderr));
    let answer: Value = serde_json::from_slice(&answer.stdout).expect("json");
    let hosts = answer["hosts"].as_array().expect("hosts");
    // The table for people, of one host.
    let table_a = Command::new("python3")
        .arg(repo_root().join("scripts/fleet_query.py"))
        .arg(&fleet.store)
        .arg(&index_file)
        .args([
            "--from",
            &from.to_string(),
            "--host",
            HOSTS[0],
            "--trace-processor",
        ])
        .arg(trace_processor::query_program())
        .output()
        .expect("python3 runs");
    assert!(table_a.status.success(), "{}", text(&table_a.stderr));
    let lines: Vec<String> = text(&table_a.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 2, "a header and fleet-a: {lines:?}");
    let ms = hosts[0]["longest_runnable_ns"].as_f64().expect("ns") / 1e6;
    assert!(
        lines[1].starts_with(HOSTS[0]) && lines[1].contains(&format!("{ms:.3} ms")),
        "{lines:?}"
    );
    assert_eq!(hosts.len(), 2, "{answer}");
    for (h, (host, paths)) in hosts.iter().zip(&want) {
        assert_eq!(h["host"].as_str(), Some(host.as_str()));
        let mut picked: Vec<String> = h["paths"]
            .as_array()
            .expect("paths")
            .iter()
            .map(|p| p.as_str().expect("path").to_string())
            .collect();
        picked.sort();
        assert_eq!(&picked, paths, "{host}: the segments picked by time");
        assert!(
            paths.len() < local[host.as_str()].len(),
            "{host}: {paths:?}"
        );
        // The same question of each segment alone, in trace processor.
        let mut longest = 0;
        for p in paths {
            let tp = trace_processor::open(&fleet.store.join(p)).expect("tp");
            longest = longest.max(tp.query(RUNNABLE).scalar().opt_int().unwrap_or(0));
        }
        assert!(longest > 0, "{host}: threads waited runnable under load");
        assert_eq!(h["longest_runnable_ns"].as_i64(), Some(longest), "{h}");
        assert!(
            paths.contains(&h["path"].as_str().expect("path").to_string()),
            "{h}"
        );
    }
}

#[test]
fn a_budget_faster_than_the_shipper_leaves_named_gaps_never_torn_copies() {
    require!(rclone());
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 1500",
        "message_count: 0 message_size: 100 max_messages_per_second: 2000",
    ));
    let fleet = Fleet::new();
    let out = run.dir.path().join("segs");
    let script = repo_root().join("scripts/ship_segment.sh");
    // Each shipping starts after the budget (one closed segment kept while
    // recording) has deleted its segment, but for the first and the last
    // two: the first command's second holds the next back until two more
    // segments have closed (at 500 ms) with half a second to spare. (With
    // 0.4 s the next could start as the third closed: once, on a loaded
    // machine, no segment was deleted before its command.)
    let hook = format!("sleep 1; {} {}", script.display(), fleet.dest());
    let mut c = run.command_to("pwritev", &out.join(""));
    c.args(["--rotate-period", "250ms", "--max-segments", "2"])
        .args(["--on-segment-closed", &hook])
        .env("RCLONE_CONFIG", &fleet.rclone_conf)
        .env("RECORDER", recorder_bin());
    let o = c.output().expect("runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let kept = closed_segments(&out);
    assert_eq!(kept.len(), 2, "{kept:?}");

    let index = fleet.recorder(&["index"], &[&fleet.store]);
    assert_eq!(index.status.code(), Some(1), "{}", text(&index.stderr));
    let table = rows(&index);
    let mut shipped = BTreeSet::new();
    let mut gaps = 0;
    for r in &table {
        match r["status"].as_str() {
            Some("ok") => {
                let path = r["path"].as_str().expect("path");
                shipped.insert(path.rsplit('/').next().expect("file").to_string());
            }
            // Deleted before its command's turn: not run, and the store
            // names the gap.
            Some("missing") => {
                assert!(
                    r["problem"].as_str().is_some_and(|p| p.contains("neither")),
                    "{r}"
                );
                gaps += 1;
            }
            _ => panic!("no torn or unchecked copy: {r}"),
        }
    }
    assert!(gaps > 0, "{table:?}");
    assert!(shipped.is_superset(&kept), "{shipped:?} {kept:?}");
    let left = fleet.recorder(&["index", "--unshipped"], &[&fleet.store, &out]);
    assert!(left.status.success(), "{}", text(&left.stderr));
    assert_eq!(text(&left.stdout), "");
}

#[test]
fn a_user_who_can_write_to_the_store_cannot_hang_or_fool_its_check() {
    use std::os::unix::fs::PermissionsExt;
    require!(need::attacker());
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 300",
        "message_count: 0 message_size: 100 max_messages_per_second: 1000",
    ));
    let out = run.dir.path().join("segs");
    let o = run
        .command_to("pwritev", &out.join(""))
        .args(["--rotate-period", "1s"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A shared upload area: anyone may write, as on a collection host.
    let fleet = Fleet::new();
    let perm = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    perm(fleet.dir.path(), 0o755);
    perm(&fleet.store, 0o1777);
    let good = fleet.store.join("good");
    std::fs::create_dir_all(&good).expect("mkdir");
    for f in ["trace-000000.pftrace", "trace-000000.pftrace.json"] {
        std::fs::copy(out.join(f), good.join(f)).expect("copy");
        perm(&good.join(f), 0o644);
    }
    // As nobody: a fifo named as a segment, a directory loop, a link to a
    // file only root may read, a 4 MB "sidecar", and a sidecar whose host
    // name clears the terminal.
    let plant = format!(
        "set -e; mkdir -p {s}/evil; cd {s}/evil; mkfifo trace-000000.pftrace; ln -s .. loop; \
         ln -s /etc/shadow trace-000001.pftrace; head -c 4000000 /dev/zero > trace-000002.pftrace.json; \
         cp {g}/trace-000000.pftrace trace-000003.pftrace; \
         sed 's/\"host\": \"[^\"]*\"/\"host\": \"\\\\u001b[2J\"/' {g}/trace-000000.pftrace.json > trace-000003.pftrace.json",
        s = fleet.store.display(),
        g = good.display()
    );
    plant_as_nobody(&plant);
    assert!(
        std::fs::read_to_string(fleet.store.join("evil/trace-000003.pftrace.json"))
            .expect("planted")
            .contains("\\u001b[2J"),
        "the escape is in the sidecar"
    );

    for args in [&["inspect"][..], &["index"][..]] {
        let mut c = fleet.command(recorder_bin());
        c.args(args).arg(&fleet.store);
        let o = output_within_named(
            &mut c,
            std::time::Duration::from_secs(20),
            "checking a planted store",
        );
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        assert!(
            !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
            "{args:?}: {stdout:?}"
        );
        assert!(
            !stdout.contains("loop/"),
            "{args:?}: the loop is not followed"
        );
        if args == ["index"] {
            let table = rows(&o);
            let status = |path: &str| {
                table
                    .iter()
                    .find(|r| r["path"] == path)
                    .map(|r| r["status"].as_str().expect("status").to_string())
            };
            assert_eq!(status("good/trace-000000.pftrace").as_deref(), Some("ok"));
            // Not a sidecar; the link is never read (a gap); the fifo is no
            // segment (its index is the good copy's).
            assert_eq!(
                status("evil/trace-000002.pftrace").as_deref(),
                Some("corrupt")
            );
            assert_eq!(
                status("evil/trace-000001.pftrace").as_deref(),
                Some("missing")
            );
            assert_eq!(status("evil/trace-000000.pftrace"), None);
            // A copy of good's segment under another name: its sidecar
            // describes another file.
            assert_eq!(
                status("evil/trace-000003.pftrace").as_deref(),
                Some("corrupt")
            );
        }
    }
}

#[test]
fn after_a_crash_the_sidecars_say_what_is_left_to_ship() {
    require!(rclone());
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 20000",
        "message_count: 0 message_size: 100 max_messages_per_second: 2000",
    ));
    let fleet = Fleet::new();
    let out = run.dir.path().join("segs");
    let script = repo_root().join("scripts/ship_segment.sh");
    // A shipper slower than the session lives: nothing is shipped before the crash.
    let hook = format!("sleep 30; {} {}", script.display(), fleet.dest());
    let mut child = run
        .command_to("pwritev", &out.join(""))
        .args(["--rotate-period", "200ms", "--on-segment-closed", &hook])
        .env("RCLONE_CONFIG", &fleet.rclone_conf)
        .env("RECORDER", recorder_bin())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    // Three closed segments, or whatever there is after 15 s.
    poll(std::time::Duration::from_secs(15), || {
        (out.is_dir() && closed_segments(&out).len() >= 3).then_some(())
    });
    signal(&child, rustix::process::Signal::KILL);
    let _ = child.wait();
    let closed = closed_segments(&out);
    assert!(closed.len() >= 3, "{closed:?}");

    // The closed segments, found from their sidecars; not the one being
    // written (no sidecar: it never closed).
    let left = fleet.recorder(
        &["index", "--format", "{path}", "--unshipped"],
        &[&fleet.store, &out],
    );
    assert!(left.status.success(), "{}", text(&left.stderr));
    let listed: BTreeSet<String> = text(&left.stdout).lines().map(String::from).collect();
    assert_eq!(listed, closed);
    // The resume loop of the docs.
    let resume = format!(
        "\"$RECORDER\" index --unshipped {store} --format '{out}/{{path}}' {out} | \
         while read -r s; do {script} {dest} \"$s\" || exit 1; done",
        store = fleet.store.display(),
        out = out.display(),
        script = script.display(),
        dest = fleet.dest()
    );
    let resumed = fleet
        .command("sh")
        .args(["-c", &resume])
        .output()
        .expect("sh");
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let left = fleet.recorder(&["index", "--unshipped"], &[&fleet.store, &out]);
    assert_eq!(text(&left.stdout), "", "{}", text(&left.stderr));
    let index = fleet.recorder(&["index"], &[&fleet.store]);
    assert!(index.status.success(), "{}", text(&index.stderr));
    let stored: BTreeSet<String> = rows(&index)
        .iter()
        .map(|r| {
            let p = r["path"].as_str().expect("path");
            p.rsplit('/').next().expect("file").to_string()
        })
        .collect();
    assert_eq!(stored, closed);
}
