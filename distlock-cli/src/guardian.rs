//! The guardian: a small process of distlock's own that ends the child's
//! process group when distlock ends without doing so itself.
//!
//! `PR_SET_PDEATHSIG` reaches only the group's leader (a shell), not what
//! it started, and nothing of distlock runs after a `SIGKILL`: a
//! `sleep` started by `sh -c` kept running after `kill -9` of distlock, and
//! once the lease expired another host took the lock while it ran. So
//! before the child starts, distlock starts itself again as the guardian
//! (`distlock __guardian GRACE_MS`, its stdin the read end of a pipe whose
//! write end only distlock holds, close-on-exec so the child never gets
//! it), then writes it the child's group. When distlock is gone, by any
//! death, the pipe reads end of file: the guardian sends the group SIGTERM,
//! then SIGKILL to what is left after the grace, and exits. When distlock
//! has seen the group gone, it writes `done` first and the guardian exits
//! at once, so a reused group id is never signalled. The guardian ignores
//! the signals that end a process (a signal to distlock's whole group does
//! not take it away before it has done its work) and holds nothing else.
//!
//! Chosen over a cgroup (not available to every user, nor in every
//! container) and over a subreaper (a process that leaves the group, by
//! `setsid`, is out of reach either way; the group is what distlock
//! signals everywhere else).

use std::io::{self, BufRead as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::failure::say;

/// The hidden first argument that makes `distlock` the guardian.
pub const ARG: &str = "__guardian";

/// distlock's side: the pipe to its guardian.
pub struct Guardian {
    pipe: Option<io::PipeWriter>,
}

impl Guardian {
    /// Starts the guardian, which will give a group it is told of `grace`
    /// between SIGTERM and SIGKILL. It runs the very executable distlock
    /// runs (`/proc/self/exe`: still there when the file was replaced or
    /// deleted since, as by an upgrade during a long wait). If it cannot
    /// start, distlock says so and goes on without it: the child's leader
    /// still gets SIGTERM from the kernel should distlock die.
    pub fn start(grace: Duration) -> Guardian {
        let started = (|| -> io::Result<io::PipeWriter> {
            let (reader, writer) = io::pipe()?;
            let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
            let spawn = |exe: &std::path::Path| {
                Command::new(exe)
                    .arg(ARG)
                    .arg(ms.to_string())
                    .stdin(Stdio::from(reader.try_clone()?))
                    .stdout(Stdio::null())
                    .spawn()
            };
            let mut process = match spawn(std::path::Path::new("/proc/self/exe")) {
                Ok(process) => process,
                Err(_) => spawn(&std::env::current_exe()?)?,
            };
            // Reaped by whoever outlives it: it ends after distlock, or
            // right after `done`; here in the background if distlock
            // lives on.
            std::thread::spawn(move || process.wait());
            Ok(writer)
        })();
        match started {
            Ok(writer) => Guardian { pipe: Some(writer) },
            Err(e) => {
                say!("cannot start the guardian of the child's group ({e}): should distlock be killed, what the child started may outlive it");
                Guardian { pipe: None }
            }
        }
    }

    /// Tells the guardian the child's group.
    pub fn guard(&mut self, pgid: i32) {
        self.send(&format!("{pgid}\n"));
    }

    /// The group is gone: the guardian exits without signalling anyone.
    pub fn dismiss(&mut self) {
        self.send("done\n");
        self.pipe = None;
    }

    fn send(&mut self, line: &str) {
        if let Some(pipe) = &mut self.pipe {
            if pipe.write_all(line.as_bytes()).is_err() {
                tracing::warn!("the guardian of the child's group is gone");
                self.pipe = None;
            }
        }
    }
}

/// The guardian's own run: `args` are what follows [`ARG`].
pub fn run(args: &[String]) -> u8 {
    let grace = args
        .first()
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGPIPE,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ] {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let mut group: Option<i32> = None;
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "done" => return 0,
            pgid => {
                if let Ok(pgid) = pgid.parse::<i32>() {
                    if pgid > 1 {
                        group = Some(pgid);
                    }
                }
            }
        }
    }
    // distlock is gone and did not see the group end.
    if let Some(pgid) = group {
        end_group(pgid, grace);
    }
    0
}

/// SIGTERM to the group, SIGKILL to what is left of it after `grace`.
fn end_group(pgid: i32, grace: Duration) {
    // SAFETY: kill(2) with a negative pid signals a process group; signal
    // 0 only checks that it exists.
    let alive = || unsafe { libc::kill(-pgid, 0) == 0 };
    if !alive() {
        return;
    }
    unsafe {
        libc::kill(-pgid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive() {
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}
