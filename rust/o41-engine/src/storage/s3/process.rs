//! A profile's `credential_process`: a helper program printing version 1 credential JSON, run
//! bounded in time and output, stoppable, and never left behind.
//!
//! The helper starts in its own process group with no stdin and both outputs captured. Its run
//! waits in steps of [`POLL_STEP`], reading what it printed, until it has exited and closed
//! both outputs; at its timeout ([`DEFAULT_TIMEOUT`], or `O41_CREDENTIAL_PROCESS_TIMEOUT`), once
//! it has printed more than [`MAX_OUTPUT`] bytes, or when the request that needed it is dropped
//! (Ctrl-C, `close()`), its whole group is killed and the helper reaped before the call
//! returns: nothing it started outlives the call, holding our stderr open or running on. Its
//! stderr never reaches ours: a failure's message carries its last lines with anything that
//! looks like a key redacted; after a success it is dropped.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::keys::TemporaryCredentials;
use super::scrub::redact_secret_like;
use crate::cancel::Cancel;
use crate::error::{Error, Result};

/// How long a helper may run, as the AWS SDK for Go's `processcreds.DefaultTimeout`: one
/// network round trip of a helper takes seconds; a minute is waiting for what is not coming.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable that sets the timeout, in seconds.
pub(super) const TIMEOUT_VARIABLE: &str = "O41_CREDENTIAL_PROCESS_TIMEOUT";
/// The most a helper may print on stdout, as the AWS SDKs for Java (64,000 bytes) and Kotlin
/// (64 KiB) cap it: its answer is a few hundred bytes of JSON, a session token included.
pub(super) const MAX_OUTPUT: usize = 64 << 10;
/// How much of a helper's stderr is kept (its end): read on, so that a chatty helper never
/// blocks on a full pipe, and dropped beyond.
const MAX_STDERR_KEPT: usize = 64 << 10;
/// How much of the kept stderr a message shows (its end, where the reason usually is).
const STDERR_SHOWN: usize = 1000;
/// How often a waiting run looks at its cancellation flag, its deadline, the helper and what it
/// printed.
const POLL_STEP: Duration = Duration::from_millis(10);
/// How long dropping a fetch waits for its helper to be killed and reaped: one poll step and a
/// kill, unless the kernel is slow to end the process.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Reads the timeout from `value` (seconds) when the variable is set.
pub(super) fn timeout_from(value: Option<String>) -> Result<Duration> {
    let Some(text) = value else {
        return Ok(DEFAULT_TIMEOUT);
    };
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= 1e9)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            Error::config(
                TIMEOUT_VARIABLE,
                format!(
                    "expected a number of seconds above 0 (the time a credential_process may \
                     run), got '{text}'"
                ),
            )
        })
}

/// A profile's `credential_process`.
pub(super) struct CredentialProcess {
    /// `credential_process of profile 'name'`.
    pub(super) what: String,
    pub(super) argv: Vec<String>,
    pub(super) timeout: Duration,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessAnswer {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

impl CredentialProcess {
    /// Runs the helper on a blocking thread. Dropping the future (the request that needed the
    /// credentials was cancelled) kills the helper's group and waits for it to be reaped.
    pub(super) async fn fetch(self: Arc<Self>) -> Result<TemporaryCredentials> {
        let stop = StopOnDrop::default();
        let (cancel, done) = (stop.cancel.clone(), stop.done.clone());
        let what = self.what.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let result = self.fetch_blocking(&cancel);
            done.finish();
            result
        })
        .await;
        joined.map_err(|e| {
            Error::config(
                "credential_process",
                format!("{what}: the thread that ran it failed: {e}"),
            )
        })?
    }

    /// Runs the helper and reads its answer; gives up (killing it) once `cancel` is set.
    pub(super) fn fetch_blocking(&self, cancel: &Cancel) -> Result<TemporaryCredentials> {
        let program = self.argv.first().map_or("", String::as_str);
        // Only the program is named: its arguments may carry a secret.
        let fail = |message: String| {
            Error::config(
                "credential_process",
                format!("{} ('{program}'): {message}", self.what),
            )
        };
        if program.is_empty() {
            return Err(fail("the command is empty".into()));
        }
        let output = match run(&self.argv, self.timeout, cancel) {
            Ok(output) => output,
            Err(Ended::Start(e)) => return Err(fail(format!("could not start it: {e}"))),
            Err(Ended::Io(e)) => return Err(fail(format!("reading its output failed: {e}"))),
            Err(Ended::Cancelled) => {
                return Err(Error::Cancelled {
                    what: self.what.clone(),
                })
            }
            Err(Ended::TimedOut { stderr }) => {
                return Err(fail(format!(
                    "it did not finish within {} s ({TIMEOUT_VARIABLE}) and was killed with \
                     every process it started{}",
                    self.timeout.as_secs_f64(),
                    said(&stderr)
                )))
            }
            Err(Ended::TooMuchOutput { stderr }) => {
                return Err(fail(format!(
                    "it printed more than {MAX_OUTPUT} bytes, more than credential JSON takes, \
                     and was killed with every process it started{}",
                    said(&stderr)
                )))
            }
        };
        if !output.status.success() {
            return Err(fail(format!(
                "it exited with {}{}",
                output.status,
                said(&output.stderr)
            )));
        }
        // Not echoed on failure: the output holds secrets.
        let answer: ProcessAnswer = serde_json::from_slice(&output.stdout).map_err(|e| {
            fail(format!(
                "its output is not credential JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        if answer.version != 1 {
            return Err(fail(format!(
                "its output has Version {}, expected 1",
                answer.version
            )));
        }
        let expiry = answer
            .expiration
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(&text)
                    .map(SystemTime::from)
                    .map_err(|e| fail(format!("Expiration '{text}' is not an RFC 3339 time ({e})")))
            })
            .transpose()?;
        Ok(TemporaryCredentials {
            access_key_id: answer.access_key_id,
            secret_access_key: answer.secret_access_key,
            session_token: answer.session_token,
            expiry,
        })
    }
}

/// What the helper wrote on stderr, for a message: its end, secret-like runs redacted.
fn said(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return String::new();
    }
    let start = text
        .char_indices()
        .rev()
        .nth(STDERR_SHOWN - 1)
        .map_or(0, |(at, _)| at);
    let cut = if start > 0 { "..." } else { "" };
    format!(
        "; it wrote on stderr: {cut}{}",
        redact_secret_like(&text[start..])
    )
}

/// Sets the flag of a fetch whose future is dropped and waits for its helper to be gone.
#[derive(Default)]
struct StopOnDrop {
    cancel: Cancel,
    done: Arc<Done>,
}

#[derive(Default)]
struct Done(Mutex<bool>, Condvar);

impl Done {
    fn finish(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.1.notify_all();
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.cancel.cancel();
        let finished = self.done.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded: a helper stuck in the kernel is still reaped by its thread, later.
        let _ = self
            .done
            .1
            .wait_timeout_while(finished, STOP_WAIT, |finished| !*finished);
    }
}

/// What a helper printed once it exited.
#[derive(Debug)]
pub(super) struct Output {
    pub(super) status: ExitStatus,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
}

/// How a run ended without output: each stop but `Start` killed the group and reaped the
/// helper. `stderr` is the end of what it wrote.
#[derive(Debug)]
pub(super) enum Ended {
    Start(std::io::Error),
    Io(std::io::Error),
    Cancelled,
    TimedOut { stderr: Vec<u8> },
    TooMuchOutput { stderr: Vec<u8> },
}

/// A started helper, in its own group. Unless its run ended cleanly (it exited and closed both
/// outputs), dropping this kills the group and reaps the helper, on every path out of [`run`].
struct Group {
    child: Child,
    clean: bool,
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.clean {
            return;
        }
        // The child leads its group (`process_group(0)`), so its pid names the group. `run`
        // reaps it only once it is done, so here it is not reaped and its id, which stays
        // reserved until then, cannot name another group. Everything it started without
        // leaving the group goes with it.
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

/// Sends SIGKILL to the process group `group`. The standard library signals one child
/// (`Child::kill`), not its group, and the engine has no other way to make the call.
#[allow(unsafe_code)]
fn kill_group(group: u32) {
    if let Ok(group) = libc::pid_t::try_from(group) {
        // SAFETY: killpg takes two integers and touches no memory of ours; an error (the group
        // has ended) leaves nothing to do.
        unsafe {
            libc::killpg(group, libc::SIGKILL);
        }
    }
}

/// What a reader thread has read of one output, and whether it reached the end.
#[derive(Default)]
struct Captured {
    bytes: Mutex<Vec<u8>>,
    ended: AtomicBool,
}

impl Captured {
    fn len(&self) -> usize {
        self.bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.bytes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Reads `pipe` on a thread of its own until its end, keeping its first `keep` bytes and
/// stopping there (`tail` false: stdout, whose excess fails the run) or its last `keep` bytes
/// and reading on (`tail` true: stderr, which a chatty helper must be able to write without
/// blocking). The thread ends at the pipe's end, which comes once the helper's group is gone.
fn reader(mut pipe: impl Read + Send + 'static, keep: usize, tail: bool) -> Arc<Captured> {
    let captured = Arc::new(Captured::default());
    let shared = captured.clone();
    let read = move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let mut bytes = shared.bytes.lock().unwrap_or_else(PoisonError::into_inner);
                    if tail {
                        bytes.extend_from_slice(&buf[..n]);
                        let excess = bytes.len().saturating_sub(keep);
                        bytes.drain(..excess);
                    } else {
                        let room = keep.saturating_sub(bytes.len());
                        bytes.extend_from_slice(&buf[..n.min(room)]);
                        if n >= room {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        shared.ended.store(true, Ordering::SeqCst);
    };
    // Without a thread the output is never read nor ended: the run ends at its timeout.
    let _ = std::thread::Builder::new()
        .name("o41-credential-process".into())
        .spawn(read);
    captured
}

/// Runs `argv` as a helper: no stdin, both outputs captured, in its own process group. Returns
/// once it has exited and closed both outputs, or stops it (see [`Ended`]) at `timeout`, once
/// stdout passes [`MAX_OUTPUT`] bytes, or once `cancel` is set.
pub(super) fn run(argv: &[String], timeout: Duration, cancel: &Cancel) -> Result<Output, Ended> {
    let deadline = Instant::now() + timeout;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Ended::Start(std::io::ErrorKind::InvalidInput.into()))?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(Ended::Start)?;
    let stdout = reader(
        child.stdout.take().expect("stdout is piped"),
        MAX_OUTPUT + 1,
        false,
    );
    let stderr = reader(
        child.stderr.take().expect("stderr is piped"),
        MAX_STDERR_KEPT,
        true,
    );
    let mut group = Group {
        child,
        clean: false,
    };
    loop {
        if stdout.len() > MAX_OUTPUT {
            return Err(Ended::TooMuchOutput {
                stderr: stderr.take(),
            });
        }
        // Only once both outputs are closed is the helper waited for (and so reaped): until
        // then its pid keeps naming its group for `Group::drop`.
        if stdout.ended.load(Ordering::SeqCst) && stderr.ended.load(Ordering::SeqCst) {
            if let Some(status) = group.child.try_wait().map_err(Ended::Io)? {
                group.clean = true;
                return Ok(Output {
                    status,
                    stdout: stdout.take(),
                    stderr: stderr.take(),
                });
            }
        }
        if cancel.is_cancelled() {
            return Err(Ended::Cancelled);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Ended::TimedOut {
                stderr: stderr.take(),
            });
        }
        std::thread::sleep(POLL_STEP.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    /// Whether `pid` is gone or a zombie (ended; its reaping is another parent's business).
    fn ended(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    fn pids(dir: &std::path::Path) -> (i32, i32) {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .unwrap()
                .trim()
                .parse::<i32>()
                .unwrap()
        };
        (read("helper.pid"), read("grandchild.pid"))
    }

    /// A helper that writes its pid and its child's, then waits for good.
    fn stuck(dir: &std::path::Path) -> Vec<String> {
        std::fs::create_dir_all(dir).unwrap();
        let d = dir.display();
        sh(&format!(
            "echo $$ > {d}/helper.pid; sleep 600 & echo $! > {d}/grandchild.pid.tmp; \
             mv {d}/grandchild.pid.tmp {d}/grandchild.pid; wait"
        ))
    }

    fn assert_gone(dir: &std::path::Path) {
        let (helper, grandchild) = pids(dir);
        // The helper was reaped before `run` returned: not even a zombie is left.
        assert!(
            !std::path::Path::new(&format!("/proc/{helper}")).exists(),
            "helper {helper} left"
        );
        // The grandchild got SIGKILL with the group; its end and reaping are the kernel's and
        // its new parent's, so look until it has ended.
        let mut tries = 0;
        while !ended(grandchild) && tries < 1000 {
            std::thread::sleep(Duration::from_millis(10));
            tries += 1;
        }
        assert!(ended(grandchild), "grandchild {grandchild} left running");
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("o41-process-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_helper_is_killed_with_its_group_at_the_timeout() {
        let dir = temp("timeout");
        let ended = run(&stuck(&dir), Duration::from_millis(500), &Cancel::new()).unwrap_err();
        assert!(matches!(ended, Ended::TimedOut { .. }), "{ended:?}");
        assert_gone(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_helper_is_killed_with_its_group_once_cancelled() {
        let dir = temp("cancel");
        let cancel = Cancel::new();
        let argv = stuck(&dir);
        let ended = std::thread::scope(|scope| {
            let running = scope.spawn(|| run(&argv, Duration::from_secs(600), &cancel));
            while !dir.join("grandchild.pid").exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            cancel.cancel();
            running.join().unwrap()
        });
        assert!(matches!(ended, Err(Ended::Cancelled)), "{ended:?}");
        assert_gone(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dropping_a_fetch_kills_its_helper_before_the_drop_returns() {
        let dir = temp("drop");
        let process = Arc::new(CredentialProcess {
            what: "credential_process of profile 'stuck'".into(),
            argv: stuck(&dir),
            timeout: Duration::from_secs(600),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let marker = dir.join("grandchild.pid");
        runtime.block_on(async {
            tokio::select! {
                _ = process.fetch() => panic!("the helper never exits"),
                () = async {
                    while !marker.exists() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                } => {}
            }
        });
        assert_gone(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_capped_and_stderr_is_captured() {
        let cancel = Cancel::new();
        let endless = run(&sh("yes AKIA"), Duration::from_secs(60), &cancel).unwrap_err();
        assert!(
            matches!(endless, Ended::TooMuchOutput { .. }),
            "{endless:?}"
        );
        // Chatty on stderr, far past what is kept: never blocks, keeps the end.
        let output = run(
            &sh("head -c 1000000 /dev/zero | tr '\\0' x >&2; echo end >&2; echo '{}'"),
            Duration::from_secs(60),
            &cancel,
        )
        .unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, b"{}\n");
        assert_eq!(output.stderr.len(), MAX_STDERR_KEPT);
        assert!(output.stderr.ends_with(b"xxxend\n"));
    }

    #[test]
    fn failures_name_the_profile_and_program_and_show_stderr_redacted() {
        let process = |script: &str, timeout| CredentialProcess {
            what: "credential_process of profile 'p'".into(),
            argv: sh(script),
            timeout,
        };
        let message =
            |p: CredentialProcess| p.fetch_blocking(&Cancel::new()).err().unwrap().to_string();
        let failed = message(process(
            "echo 'login failed for AKIAIOSFODNN7EXAMPLE' >&2; exit 3",
            DEFAULT_TIMEOUT,
        ));
        assert_eq!(
            failed,
            "invalid credential_process: credential_process of profile 'p' ('/bin/sh'): it \
             exited with exit status: 3; it wrote on stderr: login failed for <redacted>"
        );
        let slow = message(process("sleep 600", Duration::from_millis(200)));
        assert!(
            slow.ends_with(
                "it did not finish within 0.2 s (O41_CREDENTIAL_PROCESS_TIMEOUT) and was \
                 killed with every process it started"
            ),
            "{slow}"
        );
        let endless = message(process("yes", DEFAULT_TIMEOUT));
        assert!(
            endless.contains("it printed more than 65536 bytes"),
            "{endless}"
        );
        let missing = message(CredentialProcess {
            what: "credential_process of profile 'p'".into(),
            argv: vec!["/nonexistent/o41-helper".into()],
            timeout: DEFAULT_TIMEOUT,
        });
        assert!(missing.contains("could not start it"), "{missing}");
        let cancel = Cancel::new();
        cancel.cancel();
        let cancelled = process("sleep 600", DEFAULT_TIMEOUT).fetch_blocking(&cancel);
        assert!(matches!(cancelled, Err(Error::Cancelled { .. })));
    }

    #[test]
    fn the_timeout_is_read_from_its_variable() {
        assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(Some("0.5".into())).unwrap(),
            Duration::from_millis(500)
        );
        for bad in ["0", "-1", "nan", "inf", "soon", "1e300"] {
            let error = timeout_from(Some(bad.into())).unwrap_err().to_string();
            assert!(error.contains(TIMEOUT_VARIABLE), "{error}");
        }
    }
}
