//! [`FenceLayer`]: a tower layer for an HTTP service that is itself the
//! protected resource, and [`FencingTokenExt`], the client side that puts
//! a guard's token on a request.
//!
//! # The headers
//!
//! * `Fencing-Token` ([`TOKEN_HEADER`]): the holder's token in decimal,
//!   `42` for an exclusive holder (a mutex, a fair mutex, a write guard, a
//!   leader), `42; shared` for a shared one (a read guard, a semaphore
//!   permit; fenced against exclusive holders only, see
//!   `distlock::fence`). Whitespace around the `;` is allowed.
//! * `Fencing-Resource` ([`RESOURCE_HEADER`]): the fenced resource's name,
//!   unless the layer takes it from the request with a closure of yours
//!   ([`FenceLayer::resource_from`]: the path, a tenant, ...).
//!
//! # What the layer answers
//!
//! | request | answer |
//! |---|---|
//! | token admitted by [`Fence::admit`] | the inner service's, the request carrying [`Admitted`] in its extensions |
//! | token below the resource's highest ([`Error::Stale`]) | `409 Conflict`, header `Fencing-Highest: N`, body `{"error":"stale fencing token","token":T,"highest":N}` |
//! | no or unreadable `Fencing-Token`, token 0, no resource, or one outside [the resource rule](distlock_core::fence#resource-names) (a control character, the shape of a fence or of a lock's internal key, ...) | `400 Bad Request`, a one-line text body saying which; nothing admitted, the service not called |
//! | the fence's store failed, retryably ([`Error::is_retryable`]) | `503 Service Unavailable` |
//! | the fence's store failed otherwise | `500 Internal Server Error` |
//!
//! # Admission is a barrier; write through the fence as well
//!
//! The layer admits through any [`Fence<()>`](Fence) ([`MemFence`],
//! `RedisFence`, ...): from its answer on, every lower token is refused.
//! That alone does not make the service's write safe (the request could
//! stall between the admission and the write while a newer holder's
//! request passes), so the service **writes through the store's fenced
//! writes with the same token**, taken from [`Admitted`]
//! (`MemFence::write`, `RedisFence::set`, ...), which check again
//! atomically. For PostgreSQL, the service admits itself, on its own
//! transaction, with `PgFence` (the layer's admission has no transaction to
//! run in); the layer with a `Fence<()>` in front of it still answers 400
//! and 409 early.
//!
//! Works with any tower-based server: axum (`Router::layer`), hyper
//! through `hyper-util`'s `TowerToHyperService`, tonic. The response body
//! type only needs `From<String>` (axum's `Body`, `Full<Bytes>`, `String`).
//!
//! [`MemFence`]: distlock_core::MemFence

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use distlock_core::fence::{check_resource, Fence, FenceToken, Hold};
use distlock_core::{Error, LockGuard};
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

pub use http;

/// `Fencing-Token`: the holder's token (`42`, or `42; shared`).
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("fencing-token");
/// `Fencing-Resource`: the fenced resource's name.
pub const RESOURCE_HEADER: HeaderName = HeaderName::from_static("fencing-resource");
/// `Fencing-Highest`: on a `409`, the token the stale one was compared with.
pub const HIGHEST_HEADER: HeaderName = HeaderName::from_static("fencing-highest");

/// What the layer admitted, in the request's extensions for the service
/// behind it: write through the store's fenced write with `token`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The resource's name.
    pub resource: String,
    /// The token admitted, and how its holder holds.
    pub token: FenceToken,
}

/// Formats a token as the `Fencing-Token` header's value.
#[must_use]
pub fn header_value(token: FenceToken) -> HeaderValue {
    let text = match token.hold() {
        Hold::Exclusive => token.token().to_string(),
        Hold::Shared => format!("{}; shared", token.token()),
    };
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Parses a `Fencing-Token` value (`42`, `42; shared`, `42;exclusive`).
///
/// # Errors
///
/// [`Error::InvalidOptions`] for anything else, and for token 0.
pub fn parse_header(value: &HeaderValue) -> Result<FenceToken, Error> {
    let bad = || {
        Error::InvalidOptions(format!(
            "{TOKEN_HEADER} must be a token from 1 to {}, optionally followed by \"; shared\"",
            u64::MAX
        ))
    };
    let text = value.to_str().map_err(|_| bad())?;
    let mut parts = text.split(';').map(str::trim);
    let digits = parts.next().unwrap_or_default();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let token: u64 = digits.parse().map_err(|_| bad())?;
    let token = match (parts.next(), parts.next()) {
        (None, _) => FenceToken::exclusive(token),
        (Some(h), None) if h.eq_ignore_ascii_case("shared") => FenceToken::shared(token),
        (Some(h), None) if h.eq_ignore_ascii_case("exclusive") => FenceToken::exclusive(token),
        _ => return Err(bad()),
    };
    token.check()
}

/// The client side: adds `Fencing-Token` (and `Fencing-Resource`) to an
/// [`http::request::Builder`] or an [`http::Request`].
pub trait FencingTokenExt: Sized {
    /// Sets `Fencing-Token` to `token`.
    #[must_use]
    fn fencing_token(self, token: FenceToken) -> Self;

    /// Sets `Fencing-Token` to `guard`'s token, as an exclusive holder's
    /// (use [`fencing_token`](Self::fencing_token) with
    /// [`FenceToken::shared`] for a read guard or a permit).
    #[must_use]
    fn fenced_by(self, guard: &LockGuard) -> Self {
        self.fencing_token(FenceToken::of(guard))
    }

    /// Sets `Fencing-Resource` (for a layer that reads it from there).
    ///
    /// A name that is no valid header value (a control character) is
    /// left out, and the server answers 400.
    #[must_use]
    fn fenced_resource(self, resource: &str) -> Self;
}

impl FencingTokenExt for http::request::Builder {
    fn fencing_token(self, token: FenceToken) -> Self {
        self.header(TOKEN_HEADER, header_value(token))
    }

    fn fenced_resource(self, resource: &str) -> Self {
        match HeaderValue::from_str(resource) {
            Ok(v) => self.header(RESOURCE_HEADER, v),
            Err(_) => self,
        }
    }
}

impl<B> FencingTokenExt for Request<B> {
    fn fencing_token(mut self, token: FenceToken) -> Self {
        self.headers_mut().insert(TOKEN_HEADER, header_value(token));
        self
    }

    fn fenced_resource(mut self, resource: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(resource) {
            self.headers_mut().insert(RESOURCE_HEADER, v);
        }
        self
    }
}

/// Takes the resource's name from a request.
pub trait ResourceOf<B>: Send + Sync + 'static {
    /// The name, or `None` when the request names none (answered 400).
    fn resource(&self, request: &Request<B>) -> Option<String>;
}

/// The default [`ResourceOf`]: the `Fencing-Resource` header.
#[derive(Clone, Copy, Debug, Default)]
pub struct FromHeader;

impl<B> ResourceOf<B> for FromHeader {
    fn resource(&self, request: &Request<B>) -> Option<String> {
        let value = request.headers().get(RESOURCE_HEADER)?;
        value.to_str().ok().map(str::to_owned)
    }
}

/// A closure as [`ResourceOf`] (see [`FenceLayer::resource_from`]).
#[derive(Clone, Copy, Debug)]
pub struct FromFn<F>(F);

impl<B, F> ResourceOf<B> for FromFn<F>
where
    F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
{
    fn resource(&self, request: &Request<B>) -> Option<String> {
        (self.0)(request)
    }
}

/// A tower [`Layer`] that admits every request's fencing token through a
/// [`Fence<()>`](Fence) before the service sees it (see [the module
/// docs](self)).
///
/// # Example
///
/// ```
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub mod fence { pub use distlock_core::fence::*; pub use distlock_fence::tower; }
/// # }
/// use std::sync::Arc;
/// use axum::{routing::put, Extension, Router};
/// use distlock::fence::MemFence;
/// use distlock::fence::tower::{http, Admitted, FenceLayer};
///
/// let store: Arc<MemFence<String>> = Arc::new(MemFence::new());
/// let app: Router = Router::new()
///     .route("/orders/{id}", put({
///         let store = Arc::clone(&store);
///         move |Extension(a): Extension<Admitted>, body: String| async move {
///             // Write through the fence too, with the admitted token.
///             match store.write(&a.resource, a.token, |v| *v = Some(body)) {
///                 Ok(()) => "stored".to_owned(),
///                 Err(e) => e.to_string(),
///             }
///         }
///     }))
///     // The resource is the request's path; the token its Fencing-Token.
///     .layer(FenceLayer::new(Arc::clone(&store)).resource_from(|r: &http::Request<_>| Some(r.uri().path().to_owned())));
/// # let _ = app;
/// ```
#[derive(Debug)]
pub struct FenceLayer<F: ?Sized, R = FromHeader> {
    fence: Arc<F>,
    resource: Arc<R>,
}

impl<F: ?Sized, R> Clone for FenceLayer<F, R> {
    fn clone(&self) -> Self {
        FenceLayer {
            fence: Arc::clone(&self.fence),
            resource: Arc::clone(&self.resource),
        }
    }
}

impl<F: Fence + ?Sized> FenceLayer<F> {
    /// A layer admitting through `fence`, the resource named by the
    /// `Fencing-Resource` header.
    #[must_use]
    pub fn new(fence: Arc<F>) -> Self {
        FenceLayer {
            fence,
            resource: Arc::new(FromHeader),
        }
    }
}

impl<F: Fence + ?Sized, R> FenceLayer<F, R> {
    /// Names the resource with `name` (the request's path, a tenant, ...)
    /// instead of the `Fencing-Resource` header; `None` is answered 400.
    #[must_use]
    pub fn resource_from<B, N>(self, name: N) -> FenceLayer<F, FromFn<N>>
    where
        N: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
    {
        FenceLayer {
            fence: self.fence,
            resource: Arc::new(FromFn(name)),
        }
    }
}

impl<S, F: ?Sized, R> Layer<S> for FenceLayer<F, R> {
    type Service = FenceService<S, F, R>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            fence: Arc::clone(&self.fence),
            resource: Arc::clone(&self.resource),
        }
    }
}

/// The service [`FenceLayer`] wraps around yours.
#[derive(Debug)]
pub struct FenceService<S, F: ?Sized, R = FromHeader> {
    inner: S,
    fence: Arc<F>,
    resource: Arc<R>,
}

impl<S: Clone, F: ?Sized, R> Clone for FenceService<S, F, R> {
    fn clone(&self) -> Self {
        FenceService {
            inner: self.inner.clone(),
            fence: Arc::clone(&self.fence),
            resource: Arc::clone(&self.resource),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, F, R, ReqB, ResB> Service<Request<ReqB>> for FenceService<S, F, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    F: Fence + ?Sized + 'static,
    R: ResourceOf<ReqB>,
    ReqB: Send + 'static,
    ResB: From<String>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqB>) -> Self::Future {
        // The clone that was driven ready is the one that serves.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fence = Arc::clone(&self.fence);
        let resource = self.resource.resource(&request);
        let token = request.headers().get(TOKEN_HEADER).map(parse_header);
        Box::pin(async move {
            let token = match token {
                None => return Ok(bad_request(format!("missing {TOKEN_HEADER} header"))),
                Some(Err(e)) => return Ok(bad_request(e.to_string())),
                Some(Ok(t)) => t,
            };
            let Some(resource) = resource else {
                return Ok(bad_request(format!(
                    "the request names no fenced resource ({RESOURCE_HEADER} header)"
                )));
            };
            if let Err(e) = check_resource(&resource) {
                return Ok(bad_request(e.to_string()));
            }
            match fence.admit(&mut (), &resource, token).await {
                Ok(_) => {
                    request
                        .extensions_mut()
                        .insert(Admitted { resource, token });
                    inner.call(request).await
                }
                Err(e) => Ok(refusal(&e)),
            }
        })
    }
}

fn text(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn bad_request<B: From<String>>(why: String) -> Response<B> {
    text(StatusCode::BAD_REQUEST, why + "\n").map(B::from)
}

fn refusal<B: From<String>>(e: &Error) -> Response<B> {
    let response = match e {
        Error::Stale { token, highest } => {
            let mut r = text(
                StatusCode::CONFLICT,
                format!(r#"{{"error":"stale fencing token","token":{token},"highest":{highest}}}"#),
            );
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r.headers_mut()
                .insert(HIGHEST_HEADER, HeaderValue::from(*highest));
            r
        }
        e if e.is_invalid_input() => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        e if e.is_retryable() => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        e => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    response.map(B::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_header_round_trips() {
        for t in [FenceToken::exclusive(1), FenceToken::shared(u64::MAX)] {
            assert_eq!(parse_header(&header_value(t)).ok(), Some(t));
        }
        let parse = |s: &'static str| parse_header(&HeaderValue::from_static(s));
        assert_eq!(parse(" 7 ;SHARED").ok(), Some(FenceToken::shared(7)));
        assert_eq!(parse("7;exclusive").ok(), Some(FenceToken::exclusive(7)));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "x",
            "1.5",
            "18446744073709551616",
            "1; both",
            "1;shared;x",
        ] {
            assert!(parse(bad).is_err_and(|e| e.is_invalid_input()), "{bad:?}");
        }
    }
}
