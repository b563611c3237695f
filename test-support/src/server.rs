//! Process plumbing shared by the server wrappers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound and released; a race with another
/// process is possible and handled by the callers' retries).
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// The loopback address with `port`.
#[must_use]
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Finds `binary` in `PATH` or fails loudly, naming the install script.
pub(crate) fn require_binary(binary: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(binary))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{binary}` is not installed: run `scripts/install-servers.sh` \
             (installs Debian's redis-server and zookeeper packages). \
             Tests never skip a missing server."
        )
    })
}

/// Requires a file, failing loudly with the install script's name.
/// A fresh temporary directory for a server's state, in memory where there
/// is a tmpfs (`/dev/shm`): a server that fsyncs (Sentinel's config at every
/// change, a replica's received snapshot before it loads it) then never
/// stalls behind a busy disk, as one does with a build beside the tests.
pub(crate) fn state_dir(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return dir;
        }
    }
    builder.tempdir().expect("temp dir")
}

pub(crate) fn require_file(path: &Path, what: &str) {
    assert!(
        path.is_file(),
        "{what} not found at {}: run `scripts/install-servers.sh`. \
         Tests never skip a missing server.",
        path.display()
    );
}

/// Sends `request` to `addr` and returns the answer: its first line when
/// `one_line` (RESP), else everything until the server closes (ZooKeeper's
/// four-letter words).
pub(crate) fn ask(addr: SocketAddr, request: &[u8], one_line: bool) -> Option<String> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream.write_all(request).ok()?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if one_line && out.ends_with(b"\r\n") {
                    break;
                }
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Polls `ready` until it is true or `limit` passes.
pub(crate) fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ready()
}

/// A child process that is killed (SIGKILL) and reaped on drop.
#[derive(Debug, Default)]
pub(crate) struct Proc {
    child: Option<Child>,
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawns every server from one thread that lives as long as the test
/// process, each child with `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills
/// the servers when the test process ends, even a server kept in a `static`
/// and shared by a whole test binary (whose destructor never runs). The
/// signal follows the *thread* that forked, hence the one long-lived thread.
fn spawn_from_keeper_thread(cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::{mpsc, Mutex, OnceLock};

    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("distlock-test-servers".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe and touches no memory
                    // of the parent; it runs in the child between fork and exec.
                    unsafe {
                        cmd.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("server keeper thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("server keeper thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("server keeper thread is gone"))?
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, log: &Path) -> std::io::Result<Proc> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        Ok(Proc {
            child: Some(spawn_from_keeper_thread(cmd)?),
        })
    }

    pub(crate) fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub(crate) fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on a pid of our own child; no memory is touched.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process must be continued to die promptly on some
            // kernels; SIGKILL works on stopped processes on Linux anyway.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
