//! The emulated remote link of `riffle_bench::netem` in front of a server, for measuring by
//! hand: `cargo run --release -p riffle-bench --example netem_proxy -- UPSTREAM [DELAY_MS
//! [MB_PER_S]]` (default: `Link::S3`, 10 ms each way and 80 MB/s per connection) prints the
//! address to connect to, then forwards until killed.

use std::time::Duration;

use riffle_bench::netem::{Link, Proxy};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(upstream) = args.first().and_then(|a| a.parse().ok()) else {
        eprintln!("usage: netem_proxy HOST:PORT [DELAY_MS [MB_PER_S]]");
        std::process::exit(2);
    };
    let mut link = Link::S3;
    if let Some(ms) = args.get(1).and_then(|a| a.parse().ok()) {
        link.delay = Duration::from_millis(ms);
    }
    if let Some(mb) = args.get(2).and_then(|a| a.parse::<u64>().ok()) {
        link.rate = Some(mb * 1_000_000);
    }
    let proxy = Proxy::start(upstream, link).unwrap_or_else(|e| {
        eprintln!("netem_proxy: cannot listen: {e}");
        std::process::exit(1);
    });
    println!("{}", proxy.addr());
    loop {
        std::thread::park();
    }
}
