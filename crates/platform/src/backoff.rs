//! Exponential backoff with jitter, for the loops that reconnect to a server or retry a step:
//! each wait doubles up to a ceiling, and its upper half is random, so replicas that lost the
//! same server at the same moment do not come back at it in lock-step.

use std::time::Duration;

/// The waits of one retry loop. [`Backoff::reset`] after a success starts over.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// Steps from `min`, doubling up to `max` (`max` below `min` is taken as `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            step: min,
        }
    }

    /// The services' reconnect backoff: 100 ms doubling to 5 s.
    pub fn reconnect() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// The wait before the next try: the current step with its upper half random. The step
    /// then doubles (up to the ceiling).
    pub fn next_wait(&mut self) -> Duration {
        let wait = jittered(self.step);
        self.step = self.step.saturating_mul(2).min(self.max);
        wait
    }

    /// The current step (the most the next wait can be).
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The ceiling of the steps.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Back to the first step (the server answered again).
    pub fn reset(&mut self) {
        self.step = self.min;
    }
}

/// `step` with its upper half random: in `step / 2 ..= step`.
pub fn jittered(step: Duration) -> Duration {
    let half = step / 2;
    half + half.mul_f64(random_unit())
}

/// A number in `0.0..1.0` from a random UUID's low 53 bits, which are all random.
pub fn random_unit() -> f64 {
    const BITS: u32 = 53;
    let low = uuid::Uuid::new_v4().as_u128() & ((1u128 << BITS) - 1);
    low as f64 / (1u64 << BITS) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_ceiling_each_in_the_upper_half_of_its_step() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1_000));
        let mut steps = Vec::new();
        for _ in 0..8 {
            let step = b.step();
            let wait = b.next_wait();
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} for step {step:?}"
            );
            steps.push(step.as_millis());
        }
        assert_eq!(steps, [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(100));
    }

    #[test]
    fn waits_of_one_step_are_spread_not_equal() {
        let waits: std::collections::HashSet<Duration> =
            (0..50).map(|_| Backoff::reconnect().next_wait()).collect();
        assert!(waits.len() > 40, "{} distinct waits of 50", waits.len());
    }

    #[test]
    fn a_ceiling_below_the_floor_is_the_floor() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.max(), Duration::from_secs(2));
        b.next_wait();
        assert_eq!(b.step(), Duration::from_secs(2));
    }
}
