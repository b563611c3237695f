//! Protect a Redis value: the write lands only with an admitted fencing token.
use distlock::fence::FenceToken;
use distlock::redis::{RedisFence, RedisProvider};
use distlock::Provider;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = RedisProvider::connect("redis://127.0.0.1:6379").await?;
    let data = RedisFence::new(&locks); // or a provider on the Redis that holds the data
    let guard = locks.mutex("orders/42")?.lock().await?;
    // SET order:42 paid, in one script with the check: refused if a newer
    // holder of the lock wrote order:42 (this one was paused past its lease).
    match data.set("order:42", "paid", FenceToken::of(&guard)).await {
        Ok(()) => println!("written with token {}", guard.fencing_token()),
        Err(e) if e.is_stale() => println!("refused, nothing written: {e}"),
        Err(e) => return Err(e.into()),
    }
    guard.release().await?;
    Ok(())
}
