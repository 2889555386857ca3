//! A network link emulated in user space: a TCP proxy on loopback that delays every byte by
//! a one-way latency in each direction and paces each connection to a bandwidth cap, so a
//! bench against a local object store sees what a remote one costs (first byte after about
//! two latencies plus the server's time, a transfer no faster than the cap per connection).
//!
//! The kernel's `netem` queueing discipline would do this on a veth pair, but this
//! machine's kernel is built without it (`CONFIG_NET_SCH_NETEM` is not set; nor `fq`), so
//! the link lives here: each direction of a connection is a reader that stamps what it
//! reads with its arrival time and a writer that sends it on no earlier than that time
//! plus the latency, and no faster than the cap (a bounded queue between them, so a slow
//! reader holds the sender back as a real link's window does).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a link does to the bytes crossing it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// One-way latency, each direction (a request's first byte back comes after about
    /// twice this, plus the server's time).
    pub delay: Duration,
    /// Bytes per second per connection and direction (`None`: no cap).
    pub rate: Option<u64>,
}

impl Link {
    /// A remote object store as one connection sees it: 10 ms each way (about 20 ms to
    /// the first byte before the server's own time) and 80 MB/s per connection.
    pub const S3: Link = Link {
        delay: Duration::from_millis(10),
        rate: Some(80_000_000),
    };
}

/// Bytes read and sent on at a time: small enough to pace smoothly.
const CHUNK: usize = 16 << 10;
/// Chunks queued per direction: 1 MiB, about a link's bandwidth-delay product.
const QUEUE: usize = 64;

/// What crossed a proxy: requests (HTTP request lines seen going upstream) and bytes each
/// way, over every connection so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// `GET ` request lines sent upstream.
    pub gets: AtomicU64,
    /// Bytes sent upstream.
    pub up: AtomicU64,
    /// Bytes sent back.
    pub down: AtomicU64,
}

impl Counters {
    /// (GETs, bytes up, bytes down) now.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.gets.load(Ordering::Relaxed),
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }
}

/// A running proxy: connections to [`Proxy::addr`] reach `upstream` through the link.
pub struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: SocketAddr, link: Link) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let counters = Arc::new(Counters::default());
        let counting = counters.clone();
        let accept = std::thread::Builder::new()
            .name("netem-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(client) = client {
                        let c = counting.clone();
                        let _ = std::thread::Builder::new()
                            .name("netem-conn".into())
                            .spawn(move || connect(client, upstream, link, c));
                    }
                }
            })?;
        Ok(Proxy {
            addr,
            stop,
            accept: Some(accept),
            counters,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What has crossed so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl Drop for Proxy {
    /// Stops accepting (connections already made run to their end).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// One connection: the upstream one made, both directions carried through the link.
fn connect(client: TcpStream, upstream: SocketAddr, link: Link, counters: Arc<Counters>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let c = counters.clone();
    let up = std::thread::spawn(move || carry(client, server, link, c, true));
    carry(s2, c2, link, counters, false);
    let _ = up.join();
}

/// One direction, `from` to `to`: a reader stamping chunks and this thread sending them on;
/// what it reads is counted (`upstream`: requests too).
fn carry(from: TcpStream, to: TcpStream, link: Link, counters: Arc<Counters>, upstream: bool) {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = std::thread::spawn(move || read_into(from, tx, &counters, upstream));
    send_from(rx, &to, link);
    let _ = to.shutdown(Shutdown::Write);
    let _ = reader.join();
}

/// Request lines starting in `buf` (at its start, or after a line end): a request split
/// across reads at its first four bytes is missed, rare enough for a bench's count.
fn gets_in(buf: &[u8]) -> u64 {
    let at_start = u64::from(buf.starts_with(b"GET "));
    at_start + buf.windows(5).filter(|w| w == b"\nGET ").count() as u64
}

fn read_into(
    mut from: TcpStream,
    tx: SyncSender<(Instant, Vec<u8>)>,
    counters: &Counters,
    upstream: bool,
) {
    loop {
        let mut buf = vec![0u8; CHUNK];
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf.truncate(n);
                if upstream {
                    counters.up.fetch_add(n as u64, Ordering::Relaxed);
                    counters.gets.fetch_add(gets_in(&buf), Ordering::Relaxed);
                } else {
                    counters.down.fetch_add(n as u64, Ordering::Relaxed);
                }
                if tx.send((Instant::now(), buf)).is_err() {
                    return;
                }
            }
        }
    }
}

fn send_from(rx: Receiver<(Instant, Vec<u8>)>, mut to: &TcpStream, link: Link) {
    // The cap: bytes sent since `paced_from` go out no faster than `rate`.
    let mut paced_from: Option<Instant> = None;
    let mut sent = 0u64;
    while let Ok((arrived, chunk)) = rx.recv() {
        let mut due = arrived + link.delay;
        if let Some(rate) = link.rate.filter(|r| *r > 0) {
            let start = *paced_from.get_or_insert(due);
            let at = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            if at < due {
                // The link was idle: pacing starts again from now.
                paced_from = Some(due);
                sent = 0;
            } else {
                due = at;
            }
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if to.write_all(&chunk).is_err() {
            return;
        }
        sent += chunk.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers each request line with `n` bytes of a pattern.
    fn server(n: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut line = [0u8; 1];
                    while s.read_exact(&mut line).is_ok() {
                        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
                        if s.write_all(&body).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn fetch(addr: SocketAddr, n: usize) -> (Duration, Duration, Vec<u8>) {
        let mut s = TcpStream::connect(addr).unwrap();
        let t = Instant::now();
        s.write_all(b"\n").unwrap();
        let mut got = vec![0u8; n];
        s.read_exact(&mut got[..1]).unwrap();
        let first = t.elapsed();
        s.read_exact(&mut got[1..]).unwrap();
        (first, t.elapsed(), got)
    }

    /// Bytes cross intact; the first comes no sooner than two latencies, and the rest no
    /// faster than the cap (lower bounds: a sleep is never shorter than asked).
    #[test]
    fn the_link_delays_and_caps_and_carries_every_byte() {
        let n = 2 << 20;
        let up = server(n);
        let want: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let link = Link {
            delay: Duration::from_millis(25),
            rate: Some(20 << 20),
        };
        let p = Proxy::start(up, link).unwrap();
        let (first, all, got) = fetch(p.addr(), n);
        assert!(got == want, "bytes changed crossing the link");
        assert!(
            first >= Duration::from_millis(50),
            "first byte after {first:?}"
        );
        // 2 MiB at 20 MiB/s: at least 100 ms (less the first chunk, sent unpaced).
        assert!(all >= Duration::from_millis(50 + 95), "all after {all:?}");
        // A second connection is delayed the same.
        let (first2, _, got2) = fetch(p.addr(), n);
        assert!(got2 == want && first2 >= Duration::from_millis(50));
        // Counted: both responses back, both one-byte requests up.
        let (_, up, down) = p.counters().read();
        assert_eq!((up, down), (2, 2 * n as u64));
        drop(p);
    }

    /// Request lines are counted where they start a read or a line.
    #[test]
    fn gets_are_counted_at_line_starts() {
        assert_eq!(
            gets_in(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\n"),
            2
        );
        assert_eq!(gets_in(b"PUT /a HTTP/1.1\r\n\r\nbody with GET inside"), 0);
    }
}
