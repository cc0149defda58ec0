//! Connections: HTTP/1.1 by hyper, with time limits that keep a slow or idle
//! client from holding a connection (server-api.md §1.2).
//!
//! A connection is, at any moment,
//! - **idle** (just accepted, or its last response ended): the next request's
//!   first byte must arrive within `idle`;
//! - **reading a head** (bytes arrived, no complete request head yet): the
//!   head must be complete within `header` of its first byte (a slowloris
//!   client is cut off here);
//! - **busy** (a request is being served): no limit here; the handler bounds
//!   the body read (`body`, routes::read_body) and a generation takes as long
//!   as it takes.
//!
//! A watchdog task per connection enforces the first two; the service marks
//! the busy span (from the parsed head to the end of the response body).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The per-connection time limits.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// From a request's first byte to its complete head.
    pub header: Duration,
    /// For the whole body, once the head is in (routes::read_body).
    pub body: Duration,
    /// With no request in progress, before the connection is closed.
    pub idle: Duration,
}

/// How long connections get to finish after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Accepts connections and serves `router` on each until `shutdown`
/// resolves; then lets open connections finish (streams end when the engine
/// stops), up to [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve_one(stream, router.clone(), timeouts, stop_rx.clone()));
                }
                // Out of file descriptors and the like: back off a little.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = &mut shutdown => break,
        }
    }
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        conns.shutdown().await;
    }
}

/// What the watchdog knows about one connection.
struct ConnState {
    busy: AtomicBool,
    /// When the connection last became idle, and when the first byte of the
    /// next request arrived since.
    clock: Mutex<(Instant, Option<Instant>)>,
}

impl ConnState {
    fn clock(&self) -> std::sync::MutexGuard<'_, (Instant, Option<Instant>)> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin_request(&self) {
        self.busy.store(true, Ordering::SeqCst);
    }

    fn end_request(&self) {
        *self.clock() = (Instant::now(), None);
        self.busy.store(false, Ordering::SeqCst);
    }

    fn saw_bytes(&self) {
        if !self.busy.load(Ordering::SeqCst) {
            let mut c = self.clock();
            c.1.get_or_insert_with(Instant::now);
        }
    }

    /// When the connection must close if nothing changes (None while busy).
    fn deadline(&self, t: &Timeouts) -> Option<Instant> {
        if self.busy.load(Ordering::SeqCst) {
            return None;
        }
        let (idle_since, first_byte) = *self.clock();
        Some(match first_byte {
            Some(b) => b + t.header,
            None => idle_since + t.idle,
        })
    }
}

/// Ends the busy span when the response body is done (or dropped).
struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

async fn serve_one(
    stream: TcpStream,
    router: Router,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) {
    let state = Arc::new(ConnState {
        busy: AtomicBool::new(false),
        clock: Mutex::new((Instant::now(), None)),
    });
    let io = TokioIo::new(Watched {
        inner: stream,
        state: state.clone(),
    });
    let svc_state = state.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let state = svc_state.clone();
        state.begin_request();
        let mut router = router.clone();
        async move {
            let response = tower_service::Service::call(&mut router, req.map(Body::new)).await?;
            let guard = BusyGuard(state);
            Ok::<_, Infallible>(response.map(move |b| {
                Body::new(b.map_frame(move |f| {
                    let _ = &guard;
                    f
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Our watchdog does the header timeout; hyper's own needs a timer.
    builder.header_read_timeout(None);
    let mut conn = std::pin::pin!(builder.serve_connection(io, service));
    // How often a busy connection is looked at again.
    let tick = timeouts
        .header
        .min(timeouts.idle)
        .min(Duration::from_secs(1));
    let mut stopping = false;
    loop {
        let wake = state
            .deadline(&timeouts)
            .map_or(Instant::now() + tick, |d| d.min(Instant::now() + tick));
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep_until(wake) => {
                if state.deadline(&timeouts).is_some_and(|d| d <= Instant::now()) {
                    // Idle or slow past its limit: drop the connection.
                    return;
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A TCP stream that tells the connection state when request bytes arrive.
struct Watched {
    inner: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.saw_bytes();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
