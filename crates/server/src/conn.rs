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
    max_body_bytes: usize,
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
                    conns.spawn(serve_one(stream, router.clone(), timeouts, max_body_bytes, stop_rx.clone()));
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
    max_body_bytes: usize,
    mut stop: watch::Receiver<bool>,
) {
    let state = Arc::new(ConnState {
        busy: AtomicBool::new(false),
        clock: Mutex::new((Instant::now(), None)),
    });
    let io = TokioIo::new(Watched {
        inner: stream,
        state: state.clone(),
        framing: Framing::new(max_body_bytes as u64),
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

/// A TCP stream that tells the connection state when request bytes arrive,
/// and follows the requests' framing ([`Framing`]) to refuse a chunk that
/// declares more bytes than any body may have the moment its size line
/// arrives (hyper would wait for the bytes until the body timeout).
struct Watched {
    inner: TcpStream,
    state: Arc<ConnState>,
    framing: Framing,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(size) = self.framing.oversized {
            return Poll::Ready(Err(OversizedChunk(size).into()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.saw_bytes();
            // What was read is hyper's to parse up to the size line; a size
            // over the limit fails the next read, and so the body.
            let this = &mut *self;
            this.framing.feed(&buf.filled()[before..]);
        }
        r
    }
}

/// A chunk whose size line declares more bytes than the body limit.
#[derive(Debug)]
pub struct OversizedChunk(pub u64);

impl std::fmt::Display for OversizedChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a chunk of {} bytes is larger than the body limit",
            self.0
        )
    }
}

impl std::error::Error for OversizedChunk {}

impl From<OversizedChunk> for std::io::Error {
    fn from(e: OversizedChunk) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// Where [`Framing`] is in the byte stream of a connection's requests.
#[derive(Debug, PartialEq)]
enum Frame {
    /// In a request head: the current line's length, whether a line of
    /// this head was seen, and what its headers said so far.
    Head {
        line: Vec<u8>,
        started: bool,
        chunked: bool,
        length: u64,
    },
    /// A body of a declared length: bytes left.
    Fixed(u64),
    /// A chunk size line: the size so far, and whether an extension began.
    Size {
        size: u64,
        extension: bool,
    },
    /// A chunk's data: bytes left; then its CRLF (bytes left of it).
    Data(u64),
    DataEnd(u8),
    /// After the last chunk: the trailer lines, up to the empty one.
    Trailer {
        empty: bool,
    },
    /// Something this tracker does not follow (hyper will refuse it or it
    /// is beyond this check): it stops looking at this connection.
    Lost,
}

/// A minimal follower of HTTP/1.1 request framing (heads, Content-Length
/// and chunked bodies, trailers), only to see chunk sizes as they arrive.
/// hyper does the real parsing; anything unusual here just stops the
/// tracking (hyper then answers as it would).
struct Framing {
    frame: Frame,
    limit: u64,
    /// Set when a chunk size over the limit arrives.
    oversized: Option<u64>,
}

/// Longest head line followed (hyper's own head limit is smaller).
const MAX_TRACKED_LINE: usize = 64 * 1024;

impl Framing {
    fn new(limit: u64) -> Framing {
        Framing {
            frame: Framing::head(),
            limit,
            oversized: None,
        }
    }

    fn head() -> Frame {
        Frame::Head {
            line: Vec::new(),
            started: false,
            chunked: false,
            length: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.oversized.is_none() {
            let (next, used) = self.step(bytes);
            if let Some(f) = next {
                self.frame = f;
            }
            bytes = &bytes[used..];
        }
    }

    /// One step over the front of `bytes`: the next frame (if it changes)
    /// and the bytes consumed (at least one, except into `Lost`).
    fn step(&mut self, bytes: &[u8]) -> (Option<Frame>, usize) {
        let b = bytes[0];
        match &mut self.frame {
            Frame::Lost => (None, bytes.len()),
            Frame::Fixed(left) => {
                let n = (*left).min(bytes.len() as u64);
                *left -= n;
                let next = (*left == 0).then(Framing::head);
                (next, n as usize)
            }
            Frame::Data(left) => {
                let n = (*left).min(bytes.len() as u64);
                *left -= n;
                let next = (*left == 0).then_some(Frame::DataEnd(2));
                (next, n as usize)
            }
            Frame::DataEnd(left) => {
                let want = if *left == 2 { b'\r' } else { b'\n' };
                if b != want {
                    return (Some(Frame::Lost), 0);
                }
                *left -= 1;
                let next = (*left == 0).then_some(Frame::Size {
                    size: 0,
                    extension: false,
                });
                (next, 1)
            }
            Frame::Size { size, extension } => {
                match b {
                    b'\n' => {
                        let size = *size;
                        if size == 0 {
                            return (Some(Frame::Trailer { empty: true }), 1);
                        }
                        if size > self.limit {
                            self.oversized = Some(size);
                        }
                        return (Some(Frame::Data(size)), 1);
                    }
                    _ if *extension => {}
                    b';' => *extension = true,
                    b'\r' | b' ' | b'\t' => {}
                    _ => match (b as char).to_digit(16) {
                        Some(d) => *size = size.saturating_mul(16).saturating_add(d as u64),
                        None => return (Some(Frame::Lost), 0),
                    },
                }
                (None, 1)
            }
            Frame::Trailer { empty } => {
                match b {
                    b'\n' if *empty => return (Some(Framing::head()), 1),
                    b'\n' => *empty = true,
                    b'\r' => {}
                    _ => *empty = false,
                }
                (None, 1)
            }
            Frame::Head {
                line,
                started,
                chunked,
                length,
            } => {
                if b != b'\n' {
                    if line.len() >= MAX_TRACKED_LINE {
                        return (Some(Frame::Lost), 0);
                    }
                    line.push(b);
                    return (None, 1);
                }
                let text = line.strip_suffix(b"\r").unwrap_or(line);
                if text.is_empty() {
                    if !*started {
                        // Empty lines before a request line are allowed.
                        return (None, 1);
                    }
                    let next = if *chunked {
                        Frame::Size {
                            size: 0,
                            extension: false,
                        }
                    } else if *length > 0 {
                        Frame::Fixed(*length)
                    } else {
                        Framing::head()
                    };
                    return (Some(next), 1);
                }
                if *started {
                    if let Some((name, value)) = split_header(text) {
                        if name.eq_ignore_ascii_case(b"transfer-encoding") {
                            *chunked = value
                                .rsplit(|&c| c == b',')
                                .next()
                                .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                        } else if name.eq_ignore_ascii_case(b"content-length") {
                            match std::str::from_utf8(value.trim_ascii())
                                .ok()
                                .and_then(|v| v.parse::<u64>().ok())
                            {
                                Some(n) => *length = n,
                                None => return (Some(Frame::Lost), 0),
                            }
                        }
                    }
                }
                *started = true;
                line.clear();
                (None, 1)
            }
        }
    }
}

fn split_header(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = line.iter().position(|&c| c == b':')?;
    Some((&line[..at], &line[at + 1..]))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(limit: u64, pieces: &[&[u8]]) -> Framing {
        let mut f = Framing::new(limit);
        for p in pieces {
            f.feed(p);
        }
        f
    }

    #[test]
    fn an_oversized_chunk_is_seen_at_its_size_line() {
        let head = b"POST /v1/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        let f = fed(1000, &[head, b"ffffffffffffffff\r\n", b"abc"]);
        assert_eq!(f.oversized, Some(u64::MAX));
        // Split anywhere, with an extension, after a first small chunk.
        let f = fed(
            1000,
            &[&head[..7], &head[7..], b"5\r\nhello\r\n3e9;x=y", b"\r\n"],
        );
        assert_eq!(f.oversized, Some(1001));
        // At the limit, and a second request after a complete first one.
        let f = fed(1000, &[head, b"3e8\r\n"]);
        assert_eq!(f.oversized, None);
        let two = [
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"[..],
            head,
            b"2\r\nhi\r\n0\r\nX-T: 1\r\n\r\n",
            head,
            b"10000\r\n",
        ];
        assert_eq!(fed(1000, &two).oversized, Some(65536));
    }

    #[test]
    fn framing_it_does_not_follow_stops_the_tracking() {
        let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let f = fed(10, &[head, b"zz\r\n", b"ffffff\r\n"]);
        assert_eq!((f.frame, f.oversized), (Frame::Lost, None));
        let f = fed(10, &[b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"]);
        assert_eq!(f.frame, Frame::Lost);
        // A body of a declared length is skipped, whatever it holds.
        let f = fed(
            10,
            &[b"POST / HTTP/1.1\r\nContent-Length: 8\r\n\r\nffffff\r\n"],
        );
        assert_eq!(f.oversized, None);
        assert!(matches!(f.frame, Frame::Head { .. }));
    }
}
