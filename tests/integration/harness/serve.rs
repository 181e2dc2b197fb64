//! `recorder serve` on private sockets, and Perfetto's own service
//! (tracebox's traced and traced_probes) beside it, driven by Perfetto's
//! `perfetto` client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::decode::python_summary;
use super::need::{is_root, tracebox_path};
use super::recorder_bin;
use super::users::as_user;
use super::wait::{described, output_within, poll_exit, wait_for, wait_until, wait_within};

/// The service user of root runs: neither root nor the attacker's nobody.
pub const SERVICE_UID: u32 = 61_234;

/// A running `recorder serve` on private sockets; stopped with SIGTERM.
pub struct Serve {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Serve {
    pub fn start() -> Serve {
        Serve::start_with(&[])
    }

    /// [`Serve::start`] with extra environment.
    pub fn start_with(env: &[(&str, &str)]) -> Serve {
        Serve::start_full(env, &[])
    }

    /// [`Serve::start`] with extra environment and arguments.
    pub fn start_full(env: &[(&str, &str)], args: &[&str]) -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        // The dropped service user and other test users reach the sockets.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .expect("chmod");
        let mut c = Command::new(recorder_bin());
        c.arg("serve")
            .arg("--consumer-socket")
            .arg(dir.path().join("consumer.sock"))
            .arg("--producer-socket")
            .arg(dir.path().join("producer.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).expect("log"))
            .env("RUST_LOG", "info")
            .args(args)
            .envs(env.iter().copied());
        if is_root() {
            c.arg("--user").arg(SERVICE_UID.to_string());
        }
        let child = c.spawn().expect("spawn recorder serve");
        let s = Serve {
            child: Some(child),
            dir,
        };
        wait_for(
            described(|| format!("serve listening: {}", s.log())),
            Duration::from_secs(10),
            || std::os::unix::net::UnixStream::connect(s.consumer()).is_ok(),
        );
        s
    }

    pub fn consumer(&self) -> PathBuf {
        self.dir.path().join("consumer.sock")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// `perfetto ARGS` against this service, as `uid` (setpriv) or as us.
    pub fn perfetto(&self, uid: Option<&str>, args: &[&str]) -> Command {
        let tb = tracebox_path().expect("tracebox");
        let mut c = match uid {
            Some(u) => as_user(u, tb),
            None => Command::new(tb),
        };
        c.arg("perfetto")
            .args(args)
            .env("PERFETTO_CONSUMER_SOCK_NAME", self.consumer())
            .env("PERFETTO_PRODUCER_SOCK_NAME", self.path("producer.sock"))
            .stdin(Stdio::null());
        c
    }

    /// What `perfetto --query` prints against this service.
    pub fn query_text(&self) -> String {
        let o = output_within(
            &mut self.perfetto(None, &["--query"]),
            Duration::from_secs(10),
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    /// Waits until `perfetto --query` shows at least `n` sessions started.
    pub fn wait_started(&self, n: usize) {
        let last = std::cell::RefCell::new(String::new());
        wait_until(
            described(|| format!("{n} sessions started: {}", last.borrow())),
            Duration::from_secs(20),
            || {
                let t = self.query_text();
                let started = t.matches("STARTED").count() >= n;
                *last.borrow_mut() = t;
                started.then_some(())
            },
        )
    }

    /// Writes `config` (text) as NAME.pbtx, readable by every client uid.
    pub fn write_config(&self, name: &str, config: &str) -> PathBuf {
        let cfg = self.path(&format!("{name}.pbtx"));
        std::fs::write(&cfg, config).expect("config");
        std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
        cfg
    }

    /// Writes `config` (text) as NAME.pbtx and starts `perfetto --txt -c
    /// NAME.pbtx -o NAME.pftrace`, as `uid` or as us.
    pub fn spawn_client(&self, uid: Option<&str>, name: &str, config: &str) -> (Child, PathBuf) {
        let cfg = self.write_config(name, config);
        let out = self.path(&format!("{name}.pftrace"));
        (self.spawn_perfetto(uid, &cfg, &out), out)
    }

    /// Starts `perfetto --txt -c CFG -o OUT`, as `uid` or as us.
    pub fn spawn_perfetto(&self, uid: Option<&str>, cfg: &Path, out: &Path) -> Child {
        self.perfetto(uid, &["--txt", "-c"])
            .arg(cfg)
            .arg("-o")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perfetto")
    }

    /// Writes `config` (text) and runs `perfetto --txt -c CFG -o OUT`.
    pub fn record(&self, name: &str, config: &str) -> (Output, PathBuf) {
        self.record_as(None, name, config)
    }

    /// [`record`](Self::record) as `uid` (None: as us).
    pub fn record_as(&self, uid: Option<&str>, name: &str, config: &str) -> (Output, PathBuf) {
        let cfg = self.write_config(name, config);
        let out = self.path(&format!("{name}.pftrace"));
        let o = output_within(
            self.perfetto(uid, &["--txt", "-c"])
                .arg(&cfg)
                .arg("-o")
                .arg(&out),
            Duration::from_secs(60),
        );
        (o, out)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // A failing test shows what the service said, whatever it asserted.
        if std::thread::panicking() {
            eprintln!("--- serve.log ---\n{}--- end of serve.log ---", self.log());
        }
        if let Some(mut c) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&c),
                rustix::process::Signal::TERM,
            );
            if poll_exit(&mut c, Duration::from_secs(15)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The sched_switch events of a trace, typed or in the compact form
/// (traced_probes and compact_sched configs write the latter).
pub fn sched_switches(packets: &[perfetto_protos::trace_packet::TracePacket]) -> usize {
    packets
        .iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| {
            let b = p.ftrace_events();
            b.event.iter().filter(|e| e.has_sched_switch()).count()
                + b.compact_sched.switch_timestamp.len()
        })
        .sum()
}

/// Perfetto's own service (traced + traced_probes, tracebox) on private
/// sockets in `dir`; killed when dropped.
pub struct Traced {
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Traced {
    pub fn start(dir: &Path) -> Traced {
        let tb = tracebox_path().expect("tracebox");
        let spawn = |applet: &str| {
            Command::new(&tb)
                .arg(applet)
                .env("PERFETTO_CONSUMER_SOCK_NAME", dir.join("consumer.sock"))
                .env("PERFETTO_PRODUCER_SOCK_NAME", dir.join("producer.sock"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("tracebox")
        };
        let mut t = Traced {
            procs: vec![spawn("traced")],
            dir: dir.to_path_buf(),
        };
        wait_for("traced's sockets", Duration::from_secs(10), || {
            dir.join("producer.sock").exists() && dir.join("consumer.sock").exists()
        });
        t.procs.push(spawn("traced_probes"));
        wait_for(
            "traced_probes's data sources",
            Duration::from_secs(10),
            || t.query().contains("linux.ftrace"),
        );
        t
    }

    pub fn query(&self) -> String {
        let o = Command::new(tracebox_path().expect("tracebox"))
            .args(["perfetto", "--query"])
            .env(
                "PERFETTO_CONSUMER_SOCK_NAME",
                self.dir.join("consumer.sock"),
            )
            .stdin(Stdio::null())
            .output()
            .expect("perfetto --query");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn record(&self, config: &str) -> PathBuf {
        let cfg = self.dir.join("traced.pbtx");
        std::fs::write(&cfg, config).expect("config");
        let out = self.dir.join("traced.pftrace");
        let client = Command::new(tracebox_path().expect("tracebox"))
            .args(["perfetto", "--txt", "-c"])
            .arg(&cfg)
            .arg("-o")
            .arg(&out)
            .env(
                "PERFETTO_CONSUMER_SOCK_NAME",
                self.dir.join("consumer.sock"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perfetto");
        let o = wait_within(client, Duration::from_secs(60));
        assert!(
            o.status.success(),
            "perfetto against traced: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The packet kinds the Python decoder counts.
pub fn kinds(path: &Path) -> Option<serde_json::Map<String, serde_json::Value>> {
    python_summary(path).map(|s| s["kinds"].as_object().cloned().unwrap_or_default())
}

/// A text TraceConfig as the bytes a consumer sends (Perfetto's schema,
/// through the independent decoder's text format).
pub fn text_config(s: &str) -> Vec<u8> {
    let c: perfetto_protos::trace_config::TraceConfig =
        protobuf::text_format::parse_from_str(s).expect("a text config");
    protobuf::Message::write_to_bytes(&c).expect("encode")
}
