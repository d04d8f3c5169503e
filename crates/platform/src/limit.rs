//! Per-user limits at the edge of a service: a keyed rate limiter for calls such as CreateOrder
//! (governor's GCRA, one cell per user) and a cap on the streams one user keeps open. Both
//! refuse with `RESOURCE_EXHAUSTED`, reason `RATE_LIMITED` and a `google.rpc.RetryInfo` saying
//! when to try again, before the call reaches any store: a refusal writes nothing.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::Duration,
};

use governor::{Quota, RateLimiter, clock::Clock as _};

use serde::{Deserialize, Serialize};

use crate::{
    auth::{Caller, Role},
    config::{ConfigError, Validate, check_range},
    error::ApiError,
};

/// The largest per-second rate and burst a per-user limit accepts.
pub const MAX_USER_RATE: u32 = 1_000_000;

/// `limits.*` of a service whose buyers only read (product-stock's GetProduct and
/// ListProducts, outbound's GetShipment): one count of reads per user. Admin and service
/// callers are not counted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReadLimitSettings {
    /// Reads one user may make per second, on average (0: no limit) ...
    pub read_per_sec: u32,
    /// ... and at once after a pause.
    pub read_burst: u32,
}

impl Default for ReadLimitSettings {
    /// A buyer's screen reads once or twice a second; twenty a second (forty at once) is ten
    /// times that, while a script reading in a loop is cut off within a fraction of a second.
    fn default() -> Self {
        Self {
            read_per_sec: 20,
            read_burst: 40,
        }
    }
}

impl ReadLimitSettings {
    /// The limiter of these reads; `what` names them in refusals (e.g. "GetProduct/ListProducts").
    pub fn limiter(&self, what: &'static str) -> UserRateLimiter {
        UserRateLimiter::new(what, self.read_per_sec, self.read_burst)
    }
}

impl Validate for ReadLimitSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(
            &format!("{p}.read_per_sec"),
            self.read_per_sec,
            0,
            MAX_USER_RATE,
        )?;
        check_range(
            &format!("{p}.read_burst"),
            self.read_burst,
            1,
            MAX_USER_RATE,
        )
    }
}

type Keyed = governor::DefaultKeyedRateLimiter<String>;

/// A per-user rate limit on one kind of call: `per_second` calls a second, in bursts of up to
/// `burst`. Cheap to clone (clones share the counts).
#[derive(Clone)]
pub struct UserRateLimiter {
    /// `None`: no limit.
    limiter: Option<Arc<Keyed>>,
    /// The call it limits, for the refusal's message (e.g. "CreateOrder").
    what: &'static str,
}

impl std::fmt::Debug for UserRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRateLimiter")
            .field("what", &self.what)
            .field("users", &self.users())
            .finish()
    }
}

impl UserRateLimiter {
    /// `per_second` calls a second per user, `burst` at once (at least one); `per_second` 0
    /// means no limit.
    pub fn new(what: &'static str, per_second: u32, burst: u32) -> Self {
        let limiter = NonZeroU32::new(per_second).map(|rate| {
            let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
            Arc::new(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            ))
        });
        Self { limiter, what }
    }

    /// Counts one call of `user`; `RESOURCE_EXHAUSTED` (with the wait before the next call
    /// would pass) when the user is over their rate.
    pub fn check(&self, user: &str) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check_key(&user.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(limiter.clock().now());
            metrics::counter!(RATE_LIMITED_TOTAL, "rpc" => self.what).increment(1);
            ApiError::ResourceExhausted {
                reason: flashsale_contract::reason::RATE_LIMITED,
                message: format!(
                    "too many {} calls from this user; retry in {} ms",
                    self.what,
                    wait.as_millis().max(1)
                ),
                retry_after: wait.max(Duration::from_millis(1)),
            }
        })
    }

    /// [`Self::check`] for a buyer (role `user`); admin and service callers are not counted:
    /// the per-user limits bound what one buyer may ask, and an operator's or a service's
    /// calls are bounded by the server's own limits (`grpc.max_concurrent_requests`).
    pub fn check_caller(&self, caller: &Caller) -> Result<(), ApiError> {
        match caller.role {
            Role::User => self.check(&caller.subject),
            Role::Admin | Role::Service => Ok(()),
        }
    }

    /// Users whose counts are kept now.
    pub fn users(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }

    /// Forgets the users whose counts are back to full (their next call would pass anyway), so
    /// memory follows the users active lately, not every user ever seen.
    pub fn forget_idle(&self) {
        if let Some(l) = &self.limiter {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// Counter of calls refused by a per-user limit, labelled `rpc`.
pub const RATE_LIMITED_TOTAL: &str = "flashsale_rate_limited_total";

/// Runs [`UserRateLimiter::forget_idle`] on `limiters` every `every` until `stop` resolves.
pub async fn forget_idle_users(
    limiters: Vec<UserRateLimiter>,
    every: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            _ = tick.tick() => limiters.iter().for_each(UserRateLimiter::forget_idle),
        }
    }
}

/// A cap on the streams one user has open at once (e.g. WatchOrder). Cheap to clone (clones
/// share the counts).
#[derive(Clone, Debug)]
pub struct StreamCap {
    per_user: usize,
    what: &'static str,
    /// Open streams per user; a user with none has no entry.
    open: Arc<Mutex<HashMap<String, usize>>>,
    /// What a refused caller is told to wait before trying again.
    retry_after: Duration,
}

impl StreamCap {
    /// At most `per_user` open streams per user; a refused caller is told to retry after
    /// `retry_after`.
    pub fn new(what: &'static str, per_user: usize, retry_after: Duration) -> Self {
        Self {
            per_user,
            what,
            open: Arc::default(),
            retry_after,
        }
    }

    /// Opens a stream of `user`: the permit counts it until it is dropped (keep it in the
    /// stream). `RESOURCE_EXHAUSTED` when the user already has `per_user` open.
    pub fn open(&self, user: &str) -> Result<StreamPermit, ApiError> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| ApiError::internal(anyhow::anyhow!("stream cap poisoned")))?;
        let n = open.entry(user.to_owned()).or_insert(0);
        if *n >= self.per_user {
            metrics::counter!(RATE_LIMITED_TOTAL, "rpc" => self.what).increment(1);
            return Err(ApiError::ResourceExhausted {
                reason: flashsale_contract::reason::RATE_LIMITED,
                message: format!(
                    "this user already has {} {} streams open; close one first",
                    self.per_user, self.what
                ),
                retry_after: self.retry_after,
            });
        }
        *n += 1;
        Ok(StreamPermit {
            open: self.open.clone(),
            user: user.to_owned(),
        })
    }

    /// Streams `user` has open now.
    pub fn open_streams(&self, user: &str) -> usize {
        self.open
            .lock()
            .map(|o| o.get(user).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// One open stream counted by a [`StreamCap`]; dropping it closes the count.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<HashMap<String, usize>>>,
    user: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if let Ok(mut open) = self.open.lock()
            && let Some(n) = open.get_mut(&self.user)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use tonic_types::StatusExt as _;

    use super::*;

    #[test]
    fn a_user_over_their_rate_is_refused_with_a_retry_delay_and_others_are_not() {
        let limiter = UserRateLimiter::new("CreateOrder", 1, 3);
        for _ in 0..3 {
            assert!(limiter.check("alice").is_ok());
        }
        let status: tonic::Status = limiter.check("alice").unwrap_err().into();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            crate::error::reason_of(&status).as_deref(),
            Some("RATE_LIMITED")
        );
        let retry = status
            .get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .expect("a retry delay");
        assert!(retry > Duration::ZERO && retry <= Duration::from_secs(1));
        assert!(limiter.check("bob").is_ok());
        assert_eq!(limiter.users(), 2);
    }

    #[test]
    fn only_buyers_are_counted_and_admin_and_service_callers_pass() {
        let limiter = UserRateLimiter::new("GetOrder", 1, 1);
        let caller = |subject: &str, role| Caller {
            subject: subject.to_owned(),
            role,
        };
        assert!(limiter.check_caller(&caller("alice", Role::User)).is_ok());
        assert!(limiter.check_caller(&caller("alice", Role::User)).is_err());
        for _ in 0..100 {
            assert!(limiter.check_caller(&caller("ops", Role::Admin)).is_ok());
            assert!(
                limiter
                    .check_caller(&caller("order", Role::Service))
                    .is_ok()
            );
        }
        assert_eq!(limiter.users(), 1, "only the buyer has a count");
    }

    #[test]
    fn bad_read_limits_name_their_key() {
        assert!(ReadLimitSettings::default().validate("x.limits").is_ok());
        let bad = [
            (
                ReadLimitSettings {
                    read_per_sec: MAX_USER_RATE + 1,
                    ..Default::default()
                },
                "x.limits.read_per_sec",
            ),
            (
                ReadLimitSettings {
                    read_burst: 0,
                    ..Default::default()
                },
                "x.limits.read_burst",
            ),
            (
                ReadLimitSettings {
                    read_burst: MAX_USER_RATE + 1,
                    ..Default::default()
                },
                "x.limits.read_burst",
            ),
        ];
        for (settings, key) in bad {
            let e = settings.validate("x.limits").unwrap_err().to_string();
            assert!(e.contains(key), "`{e}` does not name {key}");
        }
    }

    #[test]
    fn a_rate_of_zero_is_no_limit() {
        let limiter = UserRateLimiter::new("PayOrder", 0, 0);
        for _ in 0..1000 {
            assert!(limiter.check("alice").is_ok());
        }
        assert_eq!(limiter.users(), 0);
    }

    #[test]
    fn streams_are_capped_per_user_and_a_closed_one_frees_its_place() {
        let cap = StreamCap::new("WatchOrder", 2, Duration::from_secs(2));
        let a = cap.open("alice").unwrap();
        let _b = cap.open("alice").unwrap();
        let status: tonic::Status = cap.open("alice").unwrap_err().into();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.get_details_retry_info().is_some());
        let _other = cap.open("bob").unwrap();
        drop(a);
        assert_eq!(cap.open_streams("alice"), 1);
        let _c = cap.open("alice").unwrap();
        drop(_c);
        drop(_b);
        assert_eq!(cap.open_streams("alice"), 0);
        assert!(
            cap.open.lock().unwrap().get("alice").is_none(),
            "no entry left behind"
        );
    }
}
