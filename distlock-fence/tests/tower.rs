//! `FenceLayer` in front of axum services and of a bare hyper one, over
//! real HTTP on 127.0.0.1: the answers (admitted, 409, 400, 503 while the
//! fence's store cannot be reached), and the starved holder whose late
//! write is refused.
#![cfg(feature = "tower")]
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Extension, Router};
use distlock_core::fence::FenceToken;
use distlock_core::{MemFence, Provider};
use distlock_fence::tower::{Admitted, FenceLayer, FencingTokenExt};
use distlock_redis::redis::AsyncCommands;
use distlock_redis::{RedisFence, RedisProvider};
use test_support::unique_name;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `request` as HTTP/1.1 over a new TCP connection (a client as
/// plain as can be: what is on the wire is what the test wrote).
async fn send(addr: SocketAddr, request: http::Request<String>) -> Answer {
    let mut wire = format!(
        "{} {} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        request.method(),
        request.uri(),
        request.body().len()
    );
    for (name, value) in request.headers() {
        wire += &format!("{name}: {}\r\n", value.to_str().unwrap());
    }
    wire += "\r\n";
    wire += request.body();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(wire.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut out))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn put_request(path: &str) -> http::request::Builder {
    http::Request::builder().method("PUT").uri(path)
}

/// A service over an in-process store: `PUT /value` writes the body under
/// the admitted token, `GET /seen` says what the service saw.
async fn mem_service() -> (SocketAddr, Arc<MemFence<String>>) {
    let store: Arc<MemFence<String>> = Arc::new(MemFence::new());
    let write = {
        let store = Arc::clone(&store);
        move |Extension(a): Extension<Admitted>, body: String| async move {
            match store.write(&a.resource, a.token, |v| *v = Some(body)) {
                Ok(()) => (StatusCode::OK, format!("{} {:?}", a.resource, a.token)),
                Err(e) => (StatusCode::CONFLICT, e.to_string()),
            }
        }
    };
    let app = Router::new()
        .route("/value", put(write))
        .layer(FenceLayer::new(Arc::clone(&store)));
    (serve(app).await, store)
}

#[tokio::test]
async fn admitted_requests_pass_with_the_token_and_stale_ones_get_409() {
    let (addr, store) = mem_service().await;
    let r = unique_name("tower_answers");
    let req = |token: FenceToken, body: &str| {
        put_request("/value")
            .fencing_token(token)
            .fenced_resource(&r)
            .body(body.to_owned())
            .unwrap()
    };
    let a = send(addr, req(FenceToken::exclusive(5), "five")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body, format!("{r} {:?}", FenceToken::exclusive(5)));
    let a = send(addr, req(FenceToken::exclusive(5), "five again")).await;
    assert_eq!(a.status, 200, "the same holder again");

    let a = send(addr, req(FenceToken::exclusive(4), "four")).await;
    assert_eq!(a.status, 409);
    assert_eq!(a.header("fencing-highest"), Some("5"));
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(
        a.body,
        r#"{"error":"stale fencing token","token":4,"highest":5}"#
    );
    assert_eq!(
        store.read(&r).as_deref(),
        Some("five again"),
        "refused: unchanged"
    );

    // A shared token (a reader's) is fenced against exclusive ones only.
    let a = send(addr, req(FenceToken::shared(7), "reader 7")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.ends_with(&format!("{:?}", FenceToken::shared(7))));
    let a = send(addr, req(FenceToken::shared(6), "reader 6")).await;
    assert_eq!(a.status, 200, "a reader below a reader: {}", a.body);
    let a = send(addr, req(FenceToken::exclusive(6), "writer 6")).await;
    assert_eq!(a.status, 409, "a writer below a reader");
    assert_eq!(a.header("fencing-highest"), Some("7"));
    assert_eq!(store.read(&r).as_deref(), Some("reader 6"));
}

#[tokio::test]
async fn a_missing_or_bad_token_or_resource_is_400_and_changes_nothing() {
    let (addr, store) = mem_service().await;
    let r = unique_name("tower_bad");
    let long = "x".repeat(2000);
    let cases: Vec<(http::Request<String>, &str)> = vec![
        (
            put_request("/value")
                .fenced_resource(&r)
                .body("a".into())
                .unwrap(),
            "missing fencing-token",
        ),
        (
            put_request("/value")
                .header("fencing-token", "abc")
                .fenced_resource(&r)
                .body("a".into())
                .unwrap(),
            "fencing-token must be",
        ),
        (
            put_request("/value")
                .header("fencing-token", "0")
                .fenced_resource(&r)
                .body("a".into())
                .unwrap(),
            "fencing token 0",
        ),
        (
            put_request("/value")
                .header("fencing-token", "3; maybe")
                .fenced_resource(&r)
                .body("a".into())
                .unwrap(),
            "fencing-token must be",
        ),
        (
            put_request("/value")
                .fencing_token(FenceToken::exclusive(3))
                .body("a".into())
                .unwrap(),
            "names no fenced resource",
        ),
        (
            put_request("/value")
                .fencing_token(FenceToken::exclusive(3))
                .fenced_resource("")
                .body("a".into())
                .unwrap(),
            "needs a name",
        ),
        (
            put_request("/value")
                .fencing_token(FenceToken::exclusive(3))
                .fenced_resource(&long)
                .body("a".into())
                .unwrap(),
            "at most 1024 bytes",
        ),
    ];
    for (request, why) in cases {
        let a = send(addr, request).await;
        assert_eq!(a.status, 400, "{why}: {}", a.body);
        assert!(a.body.contains(why), "{why}: {}", a.body);
    }
    assert_eq!(store.read(&r), None);
    assert_eq!(store.highest(&r).unwrap().token, 0);
}

#[tokio::test]
async fn the_resource_from_a_closure_over_the_request() {
    let store: Arc<MemFence<String>> = Arc::new(MemFence::new());
    let write = {
        let store = Arc::clone(&store);
        move |Extension(a): Extension<Admitted>, body: String| async move {
            store
                .write(&a.resource, a.token, |v| *v = Some(body))
                .unwrap();
            a.resource
        }
    };
    let app = Router::new()
        .route("/orders/{id}", put(write))
        .route("/free", get(|| async { "not fenced" }))
        .layer(
            FenceLayer::new(Arc::clone(&store)).resource_from(|r: &http::Request<_>| {
                r.uri()
                    .path()
                    .strip_prefix("/orders/")
                    .map(|id| format!("orders/{id}"))
            }),
        );
    let addr = serve(app).await;
    let a = send(
        addr,
        put_request("/orders/42")
            .fencing_token(FenceToken::exclusive(9))
            .body("x".into())
            .unwrap(),
    )
    .await;
    assert_eq!((a.status, a.body.as_str()), (200, "orders/42"));
    assert_eq!(store.highest("orders/42").unwrap().token, 9);
    let a = send(
        addr,
        put_request("/orders/42")
            .fencing_token(FenceToken::exclusive(8))
            .body("y".into())
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 409);
    let get = http::Request::builder()
        .uri("/free")
        .fencing_token(FenceToken::exclusive(1))
        .body(String::new())
        .unwrap();
    assert_eq!(
        send(addr, get).await.status,
        400,
        "the closure names no resource for /free"
    );
}

/// The starved holder, end to end over HTTP with real Redis: the holder's
/// runtime is blocked past its lease (its watchdog cannot renew), a new
/// holder takes the lock and writes through the fenced service, then the
/// stale holder wakes and sends its write: 409, nothing changed. The same
/// late write to an unfenced route of the same service is the lost update
/// the fence prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_holders_late_write_gets_409_and_changes_nothing() {
    let url = format!("{}?lease_ttl_ms=300", test_support::redis::shared().url());
    let data = RedisProvider::connect(&test_support::redis::shared().url())
        .await
        .unwrap();
    let fence = Arc::new(RedisFence::new(&data));
    let name = unique_name("starved");
    // The resource the lock protects (a key of its own beside the lock's).
    let data_key = format!("data:{name}");
    let fenced = {
        let fence = Arc::clone(&fence);
        move |Extension(a): Extension<Admitted>, body: String| async move {
            match fence.set(&a.resource, body, a.token).await {
                Ok(()) => (StatusCode::OK, String::new()),
                Err(e) => (StatusCode::CONFLICT, e.to_string()),
            }
        }
    };
    let mut plain = distlock_redis::redis::Client::open(test_support::redis::shared().url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let unfenced = {
        let plain = plain.clone();
        move |headers: http::HeaderMap, body: String| async move {
            let mut plain = plain.clone();
            let name = headers["fencing-resource"].to_str().unwrap().to_owned();
            let () = plain.set(format!("unfenced:{name}"), body).await.unwrap();
        }
    };
    let app = Router::new()
        .route(
            "/value",
            put(fenced).layer(FenceLayer::new(Arc::clone(&fence))),
        )
        .route("/unfenced", put(unfenced));
    let addr = serve(app).await;

    // The holder that will starve: its own thread and runtime.
    let (token_tx, token_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let stale = {
        let (url, name, data_key) = (url.clone(), name.clone(), data_key.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let locks = RedisProvider::connect(&url).await.unwrap();
                let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
                token_tx.send(guard.fencing_token()).unwrap();
                // Starved: the runtime is blocked, the watchdog cannot run,
                // until the new holder has written.
                go_rx.recv().unwrap();
                let held = guard.is_held();
                let late = |path: &str| {
                    put_request(path)
                        .fenced_by(&guard)
                        .fenced_resource(&data_key)
                        .body("stale".to_owned())
                        .unwrap()
                };
                let fenced = send(addr, late("/value")).await;
                let unfenced = send(addr, late("/unfenced")).await;
                (guard.fencing_token(), held, fenced, unfenced)
            })
        })
    };
    let old_token = token_rx.recv().unwrap();
    let locks = RedisProvider::connect(&url).await.unwrap();
    let new = locks
        .mutex(&name)
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the lock once the starved holder's lease ran out");
    assert!(new.fencing_token() > old_token);
    let write = |path: &str| {
        put_request(path)
            .fenced_by(&new)
            .fenced_resource(&data_key)
            .body("new".to_owned())
            .unwrap()
    };
    let a = send(addr, write("/value")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = send(addr, write("/unfenced")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    go_tx.send(()).unwrap();
    let (token, held, fenced, unfenced) =
        tokio::task::spawn_blocking(move || stale.join().unwrap())
            .await
            .unwrap();

    assert_eq!(token, old_token);
    assert!(!held, "the starved holder's lease was lost");
    assert_eq!(fenced.status, 409, "{}", fenced.body);
    assert_eq!(
        fenced.header("fencing-highest"),
        Some(new.fencing_token().to_string().as_str())
    );
    let now: Option<String> = plain.get(&data_key).await.unwrap();
    assert_eq!(
        now.as_deref(),
        Some("new"),
        "the fenced value is the new holder's"
    );
    assert_eq!(
        fence.highest(&data_key).await.unwrap().token,
        new.fencing_token()
    );
    // Without the fence, the same late write lands over the new holder's.
    assert_eq!(unfenced.status, 200);
    let lost: Option<String> = plain.get(format!("unfenced:{data_key}")).await.unwrap();
    assert_eq!(
        lost.as_deref(),
        Some("stale"),
        "the lost update the fence prevents"
    );
    new.release().await.unwrap();
}

/// The layer in front of a bare hyper 1 service (no axum): a tower
/// `service_fn` under the layer, served by hyper's HTTP/1 connection
/// through hyper-util's tower adapter. Admitted, stale and bad requests get
/// the same answers as under axum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_serves_a_bare_hyper_service() {
    use http_body_util::Full;
    use hyper::body::Incoming;
    use tower::ServiceBuilder;

    let store: Arc<MemFence<String>> = Arc::new(MemFence::new());
    let inner = {
        let store = Arc::clone(&store);
        tower::service_fn(move |request: http::Request<Incoming>| {
            let store = Arc::clone(&store);
            async move {
                let a = request.extensions().get::<Admitted>().cloned().unwrap();
                let written = store.write(&a.resource, a.token, |v| *v = Some("hyper".into()));
                let body = match written {
                    Ok(()) => format!("{} {:?}", a.resource, a.token),
                    Err(e) => e.to_string(),
                };
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::<bytes::Bytes>::from(
                    body,
                )))
            }
        })
    };
    let service = ServiceBuilder::new()
        .layer(FenceLayer::new(Arc::clone(&store)))
        .service(inner);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
                    .unwrap();
            });
        }
    });
    let resource = unique_name("hyper");
    let request = |token: &str| {
        put_request("/value")
            .header("fencing-token", token)
            .header("fencing-resource", &resource)
            .body(String::new())
            .unwrap()
    };
    let a = send(addr, request("7")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body, format!("{resource} {:?}", FenceToken::exclusive(7)));
    let a = send(addr, request("6")).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(a.header("fencing-highest"), Some("7"));
    let a = send(addr, request("seven")).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(store.highest(&resource).unwrap().token, 7);
}

/// The fence's store cannot be reached (its connection goes through a
/// proxy that stops forwarding): the layer answers 503 within the store's
/// response timeout and calls nothing; once the store is back, the same
/// request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_503_and_calls_nothing() {
    let redis = test_support::redis::shared();
    let proxy = test_support::Proxy::start(redis.addr());
    let data = RedisProvider::connect_with(
        &format!("redis://{}", proxy.addr()),
        distlock_redis::RedisOptions::new().response_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let fence = Arc::new(RedisFence::new(&data));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        move || async move {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            StatusCode::OK
        }
    };
    let app = Router::new()
        .route("/value", put(handler))
        .layer(FenceLayer::new(Arc::clone(&fence)));
    let addr = serve(app).await;
    let resource = unique_name("unreachable");
    let request = |token: u64| {
        put_request("/value")
            .header("fencing-token", token.to_string())
            .header("fencing-resource", &resource)
            .body(String::new())
            .unwrap()
    };
    assert_eq!(send(addr, request(3)).await.status, 200);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The store's connection is cut, and nothing is forwarded while the
    // blackhole lasts (the first 503 may come from the cut connection's
    // error, later ones from the response timeout).
    proxy.set_blackhole(true);
    proxy.cut();
    let started = std::time::Instant::now();
    let a = send(addr, request(4)).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "answered within the store's timeouts: {:?}",
        started.elapsed()
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    proxy.set_blackhole(false);
    proxy.heal();
    admitted_once_the_store_is_back(addr, || request(4)).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(fence.highest(&resource).await.unwrap().token, 4);
    // A reset right after the admission was forwarded: it ran on the
    // server, its answer is lost. 503 again, and the inner service is not
    // called; the same request sent again is admitted (the same token is
    // the same holder's), and a lower one is still refused.
    proxy.reset_after_request(b"EVAL");
    let a = send(addr, request(5)).await;
    assert_eq!(a.status, 503, "{}", a.body);
    // Counted just after the reset is sent.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while proxy.resets() == 0 {
        assert!(std::time::Instant::now() < deadline, "the reset happened");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The admission did run: seen on a connection that bypasses the proxy.
    let direct = RedisFence::new(&RedisProvider::connect(&redis.url()).await.unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while direct.highest(&resource).await.unwrap().token != 5 {
        assert!(std::time::Instant::now() < deadline, "the admission ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    admitted_once_the_store_is_back(addr, || request(5)).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(send(addr, request(4)).await.status, 409);
    assert_eq!(fence.highest(&resource).await.unwrap().token, 5);
}

/// Sends `request()` until the layer admits it (200), within 10 s: only
/// 503 (the store not reachable yet) may come before.
async fn admitted_once_the_store_is_back(
    addr: SocketAddr,
    request: impl Fn() -> http::Request<String>,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = send(addr, request()).await;
        if a.status == 200 {
            return;
        }
        assert_eq!(a.status, 503, "{}", a.body);
        assert!(std::time::Instant::now() < deadline, "the store came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A resource from a request that names another resource's fence or a
/// lock's internals (as a header or through the layer's closure), or holds
/// a control character, is a client error: `400 Bad Request` saying why,
/// the inner service is not called, and the fenced resource it points at
/// keeps its highest token, so its stale holder stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_or_control_resource_is_400_and_changes_no_fence() {
    let data = RedisProvider::connect(&test_support::redis::shared().url())
        .await
        .unwrap();
    let fence = Arc::new(RedisFence::new(&data));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The service deletes what the request names, through the fence.
    let delete = {
        let (fence, calls) = (Arc::clone(&fence), Arc::clone(&calls));
        move |Extension(a): Extension<Admitted>| async move {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match fence.del(&a.resource, a.token).await {
                Ok(_) => (StatusCode::OK, String::new()),
                Err(e) => (StatusCode::CONFLICT, e.to_string()),
            }
        }
    };
    let app = Router::new()
        .route("/value", put(delete.clone()))
        .layer(FenceLayer::new(Arc::clone(&fence)));
    let by_header = serve(app).await;
    // The tenant from the path, as a service would take it.
    let app = Router::new()
        .route("/tenants/{*tenant}", put(delete))
        .layer(
            FenceLayer::new(Arc::clone(&fence)).resource_from(|r: &http::Request<_>| {
                let tenant = r.uri().path().strip_prefix("/tenants/")?;
                let tenant = tenant.replace("%7B", "{").replace("%7D", "}");
                Some(tenant.replace("%00", "\0"))
            }),
        );
    let by_path = serve(app).await;

    let k = unique_name("tower_reserved");
    fence
        .set(&k, "hundred", FenceToken::exclusive(100))
        .await
        .unwrap();
    let before = fence.highest(&k).await.unwrap();
    let reserved = [
        RedisFence::fence_key(&k).unwrap(),
        format!("{{{k}}}:fence"),
        format!("{{{k}}}:rw:writer"),
    ];
    for (resource, why) in reserved
        .iter()
        .map(|r| (r.clone(), "reserved"))
        .chain([(format!("{k}\tx"), "control")])
    {
        let a = send(
            by_header,
            put_request("/value")
                .fencing_token(FenceToken::exclusive(5))
                .fenced_resource(&resource)
                .body(String::new())
                .unwrap(),
        )
        .await;
        assert_eq!(a.status, 400, "{resource:?}: {}", a.body);
        assert!(a.body.contains(why), "{resource:?}: {}", a.body);
    }
    for path in [
        format!("/tenants/%7B{k}%7D:distlock:highest"),
        format!("/tenants/%7B{k}%7D:fence"),
        format!("/tenants/{k}%00"),
    ] {
        let a = send(
            by_path,
            put_request(&path)
                .fencing_token(FenceToken::exclusive(5))
                .body(String::new())
                .unwrap(),
        )
        .await;
        assert_eq!(a.status, 400, "{path}: {}", a.body);
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(fence.highest(&k).await.unwrap(), before);
    assert!(fence
        .set(&k, "five", FenceToken::exclusive(5))
        .await
        .unwrap_err()
        .is_stale());
}
