//! A TCP proxy between a service and a server it calls, so a scenario can cut the network
//! without touching either process: pass bytes through, delay them, hold them back (blackhole),
//! or drop every connection.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// What the proxy does with the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bytes go through untouched.
    Pass,
    /// Every chunk waits this long before it is forwarded.
    Delay(Duration),
    /// Connections are accepted (and open ones kept) but no byte goes through either way.
    Blackhole,
    /// Open connections are closed and new ones are reset (RST) at once.
    Reset,
}

/// A running proxy on a loopback port; stops when dropped.
pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind proxy")?;
        let port = listener.local_addr()?.port();
        let (mode, rx) = watch::channel(Mode::Pass);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let t = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                let handle = tokio::spawn(serve(client, upstream, rx));
                if let Ok(mut v) = t.lock() {
                    v.retain(|h| !h.is_finished());
                    v.push(handle);
                }
            }
        });
        Ok(Self {
            port,
            mode,
            tasks,
            accept,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        let _ = self.mode.send(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(v) = self.tasks.lock() {
            for h in v.iter() {
                h.abort();
            }
        }
    }
}

async fn serve(client: TcpStream, upstream: u16, mut mode: watch::Receiver<Mode>) {
    if *mode.borrow() == Mode::Reset {
        reset(client);
        return;
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(pump(cr, sw, mode.clone()));
    let down = tokio::spawn(pump(sr, cw, mode.clone()));
    // A switch to Reset ends both directions; their halves drop and the sockets close.
    loop {
        if *mode.borrow_and_update() == Mode::Reset || up.is_finished() || down.is_finished() {
            break;
        }
        if mode.changed().await.is_err() {
            break;
        }
    }
    up.abort();
    down.abort();
}

/// Closes `s` with RST rather than FIN.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let m = *mode.borrow_and_update();
            match m {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                // Hold the bytes until the mode changes (a blackhole drops nothing it might
                // later pass: TCP would have retransmitted them).
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::Reset => return,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
