//! Running the gate's Lua scripts by digest, and reading their replies defensively.
//!
//! `redis::Script` would do the EVALSHA/NOSCRIPT dance, but deadpool-redis builds redis without
//! its `script` feature; a script here loads itself with `SCRIPT LOAD` on first use, then runs
//! with `EVALSHA` and its digest (SHA-1 of the source, computed here). On a Redis Cluster the
//! first use skips `SCRIPT LOAD`, which goes to every node and fails while one is down. Redis's script cache is volatile (restart, failover, `SCRIPT FLUSH`): on
//! `NOSCRIPT` the call is retried with `EVAL`, which runs the source and caches it again in one
//! round trip, so a flush racing the retry cannot fail it.

use std::sync::{
    OnceLock,
    atomic::{AtomicBool, Ordering},
};

use deadpool_redis::redis::{self, ErrorKind, RedisError, ServerErrorKind, Value};

use super::GateError;

/// One Lua script of the gate.
pub(super) struct LuaScript {
    name: &'static str,
    source: &'static str,
    sha: OnceLock<String>,
    loaded: AtomicBool,
}

impl LuaScript {
    pub(super) const fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            sha: OnceLock::new(),
            loaded: AtomicBool::new(false),
        }
    }

    /// Loads the script into the server's cache (every node's, on a cluster); answers its
    /// digest.
    pub(super) async fn load(
        &self,
        conn: &mut flashsale_platform::redis::Conn,
    ) -> Result<String, GateError> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(self.source)
            .query_async(conn)
            .await
            .map_err(redis_error)?;
        if sha != self.sha() {
            return Err(GateError::Script(format!(
                "SCRIPT LOAD of {} answered digest {sha}, not {}",
                self.name,
                self.sha()
            )));
        }
        self.loaded.store(true, Ordering::Relaxed);
        Ok(sha)
    }

    /// The script's digest, as `SCRIPT LOAD` answers it.
    fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| sha1_smol::Sha1::from(self.source).digest().to_string())
    }

    /// [`load`](Self::load) on the first use, on one server.
    async fn load_once(&self, conn: &mut flashsale_platform::redis::Conn) -> Result<(), GateError> {
        if !conn.is_cluster() && !self.loaded.load(Ordering::Relaxed) {
            self.load(conn).await?;
        }
        Ok(())
    }

    /// Runs the script, reloading it if the server forgot it.
    pub(super) async fn run(
        &self,
        conn: &mut flashsale_platform::redis::Conn,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, GateError> {
        self.load_once(conn).await?;
        let sha = self.sha();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(sha).arg(keys.len()).arg(keys).arg(args);
        match evalsha.query_async::<Value>(conn).await {
            Ok(value) => Ok(value),
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                metrics::counter!("flashsale_gate_script_reloads_total", "script" => self.name)
                    .increment(1);
                tracing::debug!(
                    script = self.name,
                    "redis forgot a gate script; reloading it"
                );
                let mut eval = redis::cmd("EVAL");
                eval.arg(self.source).arg(keys.len()).arg(keys).arg(args);
                eval.query_async::<Value>(conn).await.map_err(redis_error)
            }
            Err(e) => Err(redis_error(e)),
        }
    }
}

impl LuaScript {
    /// Runs the script once per `(keys, args)` in one pipeline (one round trip; each run is
    /// atomic on its own, the pipeline as a whole is not). One reply per call, in order; a
    /// call the server could not run because it forgot the script is run again with `EVAL`.
    pub(super) async fn run_many(
        &self,
        conn: &mut flashsale_platform::redis::Conn,
        calls: &[&(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Result<Value, GateError>>, GateError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        self.load_once(conn).await?;
        let sha = self.sha();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (keys, args) in calls {
            pipe.cmd("EVALSHA")
                .arg(sha)
                .arg(keys.len())
                .arg(keys)
                .arg(args);
        }
        let replies: Vec<redis::RedisResult<Value>> =
            pipe.query_async(conn).await.map_err(redis_error)?;
        let mut out = Vec::with_capacity(replies.len());
        for (reply, (keys, args)) in replies.into_iter().zip(calls) {
            out.push(match reply {
                Ok(v) => Ok(v),
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.run(conn, keys, args).await
                }
                Err(e) => Err(redis_error(e)),
            });
        }
        Ok(out)
    }
}

/// Connection trouble and a server that cannot serve right now are `Unavailable`; anything
/// else (a script error, a wrong key type) is `Script`. On a Redis Cluster a redirect
/// (`MOVED`/`ASK`) reaches here only when the client ran out of retries while slots moved (a
/// failover): the caller may try again.
pub(super) fn redis_error(e: RedisError) -> GateError {
    let unavailable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            )
        );
    if unavailable {
        GateError::Unavailable(e.to_string())
    } else {
        GateError::Script(e.to_string())
    }
}

/// A script's array reply.
pub(super) struct Reply(Vec<Value>);

impl Reply {
    pub(super) fn new(value: Value) -> Result<Self, GateError> {
        match value {
            Value::Array(items) | Value::Set(items) => Ok(Self(items)),
            other => Err(unexpected("an array", &other)),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The reply's first element, a short code.
    pub(super) fn code(&self) -> Result<&str, GateError> {
        self.text(0)
    }

    pub(super) fn text(&self, i: usize) -> Result<&str, GateError> {
        text(self.get(i)?)
    }

    pub(super) fn int(&self, i: usize) -> Result<i64, GateError> {
        int(self.get(i)?)
    }

    pub(super) fn get(&self, i: usize) -> Result<&Value, GateError> {
        self.0.get(i).ok_or_else(|| {
            GateError::Script(format!(
                "reply has {} elements, wanted index {i}",
                self.0.len()
            ))
        })
    }
}

pub(super) fn text(value: &Value) -> Result<&str, GateError> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .map_err(|_| GateError::Script("reply string is not utf-8".into())),
        Value::SimpleString(s) => Ok(s),
        other => Err(unexpected("a string", other)),
    }
}

/// An integer reply, or a string holding one (Redis stores counters as strings).
pub(super) fn int(value: &Value) -> Result<i64, GateError> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(_) | Value::SimpleString(_) => {
            let s = text(value)?;
            s.parse()
                .map_err(|_| GateError::Script(format!("reply {s:?} is not an integer")))
        }
        other => Err(unexpected("an integer", other)),
    }
}

fn unexpected(wanted: &str, got: &Value) -> GateError {
    GateError::Script(format!("wanted {wanted} in the reply, got {got:?}"))
}
