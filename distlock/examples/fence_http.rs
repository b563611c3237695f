//! Protect an HTTP service that is itself the resource: a tower layer (axum here).
use std::sync::Arc;

use axum::{http::StatusCode, routing::put, Extension, Router};
use distlock::fence::tower::{http, Admitted, FenceLayer, FencingTokenExt};
use distlock::redis::{RedisFence, RedisProvider};
use distlock::Provider;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The service is the protected resource; it keeps its data in Redis.
    let locks = RedisProvider::connect("redis://127.0.0.1:6379").await?;
    let store = Arc::new(RedisFence::new(&locks));
    let write = {
        let store = Arc::clone(&store);
        move |Extension(a): Extension<Admitted>, body: String| async move {
            // Write through the fence too, with the token the layer admitted.
            match store.set(&a.resource, body, a.token).await {
                Ok(()) => StatusCode::NO_CONTENT,
                Err(e) if e.is_stale() => StatusCode::CONFLICT,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            }
        }
    };
    let app = Router::new().route("/orders/{id}", put(write)).layer(
        // 400 without a good Fencing-Token header, 409 and Fencing-Highest
        // for a stale one; the resource is the request's path.
        FenceLayer::new(store)
            .resource_from(|r: &http::Request<_>| Some(r.uri().path().to_owned())),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A client holding the lock puts its guard's token on the request
    // (`Fencing-Token: 42`; a reader's or a permit's: `42; shared`).
    let guard = locks.mutex("orders/42")?.lock().await?;
    let request = http::Request::put("http://127.0.0.1:8080/orders/42")
        .fenced_by(&guard)
        .body("paid".to_owned())?;
    println!("send with any HTTP client: {request:?}");
    guard.release().await?;
    Ok(())
}
