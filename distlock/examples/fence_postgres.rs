//! Protect a PostgreSQL row: the admission and the write commit together.
use distlock::fence::postgres::{tokio_postgres, PgFence};
use distlock::fence::{Fence, FenceToken};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = distlock::connect("redis://127.0.0.1:6379").await?;
    let (mut db, connection) = tokio_postgres::connect(
        "host=127.0.0.1 user=postgres dbname=shop",
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    let fence = PgFence::new();
    fence.migrate(&db).await?; // CREATE TABLE IF NOT EXISTS distlock_fence (...), once

    let guard = locks.mutex("orders/42")?.lock().await?;
    let mut tx = db.transaction().await?;
    // Admit first: Err(Stale) if a newer holder of "orders/42" committed;
    // then `?` drops the transaction, which rolls it back.
    fence
        .admit(&mut tx, "orders/42", FenceToken::of(&guard))
        .await?;
    tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[])
        .await?;
    tx.commit().await?; // the write and the admission commit together
    guard.release().await?;
    Ok(())
}
