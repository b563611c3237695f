//! Redlock over independent redis-server masters on loopback: the
//! conformance suite over 3 masters (and mutual exclusion and fencing over
//! 5), quorum under killed and paused masters, splits, fencing tokens under
//! kills, empty restarts and cancellations, the write-back path, the
//! watchdog with masters down, and bad input.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, Lock, LostReason, Provider};
use distlock_redis::{RedisOptions, RedisProvider, RedlockProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::masters::RedisMasters;
use test_support::safety::FencedStore;
use test_support::unique_name;

fn three() -> &'static RedisMasters {
    static M: OnceLock<RedisMasters> = OnceLock::new();
    M.get_or_init(|| RedisMasters::start(3))
}

fn five() -> &'static RedisMasters {
    static M: OnceLock<RedisMasters> = OnceLock::new();
    M.get_or_init(|| RedisMasters::start(5))
}

struct Redlock {
    masters: fn() -> &'static RedisMasters,
}

impl Fixture for Redlock {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        Box::pin(async move {
            let client = RedlockProvider::connect(&(self.masters)().url())
                .await
                .expect("connect to the test masters");
            Arc::new(client) as Arc<dyn Provider>
        })
    }

    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        client.with_lease(lease).and_then(|p| p.mutex(name))
    }
}

mod over_three {
    test_support::conformance_suite!(super::Redlock {
        masters: super::three
    });
}

mod over_five {
    test_support::conformance_suite!(@tests super::Redlock { masters: super::five };
        mutual_exclusion, fencing_monotonic, cancellation_leaves_nothing);
}

/// Fast failure detection for the fault tests. The connect timeout is what
/// `connect` gives a quorum of masters to load the scripts (four round trips
/// each, after the handshake). A killed master fails at once whatever the
/// timeout, so it need not be short: 500 ms was once not enough beside two
/// test runs on 2 cores.
fn quick() -> RedisOptions {
    RedisOptions::new()
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_secs(2))
        .recheck_interval(Duration::from_millis(100))
}

async fn connect(masters: &RedisMasters, options: RedisOptions) -> RedlockProvider {
    let urls = masters.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedlockProvider::connect_with(&urls, options)
        .await
        .expect("connect")
}

fn lease(ms: u64) -> LeaseOptions {
    LeaseOptions::new(Duration::from_millis(ms)).unwrap()
}

/// Whether master `i` has `key`.
fn exists(masters: &RedisMasters, i: usize, key: &str) -> bool {
    masters.node(i).cli(&["EXISTS", key]) == "1"
}

async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < until, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Locks `lock` with its key on every master: an acquisition returns once a
/// quorum took the lock and drops the straggler's call (it may not have been
/// sent yet, e.g. behind the script load that follows `connect`), so the
/// key can be on two masters only. Tests whose premise is the key on all
/// three release and lock again until it is (a straggler that was sent lands
/// within a round trip).
async fn lock_on_every_master(
    m: &RedisMasters,
    lock: &Arc<dyn Lock>,
    key: &str,
) -> distlock_core::LockGuard {
    for _ in 0..20 {
        let g = lock.lock().await.unwrap();
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if (0..3).all(|i| exists(m, i, key)) {
                return g;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        g.release().await.unwrap();
    }
    panic!("20 acquisitions of {key} never held it on every master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_at_connect_and_after_still_locks_and_releases() {
    let mut m = RedisMasters::start(3);
    m.node_mut(2).kill();
    let client = connect(&m, quick()).await;
    assert_eq!((client.masters(), client.quorum()), (3, 2));
    let name = unique_name("minority");
    let key = client.lock_key(&name).unwrap();
    let lock = client
        .with_lease(lease(5000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    let g = lock.try_lock().await.unwrap().expect("2 of 3 masters up");
    assert!(exists(&m, 0, &key) && exists(&m, 1, &key));
    g.release().await.unwrap();
    assert!(!exists(&m, 0, &key) && !exists(&m, 1, &key));
    // The third comes back, another goes down.
    m.node_mut(2).restart();
    m.node_mut(0).kill();
    let g = test_support::conformance::eventually_locks(
        lock.as_ref(),
        Duration::from_secs(5),
        "Redlock over masters 1 and 2",
    )
    .await;
    assert!(exists(&m, 1, &key) && exists(&m, 2, &key));
    g.release().await.unwrap();
    assert!(!exists(&m, 1, &key) && !exists(&m, 2, &key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_is_a_typed_error_and_leaves_nothing_on_the_live_master() {
    let mut m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("majority");
    let key = client.lock_key(&name).unwrap();
    let lock = client
        .with_lease(lease(60_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    m.node_mut(1).kill();
    m.node_mut(2).kill();
    for _ in 0..3 {
        let r = lock.try_lock().await;
        assert!(
            matches!(r, Err(ref e) if e.is_retryable()),
            "try_lock without a quorum: {r:?}"
        );
        assert!(!exists(&m, 0, &key), "the live master kept the attempt");
    }
    // A waiting acquisition rides it out until its deadline, then says why.
    let start = Instant::now();
    let r = lock.lock_timeout(Duration::from_millis(600)).await;
    assert!(matches!(r, Err(ref e) if e.is_retryable()), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(!exists(&m, 0, &key));
    // Connecting needs a quorum too.
    let urls = m.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let r = RedlockProvider::connect_with(&urls, quick()).await;
    assert!(
        matches!(r, Err(Error::Connection { .. })),
        "connect without a quorum: {r:?}"
    );
    // The error says why: the quorum, and each master that failed (it comes
    // once the second failed, whether the live one answered by then or not).
    let why = chain(&r.unwrap_err());
    assert!(why.contains("2 of 3 masters failed and "), "{why}");
    assert!(why.contains("a quorum is 2"), "{why}");
    for i in [1, 2] {
        let addr = m.node(i).addr().to_string();
        assert!(why.contains(&addr), "{addr} is not named: {why}");
    }
}

/// Connects to `urls` with the quick options and `within` to connect,
/// which must fail with a connection error (`case` says what the masters
/// do): that error and its sources as one line, and how long it took.
async fn failed_connect(urls: &[&str], within: Duration, case: &str) -> (String, Duration) {
    let start = Instant::now();
    let r = RedlockProvider::connect_with(urls, quick().connect_timeout(within)).await;
    let took = start.elapsed();
    assert!(
        matches!(r, Err(Error::Connection { .. })),
        "connect with {case}: {r:?}"
    );
    (chain(&r.unwrap_err()), took)
}

/// An error and its sources, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A master that takes the connection but answers no command (`CLIENT
/// PAUSE`) fails at its response timeout, and counts as failed: with the
/// other two refused or up, a quorum is out of reach then, and the connect
/// ends there, counting it among the failed and saying it gave no answer;
/// alone, it is a timeout that says how long it waited (its response
/// timeout, not the connect timeout it did not wait out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_whose_script_load_times_out_counts_as_failed() {
    let mut m = RedisMasters::start(3);
    let urls = m.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let within = Duration::from_secs(30);
    m.node_mut(0).kill();
    // (No UNPAUSE: a paused server holds it too; the server ends with the
    // test.)
    assert_eq!(m.node(1).cli(&["CLIENT", "PAUSE", "60000", "ALL"]), "OK");
    let (why, took) = failed_connect(&urls, within, "a master down and one paused").await;
    assert!(why.contains("2 of 3 masters failed and "), "{why}");
    let paused = m.node(1).addr().to_string();
    assert!(
        why.contains(&format!("{paused}: no answer (connect timed out after")),
        "{why}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let start = Instant::now();
    let r = RedlockProvider::connect_with(&[urls[1]], quick().connect_timeout(within)).await;
    let took = start.elapsed();
    let Err(Error::Timeout { after, .. }) = r else {
        panic!("connect to a paused master alone: {r:?}")
    };
    assert!(
        after >= Duration::from_millis(300) && after <= took && took < Duration::from_secs(10),
        "after {after:?}, took {took:?}"
    );
}

/// Once too many masters refused for a quorum, connect fails at once: it
/// does not wait out the connect timeout for a silent master that could not
/// make a quorum even if it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_cannot_reach_a_quorum_fails_without_waiting_for_the_silent() {
    let mut m = RedisMasters::start(3);
    let urls = m.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let within = Duration::from_secs(30);
    m.node_mut(0).kill();
    m.node_mut(1).kill();
    m.node(2).pause();
    let (why, took) = failed_connect(&urls, within, "two masters down and one silent").await;
    m.node(2).resume();
    assert!(
        why.contains("2 of 3 masters failed and 0 answered"),
        "{why}"
    );
    for i in [0, 1] {
        let addr = m.node(i).addr().to_string();
        assert!(why.contains(&format!("{addr}: connection")), "{why}");
    }
    let silent = m.node(2).addr().to_string();
    assert!(why.contains(&format!("{silent}: no answer")), "{why}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: it waited for the silent master"
    );
}

/// A connect that runs out of time without a quorum: with one master down
/// and one silent, it is a connection error naming both (not the first
/// failure alone, which would send a user after the wrong master); with
/// every master silent, a timeout. Either returns within the connect
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_runs_out_of_time_names_the_silent_and_the_failed_masters() {
    let mut m = RedisMasters::start(3);
    let urls = m.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let within = Duration::from_secs(1);
    m.node_mut(1).kill();
    m.node(2).pause();
    let (why, took) = failed_connect(&urls, within, "one master down and one silent").await;
    let (down, silent) = (m.node(1).addr().to_string(), m.node(2).addr().to_string());
    assert!(why.contains("a quorum is 2"), "{why}");
    assert!(why.contains(&format!("{down}: connection")), "{why}");
    assert!(why.contains(&format!("{silent}: no answer")), "{why}");
    assert!(took < within + Duration::from_secs(1), "took {took:?}");
    // Every master silent: nothing failed, time ran out.
    m.node(0).pause();
    let start = Instant::now();
    let r =
        RedlockProvider::connect_with(&[urls[0], urls[2]], quick().connect_timeout(within)).await;
    let took = start.elapsed();
    m.node(0).resume();
    m.node(2).resume();
    assert!(
        matches!(
            r,
            Err(Error::Timeout {
                operation: "connect",
                ..
            })
        ),
        "connect with every master silent: {r:?}"
    );
    assert!(took < within + Duration::from_secs(1), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_is_outvoted_within_the_response_timeout() {
    let m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("paused");
    let key = client.lock_key(&name).unwrap();
    let lock = client
        .with_lease(lease(1500))
        .unwrap()
        .mutex(&name)
        .unwrap();
    m.node(0).pause();
    let start = Instant::now();
    let g = lock.try_lock().await.unwrap().expect("2 of 3 answer");
    assert!(
        start.elapsed() < Duration::from_millis(300 + 500),
        "took {:?}",
        start.elapsed()
    );
    assert!(g.is_held());
    g.release().await.unwrap();
    assert!(!exists(&m, 1, &key) && !exists(&m, 2, &key));
    m.node(0).resume();
    // The paused master ran the acquire late: undone, or gone with the TTL.
    eventually(
        "the paused master's key is gone",
        Duration::from_millis(1500) + Duration::from_secs(2),
        || !exists(&m, 0, &key),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_gives_nobody_the_lock_and_leaves_nothing() {
    let m = RedisMasters::start(3);
    let a = connect(&m, quick()).await;
    let b = connect(&m, quick()).await;
    let name = unique_name("split");
    let key = a.lock_key(&name).unwrap();
    // Master 0 is held by "client A", master 1 by "client B" (by hand).
    let _ = m.node(0).cli(&["SET", &key, "held-by-a", "PX", "60000"]);
    let _ = m.node(1).cli(&["SET", &key, "held-by-b", "PX", "60000"]);
    let la = a.with_lease(lease(60_000)).unwrap().mutex(&name).unwrap();
    let lb = b.with_lease(lease(60_000)).unwrap().mutex(&name).unwrap();
    let (ra, rb) = tokio::join!(la.try_lock(), lb.try_lock());
    assert!(ra.unwrap().is_none() && rb.unwrap().is_none(), "no quorum");
    // Undone at once, or (an answer not waited for) in the background.
    eventually(
        "no attempt left on master 2",
        Duration::from_secs(2),
        || !exists(&m, 2, &key),
    )
    .await;
    let (ra, rb) = tokio::join!(
        la.lock_timeout(Duration::from_millis(400)),
        lb.lock_timeout(Duration::from_millis(400))
    );
    assert!(ra.unwrap().is_none() && rb.unwrap().is_none(), "no quorum");
    // Undone at once, or (an answer not waited for) in the background.
    eventually(
        "no attempt left on master 2",
        Duration::from_secs(2),
        || !exists(&m, 2, &key),
    )
    .await;
    assert_eq!(m.node(0).cli(&["GET", &key]), "held-by-a");
    assert_eq!(m.node(1).cli(&["GET", &key]), "held-by-b");
    // Once one side lets go, the lock is free for a quorum.
    let _ = m.node(1).cli(&["DEL", &key]);
    let g = la.try_lock().await.unwrap().expect("masters 1 and 2 free");
    g.release().await.unwrap();
    assert_eq!(m.node(0).cli(&["GET", &key]), "held-by-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_that_split_end_up_taking_turns() {
    let m = RedisMasters::start(3);
    let clients = [
        connect(&m, quick()).await,
        connect(&m, quick()).await,
        connect(&m, quick()).await,
    ];
    let name = unique_name("turns");
    let store = Arc::new(FencedStore::default());
    let mut tasks = Vec::new();
    for (t, client) in clients.iter().enumerate() {
        let lock = client
            .with_lease(lease(5000))
            .unwrap()
            .mutex(&name)
            .unwrap();
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for _ in 0..30 {
                let g = lock
                    .lock_timeout(Duration::from_secs(10))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("task {t} starved"));
                let v = store.read(g.fencing_token()).expect("fresh token");
                store.write(g.fencing_token(), v + 1).expect("fresh token");
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(store.snapshot(), (90, 90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unequal_counters_are_written_back_to_a_quorum_above_every_counter_seen() {
    let m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("write_back");
    let fence = client.fence_key(&name).unwrap();
    let base: u64 = 3_000_000_000_000_000;
    let set = [base, base + 10, base + 20];
    for (i, c) in set.iter().enumerate() {
        let _ = m.node(i).cli(&["SET", &fence, &c.to_string()]);
    }
    let lock = client
        .with_lease(lease(60_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    let g = lock.try_lock().await.unwrap().expect("free");
    let t = g.fencing_token();
    // Any quorum holds master 1 or 2: T is above the largest counter of the
    // quorum, so above at least two of the three.
    assert!(t > set[1], "token {t} not above {}", set[1]);
    assert!(t == set[1] + 1 || t == set[2] + 1, "token {t}");
    let at_least_t = (0..3)
        .filter(|&i| m.node(i).cli(&["GET", &fence]).parse::<u64>().unwrap() >= t)
        .count();
    assert!(at_least_t >= 2, "token {t} on {at_least_t} masters only");
    g.release().await.unwrap();
    let next = lock.try_lock().await.unwrap().expect("free");
    let t2 = next.fencing_token();
    assert!(t2 > t);
    next.release().await.unwrap();
    let again = lock.try_lock().await.unwrap().expect("free");
    assert!(again.fencing_token() > t2);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_under_kills_empty_restarts_and_cancellations() {
    const TTL_MS: u64 = 500;
    let masters = RedisMasters::start(3);
    let clients = [
        connect(&masters, quick()).await,
        connect(&masters, quick()).await,
        connect(&masters, quick()).await,
    ];
    let name = unique_name("fencing_faults");
    let store = Arc::new(FencedStore::default());
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Chaos: one master at a time is killed and restarted empty after
    // 1.1 s (>= 1 s and >= the TTL, the documented restart delay).
    let chaos = {
        let stop = Arc::clone(&stop);
        tokio::task::spawn_blocking(move || {
            let mut masters = masters;
            let mut rng = fastrand::Rng::new();
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.u64(200..600)));
                let i = rng.usize(0..3);
                masters.node_mut(i).kill();
                std::thread::sleep(Duration::from_millis(1100));
                masters.restart_empty(i);
                rounds += 1;
            }
            (masters, rounds)
        })
    };
    let mut tasks = Vec::new();
    for (t, client) in clients.iter().enumerate() {
        for k in 0..2 {
            let lock = client
                .with_lease(lease(TTL_MS))
                .unwrap()
                .mutex(&name)
                .unwrap();
            let (store, tokens, stop) =
                (Arc::clone(&store), Arc::clone(&tokens), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed((t * 2 + k) as u64);
                let (mut held, mut refused) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if rng.u8(0..3) == 0 {
                        // Cancelled at a random point of the acquisition.
                        let cut = Duration::from_micros(rng.u64(0..3000));
                        let _ = tokio::time::timeout(cut, lock.lock()).await;
                        continue;
                    }
                    let Ok(Some(g)) = lock.lock_timeout(Duration::from_secs(2)).await else {
                        continue;
                    };
                    let token = g.fencing_token();
                    tokens.lock().unwrap().push(token);
                    match store.read(token) {
                        Ok(v) => {
                            tokio::time::sleep(Duration::from_millis(rng.u64(0..5))).await;
                            if store.write(token, v + 1).is_err() {
                                refused += 1;
                            }
                        }
                        Err(_) => refused += 1,
                    }
                    held += 1;
                    let _ = g.release().await;
                }
                (held, refused)
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut held, mut refused) = (0, 0);
    for t in tasks {
        let (h, r) = t.await.unwrap();
        held += h;
        refused += r;
    }
    let (_masters, rounds) = chaos.await.unwrap();
    assert!(rounds >= 3, "only {rounds} kill/restart rounds");
    assert!(held >= 20, "only {held} acquisitions");
    let tokens = tokens.lock().unwrap();
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "token went from {} to {}",
            pair[0],
            pair[1]
        );
    }
    let (value, accepted) = store.snapshot();
    assert_eq!(
        refused, 0,
        "a holder was fenced off: two holders overlapped"
    );
    assert_eq!((value, accepted), (held, held), "lost update");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_lease_with_one_master_down_and_loses_it_without_a_quorum() {
    watchdog_with_masters_down(None).await;
}

/// The same with the key on two masters only: the third was held by someone
/// else when the acquisition ran (as a straggler whose acquire is dropped
/// leaves it), so the master to lose first is that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_lease_held_on_two_of_three_with_the_third_down() {
    watchdog_with_masters_down(Some(2)).await;
}

/// Takes a 2 s lease over three masters (with `occupied`'s key held by
/// another token for 1 s, so the lease lands on the other two), kills a
/// master that does not hold the key if there is one (else master 0), checks
/// the watchdog keeps the lease for two TTLs, kills a second master and
/// checks `lost()` fires.
///
/// The lease is long beside the 300 ms response timeout so that a renewal
/// round slowed down by a loaded machine can be retried (about four rounds
/// fit between the renewal at TTL/3 and the deadline): with a 600 ms lease
/// one slow round lost it, and the test measured the scheduler.
///
/// Which masters hold the key is read, not assumed: an acquisition returns
/// once a quorum took the lock and drops the straggler's call (it may not
/// have been sent yet, e.g. behind a `NOSCRIPT` reload), so the key can be
/// on two masters only; losing one of those two leaves no quorum, and
/// `lost()` firing then is right.
async fn watchdog_with_masters_down(occupied: Option<usize>) {
    let mut m = RedisMasters::start(3);
    // Connecting is not under test: a loaded machine may take longer than
    // the quick 500 ms.
    let options = quick().connect_timeout(Duration::from_secs(3));
    let a = connect(&m, options.clone()).await;
    let b = connect(&m, options).await;
    let name = unique_name("watchdog");
    let key = a.lock_key(&name).unwrap();
    let ttl = Duration::from_secs(2);
    if let Some(o) = occupied {
        assert_eq!(
            m.node(o).cli(&["SET", &key, "someone-else", "PX", "1000"]),
            "OK"
        );
    }
    let g = a
        .with_lease(lease(2000))
        .unwrap()
        .mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .unwrap();
    if let Some(o) = occupied {
        eventually(
            "the other token's key to expire",
            Duration::from_secs(3),
            || !exists(&m, o, &key),
        )
        .await;
    } else {
        // A straggler that was sent lands within a round trip.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holders: Vec<usize> = (0..3).filter(|&i| exists(&m, i, &key)).collect();
    assert!(holders.len() >= 2, "the lease is on {holders:?} only");
    if let Some(o) = occupied {
        assert!(!holders.contains(&o), "{holders:?}");
    }
    let first = (0..3).find(|i| !holders.contains(i)).unwrap_or(0);
    m.node_mut(first).kill();
    tokio::select! {
        reason = g.lost() => panic!("lost with 2 of 3 masters up (key on {holders:?}, master {first} down): {reason}"),
        () = tokio::time::sleep(ttl * 2) => {}
    }
    assert!(g.is_held());
    let other = b.with_lease(lease(60_000)).unwrap().mutex(&name).unwrap();
    // A round slower than the response timeout (a loaded machine) is a
    // retryable error, not an answer: ask again.
    let mut tries = 0;
    let taken = loop {
        match other.try_lock().await {
            Err(e) if e.is_retryable() && tries < 5 => tries += 1,
            r => break r.unwrap(),
        }
    };
    assert!(taken.is_none(), "lease ran out");
    // With two of three masters down no quorum is left, wherever the key is.
    let second = (0..3).find(|&i| i != first).unwrap_or(1);
    let start = Instant::now();
    m.node_mut(second).kill();
    let reason = tokio::time::timeout(ttl + Duration::from_secs(2), g.lost())
        .await
        .expect("lost() did not fire without a quorum");
    assert_eq!(reason, LostReason::Expired);
    assert!(start.elapsed() <= ttl + Duration::from_secs(2));
    assert!(!g.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_is_a_plain_lock_with_the_same_keys() {
    let m = RedisMasters::start(1);
    let client = RedlockProvider::connect(&m.url()).await.unwrap();
    assert_eq!((client.masters(), client.quorum()), (1, 1));
    let name = unique_name("one");
    let key = client.lock_key(&name).unwrap();
    assert_eq!(key, name);
    let lock = client.mutex(&name).unwrap();
    let g = lock.try_lock().await.unwrap().unwrap();
    let pttl: i64 = m.node(0).cli(&["PTTL", &key]).parse().unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");
    // The single-master provider sees the key as held (same lock key).
    let single = RedisProvider::connect(&m.node(0).url()).await.unwrap();
    assert!(single
        .mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    let t = g.fencing_token();
    g.release().await.unwrap();
    let g = lock.try_lock().await.unwrap().unwrap();
    assert!(g.fencing_token() > t);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_options_and_other_primitives_are_typed_errors() {
    let m = three();
    let p = |i: usize| m.node(i).port();
    let dup = format!("redis+redlock://127.0.0.1:{},127.0.0.1:{}", p(0), p(0));
    let dup_case = format!("redis+redlock://LOCALHOST:{},localhost:{}", p(0), p(0));
    let unknown = format!("redis+redlock://127.0.0.1:{}?nope=1", p(0));
    let twice = format!("redis+redlock://127.0.0.1:{}?prefix=a&prefix=b", p(0));
    for url in [
        "redis+redlock://",
        "redis+redlock://u:s3cret@",
        "redis+redlock://,",
        "redis+redlock://127.0.0.1:notaport",
        "redis+redlock://127.0.0.1:99999",
        "redis://127.0.0.1:1",
        &dup,
        &dup_case,
        &unknown,
        &twice,
    ] {
        let r = RedlockProvider::connect(url).await;
        let Err(e) = r else { panic!("{url} accepted") };
        assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
    let pool = format!("redis+redlock://127.0.0.1:{}?pool_size=2", p(0));
    let r = RedlockProvider::connect(&pool).await;
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    let bad_ttl = format!("redis+redlock://127.0.0.1:{}?lease_ttl_ms=0", p(0));
    let r = RedlockProvider::connect(&bad_ttl).await;
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    let r = RedlockProvider::connect_with(&[], RedisOptions::new()).await;
    assert!(matches!(r, Err(Error::InvalidUrl(_))), "{r:?}");
    let with_option = format!("redis://127.0.0.1:{}?prefix=x", p(0));
    let r = RedlockProvider::connect_with(&[&with_option], RedisOptions::new()).await;
    assert!(matches!(r, Err(Error::InvalidUrl(_))), "{r:?}");

    let client = RedlockProvider::connect(&m.url()).await.unwrap();
    assert_eq!(client.backend(), "redis+redlock");
    let name = unique_name("unsupported");
    let unsupported = |r: distlock_core::Result<()>| match r {
        Err(Error::Unsupported { backend, what }) => {
            assert_eq!(backend, "redis+redlock");
            assert!(
                what.contains("redis://") && what.contains("redis+sentinel://"),
                "{what}"
            );
        }
        other => panic!("{other:?}"),
    };
    unsupported(client.fair_mutex(&name).map(|_| ()));
    unsupported(client.election(&name).map(|_| ()));
    unsupported(client.rw_lock(&name).map(|_| ()));
    unsupported(client.semaphore(&name, 2).map(|_| ()));
    unsupported(client.id_generator(&name, 10).map(|_| ()));
    for bad in ["", "a//b", "{tag}", "a b"] {
        assert!(matches!(client.mutex(bad), Err(Error::InvalidName { .. })));
        assert!(client.lock_key(bad).is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cancelled_around_the_write_back_leave_nothing_and_tokens_still_increase() {
    let m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("cancel_write_back");
    let fence = client.fence_key(&name).unwrap();
    let key = client.lock_key(&name).unwrap();
    let lock = client
        .with_lease(lease(60_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    let base: u64 = 3_000_000_000_000_000;
    let mut rng = fastrand::Rng::new();
    let (mut completed, mut cancelled, mut highest) = (0, 0, 0);
    let mut last_floor = 0;
    for k in 0..30u64 {
        // Unequal counters, so every attempt that takes a quorum needs the
        // write-back round; cancelled at a random point of it all.
        last_floor = base + 1000 * k;
        for i in 0..3u64 {
            let _ = m.node(usize::try_from(i).unwrap()).cli(&[
                "SET",
                &fence,
                &(last_floor + 10 * i).to_string(),
            ]);
        }
        // At random, but at least one let through (first: it also loads
        // the scripts) and one cancelled at once, before any reply can come.
        let cut = match k {
            0 => Duration::from_secs(2),
            1 => Duration::ZERO,
            _ => Duration::from_micros(rng.u64(0..4000)),
        };
        match tokio::time::timeout(cut, lock.lock()).await {
            Ok(g) => {
                let g = g.unwrap();
                assert!(g.fencing_token() > highest);
                highest = g.fencing_token();
                completed += 1;
                drop(g);
            }
            Err(_) => cancelled += 1,
        }
    }
    assert!(
        completed > 0 && cancelled > 0,
        "{completed} completed, {cancelled} cancelled"
    );
    // Nothing left held: the next acquisition gets in (the dropped guards
    // and the undone attempts release in the background).
    let g = lock
        .lock_timeout(Duration::from_secs(3))
        .await
        .unwrap()
        .expect("a cancelled acquisition left the lock held");
    assert!(g.fencing_token() > highest, "after {completed} completed");
    // Any quorum holds master 1 or 2 of the last round's counters.
    assert!(g.fencing_token() > last_floor + 10);
    g.release().await.unwrap();
    // The release returns once a quorum released; the third follows.
    eventually("no master keeps a key", Duration::from_secs(2), || {
        (0..3).all(|i| !exists(&m, i, &key))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_finishing_in_the_background_reloads_a_lost_script_and_deletes_the_key() {
    // The release returns once a quorum released; a master that lost its
    // scripts (a restart, `SCRIPT FLUSH`) answers `NOSCRIPT` and is the
    // last: loading the script there and sending the release again happens
    // after the release returned, and must still happen.
    let m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("release_noscript");
    let key = client.lock_key(&name).unwrap();
    let lock = client
        .with_lease(lease(60_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    let g = lock_on_every_master(&m, &lock, &key).await;
    assert_eq!(m.node(1).cli(&["SCRIPT", "FLUSH"]), "OK");
    g.release().await.unwrap();
    eventually(
        "the master whose scripts were flushed lets the key go",
        Duration::from_secs(2),
        || (0..3).all(|i| !exists(&m, i, &key)),
    )
    .await;
}

/// A renewal left to finish in the background can reach a master after a
/// later renewal of the same guard (its connection was re-established in
/// between). Played here by sending that straggler's script call by hand
/// after a later `extend()`: it must not cut the TTL the later one set,
/// and a renewal after both still applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_landing_after_a_later_one_changes_nothing() {
    const EXTEND: &str = include_str!("../src/scripts/redlock_extend.lua");
    let m = three();
    let client = connect(m, quick()).await;
    let name = unique_name("late_renewal");
    let key = client.lock_key(&name).unwrap();
    let holder = format!("{{{key}}}:holder");
    let manual = LeaseOptions::manual(Duration::from_secs(5)).unwrap();
    let lock = client.with_lease(manual).unwrap().mutex(&name).unwrap();
    let g = lock_on_every_master(m, &lock, &key).await;
    // Round 1: a short extension; round 2: a long one.
    g.extend(Duration::from_secs(2)).await.unwrap();
    g.extend(Duration::from_secs(60)).await.unwrap();
    let node = m.node(2);
    eventually(
        "round 2 reached the last master",
        Duration::from_secs(2),
        || node.cli(&["HGET", &holder, "round"]) == "2",
    )
    .await;
    let token = node.cli(&["GET", &key]);
    let fence = node.cli(&["HGET", &holder, "fence"]);
    let pttl = |node: &test_support::RedisServer| node.cli(&["PTTL", &key]).parse::<i64>().unwrap();
    // Round 1 again, late: "renewed" (a later round was), and nothing cut.
    let late = node.cli(&[
        "EVAL", EXTEND, "2", &key, &holder, &token, "2000", &fence, "1",
    ]);
    assert_eq!(late, "1");
    assert!(
        pttl(node) > 30_000,
        "a late renewal cut the TTL to {} ms",
        pttl(node)
    );
    assert!(node.cli(&["PTTL", &holder]).parse::<i64>().unwrap() > 30_000);
    // A later round applies.
    let next = node.cli(&[
        "EVAL", EXTEND, "2", &key, &holder, &token, "3000", &fence, "3",
    ]);
    assert_eq!(next, "1");
    assert!(
        pttl(node) <= 3000,
        "round 3 did not apply: {} ms",
        pttl(node)
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_counter_is_a_typed_error_and_takes_nothing() {
    let m = RedisMasters::start(3);
    let client = connect(&m, quick()).await;
    let name = unique_name("exhausted");
    let fence = client.fence_key(&name).unwrap();
    let key = client.lock_key(&name).unwrap();
    for i in 0..3 {
        let _ = m.node(i).cli(&["SET", &fence, "9007199254740991"]);
    }
    let lock = client
        .with_lease(lease(60_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    let r = lock.try_lock().await;
    assert!(matches!(r, Err(Error::Exhausted { .. })), "{r:?}");
    for i in 0..3 {
        assert!(!exists(&m, i, &key), "master {i} kept the lock");
    }
    // A counter that is not a number is a conflict, not ours to fix.
    for i in 0..3 {
        let _ = m.node(i).cli(&["SET", &fence, "not-a-number"]);
    }
    let r = lock.try_lock().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    for i in 0..3 {
        assert!(!exists(&m, i, &key), "master {i} kept the lock");
    }
}

/// Inspects the mutex `name` until its holder shows `token`. The holder
/// records show the guard's token from its first renewal on at the latest:
/// a master that took the lock after the acquisition was decided wrote its
/// own counter, and the masters' counters can differ (after a
/// force-release, or when they were first set in different seconds).
async fn inspect_showing(
    operator: &RedlockProvider,
    name: &str,
    token: u64,
) -> distlock_core::Snapshot {
    let until = Instant::now() + Duration::from_secs(6);
    loop {
        let seen = operator
            .inspect(name, distlock_core::PrimitiveKind::Mutex)
            .await
            .unwrap();
        let shown = seen.holders.first().and_then(|h| h.fencing_token);
        if shown == Some(token) || Instant::now() > until {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_see_and_evict_the_quorums_holder() {
    use distlock_core::{HoldRole, LeaseLeft, PrimitiveKind};
    // Masters are paused, never killed and restarted here: a restart on
    // the same port races other tests for it.
    let m = RedisMasters::start(3);
    let holder = RedlockProvider::connect(&format!("{}?owner=job-a", m.url()))
        .await
        .unwrap();
    let waiter = connect(&m, quick()).await;
    let operator = connect(&m, quick()).await;
    let name = unique_name("ops");
    let key = holder.lock_key(&name).unwrap();
    let mutex = PrimitiveKind::Mutex;

    // Free: empty; other kinds are Unsupported with the backend named.
    let empty = operator.inspect(&name, mutex).await.unwrap();
    assert!(
        !empty.is_held() && empty.backend == "redis+redlock",
        "{empty:?}"
    );
    for kind in [PrimitiveKind::FairMutex, PrimitiveKind::Semaphore] {
        let e = operator.inspect(&name, kind).await.unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        let e = operator.force_release(&name, kind).await.unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    }

    // Held: owner, token, acquired at, lease left; reading changes nothing.
    let before = std::time::SystemTime::now();
    let lease = LeaseOptions::new(Duration::from_secs(9)).unwrap();
    let held = holder.with_lease(lease).unwrap().mutex(&name).unwrap();
    let guard = held.try_lock().await.unwrap().expect("free");
    let seen = inspect_showing(&operator, &name, guard.fencing_token()).await;
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    let h = &seen.holders[0];
    assert_eq!(h.role, HoldRole::Exclusive);
    assert_eq!(h.owner.as_deref(), Some(holder.owner()), "{seen:?}");
    assert!(holder.owner().starts_with("job-a@"));
    assert_eq!(h.fencing_token, Some(guard.fencing_token()), "{seen:?}");
    assert_eq!(h.foreign, None);
    let at = h.acquired_at.unwrap();
    assert!(at + Duration::from_secs(2) >= before && at <= std::time::SystemTime::now());
    assert!(
        matches!(h.lease, LeaseLeft::Ttl(d) if d > Duration::ZERO && d <= Duration::from_secs(9)),
        "{seen:?}"
    );
    assert!(guard.is_held());

    // One master down: the two left are a quorum and still show the holder.
    m.node(2).pause();
    let seen = operator.inspect(&name, mutex).await.unwrap();
    assert_eq!(
        seen.holders[0].fencing_token,
        Some(guard.fencing_token()),
        "{seen:?}"
    );
    m.node(2).resume();

    // Force-release: the waiter gets in, the evicted holder's lost() fires
    // at its next renewal (TTL/3 = 3 s), and the fence is past its token.
    let waiting = waiter.with_lease(lease).unwrap().mutex(&name).unwrap();
    let task = tokio::spawn(async move { waiting.lock().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "the waiter got in while held");
    let done = operator.force_release(&name, mutex).await.unwrap();
    assert_eq!(done.evicted, 1, "{done:?}");
    let fence = done.fence.expect("a fence");
    assert!(fence > guard.fencing_token(), "{done:?}");
    let next = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter got in after the force-release")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > fence, "{next:?} {done:?}");
    let reason = tokio::time::timeout(Duration::from_secs(8), guard.lost())
        .await
        .expect("the evicted holder learns of it");
    assert_eq!(reason, LostReason::Taken);
    let seen = inspect_showing(&operator, &name, next.fencing_token()).await;
    assert_eq!(seen.holders[0].owner.as_deref(), Some(waiter.owner()));
    assert_eq!(
        seen.holders[0].fencing_token,
        Some(next.fencing_token()),
        "{seen:?}"
    );
    next.release().await.unwrap();
    assert!(!operator.inspect(&name, mutex).await.unwrap().is_held());
    let nothing = operator.force_release(&name, mutex).await.unwrap();
    assert_eq!(nothing.evicted, 0, "{nothing:?}");

    // A foreign hold (a plain SET on a quorum, as redis-py would make on
    // each master) shows as foreign; a minority's key is no hold.
    for i in 0..2 {
        assert_eq!(m.node(i).cli(&["SET", &key, "foreign", "PX", "9000"]), "OK");
    }
    let seen = operator.inspect(&name, mutex).await.unwrap();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert!(seen.holders[0].foreign.is_some() && seen.holders[0].owner.is_none());
    assert!(
        !format!("{seen:?}").contains("\"foreign\""),
        "the value shows"
    );
    assert_eq!(m.node(1).cli(&["DEL", &key]), "1");
    assert!(!operator.inspect(&name, mutex).await.unwrap().is_held());
    assert_eq!(m.node(0).cli(&["DEL", &key]), "1");

    // Without a quorum: a retryable error, nothing guessed.
    m.node(1).pause();
    m.node(2).pause();
    let e = operator.inspect(&name, mutex).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let e = operator.force_release(&name, mutex).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    m.node(1).resume();
    m.node(2).resume();
}

/// Nothing left behind, on Redlock: the fencing counter `{K}:redlock:fence`
/// expires on every master the fence retention after the last lease on it
/// could have ended (set by the acquisition, re-set by the renewals), and
/// a later acquisition's token is still above every earlier one. Before,
/// the counter never expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_counter_expires_on_every_master_and_tokens_still_increase() {
    let m = three();
    let client = connect(m, quick().fence_retention(Duration::from_millis(1000))).await;
    let name = unique_name("redlock_retention");
    let fence = client.fence_key(&name).unwrap();
    let lock = client.with_lease(lease(500)).unwrap().mutex(&name).unwrap();
    let mut earlier = Vec::new();
    // Held past several renewals (a third of the TTL each): the counter's
    // TTL is set again with each, so it outlives the lease.
    let g = lock_on_every_master(m, &lock, &client.lock_key(&name).unwrap()).await;
    earlier.push(g.fencing_token());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 0..3 {
        let pttl: i64 = m.node(i).cli(&["PTTL", &fence]).parse().unwrap();
        assert!(pttl > 0, "master {i}: counter TTL {pttl} while held");
    }
    g.release().await.unwrap();
    let g = lock.lock().await.unwrap();
    earlier.push(g.fencing_token());
    g.release().await.unwrap();
    eventually(
        "the fencing counter gone on every master",
        Duration::from_secs(20),
        || (0..3).all(|i| !exists(m, i, &fence)),
    )
    .await;
    let g = lock.lock().await.unwrap();
    let t = g.fencing_token();
    g.release().await.unwrap();
    let highest = earlier.iter().copied().max().unwrap();
    assert!(
        t > highest,
        "token {t} after the expiry, not above {earlier:?}"
    );
}

/// Redlock cannot ask its holders to release (no holder listens on the
/// masters): a typed `Unsupported`, and nothing is written on any master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_release_is_unsupported_and_writes_nothing() {
    let masters = three();
    let client = connect(masters, quick()).await;
    let name = test_support::unique_name("redlock-ask");
    let guard = client.mutex(&name).unwrap().lock().await.unwrap();
    let e = client
        .request_release(&name, distlock_core::PrimitiveKind::Mutex)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            distlock_core::Error::Unsupported {
                what: "request_release",
                ..
            }
        ),
        "{e:?}"
    );
    for i in 0..3 {
        assert!(!exists(masters, i, &format!("{{{name}}}:revoke")));
    }
    assert!(!guard.is_release_requested());
    guard.release().await.unwrap();
}
