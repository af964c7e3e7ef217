//! Supervising an exporter process: its time limits, its output lines and progress markers,
//! and the one-line error of a process that failed.

use super::protocol::{MARKER_PREFIX, MISMATCH_EXIT};
use super::pyenv::PyEnv;
use anyhow::anyhow;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The time limit of one module (the config's `export_timeout_s`), in seconds.
static TIMEOUT_S: AtomicU64 = AtomicU64::new(600);

/// Sets the time the exporter may spend on one implementation's module: importing it,
/// checking its entry, tracing and exporting one case (the config's `export_timeout_s`).
/// Past it the exporter is killed and that implementation's trials are errors.
pub fn set_timeout(secs: u64) {
    TIMEOUT_S.store(secs.max(1), Ordering::Relaxed);
}

/// The time limit of one module ([`set_timeout`]).
pub fn timeout() -> Duration {
    Duration::from_secs(TIMEOUT_S.load(Ordering::Relaxed))
}

/// The time limit of the exporter's own start-up (Python, jax, `grpo_jax`), before any
/// implementation's code runs: at least five minutes, a cold jax import on a loaded
/// machine is slow and is nobody's module.
pub(super) fn startup_limit() -> Duration {
    timeout().max(Duration::from_secs(300))
}

/// One line of an exporter process: a stdout line, a stderr line, or a progress marker
/// (a stderr line starting with `grpo-exporter: `, prefix removed).
pub(super) enum Said {
    Out(String),
    Err(String),
    Marker(String),
}

/// How a supervised exporter process ended.
pub(super) enum Ended {
    /// It exited (or was killed by a signal of its own doing).
    Exited(ExitStatus),
    /// It passed a time limit and was killed.
    TimedOut,
}

/// Runs an exporter command with `input` on its stdin under time limits: `startup` until
/// `on` first returns true, then `limit` from each line for which `on` returns true (a
/// result, a progress marker). Past the limit the process is killed. Returns how it ended
/// and its last stderr lines (markers excluded).
pub(super) fn supervised(
    mut cmd: Command,
    input: String,
    startup: Duration,
    limit: Duration,
    mut on: impl FnMut(&Said) -> bool,
) -> std::io::Result<(Ended, Vec<String>)> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take();
    std::thread::spawn(move || {
        if let Some(mut stdin) = stdin {
            // A process that exits early closes its end: a write error is no news.
            stdin.write_all(input.as_bytes()).ok();
        }
    });
    // None: that stream ended.
    let (tx, rx) = channel::<Option<Said>>();
    let out = child.stdout.take();
    let tx_out = tx.clone();
    std::thread::spawn(move || {
        if let Some(out) = out {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx_out.send(Some(Said::Out(l))).is_err() {
                    return;
                }
            }
        }
        tx_out.send(None).ok();
    });
    let err = child.stderr.take();
    std::thread::spawn(move || {
        if let Some(err) = err {
            for l in BufReader::new(err).lines().map_while(|l| l.ok()) {
                let said = match l.strip_prefix(MARKER_PREFIX) {
                    Some(m) => Said::Marker(m.to_string()),
                    None => Said::Err(l),
                };
                if tx.send(Some(said)).is_err() {
                    return;
                }
            }
        }
        tx.send(None).ok();
    });
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut deadline = Instant::now() + startup;
    let mut open_streams = 2;
    let killed = loop {
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        if open_streams == 0 {
            // Both streams closed: the process is exiting (or holds on without output).
            match child.try_wait()? {
                Some(_) => break false,
                None => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
        }
        match rx.recv_timeout(deadline - now) {
            Ok(Some(said)) => {
                if on(&said) {
                    deadline = Instant::now() + limit;
                }
                if let Said::Err(l) = said {
                    if !l.trim().is_empty() {
                        tail.push_back(l);
                        if tail.len() > 20 {
                            tail.pop_front();
                        }
                    }
                }
            }
            Ok(None) => open_streams -= 1,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open_streams = 0,
        }
    };
    let tail = tail.into_iter().collect();
    if killed {
        child.kill().ok();
        child.wait()?;
        return Ok((Ended::TimedOut, tail));
    }
    Ok((Ended::Exited(child.wait()?), tail))
}

/// The last stderr line worth quoting: the exception line of a traceback if there is one
/// (never the traceback), else the last non-empty line.
pub(super) fn last_message(tail: &[String]) -> Option<String> {
    let last = tail.iter().rev().find(|l| !l.trim().is_empty())?;
    Some(last.trim().chars().take(500).collect())
}

/// The one-line error of a failed exporter process: the protocol mismatch line as is.
pub(super) fn exporter_failure(env: &PyEnv, status: ExitStatus, stderr: &[u8]) -> anyhow::Error {
    let lines: Vec<String> = String::from_utf8_lossy(stderr)
        .lines()
        .map(str::to_string)
        .collect();
    exporter_failure_of(env, status, &lines)
}

/// [`exporter_failure`] from the process's last stderr lines.
pub(super) fn exporter_failure_of(
    env: &PyEnv,
    status: ExitStatus,
    tail: &[String],
) -> anyhow::Error {
    let last = last_message(tail).unwrap_or_else(|| "(no message)".into());
    if status.code() == Some(MISMATCH_EXIT) {
        anyhow!("{last}")
    } else {
        anyhow!("exporter {} exited with {status}: {last}", env.describe())
    }
}
