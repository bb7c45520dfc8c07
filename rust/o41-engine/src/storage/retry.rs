//! The retry policy of remote requests. It counts consecutive failures and time without
//! progress, not total attempts: a long read over a flaky link keeps going as long as bytes keep
//! arriving, and gives up only when the service stops delivering.

use std::time::{Duration, Instant};

/// When a remote read or write gives up, and how long it waits between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed attempts in a row, with no byte received in between, before giving up.
    pub max_consecutive_failures: u32,
    /// Time without a received byte (or a completed request) before giving up.
    pub no_progress_timeout: Duration,
    /// Silence on an open response after which the attempt counts as failed and is retried.
    pub read_timeout: Duration,
    /// Time to establish a connection before the attempt counts as failed.
    pub connect_timeout: Duration,
    /// Wait after the first failure; doubles per consecutive failure up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_consecutive_failures: 64,
            no_progress_timeout: Duration::from_secs(15 * 60),
            read_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
        }
    }
}

/// One operation's failure budget.
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    failures: u32,
    last_progress: Instant,
}

impl Attempts {
    pub fn new(policy: RetryPolicy) -> Self {
        Attempts {
            policy,
            failures: 0,
            last_progress: Instant::now(),
        }
    }

    /// Bytes arrived or a request completed: the failure count starts over.
    pub fn progress(&mut self) {
        self.failures = 0;
        self.last_progress = Instant::now();
    }

    /// Records a transient failure. Returns how long to wait before the next attempt, or the
    /// reason to give up.
    pub fn failed(&mut self) -> Result<Duration, String> {
        self.failures += 1;
        let stalled = self.last_progress.elapsed();
        if self.failures >= self.policy.max_consecutive_failures {
            return Err(format!(
                "gave up after {} consecutive failed attempts",
                self.failures
            ));
        }
        if stalled >= self.policy.no_progress_timeout {
            return Err(format!(
                "gave up after {:.1} s without progress ({} consecutive failed attempts)",
                stalled.as_secs_f64(),
                self.failures
            ));
        }
        let doubling = 1u32 << (self.failures - 1).min(16);
        let wait = self
            .policy
            .initial_backoff
            .saturating_mul(doubling)
            .min(self.policy.max_backoff);
        // Never sleep past the no-progress deadline; the next failure then reports it.
        Ok(wait.min(self.policy.no_progress_timeout.saturating_sub(stalled)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(max: u32, no_progress: Duration) -> RetryPolicy {
        RetryPolicy {
            max_consecutive_failures: max,
            no_progress_timeout: no_progress,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn gives_up_after_consecutive_failures_only() {
        let mut attempts = Attempts::new(quick(3, Duration::from_secs(60)));
        assert!(attempts.failed().is_ok());
        assert!(attempts.failed().is_ok());
        attempts.progress();
        assert!(attempts.failed().is_ok());
        assert!(attempts.failed().is_ok());
        let reason = attempts.failed().unwrap_err();
        assert!(reason.contains("3 consecutive"), "{reason}");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut attempts = Attempts::new(quick(100, Duration::from_secs(60)));
        let waits: Vec<u128> = (0..5)
            .map(|_| attempts.failed().unwrap().as_millis())
            .collect();
        assert_eq!(waits, vec![1, 2, 4, 4, 4]);
    }

    #[test]
    fn gives_up_without_progress() {
        let mut attempts = Attempts::new(quick(100, Duration::from_millis(20)));
        std::thread::sleep(Duration::from_millis(25));
        let reason = attempts.failed().unwrap_err();
        assert!(reason.contains("without progress"), "{reason}");
    }
}
