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
//! at once, so a reused group id is never signalled.
//!
//! The group must be dead before the lock can be someone else's, so the
//! grace is bounded by the lease: distlock also writes the guardian the
//! instant until which the lease is known held (`until NS`, on
//! `CLOCK_MONOTONIC`, which both processes read alike), first before the
//! child starts and again each time a renewal moves it (by 5 ms or more
//! later, or earlier at all: one line a renewal, never a flood). On end of
//! file the group gets SIGTERM, and SIGKILL at the earlier of the grace's
//! end and that instant; at once if it has passed (a `kill -9` of distlock
//! while its lease lapses leaves no time). The guardian keeps the instant
//! itself while distlock lives too: should it pass with no later one told
//! (distlock stopped, or too starved to renew or to stop the child in
//! time), the group gets SIGKILL then, as distlock would have done. The
//! lease's instant comes before the server can hand the lock on by the
//! lease's own margin (see `LockGuard::held_until`). The guardian holds
//! nothing but the pipe.
//!
//! The guardian runs in a process group of its own, neither distlock's nor
//! the child's: what is sent to distlock's whole group (a shell's
//! `kill -STOP %job` or `kill -9 -PGID`, `timeout -s KILL`, which SIGKILLs
//! its whole group) takes distlock, never the guardian, which then does its
//! work (a stopped distlock: SIGKILL at the lease's deadline; a dead one:
//! end of file). Nor does it hear the terminal: Ctrl-C, Ctrl-Z and a hangup
//! go to the foreground group only (and would change nothing: it ignores
//! SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP and the like anyway). Each of its
//! SIGKILLs also reaches the groups that the group's members' descendants
//! run in (see [`kill_group_and_offspring`]): a nested `distlock exec`
//! puts its own child in a group of its own, which the outer group's
//! SIGKILL alone would leave running, its guardian given the whole grace.
//!
//! What the guardian does not survive: a SIGKILL or SIGSTOP sent to it
//! alone (by pid or by its own group). Killed, it is gone and distlock
//! goes on without it (its next line to the pipe fails: logged); the child's
//! group is then ended by distlock alone, on a lost lease or when the
//! child exits, and a later death of distlock leaves it to the kernel's
//! SIGTERM to the group's leader. Stopped, it reads nothing: distlock's
//! writes never block on it (the pipe is non-blocking; a line the full pipe
//! refuses is dropped, and only the latest deadline matters), and when it
//! is continued it reads what is there, the latest deadline included,
//! before it acts on one that passed. A guardian never
//! outlives its purpose: it exits on `done`, or once it has ended the
//! group after end of file; its only wait without a bound is for the next
//! line while distlock lives.
//!
//! Chosen over a cgroup (not available to every user, nor in every
//! container) and over a subreaper (a process that leaves the group, by
//! `setsid`, and whose parent then ends, is out of reach either way; the
//! group is what distlock signals everywhere else).

use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::failure::say;

/// The hidden first argument that makes `distlock` the guardian.
pub const ARG: &str = "__guardian";

/// Later moves of the lease's deadline smaller than this are not written:
/// renewals move it by their interval (a third of the TTL on Redis, a
/// quarter of the session timeout on ZooKeeper), so this bounds the lines
/// only for the shortest leases; earlier moves are always written.
const SMALLEST_MOVE: Duration = Duration::from_millis(5);

/// distlock's side: the pipe to its guardian.
pub struct Guardian {
    pipe: Option<io::PipeWriter>,
    /// The lease's deadline last written (`CLOCK_MONOTONIC` nanoseconds).
    told: Option<u64>,
}

impl Guardian {
    /// Starts the guardian, which will give a group it is told of `grace`
    /// between SIGTERM and SIGKILL (less when the lease's deadline it is
    /// told comes first). It runs the very executable distlock
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
                    // A group of its own: what is sent to distlock's
                    // whole group (`kill -STOP %job`, `kill -9 -PGID`,
                    // `timeout -s KILL`, the SIGKILL an outer distlock's
                    // guardian gives the group a nested distlock runs in)
                    // never reaches it.
                    .process_group(0)
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
            // Never blocks distlock: a stopped guardian reads nothing, and
            // a full pipe would otherwise stop distlock's runtime thread
            // at its next line (see `send`).
            // SAFETY: fcntl(2) on a pipe's write end distlock owns.
            unsafe {
                let fd = writer.as_raw_fd();
                let flags = libc::fcntl(fd, libc::F_GETFL);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(writer)
        })();
        match started {
            Ok(writer) => Guardian {
                pipe: Some(writer),
                told: None,
            },
            Err(e) => {
                say!("cannot start the guardian of the child's group ({e}): should distlock be killed, what the child started may outlive it");
                Guardian {
                    pipe: None,
                    told: None,
                }
            }
        }
    }

    /// Tells the guardian the child's group.
    pub fn guard(&mut self, pgid: i32) {
        self.send(&format!("{pgid}\n"));
    }

    /// Tells the guardian the instant until which the lease is known held,
    /// if it moved earlier, or later by [`SMALLEST_MOVE`] or more, since
    /// last told. `None` (no deadline) tells nothing.
    pub fn hold_until(&mut self, until: Option<Instant>) {
        let Some(ns) = until.map(monotonic_of) else {
            return;
        };
        let moved = match self.told {
            None => true,
            Some(told) => {
                ns < told
                    || ns - told >= u64::try_from(SMALLEST_MOVE.as_nanos()).unwrap_or(u64::MAX)
            }
        };
        if moved && self.send(&format!("until {ns}\n")) {
            self.told = Some(ns);
        }
    }

    /// Whether the lease's deadline last told has passed: the guardian
    /// then SIGKILLs the group (or did).
    pub fn deadline_passed(&self) -> bool {
        self.told.is_some_and(|told| monotonic_now() >= told)
    }

    /// The group is gone: the guardian exits without signalling anyone.
    pub fn dismiss(&mut self) {
        self.send("done\n");
        self.pipe = None;
    }

    /// Writes `line` whole or not at all: whether it was written. A line
    /// is shorter than `PIPE_BUF`, so the pipe takes it whole or, when
    /// full (the guardian stopped: it reads nothing), refuses it with
    /// `WouldBlock`; that line is dropped and distlock goes on. Nothing
    /// is lost that matters: the guardian only needs the latest deadline,
    /// and as `told` did not move, the next renewal tells it again.
    fn send(&mut self, line: &str) -> bool {
        use std::io::Write as _;
        let Some(pipe) = &mut self.pipe else {
            return false;
        };
        match pipe.write(line.as_bytes()) {
            Ok(n) if n == line.len() => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tracing::debug!("the guardian's pipe is full (is it stopped?): line dropped");
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            _ => {
                tracing::warn!("the guardian of the child's group is gone");
                self.pipe = None;
                false
            }
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (what `Instant` reads on Linux,
/// and the same in every process of the machine).
fn monotonic_now() -> u64 {
    // SAFETY: clock_gettime(2) into a zeroed timespec.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts
    };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `at` on `CLOCK_MONOTONIC`, in nanoseconds: its distance from now, laid
/// on the clock read now.
fn monotonic_of(at: Instant) -> u64 {
    let now = Instant::now();
    let clock = monotonic_now();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if at >= now {
        clock.saturating_add(nanos(at - now))
    } else {
        clock.saturating_sub(nanos(now - at))
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
    let mut until: Option<u64> = None;
    // The group was killed at the lease's deadline while distlock lived.
    let mut killed = false;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        // Until the lease's deadline, if a group is to be ended by then.
        // The deadline passed: what the pipe already holds is read first,
        // without waiting (a guardian that was stopped or starved may
        // have a later deadline there, written in time).
        let mut due = None;
        let wait = match (group, until) {
            (Some(pgid), Some(until)) if !killed => {
                let now = monotonic_now();
                if until <= now {
                    due = Some(pgid);
                }
                Some(until.saturating_sub(now))
            }
            _ => None,
        };
        match read_some(wait, &mut pending) {
            Read::Data => {}
            Read::Timeout => {
                if let Some(pgid) = due {
                    // Nothing later was told in time: the lease is gone
                    // as distlock itself counts it.
                    kill_group_and_offspring(pgid);
                    killed = true;
                }
                continue;
            }
            Read::End => break,
        }
        while let Some(at) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            if line == "done" {
                return 0;
            } else if let Some(ns) = line.strip_prefix("until ") {
                if let Ok(ns) = ns.parse::<u64>() {
                    until = Some(ns);
                }
            } else if let Ok(pgid) = line.parse::<i32>() {
                if pgid > 1 {
                    group = Some(pgid);
                }
            }
        }
    }
    // distlock is gone and did not see the group end.
    if let Some(pgid) = group {
        if killed {
            if group_alive(pgid) {
                kill_group_and_offspring(pgid);
            }
        } else {
            end_group(pgid, grace, until);
        }
    }
    0
}

enum Read {
    Data,
    Timeout,
    End,
}

/// Reads what stdin has into `pending`, waiting `wait` at most (`None`:
/// as long as it takes). Raw reads, no buffer of std's in between: what
/// was read is all handled before the next wait.
fn read_some(wait: Option<u64>, pending: &mut Vec<u8>) -> Read {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = wait.map(|ns| libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0),
    });
    let timeout_ptr = timeout
        .as_ref()
        .map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: ppoll(2) on one pollfd with a timespec or null.
    let ready = unsafe { libc::ppoll(&mut fd, 1, timeout_ptr, std::ptr::null()) };
    if ready == 0 {
        return Read::Timeout;
    }
    if ready < 0 {
        return if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            Read::Timeout
        } else {
            Read::End
        };
    }
    let mut buf = [0u8; 512];
    // SAFETY: read(2) into a buffer of that length.
    let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
    match usize::try_from(n) {
        Ok(0) => Read::End,
        Ok(n) => {
            pending.extend_from_slice(&buf[..n]);
            Read::Data
        }
        Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Read::Timeout,
        Err(_) => Read::End,
    }
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill(2) with a negative pid and signal 0 only checks that
    // the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// SIGKILL to group `pgid`, and to what its members' descendants run in
/// other groups: a nested `distlock exec`'s child (distlock puts it in a
/// group of its own) and its guardian, or what a child moved out with
/// `setsid`/`setpgid`, as long as its parent is still one of ours (an
/// orphan's parent is init: out of reach). Found through `/proc` by
/// parent: each such group led by one of ours is stopped (SIGSTOP: nothing
/// in it forks or exits while the rest is looked for), a process that
/// joined a group not led by one of ours alone; then all get SIGKILL,
/// `pgid` last but in the same instant. `pgid` itself is not stopped first:
/// its leader is distlock's child, whose stop distlock would follow (see
/// `Running::supervise`); what a member of it starts between the look and
/// the SIGKILL is missed.
pub fn kill_group_and_offspring(pgid: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: getpgrp(2) and getpid(2) cannot fail.
    let (own_group, own) = unsafe { (libc::getpgrp(), libc::getpid()) };
    let mut groups: Vec<i32> = Vec::new();
    let mut loners: Vec<i32> = Vec::new();
    // Each round stops what it found; a few rounds reach any depth of
    // nesting there is in practice, and the bound keeps a fork bomb from
    // holding the SIGKILL back.
    for _ in 0..8 {
        let procs = processes();
        let mut ours: std::collections::HashSet<i32> = procs
            .iter()
            .filter(|p| p.pgrp == pgid || groups.contains(&p.pgrp))
            .map(|p| p.pid)
            .collect();
        loop {
            let before = ours.len();
            for p in &procs {
                if ours.contains(&p.ppid) && p.pid != own {
                    ours.insert(p.pid);
                }
            }
            if ours.len() == before {
                break;
            }
        }
        let mut found = false;
        for p in procs.iter().filter(|p| ours.contains(&p.pid)) {
            if p.pgrp == pgid || groups.contains(&p.pgrp) {
                continue;
            }
            if p.pgrp > 1 && p.pgrp != own_group && ours.contains(&p.pgrp) {
                groups.push(p.pgrp);
                kill_group(p.pgrp, libc::SIGSTOP);
                found = true;
            } else if !loners.contains(&p.pid) {
                loners.push(p.pid);
                // SAFETY: kill(2) of one process, a descendant of the group.
                unsafe {
                    libc::kill(p.pid, libc::SIGSTOP);
                }
                found = true;
            }
        }
        if !found {
            break;
        }
    }
    for &group in &groups {
        kill_group(group, libc::SIGKILL);
    }
    for &pid in &loners {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    kill_group(pgid, libc::SIGKILL);
}

/// One process as `/proc/PID/stat` tells it.
struct Process {
    pid: i32,
    ppid: i32,
    pgrp: i32,
}

/// Every process `/proc` shows (those that end while it is read are left
/// out).
fn processes() -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's closing parenthesis: state, ppid, pgrp.
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        Some(Process { pid, ppid, pgrp })
    })
    .collect()
}

fn kill_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// SIGTERM to the group, SIGKILL to what is left of it at the earlier of
/// the grace's end and `until` (the lease's deadline); SIGKILL alone when
/// that has passed.
fn end_group(pgid: i32, grace: Duration, until: Option<u64>) {
    if !group_alive(pgid) {
        return;
    }
    let now = monotonic_now();
    let by_grace = now.saturating_add(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
    let kill_at = until.map_or(by_grace, |until| until.min(by_grace));
    if kill_at <= now {
        kill_group_and_offspring(pgid);
        return;
    }
    kill_group(pgid, libc::SIGTERM);
    loop {
        let now = monotonic_now();
        if !group_alive(pgid) || now >= kill_at {
            break;
        }
        std::thread::sleep(Duration::from_nanos(kill_at - now).min(Duration::from_millis(20)));
    }
    if group_alive(pgid) {
        kill_group_and_offspring(pgid);
    }
}
