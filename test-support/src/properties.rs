//! Property tests of bad input for any backend: arbitrary names, TTLs and
//! timeouts never panic, give typed errors, and a rejected call leaves
//! nothing on the server.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, LeaseOptions, Name, Provider};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Names: mostly near-valid strings, with every kind of breakage mixed in.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9/._:-]{0,12}",
        "[a-z]{1,4}(/[a-z]{1,4}){0,3}",
        ".{0,20}",
        "[ {}*\\x00\\n/]{0,6}",
        proptest::collection::vec(any::<char>(), 0..8).prop_map(|v| v.into_iter().collect()),
        "[a-z]{195,210}",
    ]
}

/// Durations from zero to `Duration::MAX`.
fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..5_000_000).prop_map(Duration::from_nanos),
        (0u64..120_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_secs),
        Just(Duration::MAX),
        Just(Duration::ZERO),
    ]
}

/// Runs the properties against `client`. `leftover(name)` must tell whether
/// the backend stored anything under `name` (it is only asked for names
/// whose primitives were rejected).
///
/// # Panics
///
/// When a property fails.
pub fn check(
    rt: &tokio::runtime::Handle,
    client: &Arc<dyn Provider>,
    prefix: &str,
    leftover: impl Fn(&str) -> bool,
) {
    // A runner per property: one runner counts its cases across runs.
    let runner = || {
        TestRunner::new(Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        })
    };
    // Names: a provider accepts exactly the names `Name` accepts, and a
    // rejected one stores nothing.
    runner()
        .run(&names(), |raw| {
            let name = format!("{prefix}{raw}");
            let valid = Name::new(&name).is_ok();
            let results = [
                client.mutex(&name).map(|_| ()),
                client.fair_mutex(&name).map(|_| ()),
                client.election(&name).map(|_| ()),
                client.id_generator(&name, 1).map(|_| ()),
                client.rw_lock(&name).map(|_| ()),
                client.semaphore(&name, 3).map(|_| ()),
            ];
            for r in results {
                match r {
                    Ok(()) => prop_assert!(valid, "accepted invalid name {name:?}"),
                    Err(Error::InvalidName { .. }) => {
                        prop_assert!(!valid, "rejected valid name {name:?}");
                    }
                    Err(e) => prop_assert!(false, "{name:?}: untyped rejection {e:?}"),
                }
            }
            if !valid {
                prop_assert!(!leftover(&name), "rejected name {name:?} left data behind");
            }
            Ok(())
        })
        .expect("name property");
    // TTLs: accepted exactly between MIN_TTL and 30 days, never a panic.
    runner()
        .run(&durations(), |ttl| {
            let valid = ttl >= LeaseOptions::MIN_TTL && ttl <= LeaseOptions::MAX_TTL;
            prop_assert_eq!(LeaseOptions::new(ttl).is_ok(), valid);
            prop_assert_eq!(LeaseOptions::manual(ttl).is_ok(), valid);
            Ok(())
        })
        .expect("ttl property");
    // Timeouts and extensions on a real lock: any duration is handled.
    let lock = client
        .mutex(&format!("{prefix}timeouts"))
        .expect("valid name");
    let manual = LeaseOptions::manual(Duration::from_secs(30)).expect("ttl");
    let view = match client.with_lease(manual) {
        Ok(view) => view,
        // A session backend refuses lease options it cannot honour.
        Err(Error::InvalidOptions(_)) => Arc::clone(client),
        Err(e) => panic!("with_lease: {e:?}"),
    };
    let held = view.mutex(&format!("{prefix}held")).expect("valid name");
    let guard = rt.block_on(held.lock()).expect("lock");
    // A session lease (no TTL) cannot be extended at all.
    let extensible = guard.ttl().is_some();
    let cases = std::sync::atomic::AtomicUsize::new(0);
    runner()
        .run(&durations(), |d| {
            cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // A free lock is taken whatever the timeout (no overflow).
            let g = rt.block_on(lock.lock_timeout(d)).expect("lock_timeout");
            prop_assert!(g.is_some(), "free lock not taken with timeout {d:?}");
            if let Some(g) = g {
                rt.block_on(g.release()).expect("release");
            }
            // A held lock: short timeouts give None, never an error.
            let short = d.min(Duration::from_millis(20));
            prop_assert!(rt
                .block_on(held.lock_timeout(short))
                .expect("lock_timeout")
                .is_none());
            // Extending to any duration: typed error or success (valid ones
            // at least a minute, so the lease outlives the test).
            let valid = LeaseOptions::manual(d).is_ok();
            let extension = if valid {
                d.max(Duration::from_secs(60))
            } else {
                d
            };
            match rt.block_on(guard.extend(extension)) {
                Ok(()) => prop_assert!(valid && extensible),
                Err(Error::InvalidOptions(_)) => prop_assert!(!valid || !extensible),
                Err(e) => prop_assert!(false, "extend({extension:?}): {e:?}"),
            }
            Ok(())
        })
        .expect("timeout property");
    let cases = cases.into_inner();
    assert!(cases >= 64, "the timeout property ran {cases} cases");
    rt.block_on(guard.release()).expect("release");
}
