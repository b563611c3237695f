//! `PgFence` against a real PostgreSQL (Debian's, started by test-support
//! on a free 127.0.0.1 port): the fence conformance suite, and what only a
//! transaction can show.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::fence::{Fence, FenceToken, Highest, MAX_RESOURCE_LEN};
use distlock_core::{Error, Result};
use distlock_fence::postgres::tokio_postgres::{self, Client, NoTls};
use distlock_fence::postgres::{map_error as pg, PgFence};
use futures::future::BoxFuture;
use test_support::fence_conformance::{FenceFixture, FencedStore};
use test_support::unique_name;

/// The user's own table, written in the same transactions as the fence.
const VALUES_DDL: &str = "CREATE TABLE IF NOT EXISTS fenced_values \
    (resource text PRIMARY KEY, value numeric(20, 0) NOT NULL)";
const SET_VALUE: &str = "INSERT INTO fenced_values VALUES ($1, $2::text::numeric) \
    ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value";
const GET_VALUE: &str = "SELECT value::text FROM fenced_values WHERE resource = $1";

async fn connect() -> Client {
    let (client, conn) =
        tokio_postgres::connect(&test_support::postgres::shared().conn_str(), NoTls)
            .await
            .expect("connect to the test PostgreSQL");
    tokio::spawn(conn);
    static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    MIGRATED
        .get_or_init(|| async {
            PgFence::new().migrate(&client).await.unwrap();
            client.batch_execute(VALUES_DDL).await.unwrap();
        })
        .await;
    client
}

async fn value(db: &impl tokio_postgres::GenericClient, resource: &str) -> Option<u64> {
    let row = db.query_opt(GET_VALUE, &[&resource]).await.unwrap();
    row.map(|r| r.get::<_, &str>(0).parse().unwrap())
}

async fn highest(db: &mut Client, resource: &str) -> Highest {
    let mut tx = db.transaction().await.unwrap();
    Fence::highest(&PgFence::new(), &mut tx, resource)
        .await
        .unwrap()
}

/// One client (connection) driven through transactions: each write is
/// BEGIN; admit; upsert the value; COMMIT.
struct PgStore {
    db: tokio::sync::Mutex<Client>,
    fence: PgFence,
}

impl FencedStore for PgStore {
    fn write<'a>(&'a self, r: &'a str, token: FenceToken, v: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut db = self.db.lock().await;
            let mut tx = db.transaction().await.map_err(pg)?;
            self.fence.admit(&mut tx, r, token).await?;
            tx.execute(SET_VALUE, &[&r, &v.to_string()])
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)
        })
    }

    fn admit_read<'a>(
        &'a self,
        r: &'a str,
        token: FenceToken,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            let mut db = self.db.lock().await;
            let mut tx = db.transaction().await.map_err(pg)?;
            self.fence.admit(&mut tx, r, token).await?;
            let v = value(&tx, r).await;
            tx.commit().await.map_err(pg)?;
            Ok(v)
        })
    }

    fn read<'a>(&'a self, r: &'a str) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move { Ok(value(&*self.db.lock().await, r).await) })
    }

    fn highest<'a>(&'a self, r: &'a str) -> BoxFuture<'a, Result<Highest>> {
        Box::pin(async move {
            let mut db = self.db.lock().await;
            let mut tx = db.transaction().await.map_err(pg)?;
            self.fence.highest(&mut tx, r).await
        })
    }
}

struct PgFixture;

impl FenceFixture for PgFixture {
    fn store(&self) -> BoxFuture<'_, Arc<dyn FencedStore>> {
        Box::pin(async {
            Arc::new(PgStore {
                db: tokio::sync::Mutex::new(connect().await),
                fence: PgFence::new(),
            }) as Arc<dyn FencedStore>
        })
    }
}

mod conformance {
    use super::PgFixture;
    test_support::fence_conformance_suite!(PgFixture);
}

#[tokio::test]
async fn the_write_and_the_admission_commit_or_roll_back_together() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let r = unique_name("pg_together");
    let mut tx = db.transaction().await.unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(7))
        .await
        .unwrap();
    tx.execute(SET_VALUE, &[&r, &"70"]).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        highest(&mut db, &r).await,
        Highest::default(),
        "rolled back"
    );
    assert_eq!(value(&db, &r).await, None);

    let mut tx = db.transaction().await.unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(7))
        .await
        .unwrap();
    tx.execute(SET_VALUE, &[&r, &"70"]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(highest(&mut db, &r).await.token, 7);
    assert_eq!(value(&db, &r).await, Some(70));
}

#[tokio::test]
async fn a_refusal_leaves_the_transaction_usable_and_records_nothing() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let r = unique_name("pg_refusal");
    let mut tx = db.transaction().await.unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(5))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.transaction().await.unwrap();
    let e = fence
        .admit(&mut tx, &r, FenceToken::exclusive(3))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Stale {
                token: 3,
                highest: 5
            }
        ),
        "{e:?}"
    );
    let e = fence
        .admit(&mut tx, &r, FenceToken::shared(4))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Stale {
                token: 4,
                highest: 5
            }
        ),
        "{e:?}"
    );
    // No SQL error: the transaction goes on, and may even commit.
    let one: i32 = tx.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    tx.commit().await.unwrap();
    assert_eq!(
        highest(&mut db, &r).await,
        Highest {
            token: 5,
            exclusive: 5
        }
    );
}

#[tokio::test]
async fn tokens_above_i64_max_are_exact() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let r = unique_name("pg_u64");
    let mut tx = db.transaction().await.unwrap();
    let big = u64::MAX - 1;
    assert!(big > i64::MAX as u64);
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(big))
        .await
        .unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(u64::MAX))
        .await
        .unwrap();
    let e = fence
        .admit(&mut tx, &r, FenceToken::exclusive(big))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Stale { token, highest } if token == big && highest == u64::MAX));
    tx.commit().await.unwrap();
    assert_eq!(
        highest(&mut db, &r).await,
        Highest {
            token: u64::MAX,
            exclusive: u64::MAX
        }
    );
}

/// Two transactions admit 5 and 6 on one resource, the second while the
/// first is open: it waits for the first to end, then is judged on what
/// the first committed. Only admissible outcomes: 5 then 6 both land
/// (6 last); 6 then 5 refuses 5. Never 5 over 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_with_5_and_6_in_either_order() {
    for (first, second) in [(5u64, 6u64), (6, 5)] {
        let r = unique_name("pg_concurrent");
        let mut a = connect().await;
        let mut b = connect().await;
        let fence = PgFence::new();
        let mut tx = a.transaction().await.unwrap();
        fence
            .admit(&mut tx, &r, FenceToken::exclusive(first))
            .await
            .unwrap();
        let (r2, fence2) = (r.clone(), fence.clone());
        let other = tokio::spawn(async move {
            let mut tx = b.transaction().await.unwrap();
            let got = fence2
                .admit(&mut tx, &r2, FenceToken::exclusive(second))
                .await;
            if got.is_ok() {
                tx.execute(SET_VALUE, &[&r2, &second.to_string()])
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            got
        });
        // The second admission waits on the first's row lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !other.is_finished(),
            "{second} was admitted while {first} was open"
        );
        tx.execute(SET_VALUE, &[&r, &first.to_string()])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let got = other.await.unwrap();
        let mut db = connect().await;
        if second > first {
            assert_eq!(got.unwrap().token, second);
        } else {
            assert!(
                matches!(
                    got,
                    Err(Error::Stale {
                        token: 5,
                        highest: 6
                    })
                ),
                "{got:?}"
            );
        }
        assert_eq!(value(&db, &r).await, Some(6));
        assert_eq!(highest(&mut db, &r).await.token, 6);
    }
}

/// The rule in SQL and `Highest::check` agree on random histories of
/// exclusive and shared tokens.
#[tokio::test]
async fn the_sql_rule_is_core_rule() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let mut rng = fastrand::Rng::with_seed(27);
    let mut refused = 0;
    for round in 0..20 {
        let r = unique_name("pg_rule");
        let mut model = Highest::default();
        let mut tx = db.transaction().await.unwrap();
        for _ in 0..25 {
            let t = rng.u64(1..=12) + round;
            let token = if rng.bool() {
                FenceToken::exclusive(t)
            } else {
                FenceToken::shared(t)
            };
            let want = model.check(token);
            let got = fence.admit(&mut tx, &r, token).await;
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{token:?}"),
                (
                    Err(Error::Stale {
                        token: a,
                        highest: b,
                    }),
                    Err(Error::Stale {
                        token: c,
                        highest: d,
                    }),
                ) => {
                    assert_eq!((a, b), (c, d), "{token:?}");
                    refused += 1;
                }
                _ => panic!("{token:?}: core says {want:?}, SQL says {got:?}"),
            }
            if let Ok(h) = want {
                model = h;
            }
            assert_eq!(fence.highest(&mut tx, &r).await.unwrap(), model);
        }
        tx.commit().await.unwrap();
    }
    assert!(refused > 50, "the histories refused only {refused}");
}

#[tokio::test]
async fn bad_input_is_typed_and_writes_nothing() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let r = unique_name("pg_bad");
    let long = "x".repeat(MAX_RESOURCE_LEN + 1);
    let mut tx = db.transaction().await.unwrap();
    for (resource, token) in [
        (r.as_str(), FenceToken::exclusive(0)),
        (r.as_str(), FenceToken::shared(0)),
        ("", FenceToken::exclusive(1)),
        (long.as_str(), FenceToken::exclusive(1)),
    ] {
        let e = fence.admit(&mut tx, resource, token).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e:?}");
    }
    assert!(fence
        .highest(&mut tx, "")
        .await
        .unwrap_err()
        .is_invalid_input());
    tx.commit().await.unwrap();
    let rows: i64 = db
        .query_one(
            "SELECT count(*) FROM distlock_fence WHERE resource IN ($1, '', $2)",
            &[&r, &long],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    for table in ["", "Fence", "1fence", "a;drop", &"t".repeat(64)] {
        assert!(
            PgFence::with_table(table).unwrap_err().is_invalid_input(),
            "{table:?}"
        );
    }
}

#[tokio::test]
async fn another_table() {
    let mut db = connect().await;
    let fence = PgFence::with_table("distlock_fence_other").unwrap();
    fence.migrate(&db).await.unwrap();
    fence.migrate(&db).await.unwrap();
    let r = unique_name("pg_table");
    let mut tx = db.transaction().await.unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        highest(&mut db, &r).await,
        Highest::default(),
        "not in the default table"
    );
    let mut tx = db.transaction().await.unwrap();
    assert_eq!(fence.highest(&mut tx, &r).await.unwrap().token, 3);
}

/// Connects to the test PostgreSQL through `proxy`.
async fn connect_through(proxy: &test_support::Proxy) -> Client {
    let _ = connect().await; // the tables exist
    let conn_str = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        proxy.addr().port()
    );
    let (client, conn) = tokio_postgres::connect(&conn_str, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// BEGIN; admit `token` on `resource`; write `v`; COMMIT.
async fn fenced_write(db: &mut Client, resource: &str, token: u64, v: u64) -> Result<()> {
    let mut tx = db.transaction().await.map_err(pg)?;
    PgFence::new()
        .admit(&mut tx, resource, FenceToken::exclusive(token))
        .await?;
    tx.execute(SET_VALUE, &[&resource, &v.to_string()])
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)
}

/// The `COMMIT` reaches the server and runs, but the connection is reset
/// right after it, so its answer never comes: the caller gets a typed,
/// retryable connection error and cannot tell whether it committed.
/// `read_highest` on another connection shows the commit happened; the
/// transaction retried with the same token is admitted again (same
/// holder), and a lower token is still refused. When the reset comes
/// instead of the `COMMIT` (never forwarded), nothing of the transaction
/// is left: the admission rolled back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost() {
    let fence = PgFence::new();
    let mut other = connect().await;
    for landed in [true, false] {
        let proxy = test_support::Proxy::start(test_support::postgres::shared().addr());
        let resource = unique_name("lost-commit");
        let mut db = connect_through(&proxy).await;
        fenced_write(&mut db, &resource, 5, 50).await.unwrap();
        if landed {
            proxy.reset_after_request(b"COMMIT");
        } else {
            proxy.reset_instead_of_request(b"COMMIT");
        }
        let lost = fenced_write(&mut db, &resource, 7, 70).await.unwrap_err();
        assert!(
            matches!(lost, Error::Connection { .. }) && lost.is_retryable(),
            "landed {landed}: {lost:?}"
        );
        // Counted just after the reset is sent.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while proxy.resets() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "landed {landed}: {lost:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A COMMIT that ran may take a moment to show on another session.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let mut now = fence.read_highest(&other, &resource).await.unwrap();
        while landed && now.token != 7 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
            now = fence.read_highest(&other, &resource).await.unwrap();
        }
        if landed {
            assert_eq!(now.token, 7, "the COMMIT ran");
            assert_eq!(value(&other, &resource).await, Some(70));
        } else {
            assert_eq!(now.token, 5, "nothing of the transaction is left");
            assert_eq!(value(&other, &resource).await, Some(50));
        }
        // The retry, on a new connection, with the same token.
        let mut again = connect_through(&proxy).await;
        fenced_write(&mut again, &resource, 7, 70).await.unwrap();
        assert_eq!(
            fence.read_highest(&other, &resource).await.unwrap().token,
            7
        );
        assert_eq!(value(&other, &resource).await, Some(70));
        let stale = fenced_write(&mut other, &resource, 6, 60)
            .await
            .unwrap_err();
        assert!(stale.is_stale(), "{stale:?}");
        assert_eq!(value(&other, &resource).await, Some(70));
    }
}

/// A resource PostgreSQL cannot store (a NUL byte), or of a reserved shape,
/// is refused with `Error::InvalidName` before anything is sent: the
/// caller's transaction is not aborted, its later statements run and its
/// commit writes them; the admission recorded nothing.
#[tokio::test]
async fn a_refused_resource_leaves_the_transaction_usable() {
    let mut db = connect().await;
    let fence = PgFence::new();
    let r = unique_name("pg_nul");
    let mut tx = db.transaction().await.unwrap();
    for bad in [
        format!("{r}\0"),
        format!("\0{r}"),
        format!("{r}\n"),
        format!("{{{r}}}:distlock:highest"),
        format!("{{{r}}}:fence"),
    ] {
        let e = fence
            .admit(&mut tx, &bad, FenceToken::exclusive(5))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        let e = fence.highest(&mut tx, &bad).await.unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        let e = fence.read_highest(&tx, &bad).await.unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
    }
    // The transaction goes on: a later statement runs, and commits.
    tx.execute(SET_VALUE, &[&r, &"7"]).await.unwrap();
    fence
        .admit(&mut tx, &r, FenceToken::exclusive(5))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(value(&db, &r).await, Some(7));
    assert_eq!(highest(&mut db, &r).await.token, 5);
    let rows: i64 = db
        .query_one(
            "SELECT count(*) FROM distlock_fence WHERE strpos(resource, $1) > 0",
            &[&r],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "only the valid resource has a row");
}
