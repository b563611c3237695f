//! PostgreSQL (Debian's `postgresql` package) on a free loopback port, in a
//! temp dir, killed on drop.
//!
//! `initdb` and `postgres` come from `/usr/lib/postgresql/<major>/bin` (the
//! highest major installed). PostgreSQL refuses to run as root, so when the
//! tests run as root both run as the `postgres` system user the package
//! creates (the data directory is handed to it); otherwise as the current
//! user. The server listens on 127.0.0.1 only, with no Unix socket, and
//! trusts every local connection (user `postgres`, database `postgres`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::server::{free_port, loopback, require_file, state_dir, wait_until, Proc};

/// A PostgreSQL server on 127.0.0.1 with its own throwaway cluster.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: TempDir,
    proc: Proc,
}

/// The directory of the highest PostgreSQL major installed.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    let bin = found.pop().map_or_else(
        || PathBuf::from("/usr/lib/postgresql/<major>/bin"),
        |(_, b)| b,
    );
    require_file(
        &bin.join("initdb"),
        "PostgreSQL's initdb (Debian package postgresql)",
    );
    require_file(
        &bin.join("postgres"),
        "PostgreSQL (Debian package postgresql)",
    );
    bin
}

const PREFIX: &str = "distlock-pg-";
/// The file naming the test process that owns a server's directory.
const OWNER: &str = "owner.pid";

/// Removes the directories of servers whose test binary has ended: a
/// server shared by a binary lives in a `static`, whose `TempDir` is never
/// dropped, and a cluster is some 40 MB of memory on `/dev/shm`.
fn sweep_dead_servers() {
    for root in [PathBuf::from("/dev/shm"), std::env::temp_dir()] {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_str().is_some_and(|n| n.starts_with(PREFIX)) {
                continue;
            }
            let path = entry.path();
            let owner = std::fs::read_to_string(path.join(OWNER))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            let dead = match owner {
                Some(pid) => {
                    // SAFETY: kill(2) with signal 0 only checks the pid exists.
                    let gone = unsafe { libc::kill(pid, 0) } != 0;
                    gone && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                }
                // No owner yet: being created right now, unless it is old.
                None => entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(600)),
            };
            if dead {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

/// The uid and gid to run as: the `postgres` user's when we are root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // SAFETY: a NUL-terminated name; the record is copied out at once, and
    // the tests' single keeper of servers is the only caller.
    unsafe {
        let pw = libc::getpwnam(c"postgres".as_ptr());
        assert!(
            !pw.is_null(),
            "no `postgres` user to run PostgreSQL as (it refuses root): \
             run `scripts/install-servers.sh` (Debian's postgresql package creates it)"
        );
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}

fn command(bin: &Path, dir: &Path, user: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin);
    // The test's working directory may be closed to the postgres user.
    cmd.current_dir(dir);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

impl PostgresServer {
    /// Creates a cluster (`initdb`), starts `postgres` on a free
    /// 127.0.0.1 port and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When PostgreSQL is not installed (naming `scripts/install-servers.sh`),
    /// `initdb` fails, or the server does not start within 30 s.
    #[must_use]
    pub fn start() -> Self {
        let bin = bin_dir();
        let user = run_as();
        sweep_dead_servers();
        let mut dir = state_dir(PREFIX);
        std::fs::write(dir.path().join(OWNER), std::process::id().to_string())
            .expect("write the pg dir's owner");
        let data = dir.path().join("data");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown pg dir");
        }
        let log = dir.path().join("initdb.log");
        let init = command(&bin.join("initdb"), dir.path(), user)
            .args(["--auth=trust", "--username=postgres", "--encoding=UTF8"])
            .args(["--no-sync", "--no-instructions", "-D"])
            .arg(&data)
            .stdout(std::fs::File::create(&log).expect("initdb log"))
            .stderr(std::fs::File::create(&log).expect("initdb log"))
            .status()
            .expect("run initdb");
        assert!(
            init.success(),
            "initdb failed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = command(&bin.join("postgres"), dir.path(), user);
            cmd.arg("-D").arg(&data).args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
                "-c",
                "fsync=off",
                // Segments in the data directory, not in /dev/shm, so that
                // a killed server's go with its directory.
                "-c",
                "dynamic_shared_memory_type=mmap",
                "-c",
                "max_connections=100",
                "-p",
                &port.to_string(),
            ]);
            let log = dir.path().join("postgres.log");
            let mut server = PostgresServer {
                port,
                proc: Proc::spawn(cmd, &log).expect("spawn postgres"),
                dir,
            };
            let ready = wait_until(Duration::from_secs(30), || {
                server.log().contains("ready to accept connections") || !server.proc.alive()
            });
            if ready && server.proc.alive() {
                return server;
            }
            last_log = server.log();
            server.proc.kill();
            dir = server.dir;
        }
        panic!("postgres did not start on 127.0.0.1; last log:\n{last_log}");
    }

    /// The server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq-style connection string for tokio-postgres / sqlx:
    /// `host=127.0.0.1 port=P user=postgres dbname=postgres`.
    #[must_use]
    pub fn conn_str(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// `postgres://postgres@127.0.0.1:P/postgres`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

/// One PostgreSQL server shared by every test of a test binary (killed by
/// the kernel when the binary exits, see `server::Proc`). Tests sharing it
/// use [`unique_name`](crate::unique_name) prefixes.
#[must_use]
pub fn shared() -> &'static PostgresServer {
    static SERVER: std::sync::OnceLock<PostgresServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(PostgresServer::start)
}
