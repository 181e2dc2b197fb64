//! `recorder serve`: the recorder as a tracing service. Binds the consumer
//! and producer sockets, drops root (when started as root) before it reads
//! a byte from a client, then serves until SIGINT or SIGTERM. Started as
//! root it first forks the privileged broker, which prepares a tracefs
//! instance per session that records the built-in linux.ftrace (and tears
//! it down, also when the service dies).

use super::ExitCode;
use crate::cli::ServeArgs;
use crate::consumer::{self, service::Service};
use crate::producer::host::ProducerService;
use crate::transport::socket_path;
use std::sync::Arc;

use crate::privilege::{self, Broker, PrivilegeError, user::ServiceUser};

/// No unprivileged user to serve as.
fn refuse_root(why: &str) -> ExitCode {
    eprintln!(
        "error: recorder serve started as root drops to an unprivileged user before serving: {why}"
    );
    ExitCode::Usage
}

/// Runs the service.
pub(crate) fn run(args: &ServeArgs) -> ExitCode {
    // Read before anything is claimed: a bad value leaves nothing behind.
    let direct_io = match super::record::direct_io_from_env() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::Usage;
        }
    };
    let root = rustix::process::geteuid().is_root();
    // Resolved first: a missing user must not leave sockets behind.
    let user = if root {
        let chosen = match args.user.as_deref() {
            Some(spec) => privilege::user::named(spec).map(Some),
            None => privilege::user::choose(),
        };
        let user = match chosen {
            Ok(Some(u)) => u,
            Ok(None) => return refuse_root("recorder serve never serves as root"),
            Err(e) => return refuse_root(&e.to_string()),
        };
        Some(user)
    } else {
        None
    };
    let consumer_path = match consumer::socket_path(args.consumer_socket.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::Usage;
        }
    };
    let env = std::env::var(socket_path::ENV_VAR).ok();
    let producer_path = match socket_path::resolve(args.producer_socket.as_deref(), env.as_deref())
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: producer socket: {e}");
            return ExitCode::Usage;
        }
    };
    let consumer_listener = match socket_path::claim(&consumer_path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: consumer socket: {}", super::chain(&e));
            return ExitCode::Runtime;
        }
    };
    let producer_listener = match socket_path::claim(&producer_path) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_file(&consumer_path);
            eprintln!("error: producer socket: {}", super::chain(&e));
            return ExitCode::Runtime;
        }
    };
    let mut broker = None;
    if let Some(u) = user {
        match become_user(
            u,
            &[&consumer_path, &producer_path],
            !args.no_builtin_ftrace,
        ) {
            Ok(b) => broker = b,
            Err(e) => {
                let _ = std::fs::remove_file(&consumer_path);
                let _ = std::fs::remove_file(&producer_path);
                eprintln!("error: cannot drop root: {}", super::chain(&e));
                return ExitCode::Runtime;
            }
        }
    }
    log::info!("producer socket: {}", producer_path.display());
    let producers = ProducerService::new(producer_listener, &producer_path);
    let limits = consumer::Limits::with_sessions(
        args.max_sessions.map(usize::from),
        args.max_sessions_per_uid.map(usize::from),
    );
    let mut service = Service::new(consumer_listener, consumer_path, Some(producers), limits);
    if !direct_io {
        service.no_direct_io();
    }
    match broker {
        Some(b) => {
            service.save_at_death(b.clone());
            service.serve_ftrace(b);
        }
        None => log::info!("linux.ftrace: left to producers (traced_probes)"),
    }
    match service.run() {
        Ok(()) => ExitCode::Success,
        Err(e) => {
            eprintln!("error: {}", super::chain(&e));
            ExitCode::Runtime
        }
    }
}

/// Hands the socket files to the service user (so it can remove them at
/// its stop), forks the broker that prepares tracefs (`with_broker`;
/// while still single-threaded) and drops root for good.
fn become_user(
    u: ServiceUser,
    sockets: &[&std::path::Path],
    with_broker: bool,
) -> Result<Option<Arc<Broker>>, PrivilegeError> {
    for s in sockets {
        if let Err(e) = std::os::unix::fs::lchown(s, Some(u.uid), Some(u.gid)) {
            log::warn!("chown {}: {e}", s.display());
        }
    }
    if !with_broker {
        privilege::give_up_root(&u)?;
        return Ok(None);
    }
    let p = privilege::start_for_serve(u)?;
    p.drop_now(privilege::Registration::default())?;
    Ok(Some(p.broker))
}
