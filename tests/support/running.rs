//! A `polyarch` run watched from a test: its stderr lines as they come, signals, and the
//! host processes a build's or test's RUN step starts.

use super::run;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for a line, an exit or a process to come or go.
pub const WAIT: Duration = Duration::from_secs(30);

/// A running `polyarch build` whose stderr lines are collected as they come.
pub struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<String>>,
}

impl Running {
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn polyarch");
        let (tx, lines) = mpsc::channel();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let stderr = child.stderr.take().unwrap();
        let all = seen.clone();
        let err_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                all.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
            String::new()
        });
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Running {
            child,
            lines,
            seen,
            readers: vec![stdout, err_reader],
        }
    }

    /// Blocks until a stderr line contains `needle`; panics on exit or timeout.
    pub fn wait_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => {
                    let status = self.child.try_wait().ok().flatten();
                    panic!(
                        "no stderr line with {needle:?} (status {status:?}):\n{}",
                        self.stderr()
                    );
                }
            }
        }
    }

    pub fn stderr(&self) -> String {
        self.seen.lock().unwrap().join("\n")
    }

    pub fn signal(&self, signal: &str) {
        let out = run(Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string()));
        assert!(out.status.success(), "kill -{signal}: {out:?}");
    }

    /// Waits for the exit (at most [`WAIT`]); returns the status, stdout and stderr.
    pub fn finish(mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("polyarch did not exit:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Both readers end at EOF, right after the exit.
        let stdout: String = self.readers.drain(..).map(|r| r.join().unwrap()).collect();
        (status, stdout, self.stderr())
    }
}

/// Processes on this host whose command line is exactly `args` (BuildKit and Buildah run
/// RUN steps as host processes, outside any `docker ps` container).
pub fn processes_running(args: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

/// Polls `done` every 20 ms until it holds; fails with `what()` after [`WAIT`].
pub fn wait_until(mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run stopped by SIGINT while a host process it started was running.
pub struct Interrupted {
    pub stdout: String,
    pub stderr: String,
    /// From SIGINT to the exit.
    pub exited: Duration,
    signalled: Instant,
    step: Vec<String>,
}

/// Spawns `command`, waits until a host process with the command line `step` runs (a RUN
/// step or a test's command: a `sleep` no other test runs, so that it is this run's),
/// sends SIGINT and waits for the exit, which must be 130 (interrupted).
pub fn interrupt_while_running(command: Command, step: &[&str]) -> Interrupted {
    let running = Running::spawn(command);
    wait_until(
        || !processes_running(step).is_empty(),
        || format!("{step:?} never started:\n{}", running.stderr()),
    );
    let signalled = Instant::now();
    running.signal("INT");
    let (status, stdout, stderr) = running.finish();
    let exited = signalled.elapsed();
    eprintln!("exited {exited:?} after SIGINT\n{stderr}");
    assert_eq!(status.code(), Some(130), "{stderr}");
    Interrupted {
        stdout,
        stderr,
        exited,
        signalled,
        step: step.iter().map(|a| a.to_string()).collect(),
    }
}

impl Interrupted {
    /// Waits until the step's process is gone: cancelled by the engine, or ended by itself.
    pub fn wait_step_gone(&self) {
        let step: Vec<&str> = self.step.iter().map(String::as_str).collect();
        wait_until(
            || processes_running(&step).is_empty(),
            || format!("{step:?} still runs {WAIT:?} after SIGINT"),
        );
        eprintln!("{step:?} gone {:?} after SIGINT", self.signalled.elapsed());
    }
}
