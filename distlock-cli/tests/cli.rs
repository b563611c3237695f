//! End to end: the built `distlock` binary, run as separate processes against
//! real Redis and ZooKeeper servers.
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

fn redis_url() -> String {
    test_support::redis::shared().url()
}

fn zk_url() -> String {
    // A short session: a killed holder's session ends in 2 s.
    format!(
        "zk://{}?session_timeout_ms=2000",
        test_support::zookeeper::shared().connect_string()
    )
}

/// `distlock` with `DISTLOCK_URL` set and no stdin.
fn distlock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.env("DISTLOCK_URL", url).args(args).stdin(Stdio::null());
    cmd
}

fn run(url: &str, args: &[&str]) -> Output {
    distlock(url, args).output().unwrap()
}

/// Lease options that make a Redis holder notice a force-release quickly (a
/// TTL of 1 s renews every third of a second); ZooKeeper takes none.
fn fast_lease(url: &str) -> Vec<&'static str> {
    if url.starts_with("redis") {
        vec!["--ttl", "1"]
    } else {
        vec![]
    }
}

fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().expect("distlock exits, it is not killed");
        }
        assert!(
            Instant::now() < deadline,
            "distlock did not exit in {limit:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: our own child process.
    unsafe {
        libc::kill(i32::try_from(child.id()).unwrap(), sig);
    }
}

fn inspect(url: &str, name: &str, kind: &str) -> Value {
    let out = run(url, &["inspect", name, "--kind", kind, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A holder running `sh -c SCRIPT` under `name`; returns once the child
/// wrote `dir/ready`.
fn hold(url: &str, name: &str, extra: &[&str], script: &str, dir: &Path) -> Child {
    let mut args = vec!["exec"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[name, "--", "sh", "-c", script]);
    let mut child = distlock(url, &args)
        .current_dir(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = dir.join("ready");
    wait_until(Duration::from_secs(15), "the holder's child", || {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("holder exited early: {status}");
        }
        ready.exists()
    });
    child
}

// N processes increment a counter file through a shell, each under the lock:
// no increment is lost.
fn counter(url: &str) {
    let name = test_support::unique_name("counter");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("n");
    std::fs::write(&file, "0").unwrap();
    let script = format!(
        "n=$(cat {f}); sleep 0.01; echo $((n + 1)) > {f}",
        f = file.display()
    );
    let (procs, rounds) = (6, 3);
    let workers: Vec<_> = (0..procs)
        .map(|_| {
            let (url, name, script) = (url.to_owned(), name.clone(), script.clone());
            thread::spawn(move || {
                for _ in 0..rounds {
                    let out = run(&url, &["exec", &name, "--", "sh", "-c", &script]);
                    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let n: u32 = std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(n, procs * rounds);
}

// The child sees its lease; its status is distlock's.
fn child_env_and_status(url: &str) {
    let name = test_support::unique_name("env");
    let mut child = distlock(
        url,
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo \"$DISTLOCK_NAME|$DISTLOCK_FENCING_TOKEN|$DISTLOCK_OWNER\"; exit 7",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let out = std::mem::take(&mut child.stdout).unwrap();
    let line = BufReader::new(out).lines().next().unwrap().unwrap();
    assert_eq!(wait_exit(&mut child, Duration::from_secs(15)), 7);
    let parts: Vec<&str> = line.split('|').collect();
    assert_eq!(parts[0], name);
    assert!(parts[1].parse::<u64>().is_ok(), "{line}");
    assert!(parts[2].ends_with(&format!(":{pid}")), "{line}");
}

// While held: -n gives the conflict code (-E too), -w 0.5 times out,
// inspect --json shows the holder; a forwarded SIGTERM ends the child and
// the lock is free again.
fn held(url: &str) {
    let name = test_support::unique_name("held");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(url, &name, &[], "touch ready; exec sleep 300", dir.path());

    let out = run(url, &["exec", "-n", &name, "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    let out = run(url, &["exec", "-n", "-E", "9", &name, "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr_line(&out));
    let started = Instant::now();
    let out = run(url, &["exec", "-w", "0.5", &name, "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    assert!(started.elapsed() >= Duration::from_millis(500));
    // flock(1)'s long form of -w.
    let started = Instant::now();
    let out = run(
        url,
        &["exec", "--timeout", "0.5", &name, "--", "touch", "ran"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(!dir.path().join("ran").exists());
    // -v into a pipe: what happened in plain words, no colour codes.
    let out = run(url, &["-v", "exec", "-n", &name, "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("not acquired: mutex {name}")),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");

    let snapshot = inspect(url, &name, "mutex");
    assert_eq!(snapshot["held"], true, "{snapshot}");
    let holder0 = &snapshot["holders"][0];
    let owner = holder0["owner"].as_str().unwrap();
    assert!(owner.ends_with(&format!(":{}", holder.id())), "{snapshot}");
    assert!(holder0["fencing_token"].as_u64().is_some(), "{snapshot}");
    assert!(holder0["acquired_at"].as_str().is_some(), "{snapshot}");

    signal(&holder, libc::SIGTERM);
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 128 + 15);
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
    let out = run(url, &["exec", "-n", &name, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    let out = run(url, &["-v", "exec", "--fair", &name, "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("acquired fair mutex {name}, token ")),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
}

// A signal reaches the child and the grandchild it started: both die.
fn signals_reach_the_group(url: &str) {
    let name = test_support::unique_name("group");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        url,
        &name,
        &[],
        "sleep 300 & echo $! > gc.pid; echo $$ > c.pid; touch ready; wait",
        dir.path(),
    );
    let child = read_pid(&dir.path().join("c.pid")).unwrap();
    let grandchild = read_pid(&dir.path().join("gc.pid")).unwrap();
    assert!(alive(child) && alive(grandchild));
    signal(&holder, libc::SIGHUP);
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 128 + 1);
    wait_until(
        Duration::from_secs(5),
        "child and grandchild to die",
        || !alive(child) && !alive(grandchild),
    );
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// Every catchable signal reaches the child's group, not only the four that
// end it: SIGUSR1 (which used to kill distlock, status 138, and leave the
// lock held), SIGUSR2 and SIGWINCH reach a child that traps them, while
// distlock runs on and holds.
fn other_signals_are_forwarded(url: &str) {
    let name = test_support::unique_name("usr1");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        url,
        &name,
        &[],
        "trap 'touch usr1' USR1; trap 'touch usr2' USR2; trap 'touch winch' WINCH; \
         touch ready; while [ ! -e done ]; do sleep 0.05; done",
        dir.path(),
    );
    for (sig, file) in [
        (libc::SIGUSR1, "usr1"),
        (libc::SIGUSR2, "usr2"),
        (libc::SIGWINCH, "winch"),
    ] {
        signal(&holder, sig);
        wait_until(Duration::from_secs(5), file, || {
            dir.path().join(file).exists()
        });
        assert!(
            holder.try_wait().unwrap().is_none(),
            "distlock ended on signal {sig}"
        );
        assert_eq!(inspect(url, &name, "mutex")["held"], true);
    }
    // The child saw all three; it ends when told: its status is distlock's.
    std::fs::write(dir.path().join("done"), "").unwrap();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 0);
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// distlock killed with SIGKILL (nothing of it runs): its guardian ends the
// child's whole group, the grandchild too (it kept running before, and
// another host took the lock once the lease expired).
fn the_group_ends_with_a_killed_distlock(url: &str) {
    let name = test_support::unique_name("sigkill");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        url,
        &name,
        &["--grace", "1"],
        "sleep 300 & echo $! > gc.pid; echo $$ > c.pid; touch ready; wait",
        dir.path(),
    );
    let child = read_pid(&dir.path().join("c.pid")).unwrap();
    let grandchild = read_pid(&dir.path().join("gc.pid")).unwrap();
    assert!(alive(child) && alive(grandchild));
    holder.kill().unwrap();
    let _ = holder.wait();
    wait_until(
        Duration::from_secs(10),
        "the child and the grandchild to end after distlock's SIGKILL",
        || !alive(child) && !alive(grandchild),
    );
}

// The child exits and leaves a process of its group running: distlock ends
// it (SIGTERM, SIGKILL after --grace) before it releases the lock, and exits
// with the child's status.
fn leftovers_of_the_child_end_before_the_release(url: &str) {
    let name = test_support::unique_name("leftover");
    let dir = tempfile::tempdir().unwrap();
    let out = distlock(
        url,
        &[
            "exec",
            "--grace",
            "1",
            &name,
            "--",
            "sh",
            "-c",
            // Its output away from distlock's pipes: reading them to the
            // end would wait for it.
            "sleep 300 >/dev/null 2>&1 & echo $! > gc.pid; exit 3",
        ],
    )
    .current_dir(dir.path())
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr_line(&out));
    let grandchild = read_pid(&dir.path().join("gc.pid")).unwrap();
    assert!(!alive(grandchild), "the child's leftover outlived distlock");
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// A signal while waiting: 128 + N, nothing ran, nothing is held afterwards.
fn signal_while_waiting(url: &str) {
    let name = test_support::unique_name("waiting");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        url,
        &name,
        &["--fair"],
        "touch ready; exec sleep 300",
        dir.path(),
    );
    let mut waiter = distlock(url, &["-v", "exec", "--fair", &name, "--", "touch", "ran"])
        .current_dir(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(waiter.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if line.contains("waiting") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the waiter says it waits");
    assert_eq!(inspect(url, &name, "fair")["waiters"]["count"], 1);
    signal(&waiter, libc::SIGINT);
    assert_eq!(wait_exit(&mut waiter, Duration::from_secs(10)), 128 + 2);
    assert!(!dir.path().join("ran").exists());
    wait_until(Duration::from_secs(5), "the waiter's withdrawal", || {
        inspect(url, &name, "fair")["waiters"]["count"] == 0
    });
    signal(&holder, libc::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(inspect(url, &name, "fair")["held"], false);
}

// Force-release from another process: unlock without --yes and no terminal
// refuses and changes nothing; with --yes the child is stopped, --on-lost
// runs and distlock exits 75.
fn force_release_stops_the_child(url: &str) {
    let name = test_support::unique_name("force");
    let dir = tempfile::tempdir().unwrap();
    let mut extra = fast_lease(url);
    extra.extend_from_slice(&["--grace", "5", "--on-lost", "touch lost"]);
    let mut holder = hold(
        url,
        &name,
        &extra,
        "echo $$ > c.pid; touch ready; exec sleep 300",
        dir.path(),
    );
    let child = read_pid(&dir.path().join("c.pid")).unwrap();

    let out = run(url, &["unlock", "--force", &name]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr_line(&out).contains("--yes"), "{}", stderr_line(&out));
    assert_eq!(inspect(url, &name, "mutex")["held"], true);
    assert!(holder.try_wait().unwrap().is_none());

    let out = run(url, &["unlock", "--grace", "0", "--force", "--yes", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(5)), 75);
    assert!(!alive(child));
    assert!(dir.path().join("lost").exists());
}

// A child that ignores SIGTERM is SIGKILLed after --grace (shorter here
// than what is left of the lease: ZooKeeper's is 1 to 1.5 s when the
// deletion is heard, Redis's 2 to 3 s with a TTL of 3 s).
fn stubborn_child_is_killed_after_grace(url: &str) {
    let name = test_support::unique_name("stubborn");
    let dir = tempfile::tempdir().unwrap();
    let mut extra = if url.starts_with("redis") {
        vec!["--ttl", "3"]
    } else {
        vec![]
    };
    extra.extend_from_slice(&["--grace", "0.5"]);
    let mut holder = hold(
        url,
        &name,
        &extra,
        "trap '' TERM; echo $$ > c.pid; touch ready; while :; do sleep 0.05; done",
        dir.path(),
    );
    let child = read_pid(&dir.path().join("c.pid")).unwrap();
    let out = run(url, &["unlock", "--grace", "0", "--force", "--yes", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    let forced = Instant::now();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(8)), 75);
    assert!(!alive(child));
    // It got the grace: SIGTERM alone did not end it.
    assert!(
        forced.elapsed() >= Duration::from_millis(400),
        "{:?}",
        forced.elapsed()
    );
}

// `elect` runs exactly one child among N and hands over when the leader's
// distlock is SIGKILLed; `elect --observe` prints each leader.
fn elect_hands_over(url: &str) {
    let name = test_support::unique_name("elect");
    let dir = tempfile::tempdir().unwrap();
    let mut observer = distlock(url, &["elect", "--observe", &name])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, seen) = mpsc::channel();
    let out = BufReader::new(observer.stdout.take().unwrap());
    thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(10)).unwrap(),
        "no leader"
    );

    let script = "echo $$ > $DISTLOCK_FENCING_TOKEN.pid; echo \"$DISTLOCK_OWNER\" > $DISTLOCK_FENCING_TOKEN.owner; exec sleep 300";
    let mut args = vec!["elect"];
    args.extend(fast_lease(url));
    args.extend_from_slice(&[&name, "--", "sh", "-c", script]);
    let mut candidates: Vec<Child> = (0..3)
        .map(|_| {
            distlock(url, &args)
                .current_dir(dir.path())
                .spawn()
                .unwrap()
        })
        .collect();
    let leaders = || -> Vec<(u64, i32)> {
        let mut found: Vec<(u64, i32)> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path();
                let term = path.file_stem()?.to_str()?.parse().ok()?;
                (path.extension()? == "pid").then_some(())?;
                Some((term, read_pid(&path)?))
            })
            .collect();
        found.sort_unstable();
        found
    };
    wait_until(Duration::from_secs(10), "a leader", || leaders().len() == 1);
    let first = seen.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.starts_with("leader "), "{first}");
    // Still one: the others wait.
    thread::sleep(Duration::from_millis(300));
    let (term, child) = leaders()[0];
    assert_eq!(leaders().len(), 1);
    let owner = std::fs::read_to_string(dir.path().join(format!("{term}.owner"))).unwrap();
    let leader_pid: u32 = owner.trim().rsplit(':').next().unwrap().parse().unwrap();
    let leader = candidates
        .iter()
        .position(|c| c.id() == leader_pid)
        .unwrap();

    let mut killed = candidates.remove(leader);
    killed.kill().unwrap();
    killed.wait().unwrap();
    // The dead leader's child follows it; then one other candidate leads.
    wait_until(Duration::from_secs(5), "the old child to die", || {
        !alive(child)
    });
    wait_until(Duration::from_secs(15), "a new leader", || {
        leaders().len() == 2
    });
    let (new_term, new_child) = leaders()[1];
    assert!(new_term > term && alive(new_child));
    let second = seen.recv_timeout(Duration::from_secs(15)).unwrap();
    let second = if second == "no leader" {
        seen.recv_timeout(Duration::from_secs(15)).unwrap()
    } else {
        second
    };
    assert!(second.starts_with("leader ") && second != first, "{second}");

    for c in &candidates {
        signal(c, libc::SIGTERM);
    }
    for c in &mut candidates {
        // The leader's child died of the forwarded SIGTERM; the waiter
        // was interrupted while waiting: 128 + 15 both.
        assert_eq!(wait_exit(c, Duration::from_secs(10)), 128 + 15);
    }
    assert!(!alive(new_child));
    signal(&observer, libc::SIGINT);
    assert_eq!(wait_exit(&mut observer, Duration::from_secs(5)), 0);
}

// Distinct, increasing ids, across calls too.
fn ids(url: &str) {
    let name = test_support::unique_name("ids");
    let parse = |out: Output| -> Vec<u64> {
        assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    };
    let a = parse(run(url, &["id", &name, "--count", "20", "--block", "7"]));
    let b = parse(run(url, &["id", &name, "--count", "3"]));
    assert_eq!(a.len(), 20);
    assert_eq!(b.len(), 3);
    let all: Vec<u64> = a.into_iter().chain(b).collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
}

// An unreachable server: 69 and the cause on one line.
fn unreachable(url: &str) {
    let port = test_support::free_port();
    let dead = if url.starts_with("redis") {
        format!("redis://127.0.0.1:{port}")
    } else {
        format!("zk://127.0.0.1:{port}?connect_timeout_ms=3000")
    };
    let started = Instant::now();
    let out = run(&dead, &["exec", "x", "--", "true"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr_line(&out));
    let err = stderr_line(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("distlock: "), "{err}");
    // Nothing listens there: refused at once on both backends (ZooKeeper
    // waited out its connect timeout before), with the reason.
    assert!(err.to_lowercase().contains("refused"), "{err}");
    let fast = Duration::from_millis(1500);
    assert!(
        started.elapsed() < fast,
        "took {:?}: {err}",
        started.elapsed()
    );
}

/// The state letter of `pid` in /proc (`T` stopped, `S` sleeping, ...).
fn state(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next()?.trim_start().chars().next())
        .unwrap_or('?')
}

// Ctrl-Z: SIGTSTP to distlock stops the child's group
// and then distlock itself (as dumb-init: a shell sees its job stopped);
// SIGCONT continues both, and the child runs on to its own exit status. The
// same when the group is stopped directly (the terminal sends Ctrl-Z's
// SIGTSTP to the foreground group, the child's): distlock stops after it
// instead of waiting blindly. (SIGTSTP was not caught before: the child ran
// on while distlock stopped, or distlock ran on beside a stopped child.)
fn ctrl_z_stops_the_group_then_distlock(url: &str) {
    // A stopped distlock renews nothing, and its guardian ends the group
    // at the lease's deadline: a session of 2 s left a loaded machine too
    // little time to see everything stopped. Ctrl-Z is what is tested
    // here, not the lease.
    let url = &url.replace("session_timeout_ms=2000", "session_timeout_ms=20000");
    for direct in [false, true] {
        let name = test_support::unique_name("tstp");
        let dir = tempfile::tempdir().unwrap();
        let mut holder = hold(
            url,
            &name,
            &[],
            "sleep 300 & echo $! > gc.pid; echo $$ > c.pid; touch ready;              while [ ! -e done ]; do sleep 0.05; done; kill $!; exit 7",
            dir.path(),
        );
        let child = read_pid(&dir.path().join("c.pid")).unwrap();
        let grandchild = read_pid(&dir.path().join("gc.pid")).unwrap();
        let distlock = i32::try_from(holder.id()).unwrap();
        if direct {
            // SAFETY: the child's own group (it leads it).
            unsafe {
                libc::kill(-child, libc::SIGTSTP);
            }
        } else {
            signal(&holder, libc::SIGTSTP);
        }
        wait_until(
            Duration::from_secs(10),
            "the group, then distlock, stopped",
            || state(child) == 'T' && state(grandchild) == 'T' && state(distlock) == 'T',
        );
        // Nothing runs on while stopped: the child does not see `done`.
        std::fs::write(dir.path().join("done"), "").unwrap();
        thread::sleep(Duration::from_millis(300));
        assert_eq!(state(child), 'T');
        assert!(alive(child), "the child ended while stopped");
        signal(&holder, libc::SIGCONT);
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(20)),
            7,
            "direct: {direct}"
        );
        assert!(!alive(grandchild));
        assert_eq!(inspect(url, &name, "mutex")["held"], false);
    }
}

/// Runs `script` with `bash -c`, `DL` the distlock binary and
/// `DISTLOCK_URL` set; its stdout, checked for exit 0.
fn bash(url: &str, name: &str, script: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("DL", env!("CARGO_BIN_EXE_distlock"))
        .env("DISTLOCK_URL", url)
        .env("NAME", name)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {out}"))
}

// `distlock lock NAME` (as `etcdctl lock NAME`): held
// across part of a shell script, from the token it prints until its stdin
// closes (exit 0) or a signal (released, 128 + N); --json prints the hold
// as one object.
fn hold_mode_from_a_shell_script(url: &str) {
    let name = test_support::unique_name("hold");
    let out = bash(
        url,
        &name,
        r#"
        coproc LOCK { "$DL" lock "$NAME"; }
        read -r token <&"${LOCK[0]}"
        echo "token=$token"
        "$DL" exec -n "$NAME" -- true; echo "while=$?"
        exec {LOCK[1]}>&-
        wait "$LOCK_PID"; echo "rc=$?"
        "$DL" exec -n "$NAME" -- true; echo "after=$?"
        coproc J { "$DL" lock --json --fair "$NAME"; }
        read -r record <&"${J[0]}"
        echo "record=$record"
        "$DL" exec -n --fair "$NAME" -- true; echo "while_json=$?"
        kill -TERM "$J_PID"; wait "$J_PID"; echo "rc_json=$?"
        "$DL" exec -n "$NAME" -- true; echo "after_json=$?"
        "$DL" lock -n "$NAME" < /dev/null; echo "free_now=$?"
        "#,
    );
    let token: u64 = field(&out, "token").parse().unwrap();
    assert_eq!(field(&out, "while"), "1", "{out}");
    assert_eq!(field(&out, "rc"), "0", "{out}");
    assert_eq!(field(&out, "after"), "0", "{out}");
    let record: Value = serde_json::from_str(field(&out, "record")).unwrap();
    assert_eq!(record["name"], name.as_str(), "{record}");
    assert_eq!(record["kind"], "fair", "{record}");
    assert!(
        record["fencing_token"].as_u64().unwrap() > token,
        "{record}"
    );
    assert!(record["owner"].as_str().is_some(), "{record}");
    assert_eq!(field(&out, "while_json"), "1", "{out}");
    assert_eq!(field(&out, "rc_json"), "143", "{out}");
    assert_eq!(field(&out, "after_json"), "0", "{out}");
    // stdin at its end from the start: taken, printed, released.
    assert_eq!(field(&out, "free_now"), "0", "{out}");
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// --json wherever output is data: one object a line.
fn json_output_is_one_object_a_line(url: &str) {
    let name = test_support::unique_name("json");
    let out = bash(
        url,
        &name,
        r#"
        "$DL" id "$NAME-ids" --json --count 3
        "$DL" inspect "$NAME-lock" --json
        timeout -s INT 2 "$DL" elect --observe --json "$NAME-election"; true
        "#,
    );
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(lines.len() >= 5, "{out}");
    let ids: Vec<u64> = lines[..3]
        .iter()
        .map(|v| {
            assert_eq!(v["name"], format!("{name}-ids"), "{v}");
            v["id"].as_u64().unwrap()
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(lines[3]["held"], false, "{out}");
    assert_eq!(lines[3]["name"], format!("{name}-lock"), "{out}");
    assert_eq!(lines[4]["name"], format!("{name}-election"), "{out}");
    assert!(lines[4]["leader"].is_null(), "{out}");
}

/// A listener that accepts connections and never says a word: a server
/// that hangs.
fn silent_listener() -> (u16, thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let keeper = thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().take(16) {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => return,
            }
        }
    });
    (port, keeper)
}

// A server that accepts and never answers: the connect
// timeout names the backend and the address ("connect timed out after 1s"
// named neither on Redis, no address on ZooKeeper), exit 69, one line.
fn connect_timeout_names_backend_and_address(url: &str) {
    let (port, _keeper) = silent_listener();
    let (dead, backend) = if url.starts_with("redis") {
        (
            format!("redis://127.0.0.1:{port}?connect_timeout_ms=1000"),
            "redis",
        )
    } else {
        (
            format!("zk://127.0.0.1:{port}?connect_timeout_ms=1000"),
            "zookeeper",
        )
    };
    for args in [&["exec", "x", "--", "true"][..], &["id", "x"]] {
        let out = run(&dead, args);
        let err = stderr_line(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(backend), "{err}");
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
        assert!(err.contains("connect timeout"), "{err}");
    }
}

// --semaphore N admits N holders, --read shares, --write excludes.
fn other_primitives(url: &str) {
    let name = test_support::unique_name("prims");
    let dir = tempfile::tempdir().unwrap();
    let sub = |n: &str| {
        let d = dir.path().join(n);
        std::fs::create_dir(&d).unwrap();
        d
    };
    let script = "touch ready; exec sleep 300";
    let (a, b) = (sub("a"), sub("b"));
    let mut holders = vec![
        hold(url, &name, &["--semaphore", "2"], script, &a),
        hold(url, &name, &["--semaphore", "2"], script, &b),
    ];
    let out = run(
        url,
        &["exec", "-n", "--semaphore", "2", &name, "--", "true"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    let snapshot = inspect(url, &name, "semaphore");
    assert_eq!(
        snapshot["holders"].as_array().unwrap().len(),
        2,
        "{snapshot}"
    );

    // Another name: one name is one lock (see `kinds_on_one_name`).
    let name = test_support::unique_name("prims-rw");
    let (c, d) = (sub("c"), sub("d"));
    holders.push(hold(url, &name, &["--read"], script, &c));
    holders.push(hold(url, &name, &["--read"], script, &d));
    let out = run(url, &["exec", "-n", "--write", &name, "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    for h in &holders {
        signal(h, libc::SIGTERM);
    }
    for h in &mut holders {
        assert_eq!(wait_exit(h, Duration::from_secs(10)), 128 + 15);
    }
    let out = run(url, &["exec", "-n", "--write", &name, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
}

// One name is one lock: beside `exec NAME` (a mutex), `exec --write`,
// `--read` and `--semaphore 1` on the same name exit 65 (Error::Conflict) at
// once, running nothing; `exec --fair` waits for the mutex (`-n`: exit 1)
// and gets in after it.
fn kinds_on_one_name(url: &str) {
    let name = test_support::unique_name("kinds");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(url, &name, &[], "touch ready; exec sleep 300", dir.path());
    for kind in [&["--write"][..], &["--read"], &["--semaphore", "1"]] {
        let mut args = vec!["exec", "-w", "10"];
        args.extend_from_slice(kind);
        args.extend_from_slice(&[&name, "--", "touch", "ran"]);
        let started = Instant::now();
        let out = distlock(url, &args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(65),
            "{kind:?}: {}",
            stderr_line(&out)
        );
        assert!(
            !dir.path().join("ran").exists(),
            "{kind:?} ran beside the mutex"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{kind:?} waited for the mutex"
        );
        assert!(
            stderr_line(&out).contains("mutex"),
            "{kind:?}: {}",
            stderr_line(&out)
        );
    }
    let out = distlock(url, &["exec", "-n", "--fair", &name, "--", "touch", "ran"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    assert!(!dir.path().join("ran").exists());
    let fair = distlock(
        url,
        &["exec", "-w", "30", "--fair", &name, "--", "touch", "ran"],
    )
    .current_dir(dir.path())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    signal(&holder, libc::SIGTERM);
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 128 + 15);
    let out = fair.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert!(dir.path().join("ran").exists());
}

// Losing leadership stops the child; `elect` campaigns again and runs it
// anew, `elect --once` exits 75.
fn elect_after_losing(url: &str) {
    let name = test_support::unique_name("relect");
    let dir = tempfile::tempdir().unwrap();
    let script = "echo $$ > $DISTLOCK_FENCING_TOKEN.pid; exec sleep 300";
    let terms = || -> Vec<(u64, i32)> {
        let mut found: Vec<(u64, i32)> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path();
                Some((path.file_stem()?.to_str()?.parse().ok()?, read_pid(&path)?))
            })
            .collect();
        found.sort_unstable();
        found
    };
    let mut args = vec!["elect", "--grace", "5"];
    args.extend(fast_lease(url));
    args.extend_from_slice(&[&name, "--", "sh", "-c", script]);
    let mut leader = distlock(url, &args)
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the first term", || {
        terms().len() == 1
    });
    let (_, first) = terms()[0];
    let force = [
        "unlock", "--grace", "0", "--force", "--yes", "--kind", "election", &name,
    ];
    assert_eq!(run(url, &force).status.code(), Some(0));
    wait_until(Duration::from_secs(10), "a second term", || {
        terms().len() == 2
    });
    assert!(!alive(first));
    assert!(leader.try_wait().unwrap().is_none(), "it campaigned again");
    signal(&leader, libc::SIGTERM);
    assert_eq!(wait_exit(&mut leader, Duration::from_secs(10)), 128 + 15);

    let once: Vec<&str> = [&["elect", "--once"][..], &args[1..]].concat();
    let mut leader = distlock(url, &once)
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "a third term", || {
        terms().len() == 3
    });
    assert_eq!(run(url, &force).status.code(), Some(0));
    assert_eq!(wait_exit(&mut leader, Duration::from_secs(10)), 75);
}

// Several names: the child sees every token (DISTLOCK_TOKENS, in the order
// taken), a set with one busy name runs nothing and leaves the others free,
// overlapping sets given in opposite orders by separate processes finish
// with no lost update, and one lost member stops the child (exit 75).
fn several_names(url: &str) {
    let prefix = test_support::unique_name("set");
    let [a, b, c] = ["a", "b", "c"].map(|n| format!("{prefix}/{n}"));
    let out = run(
        url,
        &[
            "exec",
            &b,
            &a,
            "--",
            "sh",
            "-c",
            "echo \"$DISTLOCK_NAME|$DISTLOCK_FENCING_TOKEN|$DISTLOCK_TOKENS\"",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let parts: Vec<&str> = line.split('|').collect();
    assert_eq!(parts[0], b, "{line}");
    let pairs: Vec<(&str, &str)> = parts[2]
        .split(',')
        .map(|p| p.split_once('=').unwrap())
        .collect();
    assert_eq!(
        pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
        [a.as_str(), b.as_str()],
        "{line}"
    );
    assert_eq!(pairs[1].1, parts[1], "{line}");
    assert!(pairs[0].1.parse::<u64>().is_ok(), "{line}");
    // One name: one pair.
    let out = run(
        url,
        &[
            "exec",
            &c,
            "--",
            "sh",
            "-c",
            "echo \"$DISTLOCK_FENCING_TOKEN|$DISTLOCK_TOKENS\"",
        ],
    );
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (token, tokens) = line.split_once('|').unwrap();
    assert_eq!(tokens, format!("{c}={token}"));

    // All or nothing.
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(url, &b, &[], "touch ready; exec sleep 300", dir.path());
    let out = run(url, &["exec", "-n", &c, &b, &a, "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    let started = Instant::now();
    let out = run(
        url,
        &[
            "exec", "-w", "0.5", "-E", "3", &c, &b, &a, "--", "touch", "ran",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr_line(&out));
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(!dir.path().join("ran").exists());
    let out = run(url, &["exec", "-n", &a, &c, "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a and c were left held: {}",
        stderr_line(&out)
    );
    signal(&holder, libc::SIGTERM);
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 128 + 15);

    // Bad sets are usage errors.
    for bad in [
        &["exec", &a, &a, "--", "true"][..],
        &["exec", "--semaphore", "2", &a, &b, "--", "true"][..],
        &["exec", "--read", &a, &b, "--", "true"][..],
        &["exec", &a, "bad//name", "--", "true"][..],
    ] {
        let out = run(url, bad);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{bad:?}: {}",
            stderr_line(&out)
        );
    }

    // Overlapping sets in opposite orders, as separate processes.
    let file = dir.path().join("n");
    std::fs::write(&file, "0").unwrap();
    let script = format!(
        "n=$(cat {f}); sleep 0.01; echo $((n + 1)) > {f}",
        f = file.display()
    );
    let orders = [
        vec![a.clone(), b.clone()],
        vec![b.clone(), a.clone()],
        vec![c.clone(), b.clone(), a.clone()],
        vec![a.clone(), c.clone()],
    ];
    let workers: Vec<_> = orders
        .into_iter()
        .map(|names| {
            let (url, script) = (url.to_owned(), script.clone());
            thread::spawn(move || {
                for _ in 0..3 {
                    let mut args: Vec<&str> = vec!["exec", "--fair"];
                    args.extend(names.iter().map(String::as_str));
                    args.extend(["--", "sh", "-c", &script]);
                    let out = run(&url, &args);
                    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let n: u32 = std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Every set holds a: no update lost, and none deadlocked.
    assert_eq!(n, 12);

    // One member force-released: the child is stopped, exit 75.
    let dir = tempfile::tempdir().unwrap();
    let mut extra = fast_lease(url);
    extra.push(&c);
    let mut holder = hold(url, &a, &extra, "touch ready; exec sleep 300", dir.path());
    let out = run(url, &["unlock", "--grace", "0", "--force", "--yes", &c]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 75);
}

/// The holder's stderr, once it exited.
fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut err).unwrap();
    }
    err
}

// `unlock` asks: the holder's child gets SIGTERM (--on-request's default),
// exits its own way, the lock is released, and unlock exits 0 once it is.
fn unlock_asks_and_the_holder_lets_go(url: &str) {
    let name = test_support::unique_name("asked");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        url,
        &name,
        &fast_lease(url),
        "trap 'touch asked; exit 3' TERM; touch ready; while :; do sleep 0.05; done",
        dir.path(),
    );
    let out = run(url, &["unlock", "--grace", "20", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("released by its holder"),
        "{out:?}"
    );
    // The child's own status, not 75: it was asked, not evicted.
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(5)), 3);
    assert!(dir.path().join("asked").exists());
    let err = stderr_of(&mut holder);
    assert!(err.contains(&format!("released {name} as asked")), "{err}");
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// A holder that does not let go: unlock without --force gives up after the
// grace (exit 1, still held); with --force it evicts (the holder exits 75).
fn unlock_of_a_stubborn_holder_forces_only_with_force(url: &str) {
    let name = test_support::unique_name("stubborn-asked");
    let dir = tempfile::tempdir().unwrap();
    let mut extra = fast_lease(url);
    extra.extend_from_slice(&["--grace", "1"]);
    let mut holder = hold(
        url,
        &name,
        &extra,
        "trap 'touch asked' TERM; touch ready; while :; do sleep 0.05; done",
        dir.path(),
    );
    let out = run(url, &["unlock", "--grace", "1.5", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    assert!(
        stderr_line(&out).contains("--force"),
        "{}",
        stderr_line(&out)
    );
    // It was asked (its child heard SIGTERM) and still holds.
    wait_until(Duration::from_secs(5), "the child to hear it", || {
        dir.path().join("asked").exists()
    });
    let snapshot = inspect(url, &name, "mutex");
    assert_eq!(snapshot["held"], true);
    assert_eq!(
        snapshot["holders"][0]["release_requested"], true,
        "{snapshot}"
    );
    assert!(holder.try_wait().unwrap().is_none());
    let out = run(
        url,
        &["unlock", "--grace", "0.5", "--force", "--yes", &name],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("force-released"),
        "{out:?}"
    );
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 75);
}

// Nobody holds: unlock says so, exits 0 and creates nothing. With
// --on-request none the child is not told, and the request shows in
// inspect.
fn unlock_of_a_free_name_and_on_request_none(url: &str) {
    let name = test_support::unique_name("free-asked");
    let out = run(url, &["unlock", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is not held"),
        "{out:?}"
    );
    let snapshot = inspect(url, &name, "mutex");
    assert_eq!(snapshot["held"], false);
    assert_eq!(snapshot["waiters"]["count"], 0);
    if url.starts_with("redis") {
        let redis = test_support::redis::shared();
        assert_eq!(redis.cli(&["EXISTS", &format!("{{{name}}}:revoke")]), "0");
    }

    let dir = tempfile::tempdir().unwrap();
    let mut extra = fast_lease(url);
    extra.extend_from_slice(&["--on-request", "none"]);
    let mut holder = hold(
        url,
        &name,
        &extra,
        "trap 'touch asked' TERM USR1; touch ready; while :; do sleep 0.05; done",
        dir.path(),
    );
    let out = run(url, &["unlock", "--grace", "1.5", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    let snapshot = inspect(url, &name, "mutex");
    assert_eq!(
        snapshot["holders"][0]["release_requested"], true,
        "{snapshot}"
    );
    thread::sleep(Duration::from_millis(300));
    assert!(!dir.path().join("asked").exists(), "the child was told");
    signal(&holder, libc::SIGINT);
    wait_exit(&mut holder, Duration::from_secs(10));
    let err = stderr_of(&mut holder);
    assert!(err.contains("--on-request none"), "{err}");
}

// A leader asked to step down: its child gets the signal, exits, distlock
// resigns and exits with the child's status; unlock exits 0.
fn the_leader_asked_steps_down(url: &str) {
    let name = test_support::unique_name("asked-leader");
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["elect"];
    let lease = fast_lease(url);
    args.extend_from_slice(&lease);
    args.extend_from_slice(&[
        "--on-request",
        "USR1",
        &name,
        "--",
        "sh",
        "-c",
        "trap 'exit 0' USR1; touch ready; while :; do sleep 0.05; done",
    ]);
    let mut leader = distlock(url, &args)
        .current_dir(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(15), "the leader's child", || {
        dir.path().join("ready").exists()
    });
    let out = run(
        url,
        &["unlock", "--kind", "election", "--grace", "20", &name],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert_eq!(wait_exit(&mut leader, Duration::from_secs(5)), 0);
    let err = stderr_of(&mut leader);
    assert!(err.contains(&format!("resigned {name} as asked")), "{err}");
    assert_eq!(inspect(url, &name, "election")["held"], false);
}

// `distlock lock` prints a line when asked, and keeps holding until its
// stdin closes.
fn hold_mode_hears_a_request(url: &str) {
    let name = test_support::unique_name("asked-hold");
    let mut args = vec!["lock"];
    let lease = fast_lease(url);
    args.extend_from_slice(&lease);
    args.push(&name);
    let mut holder = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env("DISTLOCK_URL", url)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = holder.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let token = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert!(token.parse::<u64>().is_ok(), "{token}");
    let out = run(url, &["unlock", "--grace", "0.5", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    let line = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(line, "release-requested");
    assert_eq!(inspect(url, &name, "mutex")["held"], true);
    drop(holder.stdin.take());
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(5)), 0);
    assert_eq!(inspect(url, &name, "mutex")["held"], false);
}

// exec of several names: a request on any one of them tells the child, and
// every name is released when it exits.
fn several_names_hear_a_request_on_one(url: &str) {
    let a = test_support::unique_name("set-a");
    let b = test_support::unique_name("set-b");
    let dir = tempfile::tempdir().unwrap();
    let mut extra = fast_lease(url);
    extra.push(&b);
    let mut holder = hold(
        url,
        &a,
        &extra,
        "trap 'exit 0' TERM; touch ready; while :; do sleep 0.05; done",
        dir.path(),
    );
    let out = run(url, &["unlock", "--grace", "20", &b]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_line(&out));
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(5)), 0);
    let err = stderr_of(&mut holder);
    assert!(err.contains("as asked"), "{err}");
    assert_eq!(inspect(url, &a, "mutex")["held"], false);
    assert_eq!(inspect(url, &b, "mutex")["held"], false);
}

macro_rules! on_both {
    ($($test:ident),* $(,)?) => {
        mod redis {
            $( #[test] fn $test() { super::$test(&super::redis_url()) } )*
        }
        mod zookeeper {
            $( #[test] fn $test() { super::$test(&super::zk_url()) } )*
        }
    };
}

on_both!(
    counter,
    child_env_and_status,
    held,
    signals_reach_the_group,
    other_signals_are_forwarded,
    the_group_ends_with_a_killed_distlock,
    leftovers_of_the_child_end_before_the_release,
    signal_while_waiting,
    force_release_stops_the_child,
    stubborn_child_is_killed_after_grace,
    elect_hands_over,
    other_primitives,
    kinds_on_one_name,
    elect_after_losing,
    ids,
    unreachable,
    ctrl_z_stops_the_group_then_distlock,
    hold_mode_from_a_shell_script,
    json_output_is_one_object_a_line,
    connect_timeout_names_backend_and_address,
    several_names,
    unlock_asks_and_the_holder_lets_go,
    unlock_of_a_stubborn_holder_forces_only_with_force,
    unlock_of_a_free_name_and_on_request_none,
    the_leader_asked_steps_down,
    hold_mode_hears_a_request,
    several_names_hear_a_request_on_one,
);

/// The first holder's child ignores SIGTERM, the shell and the sleep it
/// started both (`trap ''` is inherited as ignored).
const STUBBORN: &str =
    "trap '' TERM; sleep 1000 & echo $! > gc.pid; echo $$ > c.pid; touch ready; wait";

/// The next holder's child, first thing: whether each process of the first
/// child still runs (a zombie counts as dead), into `seen`. Checked where it
/// matters, when the lock is someone else's: no timing can fool it.
const SEES: &str = r#"for p in $(cat c.pid gc.pid); do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1); case "$s" in ''|Z|X) echo "dead $p";; *) echo "alive $p";; esac; done > seen.tmp; mv seen.tmp seen"#;

/// SIGKILLs what is left of the first child when a test ends (the old
/// guardian left it running).
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                // SAFETY: a process this test started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// A distlock that is SIGKILLed (and continued, were it stopped) when a
/// test ends, failed or not: a stopped one left behind kept the test's
/// output open.
struct KillOnDrop(Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // std's kill signals only a child not yet reaped.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGKILLs (after SIGCONT) what is left of a process group when a test
/// ends.
struct KillGroupOnDrop(i32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGCONT);
        signal_group(self.0, libc::SIGKILL);
    }
}

fn signal_group(pgid: i32, sig: i32) {
    assert!(pgid > 1);
    // SAFETY: a process group this test started.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// `kill -9` of the holder's distlock.
    KillDistlock,
    /// The holder's connection goes silent (a partition): its lease is lost
    /// while distlock lives.
    Partition,
    /// The holder's distlock is stopped (SIGSTOP): it renews nothing and
    /// stops nothing; its guardian, which knows the lease's deadline,
    /// ends the group then.
    StopDistlock,
    /// SIGSTOP to distlock's whole process group (a shell's `kill -STOP
    /// %job`): it reached the guardian too, and nobody ended the group.
    StopDistlocksGroup,
    /// SIGKILL to distlock's whole process group: it took the guardian
    /// along.
    KillDistlocksGroup,
    /// distlock under `timeout -s KILL`, which SIGKILLs its whole group
    /// when time is up (here on SIGALRM, which `timeout` takes as its
    /// time being up).
    TimeoutKill,
    /// `distlock exec NAME -- distlock exec NAME-inner -- CHILD`, the outer
    /// distlock killed (`kill -9`): the outer guardian's SIGKILL to the
    /// outer child's group took the inner distlock and its guardian, and
    /// nobody ended the inner child's group.
    KillNestedDistlock,
    /// The same nesting, the outer distlock stopped (SIGSTOP).
    StopNestedDistlock,
}

/// A holder (`exec`, or `elect --once`) whose child ignores SIGTERM, a
/// second one waiting (`exec -w 30`, or `elect`), then `fault`: the first
/// child's whole group is dead before the second child runs, whatever
/// `--grace` (the default 10 s here, longer than the lease) says. Before,
/// the guardian (after a `kill -9`) and distlock (after a lost lease) gave
/// the group the whole grace, and the second child ran beside the first.
fn next_holder_runs_after_the_first_child_died(backend: &str, command: &str, fault: Fault) {
    next_holder_runs_after_the_first_child_and_what_it_started_died(
        backend, command, fault, STUBBORN,
    );
}

/// As [`next_holder_runs_after_the_first_child_died`], the first child
/// `sh -c script` (which writes `c.pid`, `gc.pid` and `ready` as
/// [`STUBBORN`] does).
fn next_holder_runs_after_the_first_child_and_what_it_started_died(
    backend: &str,
    command: &str,
    fault: Fault,
    script: &str,
) {
    let (direct, target, lease): (String, std::net::SocketAddr, &[&str]) = if backend == "redis" {
        let server = test_support::redis::shared();
        (server.url(), server.addr(), &["--ttl", "2"])
    } else {
        let zk = test_support::zookeeper::shared();
        (zk_url(), zk.addr(0), &[])
    };
    let proxy = test_support::proxy::Proxy::start(target);
    let holder_url = if backend == "redis" {
        format!("redis://{}", proxy.addr())
    } else {
        format!("zk://{}?session_timeout_ms=2000", proxy.addr())
    };
    let name = test_support::unique_name("outlived");
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = if command == "exec" {
        vec!["exec"]
    } else {
        vec!["elect", "--once"]
    };
    args.extend_from_slice(lease);
    args.extend_from_slice(&[&name, "--"]);
    let inner = format!("{name}-inner");
    let nested = matches!(fault, Fault::KillNestedDistlock | Fault::StopNestedDistlock);
    if nested {
        args.extend_from_slice(&[env!("CARGO_BIN_EXE_distlock"), "exec"]);
        args.extend_from_slice(lease);
        args.extend_from_slice(&[&inner, "--"]);
    }
    args.extend_from_slice(&["sh", "-c", script]);
    let mut holder = if fault == Fault::TimeoutKill {
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", "300", env!("CARGO_BIN_EXE_distlock")])
            .args(&args)
            .env("DISTLOCK_URL", &holder_url)
            .stdin(Stdio::null());
        cmd
    } else {
        distlock(&holder_url, &args)
    };
    // A group of its own, as a shell's job: what is sent to the whole
    // group never reaches the test.
    std::os::unix::process::CommandExt::process_group(&mut holder, 0);
    let mut holder = KillOnDrop(
        holder
            .current_dir(dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let holder_group = i32::try_from(holder.id()).unwrap();
    // Whatever is left of the holder's group (a stopped one kept the
    // test's output open).
    let _group = KillGroupOnDrop(holder_group);
    wait_until(Duration::from_secs(15), "the first child", || {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("holder exited early: {status}");
        }
        dir.path().join("ready").exists()
    });
    let child = read_pid(&dir.path().join("c.pid")).unwrap();
    let grandchild = read_pid(&dir.path().join("gc.pid")).unwrap();
    let _reap = Reap(vec![child, grandchild]);
    assert!(alive(child) && alive(grandchild));

    let mut args: Vec<&str> = if command == "exec" {
        vec!["exec", "-w", "30"]
    } else {
        vec!["elect"]
    };
    args.extend_from_slice(lease);
    args.extend_from_slice(&[&name, "--", "sh", "-c", SEES]);
    let mut next = KillOnDrop(
        distlock(&direct, &args)
            .current_dir(dir.path())
            .spawn()
            .unwrap(),
    );
    // Connected and waiting (an early fault would only make it wait less).
    thread::sleep(Duration::from_millis(500));
    assert!(!dir.path().join("seen").exists(), "the lock was not free");

    match fault {
        Fault::KillDistlock => {
            holder.kill().unwrap();
            let _ = holder.wait();
        }
        Fault::Partition => proxy.set_blackhole(true),
        Fault::StopDistlock | Fault::StopNestedDistlock => signal(&holder, libc::SIGSTOP),
        Fault::StopDistlocksGroup => signal_group(holder_group, libc::SIGSTOP),
        Fault::KillDistlocksGroup => signal_group(holder_group, libc::SIGKILL),
        Fault::TimeoutKill => signal(&holder, libc::SIGALRM),
        Fault::KillNestedDistlock => signal(&holder, libc::SIGKILL),
    }
    assert_eq!(wait_exit(&mut next, Duration::from_secs(30)), 0);
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert!(
        seen.lines().count() == 2 && seen.lines().all(|l| l.starts_with("dead ")),
        "the second child ran while the first one's group lived: {seen}"
    );
    if matches!(
        fault,
        Fault::Partition
            | Fault::StopDistlock
            | Fault::StopDistlocksGroup
            | Fault::StopNestedDistlock
    ) {
        proxy.set_blackhole(false);
        signal_group(holder_group, libc::SIGCONT);
        assert_eq!(wait_exit(&mut holder, Duration::from_secs(20)), 75);
        let err = stderr_of(&mut holder);
        assert!(err.contains("lost"), "{err}");
    }
}

#[test]
fn redis_killed_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::KillDistlock);
}

#[test]
fn zookeeper_killed_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::KillDistlock);
}

#[test]
fn redis_lost_lease_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::Partition);
}

#[test]
fn zookeeper_lost_lease_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::Partition);
}

#[test]
fn redis_stopped_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::StopDistlock);
}

#[test]
fn zookeeper_stopped_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::StopDistlock);
}

#[test]
fn redis_killed_leader_child_dies_before_the_next_leader_runs() {
    next_holder_runs_after_the_first_child_died("redis", "elect", Fault::KillDistlock);
}

#[test]
fn zookeeper_killed_leader_child_dies_before_the_next_leader_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "elect", Fault::KillDistlock);
}

#[test]
fn zookeeper_lost_leadership_child_dies_before_the_next_leader_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "elect", Fault::Partition);
}

#[test]
fn redis_stopped_group_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::StopDistlocksGroup);
}

#[test]
fn zookeeper_stopped_group_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::StopDistlocksGroup);
}

#[test]
fn redis_killed_group_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::KillDistlocksGroup);
}

#[test]
fn zookeeper_killed_group_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::KillDistlocksGroup);
}

#[test]
fn redis_killed_leaders_group_child_dies_before_the_next_leader_runs() {
    next_holder_runs_after_the_first_child_died("redis", "elect", Fault::KillDistlocksGroup);
}

#[test]
fn redis_timeout_killed_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::TimeoutKill);
}

#[test]
fn zookeeper_timeout_killed_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::TimeoutKill);
}

#[test]
fn redis_killed_nested_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::KillNestedDistlock);
}

#[test]
fn zookeeper_killed_nested_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("zookeeper", "exec", Fault::KillNestedDistlock);
}

#[test]
fn redis_stopped_nested_distlock_child_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_died("redis", "exec", Fault::StopNestedDistlock);
}

/// As [`STUBBORN`], the sleep moved to a session (and group) of its own,
/// its parent still the child: the group's SIGKILL alone missed it.
const STUBBORN_SETSID: &str =
    "trap '' TERM; setsid sleep 1000 & echo $! > gc.pid; echo $$ > c.pid; touch ready; wait";

#[test]
fn redis_killed_distlock_setsid_grandchild_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_and_what_it_started_died(
        "redis",
        "exec",
        Fault::KillDistlock,
        STUBBORN_SETSID,
    );
}

#[test]
fn zookeeper_lost_lease_setsid_grandchild_dies_before_the_next_holder_runs() {
    next_holder_runs_after_the_first_child_and_what_it_started_died(
        "zookeeper",
        "exec",
        Fault::Partition,
        STUBBORN_SETSID,
    );
}

// The Redis server dies and stays dead past the TTL: the child is stopped,
// exit 75.
#[test]
fn redis_killed_past_the_ttl_stops_the_child() {
    let mut server = test_support::RedisServer::start();
    let name = test_support::unique_name("killed");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        &server.url(),
        &name,
        &["--ttl", "1", "--grace", "2"],
        "echo $$ > c.pid; touch ready; exec sleep 300",
        dir.path(),
    );
    let child = read_pid(&dir.path().join("c.pid")).unwrap();
    server.kill();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 75);
    assert!(!alive(child));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("lost"), "{err}");
}

// Messages that misled, on Redis where they were seen.
// A plain string without expiry under the lock's name: inspect and -v say
// nobody will free it and what to do (it read as an ordinary holder with
// "no expiry"); an evicted holder is not told "lease is held by someone
// else" when nobody holds.
#[test]
fn redis_messages_say_what_is_there() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    // A list under the lock's name: its type is said ("(a string key)"
    // alone read as the type found).
    let list = test_support::unique_name("list");
    assert_eq!(redis.cli(&["RPUSH", &list, "x"]), "1");
    for args in [
        &["exec", &list, "--", "true"][..],
        &["inspect", &list],
        &["unlock", "--grace", "0", "--force", "--yes", &list],
    ] {
        let out = run(&url, args);
        assert_eq!(
            out.status.code(),
            Some(65),
            "{args:?}: {}",
            stderr_line(&out)
        );
        assert!(
            stderr_line(&out).contains(&format!("redis key {list:?} (a list) is not")),
            "{args:?}: {}",
            stderr_line(&out)
        );
    }
    let name = test_support::unique_name("plain");
    assert_eq!(redis.cli(&["SET", &name, "by-hand"]), "OK");
    let out = run(&url, &["inspect", &name]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table.contains("never freed unless someone deletes it"),
        "{table}"
    );
    assert!(table.contains("exec -w SECS"), "{table}");
    assert_eq!(inspect(&url, &name, "mutex")["never_freed"], true);
    let out = run(&url, &["-v", "exec", "-w", "1", &name, "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_line(&out));
    assert!(
        stderr_line(&out).contains("waits forever"),
        "{}",
        stderr_line(&out)
    );
    // A distlock holder has an expiry: no such note.
    assert_eq!(redis.cli(&["DEL", &name]), "1");
    let dir = tempfile::tempdir().unwrap();
    let mut holder = hold(
        &url,
        &name,
        &["--ttl", "1", "--grace", "1"],
        "touch ready; exec sleep 300",
        dir.path(),
    );
    assert_eq!(inspect(&url, &name, "mutex")["never_freed"], false);
    let force = ["unlock", "--grace", "0", "--force", "--yes", &name];
    assert_eq!(run(&url, &force).status.code(), Some(0));
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 75);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("held by someone else"), "{err}");
    assert!(err.contains("no longer ours"), "{err}");
}

// Usage errors: 64, one clear line, no panic, before any connection.
#[test]
fn usage_errors_exit_64_with_one_line() {
    let zk = "zk://127.0.0.1:1";
    let cases: &[(&str, &[&str], &str)] = &[
        ("ftp://h", &["exec", "x", "--", "true"], "unknown scheme"),
        ("nonsense", &["exec", "x", "--", "true"], "no scheme"),
        (
            "redis://127.0.0.1:1",
            &["exec", "a//b", "--", "true"],
            "invalid name",
        ),
        (
            "redis://127.0.0.1:1",
            &["exec", "x", "true"],
            "missing `--`",
        ),
        ("redis://127.0.0.1:1", &["exec", "x", "--"], "<CMD>"),
        ("mem://", &["exec", "x", "--", "true"], "mem://"),
        ("mem://", &["elect", "x", "--", "true"], "mem://"),
        // Each run is a process of its own: ids, holders and force-releases
        // on mem:// would be nobody else's (`id` printed 1 every time).
        ("mem://", &["id", "x"], "mem://"),
        ("mem://", &["inspect", "x"], "mem://"),
        ("mem://", &["unlock", "--force", "--yes", "x"], "mem://"),
        (zk, &["exec", "--ttl", "5", "x", "--", "true"], "--ttl"),
        (
            "redis://127.0.0.1:1",
            &["exec", "-w", "soon", "x", "--", "true"],
            "soon",
        ),
        (
            "redis://127.0.0.1:1",
            &["exec", "--ttl", "0", "x", "--", "true"],
            "--ttl must be between 0.01 (10 ms) and 2592000 (30 days) seconds, got 0",
        ),
        (
            "redis://127.0.0.1:1",
            &["inspect", "x", "--kind", "queue"],
            "unknown kind",
        ),
        (
            "redis://127.0.0.1:1",
            &["frobnicate"],
            "unrecognized subcommand",
        ),
        ("", &["exec", "x", "--", "true"], "DISTLOCK_URL"),
        // Which part of the URL is wrong ("Redis URL did not parse" named
        // none).
        (
            "redis://127.0.0.1:notaport",
            &["id", "x"],
            "port \"notaport\" is not a number",
        ),
        ("redis://127.0.0.1:0", &["id", "x"], "port \"0\""),
        ("redis://:pw@/", &["id", "x"], "no host"),
        (
            "redis://127.0.0.1:6379/notadb",
            &["id", "x"],
            "database \"notadb\"",
        ),
        (
            "redis://127.0.0.1:6379?bogus=1",
            &["id", "x"],
            "unknown option \"bogus\"",
        ),
        (
            "redis://127.0.0.1:6379?connect_timeout_ms=soon",
            &["id", "x"],
            "connect_timeout_ms=\"soon\"",
        ),
        (
            "zk://127.0.0.1:notaport",
            &["id", "x"],
            "port \"notaport\" of server",
        ),
        ("zk://127.0.0.1", &["id", "x"], "has no port"),
        ("zk://:2181", &["id", "x"], "has no host"),
        ("zk://h:1?bogus=1", &["id", "x"], "unknown option \"bogus\""),
        ("zk://h:1/?base=", &["id", "x"], "\"base\" is empty"),
        ("zk://h:1/zookeeper", &["id", "x"], "/zookeeper subtree"),
        (
            "zk://h:1?base=/zookeeper",
            &["id", "x"],
            "/zookeeper subtree",
        ),
        ("zk://:pw@h:1", &["id", "x"], "digest user is empty"),
        ("zk://h:1", &["id", "x/_unfair_lock"], "invalid name"),
        // Zero ids printed nothing and exited 0.
        (
            "redis://127.0.0.1:1",
            &["id", "x", "--count", "0"],
            "--count <N>': must be 1 or more, got 0",
        ),
        (
            "redis://127.0.0.1:1",
            &["id", "x", "--block", "0"],
            "--block <N>': must be 1 or more, got 0",
        ),
        ("redis://127.0.0.1:1", &["id", "x", "--count", "-1"], "-1"),
    ];
    for (url, args, says) in cases {
        let out = run(url, args);
        let err = stderr_line(&out);
        assert_eq!(out.status.code(), Some(64), "{url} {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{url} {args:?}: {err}");
        assert!(
            err.starts_with("distlock: ") && err.contains(says),
            "{url} {args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let help = run("", &["exec", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Examples:"));
    // --help lists every exit code of the README's table.
    let help = String::from_utf8_lossy(&run("", &["--help"]).stdout).into_owned();
    for code in [
        "EX_TEMPFAIL",
        "128 + N",
        "EX_USAGE",
        "EX_DATAERR",
        "EX_UNAVAILABLE",
        "EX_SOFTWARE",
    ] {
        assert!(help.contains(code), "--help lacks {code}: {help}");
    }
    assert_eq!(run("", &["--version"]).status.code(), Some(0));
}
