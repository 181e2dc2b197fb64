//! Hardening of paths against an unprivileged local user (uid 65534
//! through `setpriv`) who plants names: history files, runtime and output
//! directories made by another user, links and directories at the names a
//! root session writes, hooks and descriptors. Each attack is followed by
//! the checks that matter: the session kept recording, the trigger got
//! through, and the file decodes with the independent decoder.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::*;

#[test]
fn planted_history_files_neither_redirect_nor_block_nor_exhaust_a_root_session() {
    require!(need::attacker());
    for attack in ["symlink", "fifo", "sparse"] {
        let run = shared_run(&flight_config("max_per_24_h: 3", ""));
        let victim = run.dir.path().join("victim");
        std::fs::write(&victim, "precious\n").expect("victim");
        let rt = runtime(&run);
        // Every name the history may have, planted before the session starts.
        for name in ["trigger-history", "trigger-history.0"] {
            let p = rt.join(name);
            let mut c = match attack {
                "symlink" => {
                    let mut c = as_nobody("ln");
                    c.arg("-s").arg(&victim).arg(&p);
                    c
                }
                "fifo" => {
                    let mut c = as_nobody("mkfifo");
                    c.arg(&p);
                    c
                }
                _ => {
                    let mut c = as_nobody("truncate");
                    c.args(["-s", "4G"]).arg(&p);
                    c
                }
            };
            assert!(c.status().expect("plant").success(), "{attack}");
        }
        let session = run.spawn("auto");
        wait_listening(&runtime(&run), session.id());
        // The trigger stops the session at once: the source has written
        // (a loaded machine may start it after the socket exists).
        wait_recorded(&run, session.id(), 1);
        let t = output_within_named(
            &mut recorder_as(&run, Some(NOBODY), &["trigger", "go"]),
            Duration::from_secs(10),
            attack,
        );
        assert!(t.status.success(), "{attack}: {}", stderr(&t));
        check_triggered(&run, session, 65534);
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious\n",
            "{attack}: the planted link was followed"
        );
    }
}

#[test]
fn a_runtime_directory_another_user_made_is_refused_with_the_fix() {
    require!(need::attacker());
    let run = Run::new(&flight_config("", ""));
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let theirs = shared.join("recorder");
    assert!(
        as_nobody("mkdir")
            .args(["-m", "1777"])
            .arg(&theirs)
            .status()
            .expect("mkdir")
            .success()
    );
    let link = shared.join("link");
    assert!(
        as_nobody("ln")
            .arg("-s")
            .arg(&theirs)
            .arg(&link)
            .status()
            .expect("ln")
            .success()
    );
    for (dir, says) in [(&theirs, "belongs to uid 65534"), (&link, "symbolic link")] {
        let mut c = run.command("auto");
        c.env("RECORDER_RUNTIME_DIR", dir);
        let out = output_within_named(&mut c, Duration::from_secs(10), "session start");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(says) && err.contains("RECORDER_RUNTIME_DIR"),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(&theirs).expect("ls").collect();
        assert!(left.is_empty(), "nothing was created in their directory");
    }
}

/// A planting user (tests/attacker/planter.py) as nobody, once it says it
/// is ready; `finish` waits for its report (one JSON line).
struct Planter(Child);

impl Planter {
    fn start(args: &[&str]) -> Planter {
        Planter(start_as_nobody("planter.py", args))
    }

    fn finish(self) -> serde_json::Value {
        let out = wait_within_named(self.0, Duration::from_secs(60), "planter");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).expect("the planter's report")
    }
}

/// Items 1–4 of round 4, raced: a root session rotating every 150 ms in a
/// sticky directory, two segments kept, its hook (a command that ends in a
/// newline, copying `$1`, the sidecar and stdin after a pause) running as
/// root, while nobody keeps planting links to a root-only secret at every
/// free name of the set — the names the budget just deleted, the ones about
/// to be used, temporary names — and tries to move root's files or add to
/// the hook's directory. For 60 s (some 400 segments, most of them deleted
/// under their queued or running command). No copy ever holds a byte of the secret: every copy is a whole trace
/// matching the sidecar copied beside it.
#[test]
fn a_planting_user_never_gets_roots_hook_to_read_another_file() {
    require!(need::attacker());
    let run = shared_run(&test_config(
        4096,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 60000",
        "message_count: 0 max_messages_per_second: 2000 message_size: 32",
    ));
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let private = dir_with_mode(&run.dir.path().join("private"), 0o700);
    let secret = private.join("secret");
    let secret_text = "SECRET-4c1f9 root only\n";
    std::fs::write(&secret, secret_text).expect("secret");
    let copies = private.join("copies");
    std::fs::create_dir(&copies).expect("mkdir");
    // Ends in a newline, as a TOML multi-line string would: the path is
    // still only an argument.
    let hook = format!(
        "f() {{ sleep 0.2; n=$(basename \"$1\"); cat \"$1\" > {c}/$n; cat \"$RECORDER_SEGMENT_SIDECAR\" > {c}/$n.json; cat > {c}/$n.stdin; }}; f\n",
        c = copies.display()
    );
    let planter = Planter::start(&[
        "segments",
        shared.to_str().expect("utf-8"),
        secret.to_str().expect("utf-8"),
        "61",
    ]);
    // Its log goes to a file: the planted names make it long, more than a
    // pipe nobody reads while waiting holds.
    let log_path = run.dir.path().join("session.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut c = run.command_to("pwritev", &shared.join(""));
    c.args(["--rotate-period", "150ms", "--max-segments", "2"])
        .arg("--on-segment-closed")
        .arg(&hook)
        .stdout(Stdio::null())
        .stderr(log);
    let session = c.spawn().expect("starts");
    let out = wait_within_named(session, Duration::from_secs(150), "the raced session");
    let report = planter.finish();
    let err = std::fs::read_to_string(&log_path).expect("log");
    assert!(out.status.success(), "{err}");
    assert!(err.contains("gave up root"), "{err}");
    assert!(report["planted"].as_u64() > Some(50), "{report}");
    assert_eq!(report["moved"], 0, "{report}");
    assert_eq!(
        std::fs::read_to_string(&secret).expect("secret"),
        secret_text
    );
    // Every copy is of a file the recorder wrote.
    let mut traces = 0;
    for e in std::fs::read_dir(&copies).expect("copies").flatten() {
        let p = e.path();
        let data = std::fs::read(&p).expect("copy");
        assert!(
            !String::from_utf8_lossy(&data).contains("SECRET"),
            "{} holds the secret",
            p.display()
        );
        let name = p.file_name().expect("name").to_string_lossy().into_owned();
        if name.ends_with(".json") || name.ends_with(".stdin") {
            continue;
        }
        traces += 1;
        assert_eq!(whole_prefix(&data), data.len(), "{name}");
        assert!(!decode(&data).is_empty(), "{name}");
        let car: serde_json::Value = serde_json::from_slice(
            &std::fs::read(copies.join(format!("{name}.json"))).expect("sidecar copy"),
        )
        .expect("sidecar json");
        let sha: String = <sha2::Sha256 as sha2::Digest>::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(car["sha256"], sha, "{name}");
        assert_eq!(car["file"], name.as_str(), "{name}");
        assert_eq!(
            std::fs::read(copies.join(format!("{name}.stdin"))).expect("stdin copy"),
            data,
            "{name}: stdin is the segment"
        );
    }
    // The summary accounts for every closed segment: shipped, or not run
    // because the budget took it first.
    let line = err
        .lines()
        .find(|l| l.trim_start().starts_with("--on-segment-closed:") && l.contains(" ran, "))
        .expect("the summary's hook line");
    let ran: u64 = line
        .split("--on-segment-closed: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("ran");
    assert_eq!(ran, traces, "{line}");
    assert!(traces >= 10, "{traces} copies: {line}");
    assert!(line.contains("deleted before their turn"), "{line}");
    // Nothing of the hook's is left behind.
    let left: Vec<String> = std::fs::read_dir(&shared)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".recorder-hook."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    eprintln!("raced: {traces} segments shipped; planter: {report}; {line}");
}

/// Item 2: a command the shell would end before the appended path (`;`,
/// `&`, `|`, `&&`, `!`) is refused at the start, exit 2, before anything
/// is opened, from the flag and from NAME.segments.toml alike.
#[test]
fn hook_commands_that_would_run_the_segment_path_are_refused_at_the_start() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 500",
        "message_count: 0 max_messages_per_second: 100 message_size: 8",
    ));
    let out = run.dir.path().join("segs");
    for cmd in ["cp -t /srv;", "upload &", "gzip |", "true &&", "true; !"] {
        let mut c = run.command_to("pwritev", &out.join(""));
        c.args(["--rotate-period", "100ms", "--on-segment-closed", cmd]);
        let o = output_within_named(&mut c, Duration::from_secs(10), cmd);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("would be run as a command of its own"),
            "{cmd}: {err}"
        );
        assert!(!out.exists(), "{cmd}: nothing made");
    }
    std::fs::write(
        run.config.with_extension("segments.toml"),
        "rotate_period = \"100ms\"\non_segment_closed = \"\"\"\nupload $x &\n\"\"\"\n",
    )
    .expect("toml");
    let o = output_within_named(
        &mut run.command_to("pwritev", &out.join("")),
        Duration::from_secs(10),
        "toml",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!out.exists());
    let check = output_within_named(
        Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(&run.config),
        Duration::from_secs(10),
        "config check",
    );
    assert_eq!(check.status.code(), Some(2), "{}", stderr(&check));
    assert!(stderr(&check).contains("\"&\""), "{}", stderr(&check));
}

/// Item 3: `-o sticky/a/b/` where another user made `a` first (or put a
/// link of theirs on the way) is refused, exit 2, naming the directory;
/// nothing is made inside theirs.
#[test]
fn directories_another_user_made_on_the_way_are_refused() {
    require!(need::attacker());
    let run = shared_run(&test_config(
        1024,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 300",
        "message_count: 0 max_messages_per_second: 100 message_size: 8",
    ));
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let root_only = run.dir.path().join("root-only");
    std::fs::create_dir(&root_only).expect("mkdir");
    let plant = format!(
        "mkdir -m 777 {s}/a && ln -s {r} {s}/l",
        s = shared.display(),
        r = root_only.display()
    );
    plant_as_nobody(&plant);
    for (out, says, theirs) in [
        (
            shared.join("a/b/"),
            "belongs to uid 65534",
            shared.join("a"),
        ),
        (
            shared.join("l/b/"),
            "symbolic link belonging to uid 65534",
            root_only.clone(),
        ),
        (
            shared.join("a/t.pftrace"),
            "belongs to uid 65534",
            shared.join("a"),
        ),
    ] {
        let mut c = run.command_to("pwritev", &out);
        if out.to_string_lossy().ends_with('/') {
            c.args(["--rotate-period", "100ms"]);
        }
        let o = output_within_named(&mut c, Duration::from_secs(10), "session");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", out.display());
        assert!(err.contains(says), "{}: {err}", out.display());
        assert_eq!(
            std::fs::read_dir(&theirs).expect("ls").count(),
            0,
            "{}: nothing made in {}",
            out.display(),
            theirs.display()
        );
    }
    // Made by the recorder itself, one component at a time: used.
    let ok = output_within_named(
        run.command_to("pwritev", &shared.join("x/y/"))
            .args(["--rotate-period", "100ms"]),
        Duration::from_secs(20),
        "session",
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let meta = std::fs::metadata(shared.join("x/y")).expect("made");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);
    assert!(std::fs::read_dir(shared.join("x/y")).expect("ls").count() > 0);
}

/// Item 5: `-o /dev/stdout > file` (and `/dev/fd/3 3>file`,
/// `/proc/self/fd/1`) writes the trace into the redirected file through the
/// descriptor; `/dev/stdout` stays the system's link; nothing is ever made
/// or replaced in `/dev` (exit 2, before anything is opened), as root or
/// as another user.
#[test]
fn descriptor_paths_are_written_through_and_dev_is_never_written_into() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 400",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let link_before = std::fs::read_link("/dev/stdout").ok();
    let users: &[Option<&str>] = if need::attacker().is_none() {
        &[None, Some(NOBODY)]
    } else {
        &[None]
    };
    for uid in users {
        for (i, redirect) in [
            "-o /dev/stdout > {f}",
            "-o /dev/fd/3 3> {f}",
            "-o /proc/self/fd/1 > {f}",
        ]
        .iter()
        .enumerate()
        {
            let file = run
                .dir
                .path()
                .join(format!("out-{i}-{}", uid.unwrap_or("0")));
            let line = format!(
                "{} --config {} {}",
                recorder_bin().display(),
                run.config.display(),
                redirect.replace("{f}", &file.display().to_string())
            );
            let mut c = match uid {
                Some(u) => as_user(u, "sh"),
                None => Command::new("sh"),
            };
            c.args(["-c", &line])
                .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"));
            let o = output_within_named(&mut c, Duration::from_secs(20), &line);
            assert!(o.status.success(), "{line}: {}", stderr(&o));
            let data = std::fs::read(&file).expect("the redirected file");
            assert!(data.len() > 1000, "{line}: {} bytes", data.len());
            assert_eq!(whole_prefix(&data), data.len(), "{line}");
            assert!(!test_counters(&decode(&data)).is_empty(), "{line}");
        }
    }
    assert_eq!(std::fs::read_link("/dev/stdout").ok(), link_before);
    assert!(
        std::fs::symlink_metadata("/dev/stdout")
            .expect("meta")
            .file_type()
            .is_symlink()
    );
    // A new name in /dev, a segment directory there, a snapshot beside it.
    let name = format!("/dev/recorder-test-{}", std::process::id());
    for args in [
        vec!["-o", name.as_str()],
        vec!["-o", "/dev/", "--rotate-size", "64K"],
    ] {
        let mut c = Command::new(recorder_bin());
        c.arg("--config")
            .arg(&run.config)
            .args(&args)
            .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"));
        let o = output_within_named(&mut c, Duration::from_secs(20), "dev");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("the devices' directory"), "{args:?}: {err}");
        assert!(!Path::new(&name).exists());
    }
    let mut c = Command::new(recorder_bin());
    c.arg("--config")
        .arg(&run.config)
        .args(["-o", "/dev/stdout", "--background"]);
    let o = output_within_named(&mut c, Duration::from_secs(20), "background");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// Item 7: names planted (as nobody) in a sticky segments directory — a
/// FIFO at a `.partial` name, links to a root-only file at a segment's and
/// a sidecar's name — neither hang `recorder inspect`/`index` nor get read:
/// each is named as what it is, and no byte of the secret shows.
#[test]
fn inspect_and_index_read_only_regular_files_never_planted_links() {
    require!(need::attacker());
    let run = shared_run(&test_config(
        1024,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 700",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let o = output_within_named(
        run.command_to("pwritev", &shared.join(""))
            .args(["--rotate-period", "200ms"]),
        Duration::from_secs(20),
        "session",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let secret = run.dir.path().join("secret");
    // A first byte that would show as itself, or as 0x5a, in a report.
    std::fs::write(&secret, "Zsecret\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let last = (0..100)
        .rev()
        .find(|i| shared.join(format!("trace-{i:06}.pftrace")).exists())
        .expect("segments");
    let plant = format!(
        "cd {s} && mkfifo trace-{a:06}.pftrace.partial && ln -s {x} trace-{b:06}.pftrace && ln -s {x} trace-{b:06}.pftrace.json && mkfifo trace-{c:06}.pftrace && ln -s {x} trace-{c:06}.pftrace.json",
        s = shared.display(),
        x = secret.display(),
        a = last + 1,
        b = last + 2,
        c = last + 3,
    );
    plant_as_nobody(&plant);
    for args in [&["inspect"][..], &["inspect", "--json"], &["index"]] {
        let mut c = Command::new(recorder_bin());
        c.args(args).arg(&shared).stdin(Stdio::null());
        let o = output_within_named(
            &mut c,
            Duration::from_secs(20),
            "inspect a planted directory",
        );
        let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
        // inspect reports the planted names as faults; index lists
        // regular files only, so it sees the real segments alone.
        let want = if args[0] == "index" { 0 } else { 1 };
        assert_eq!(o.status.code(), Some(want), "{args:?}: {out}{err}");
        assert!(
            !out.contains("secret") && !err.contains("secret"),
            "{args:?}: {out}{err}"
        );
        assert!(
            !out.contains("0x5a") && !err.contains("0x5a") && !out.contains("0x5A"),
            "{args:?}: {out}{err}"
        );
        if args[0] == "index" {
            assert_eq!(out.lines().count() as u64, last + 1, "{out}");
        } else {
            assert!(
                out.contains("not a regular file") || err.contains("not a regular file"),
                "{args:?}: {out}{err}"
            );
            assert!(
                out.contains("not followed") || err.contains("not followed"),
                "{args:?}: {out}{err}"
            );
        }
    }
    // A single planted name, named on the command line: refused at once.
    let mut c = Command::new(recorder_bin());
    c.arg("inspect")
        .arg(shared.join(format!("trace-{:06}.pftrace.partial", last + 1)))
        .stdin(Stdio::null());
    let o = output_within_named(&mut c, Duration::from_secs(10), "inspect a FIFO");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("a FIFO"), "{}", stderr(&o));
}

/// Item 9: a session refused for its runtime directory (another user's) or
/// for names another user planted where its sockets go refuses before its
/// output is touched: the existing file keeps its 15 bytes.
#[test]
fn refusals_over_the_runtime_directory_leave_the_output_untouched() {
    require!(need::attacker());
    let run = shared_run(&flight_config("", ""));
    let keep = b"fifteen bytes!\n";
    // Root, with another user's sticky directory as its runtime directory.
    let theirs = dir_with_mode(&run.dir.path().join("theirs"), 0o1777);
    rustix::fs::chown(
        &theirs,
        Some(rustix::process::Uid::from_raw(65534)),
        Some(rustix::process::Gid::from_raw(65534)),
    )
    .expect("chown");
    std::fs::write(&run.out, keep).expect("write");
    let mut c = run.command("auto");
    c.env("RECORDER_RUNTIME_DIR", &theirs);
    let o = output_within_named(&mut c, Duration::from_secs(20), "session");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("belongs to uid 65534"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&run.out).expect("kept"), keep);
    // uid 65533, whose trigger socket's name nobody took first.
    let mine = run.dir.path().join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    rustix::fs::chown(
        &mine,
        Some(rustix::process::Uid::from_raw(65533)),
        Some(rustix::process::Gid::from_raw(65533)),
    )
    .expect("chown");
    let out = mine.join("t.pftrace");
    assert!(
        as_user("65533", "sh")
            .args([
                "-c",
                &format!("printf 'fifteen bytes!\\n' > {}", out.display())
            ])
            .status()
            .expect("sh")
            .success()
    );
    std::fs::set_permissions(&run.config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let go = run.dir.path().join("go");
    let line = format!(
        "while [ ! -e {g} ]; do sleep 0.01; done; exec {r} --config {c} -o {o}",
        g = go.display(),
        r = recorder_bin().display(),
        c = run.config.display(),
        o = out.display()
    );
    let session = as_user("65533", "sh")
        .args(["-c", &line])
        .env("RECORDER_RUNTIME_DIR", runtime(&run))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let name = runtime(&run).join(format!("recorder-{}.trigger", session.id()));
    assert!(
        as_nobody("touch")
            .arg(&name)
            .status()
            .expect("touch")
            .success()
    );
    std::fs::write(&go, "").expect("go");
    let o = wait_within_named(session, Duration::from_secs(20), "session");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("recorder-{}.trigger", o_pid(&name))),
        "{err}"
    );
    assert_eq!(std::fs::read(&out).expect("kept"), keep);
}

/// The pid in a `recorder-PID.trigger` path.
fn o_pid(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("recorder-"))
        .and_then(|n| n.strip_suffix(".trigger"))
        .unwrap_or_default()
        .to_string()
}

/// Item 8: a directory (empty, or filled) planted by nobody at a root
/// session's `unique_session_name` lock path no longer stops it: it is
/// removed or moved aside, said in the log, and the session records and
/// takes its trigger.
#[test]
fn a_directory_planted_at_the_name_lock_does_not_stop_a_root_session() {
    require!(need::attacker());
    for filled in [false, true] {
        let run = shared_run(&flight_config("", "unique_session_name: \"flight\""));
        let lock = runtime(&run).join("session.0.flight.lock");
        let plant = if filled {
            format!(
                "mkdir -p {l}/deep/er && touch {l}/deep/er/x",
                l = lock.display()
            )
        } else {
            format!("mkdir {}", lock.display())
        };
        plant_as_nobody(&plant);
        let session = run.spawn("auto");
        wait_listening(&runtime(&run), session.id());
        let t = output_within_named(
            &mut recorder_as(&run, Some(NOBODY), &["trigger", "go"]),
            Duration::from_secs(10),
            "trigger",
        );
        assert!(t.status.success(), "{}", stderr(&t));
        let out = wait_within_named(session, Duration::from_secs(20), "session");
        let err = stderr(&out);
        assert!(out.status.success(), "filled {filled}: {err}");
        assert!(
            err.contains("a directory owned by uid 65534 left there by another user"),
            "{err}"
        );
        let data = run.trace();
        assert_eq!(whole_prefix(&data), data.len());
        assert!(!test_counters(&decode(&data)).is_empty());
    }
}

/// Item 11: directories nobody planted at `OUT.0` and `OUT.1` do not lose
/// a root CLONE_SNAPSHOT session's snapshots: each goes to the next name
/// that can take a file (`OUT.2`, `OUT.3`), said in the log, and the
/// directories are left as they were.
#[test]
fn a_directory_planted_at_a_snapshot_name_moves_the_snapshot_to_the_next_name() {
    require!(need::attacker());
    let run = shared_run(
        r#"
buffers { size_kb: 2048 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 2000 message_size: 16 } } }
trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 60000 triggers { name: "snap" } }
"#,
    );
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let out = shared.join("snap.pftrace");
    let plant = format!(
        "mkdir {o}.0 && mkdir {o}.1 && touch {o}.1/x",
        o = out.display()
    );
    plant_as_nobody(&plant);
    let session = run
        .command_to("auto", &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    wait_listening(&runtime(&run), session.id());
    for want in [2, 3] {
        let t = output_within_named(
            &mut recorder_as(&run, Some(NOBODY), &["trigger", "snap"]),
            Duration::from_secs(10),
            "trigger",
        );
        assert!(t.status.success(), "{}", stderr(&t));
        assert!(stderr(&t).contains("accepted"), "{}", stderr(&t));
        let file = PathBuf::from(format!("{}.{want}", out.display()));
        wait_for(
            format_args!("{} written", file.display()),
            Duration::from_secs(20),
            || std::fs::read(&file).is_ok_and(|d| d.len() > 100 && whole_prefix(&d) == d.len()),
        );
    }
    let stop = output_within_named(
        &mut recorder_as(&run, None, &["stop", &session.id().to_string()]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(stop.status.success(), "{}", stderr(&stop));
    let o = wait_within_named(session, Duration::from_secs(20), "session");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("is a directory someone put there"), "{err}");
    for k in [2, 3] {
        let p = PathBuf::from(format!("{}.{k}", out.display()));
        let data = std::fs::read(&p).expect("snapshot");
        assert!(
            decode(&data).iter().any(|p| p.has_clone_snapshot_trigger()),
            "{}",
            p.display()
        );
    }
    for k in [0, 1] {
        let p = PathBuf::from(format!("{}.{k}", out.display()));
        let m = std::fs::symlink_metadata(&p).expect("still there");
        assert!(m.is_dir());
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&m), 65534);
    }
    assert_eq!(
        std::fs::read_dir(format!("{}.0", out.display()))
            .expect("ls")
            .count(),
        0
    );
}
